#!/usr/bin/env python3
"""Trains a small MoE MLP layer with moekit.torch and the same model in plain torch ops, from the
same initial weights on the same data, and prints the two loss curves side by side.

    PYTHONPATH=build/python python3 examples/train_moe_mlp.py            # CPU, fp32
    PYTHONPATH=build/python python3 examples/train_moe_mlp.py --device cuda --dtype bf16

The layer: a router (Linear H -> E, softmax, top-1), tokens sorted by expert, then the experts'
grouped MLP fc1 -> ScaledSwiGLU (scaled by the routing prob) -> fc2 — moekit.torch.ops.Sequential,
fused into moekit's grouped MLP, writing its output into a caller buffer — and the rows put back
in token order. The task: regress a fixed random teacher MoE's output. Exit status 1 when the two
curves part by more than the dtype allows.
"""
import argparse

import torch
import torch.nn.functional as F

from moekit.torch import ops


class MoeKitMLP(torch.nn.Module):
    def __init__(self, experts, hidden, ffn, device, dtype):
        super().__init__()
        self.router = torch.nn.Linear(hidden, experts, bias=False, device=device, dtype=dtype)
        self.fc1 = ops.GroupedLinear(experts, hidden, 2 * ffn, bias=False, device=device, dtype=dtype)
        self.act = ops.ScaledSwiGLU()
        self.fc2 = ops.GroupedLinear(experts, ffn, hidden, bias=False, device=device, dtype=dtype)
        self.experts = ops.Sequential(self.fc1, self.act, self.fc2)

    def forward(self, x):
        probs, expert = F.softmax(self.router(x).float(), dim=-1).max(dim=-1)
        order = torch.argsort(expert, stable=True)
        splits = torch.bincount(expert, minlength=self.fc1.num_groups)
        if x.device.type == "cpu":
            splits = splits.tolist()
        out = torch.empty_like(x)  # a caller buffer (in a real model: the EP combine's input)
        y_sorted = self.experts(x[order], splits, probs[order], splits,
                                op_kwargs={self.fc2: {"output": out}})
        return y_sorted[torch.argsort(order)]


class TorchMLP(torch.nn.Module):
    """The same model in plain torch ops: one F.linear per expert."""

    def __init__(self, ref: MoeKitMLP):
        super().__init__()
        self.router = torch.nn.Linear(ref.router.in_features, ref.router.out_features, bias=False,
                                      device=ref.router.weight.device, dtype=ref.router.weight.dtype)
        self.router.weight.data.copy_(ref.router.weight.data)
        self.w1 = torch.nn.Parameter(ref.fc1.weight.detach().clone())
        self.w2 = torch.nn.Parameter(ref.fc2.weight.detach().clone())

    def forward(self, x):
        probs, expert = F.softmax(self.router(x).float(), dim=-1).max(dim=-1)
        y = torch.zeros_like(x)
        f = self.w2.shape[-1]
        for e in range(self.w1.shape[0]):
            rows = (expert == e).nonzero(as_tuple=True)[0]
            h = F.linear(x[rows], self.w1[e]).float()
            z = (probs[rows, None] * F.silu(h[:, :f]) * h[:, f:]).to(x.dtype)
            y = y.index_put((rows,), F.linear(z, self.w2[e]))
        return y


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--ffn", type=int, default=64)
    args = ap.parse_args()
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    torch.manual_seed(0)
    dims = (args.experts, args.hidden, args.ffn, args.device, dtype)
    teacher, model = MoeKitMLP(*dims), MoeKitMLP(*dims)
    plain = TorchMLP(model)
    x = torch.randn(args.tokens, args.hidden, device=args.device, dtype=dtype)
    with torch.no_grad():
        target = teacher(x)
    opt_a = torch.optim.Adam(model.parameters(), lr=3e-3)
    opt_b = torch.optim.Adam(plain.parameters(), lr=3e-3)
    print(f"{'step':>4}  {'moekit.torch':>12}  {'torch ops':>12}  {'|diff|':>9}")
    worst = 0.0
    for step in range(args.steps):
        losses = []
        for net, opt in ((model, opt_a), (plain, opt_b)):
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(net(x).float(), target.float())
            loss.backward()
            opt.step()
            losses.append(loss.item())
        diff = abs(losses[0] - losses[1])
        worst = max(worst, diff / max(losses[1], 1e-12))
        print(f"{step:>4}  {losses[0]:>12.6f}  {losses[1]:>12.6f}  {diff:>9.2e}")
    limit = 1e-3 if dtype == torch.float32 else 5e-2
    print(f"largest relative gap {worst:.2e} (limit {limit:.0e}): "
          f"{'the curves agree' if worst <= limit else 'the curves PART'}")
    return 0 if worst <= limit else 1


if __name__ == "__main__":
    raise SystemExit(main())
