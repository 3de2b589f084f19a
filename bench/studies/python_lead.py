#!/usr/bin/env python3
"""bench/studies/python_lead.py — what moekit.torch's grouped MLP step does on the host before its
first kernel (issue 43: in a per-step-synced step that lead is GPU idle time; python_step_profile
measures it on the GPU's timeline). Two views, on the device given (default cuda):
  - the Python lead: host time from step() to the moekit Sequential's forward call (the C++
    enqueue), median over --steps steps of bench/python_step.py's step at a small problem (E 4,
    1024 rows, 256 -> 128);
  - the pieces of moekit.torch's forward path, each timed alone (timeit, µs per call).

    PYTHONPATH=<build>/python python3 bench/studies/python_lead.py [--device cuda] [--steps 500]
"""
import argparse
import statistics
import time
import timeit

import os
import sys

import torch

from moekit.torch import _common as C

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from python_step import moekit_torch_step  # noqa: E402


class _Timed:
    """Stands in for a moekit Sequential: notes when its forward is called."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def forward(self, *a, **k):
        self.calls.append(time.perf_counter())
        return self.inner.forward(*a, **k)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=500)
    args = ap.parse_args()
    dev = torch.device(args.device)
    E, H, F, T = 4, 256, 128, 1024
    bf16 = torch.bfloat16
    # bench/python_step.py's step (the moekit.torch MLP with caller buffers) on a small problem
    step, mlp = moekit_torch_step({"counts": [T // E] * E, "hidden": H, "ffn": F, "tail": 0}, dev)
    fc1, fc2 = mlp[0], mlp[2]
    x = torch.randn(T, H, dtype=bf16, device=dev).requires_grad_()
    probs = torch.rand(T, device=dev).requires_grad_()
    splits = torch.full((E,), T // E, dtype=torch.int32, device=dev)
    y_buf, dx_buf = torch.empty(T, H, dtype=bf16, device=dev), torch.empty(T, H, dtype=bf16, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    for _ in range(10):
        step()
    sync()
    for k in list(mlp._cpp):
        mlp._cpp[k] = timed = _Timed(mlp._cpp[k])
    # Checkpoints on the way to the C++ forward: the Sequential's methods wrapped on the instance
    # (each notes when it is entered or left), in the order _run_eager calls them.
    marks = {}

    def mark(name, fn, at_exit=False):
        def wrapped(*a, **k):
            if not at_exit:
                marks[name] = time.perf_counter()
            out = fn(*a, **k)
            if at_exit:
                marks[name] = time.perf_counter()
            return out
        return wrapped
    mlp.forward = mark("Module.__call__ to forward", mlp.forward)
    mlp._run_eager = mark("forward to _run_eager", mlp._run_eager)
    mlp._route_extra_inputs = mark("_route_extra_inputs", mlp._route_extra_inputs, at_exit=True)
    mlp._seq = mark("x2, splits_for, probs", mlp._seq)
    mlp._route_op_kwargs = mark("_seq, _bind_params", mlp._route_op_kwargs)
    mlp._route_op_kwargs = mark("_route_op_kwargs", mlp._route_op_kwargs, at_exit=True)
    leads, totals, segments = [], [], {}
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        totals.append((time.perf_counter() - t0) * 1e6)
        leads.append((timed.calls[-1] - t0) * 1e6)
        last = t0
        for name, t in list(marks.items()) + [("needs_grad, dl, the C++ call", timed.calls[-1])]:
            segments.setdefault(name, []).append((t - last) * 1e6)
            last = t
        sync()
    print(f"{torch.__version__}, {args.device}: Python lead (step() to the C++ forward) "
          f"{statistics.median(leads):.1f} us; whole step's host enqueue {statistics.median(totals):.1f} us")
    print("  the lead by segment (median us; the first from step(): its grads cleared, the call):")
    for name, v in segments.items():
        print(f"    {name:34s} {statistics.median(v):7.2f}")

    key, ctx = C.context_for(dev)
    rkey, recipe = C.recipe_for(dev)
    kw = {fc2: {"output": y_buf.detach()}, fc1: {"grad_input": dx_buf.detach()}}
    pieces = {
        "context_for": lambda: C.context_for(dev),
        "recipe_for": lambda: C.recipe_for(dev),
        "splits_for (device counts)": lambda: C.splits_for(splits, dev, E),
        "_route_extra_inputs": lambda: mlp._route_extra_inputs((splits, probs, splits)),
        "_bind_params (both layers)": lambda: [op._bind_params(op._cpp_op((key, rkey), ctx, bf16))
                                               for op in mlp._ops],
        "_route_op_kwargs (2 buffers)": lambda: mlp._route_op_kwargs(kw, (key, rkey), ctx, bf16, T),
        "dl(x)": lambda: C.dl(x),
        "from_moekit(dl(x)) round trip": lambda: torch.from_dlpack(C.dl(x)),
        "torch.cuda.current_stream()": (lambda: torch.cuda.current_stream()) if dev.type == "cuda" else None,
        "x.__dlpack__(stream=-1)": lambda: x.detach().__dlpack__(stream=-1),
        "Module.__call__ of an Identity": lambda: torch.nn.Identity()(x),
    }
    for name, fn in pieces.items():
        if fn is None:
            continue
        fn()
        n = 2000
        print(f"  {name:34s} {timeit.timeit(fn, number=n) / n * 1e6:7.2f} us")


if __name__ == "__main__":
    main()
