#!/usr/bin/env python3
"""bench/mlp_peer.py — the grouped MLP (fc1 -> SwiGLU * probs -> fc2, forward + backward) built from
torch ops, timed on exactly the problems `moekit run --json` ran, side by side with moekit's fused
and unfused Sequential (PERFORMANCE.md: fused >= 1.25x this torch MLP and >= 1.15x unfused).

    moekit run --preset qwen3 --routing skewed --steps 10 --json > fused.json
    moekit run --preset qwen3 --routing skewed --steps 10 --json --no-fuse > unfused.json
    python3 bench/mlp_peer.py fused.json unfused.json [more.json ...] [--steps 10] [--torch-runs 3] [--out t.md]

The torch MLP: x [S, H] (the S routed rows), W1 [E, 2F, H], W2 [E, H, F] bf16, probs [S] f32,
    h = torch._grouped_mm(x, W1^T, offs); z = silu(h[:, :F]) * h[:, F:] * probs[:, None]
    y = torch._grouped_mm(z, W2^T, offs);  dx, dW1, dW2, dprobs = autograd.grad(y, ..., dy)
(bf16 gradients, like moekit run's dW; moekit also writes y and dx into caller buffers and leaves
the capacity tail alone). Both sides are timed the same way: host wall clock around one
forward + backward followed by a device synchronisation, median of --steps after warm-up.
"""
import argparse
import json
import statistics
import sys
import time


def torch_mlp_ms(torch, H, F, counts, steps, warmup=3, warmup_ms=0.0, seed=0):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(seed)
    E, S = len(counts), sum(counts)
    bf16 = torch.bfloat16
    x = torch.randn(S, H, device=dev, dtype=bf16, generator=g).requires_grad_()
    w1 = (torch.randn(E, 2 * F, H, device=dev, dtype=bf16, generator=g) / H ** 0.5).requires_grad_()
    w2 = (torch.randn(E, H, F, device=dev, dtype=bf16, generator=g) / F ** 0.5).requires_grad_()
    probs = torch.rand(S, device=dev, dtype=torch.float32, generator=g).add_(0.1).requires_grad_()
    dy = torch.randn(S, H, device=dev, dtype=bf16, generator=g)
    offs = torch.tensor(counts, device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)

    def step():
        h = torch._grouped_mm(x, w1.transpose(-2, -1), offs=offs)
        z = torch.nn.functional.silu(h[:, :F]) * h[:, F:] * probs[:, None].to(bf16)
        y = torch._grouped_mm(z, w2.transpose(-2, -1), offs=offs)
        return torch.autograd.grad(y, (x, w1, w2, probs), dy)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < warmup_ms:  # sustained load, as `moekit run --warmup-ms`
        step()
        torch.cuda.synchronize()
    ms = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="`moekit run --json` outputs (fused and --no-fuse)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup-ms", type=float, default=0.0,
                    help="untimed steps for this long before timing (give moekit run the same)")
    ap.add_argument("--torch-runs", type=int, default=3,
                    help="time the torch step this many times (each after its warm-up) and take the "
                         "median: one run moved by ~4%% between calls, more than the differences measured")
    ap.add_argument("--out", help="also write the table (markdown) here")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("mlp_peer.py: torch is not installed here; the torch peer needs the GPU machine")
        return 2
    if not torch.cuda.is_available():
        print("mlp_peer.py: torch sees no CUDA device; the torch peer needs the GPU machine")
        return 2

    runs = []
    for path in args.runs:
        with open(path) as f:
            text = f.read().strip().splitlines()
        runs.append(json.loads(text[-1]))  # the JSON line is the last one
    # One torch measurement per distinct problem (preset, routing, counts). Runs with host splits
    # or internal buffers are the "two paths" comparisons against the default fused run. Several
    # runs of one kind (tools/compare mlp runs the kinds in turns) count by their median.
    problems, variants = {}, {}
    for r in runs:
        key = (r["preset"], r["routing"], tuple(r["counts"]))
        if r.get("host_splits") or not r.get("caller_buffers", True):
            what = ("device splits / host splits" if r.get("host_splits") else
                    "caller buffers / internal allocation")
            variants.setdefault((key, what), []).append(r["step_ms"])
            continue
        problems.setdefault(key, {"run": r}).setdefault(
            "fused" if r["fused"] else "unfused", []).append(r["step_ms"])

    def median_of(key, kind):
        ms = problems.get(key, {}).get(kind)
        return (statistics.median(ms), len(ms)) if ms else (None, 0)
    lines = [
        f"# grouped MLP forward + backward: moekit vs torch ops — {torch.cuda.get_device_name()}",
        "",
        f"torch {torch.__version__}; host wall clock per step with a device sync, median of "
        f"{args.steps} steps after {args.warmup_ms:.0f} ms of untimed steps (moekit: `moekit run --steps "
        f"--warmup-ms`; with several runs of a kind, in turns, the median of their medians; runs per "
        f"kind: fused/unfused in the last column's parentheses; torch: the median of "
        f"{max(1, args.torch_runs)} runs, listed below the table); bf16; GFLOP = 18·S·H·F per step.",
        "",
        "| preset | routing | E | S | H | F | moekit fused ms | moekit unfused ms | torch ms | "
        "fused TFLOP/s | fused/torch | fused/unfused (runs) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    torch_runs = []
    for (preset, routing, counts), p in problems.items():
        r = p["run"]
        H, F = r["hidden"], r["ffn"]
        t_runs = [torch_mlp_ms(torch, H, F, list(counts), args.steps, warmup_ms=args.warmup_ms)
                  for _ in range(max(1, args.torch_runs))]
        t_ms = statistics.median(t_runs)
        torch_runs.append(f"{preset} {', '.join(f'{t:.3f}' for t in t_runs)}")
        fused, n_fused = median_of((preset, routing, counts), "fused")
        unfused, n_unfused = median_of((preset, routing, counts), "unfused")
        gflop = r["gflop_per_step"]

        def f(v, fmt="{:.3f}"):
            return fmt.format(v) if v else "-"

        lines.append(
            f"| {preset} | {routing} | {len(counts)} | {sum(counts)} | {H} | {F} | {f(fused)} | "
            f"{f(unfused)} | {t_ms:.3f} | {f(fused and gflop / fused, '{:.1f}')} | "
            f"{f(fused and t_ms / fused, '{:.2f}')} | "
            f"{f(fused and unfused and unfused / fused, '{:.2f}')} ({n_fused}/{n_unfused}) |")
    lines += ["", "torch runs, ms: " + "; ".join(torch_runs)]
    if variants:
        lines += ["", "Same MLP step, two paths (PERFORMANCE.md: both ratios should be 1.00):", "",
                  "| preset | routing | comparison | default fused ms | other ms | default / other |",
                  "|---|---|---|---|---|---|"]
        for (key, what), ms in variants.items():
            base, _ = median_of(key, "fused")
            if base:
                other = statistics.median(ms)
                lines.append(f"| {key[0]} | {key[1]} | {what} | {base:.3f} | {other:.3f} | "
                             f"{base / other:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as fo:
            fo.write(text)


if __name__ == "__main__":
    sys.exit(main())
