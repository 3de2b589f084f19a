#!/usr/bin/env python3
"""bench/studies/fp8_gemm_peers.py — issue 40's FP8 GEMM targets side by side, in one process:
moekit's native FP8 grouped GEMMs (cuda-fp8: fp8-current's per-expert scales, fp8-block's
1x128 / 128x128 blocks) for fprop, dgrad and wgrad on the suite's shapes (uniform routing,
device splits, bf16), beside
  - CUTLASS example 68 (block-scaled, the mainloop moekit's fp8-block uses) and example 57
    (per-tensor FP8), stock (the issue's targets), timing only, at each pass's per-group (m, n,
    k), and beside them the variant that computes as moekit's pass does (like for like: ex57
    stock for fprop — FastAccum, as moekit's forward; dgrad, wgrad: ex57p, promoted accumulation as
    TE's split accumulator; ex68f / ex68d: the scale layouts moekit's fprop / dgrad read, A's
    1x128 scales K-major where ex68 reads MN-major; wgrad: ex68r, B scaled per row as x's 128x1
    blocks) — built by
    bench/studies/cutlass_fp8_peers.sh DIR, given as --cutlass DIR; each timed by its own loop
    (--iterations runs of initialize() + run() between two events), example 57 its best kernel;
  - torch._scaled_grouped_mm (rowwise scales, fast accumulation) for fprop.
moekit's time of a pass: its GEMM kernel only (CUTLASS device kernels; not the quantize or the
setup kernels), from torch.profiler over --reps calls of a GroupedLinear step that runs only that
pass (fprop: a no-grad forward; dgrad: the input requires grad, the weight not; wgrad: the
reverse; a backward step's first GEMM is its forward's, not counted), after warm-up. A study: the numbers feed design/PERFORMANCE.md's FP8 row.

    PYTHONPATH=<build>/python python3 bench/studies/fp8_gemm_peers.py [--shapes a,b]
        [--passes fprop,dgrad,wgrad] [--recipes fp8-block,fp8-current] [--cutlass DIR] [--reps 10]
        [--out table.md]

--passes / --recipes narrow a run (a recipe left out shows "—" and runs no peer of its own): e.g.
a study build's tiles of fp8-current's fprop, one process per MOEKIT_SM90_STUDY value (the
override is read once a process): `MOEKIT_SM90_STUDY=fp8_fast=coop256 ... --passes fprop
--recipes fp8-current` (bench/studies/sm90_fp8_fast_study.h).

Shapes (bench/grouped_gemm_bench.cu's suite; E experts, T rows, K -> N):
"""
import argparse
import re
import statistics
import subprocess

import torch

import moekit.torch as mt
from moekit.torch.recipe import Float8BlockScaling, Float8CurrentScaling
from recipe_profile import scaled_grouped_mm_ms

SHAPES = {  # name: (E, T, K, N), as `moekit_bench --list`
    "dsv3_fc1_E8": (8, 32768, 7168, 4096), "dsv3_fc2_E8": (8, 32768, 2048, 7168),
    "dsv3_fc1_E32": (32, 32768, 7168, 4096), "qwen3_fc1_E16": (16, 16384, 4096, 3072),
    "qwen3_fc2_E16": (16, 16384, 1536, 4096), "mixtral_fc1_E8": (8, 16384, 4096, 28672),
    "small_E64": (64, 4096, 2048, 1024),
}
__doc__ += "".join(f"  {k}: E {v[0]}, T {v[1]}, {v[2]} -> {v[3]}\n" for k, v in SHAPES.items())
RECIPES = {"fp8-current": Float8CurrentScaling, "fp8-block": Float8BlockScaling}
PASSES = ("fprop", "dgrad", "wgrad")


def pass_mnk(p, T, E, K, N):
    """The per-group GEMM (m, n, k) of a pass: fprop x·Wᵀ, dgrad dy·W, wgrad dyᵀ·x."""
    m = T // E
    return {"fprop": (m, N, K), "dgrad": (m, K, N), "wgrad": (N, K, m)}[p]


SHOW_KERNELS = False  # --show-kernels: print the GEMM kernel's tile and cluster shapes once per pass


def moekit_pass_ms(recipe, p, E, T, K, N, reps):
    """Milliseconds per call of the pass's GEMM kernels (median over the profiled calls)."""
    from torch.profiler import ProfilerActivity, profile
    layer = mt.GroupedLinear(E, K, N, bias=False, params_dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        layer.weight.normal_(0.0, K ** -0.5)
    x = torch.randn(T, K, dtype=torch.bfloat16, device="cuda")
    dy = torch.randn(T, N, dtype=torch.bfloat16, device="cuda")
    splits = torch.full((E,), T // E, dtype=torch.int32, device="cuda")
    x.requires_grad_(p == "dgrad")
    layer.weight.requires_grad_(p == "wgrad")

    def step():
        with mt.autocast(recipe=RECIPES[recipe]()):
            if p == "fprop":
                with torch.no_grad():
                    layer(x, splits)
            else:
                x.grad = layer.weight.grad = None
                layer(x, splits).backward(dy)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            step()
        torch.cuda.synchronize()
    gemm = sorted((ev for ev in prof.events()
                   if ev.device_type == torch.autograd.DeviceType.CUDA and "cutlass13device_kernel" in ev.name),
                  key=lambda ev: ev.time_range.start)
    per_call = 1 if p == "fprop" else 2  # a backward step runs its forward's GEMM first
    if SHOW_KERNELS and gemm:  # e.g. a study tile (MOEKIT_SM90_STUDY): which kernel ran
        shapes = list(dict.fromkeys(re.findall(r"C<(\d+)>, (?:cute::)?C<(\d+)>, (?:cute::)?C<(\d+)>", gemm[-1].name)))
        sched = re.findall(r"KernelPtrArrayTmaWarpSpecialized\w+", gemm[-1].name)
        print(f"moekit {recipe} {p}: {sched[:1]} shapes {shapes[:3]}", flush=True)
    if len(gemm) != per_call * reps:
        raise RuntimeError(f"moekit {recipe} {p}: {len(gemm)} GEMM kernels in {reps} calls, expected {per_call * reps}")
    return statistics.median(ev.device_time / 1e3 for ev in gemm[per_call - 1::per_call])


def cutlass_ms(binary, m, n, k, groups, iterations=20):
    """The example's own 'Avg runtime' (its best kernel when it runs several), milliseconds."""
    r = subprocess.run([binary, f"--m={m}", f"--n={n}", f"--k={k}", f"--groups={groups}",
                        f"--iterations={iterations}"], capture_output=True, text=True, timeout=300)
    times = [float(t) for t in re.findall(r"Avg runtime\s*:\s*([0-9.eE+-]+)\s*ms", r.stdout)]
    if r.returncode != 0 or not times:
        raise RuntimeError(f"{binary} --m={m} --n={n} --k={k} --groups={groups}: exit {r.returncode}: "
                           f"{(r.stdout + r.stderr)[-400:]}")
    return min(times)


def peer(fn):
    """A peer's time, or None with the reason printed (a peer that refuses a shape, e.g. example
    68 with k < 128, is a missing cell, not a failed study)."""
    try:
        return fn()
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"peer refused: {e}", flush=True)
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--cutlass", help="the folder bench/studies/cutlass_fp8_peers.sh built ex57 / ex68 in")
    ap.add_argument("--passes", default=",".join(PASSES))
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--show-kernels", action="store_true", help="print each pass's GEMM schedule and shapes")
    ap.add_argument("--out", help="also write the table (markdown) here")
    args = ap.parse_args()
    lines = [f"# FP8 grouped GEMMs: moekit (cuda-fp8) beside stock CUTLASS and torch — "
             f"{torch.cuda.get_device_name()}", "",
             f"torch {torch.__version__}; uniform routing, device splits; ms per call (moekit: its GEMM "
             f"kernels, median of {args.reps} profiled calls); TFLOP/s = 2·T·N·K / time.", "",
             "| shape | pass | fp8-block ms | ex68 ms | block / ex68 (target ≥ 1.0) | like-for-like ms | "
             "block / it | fp8-current ms | ex57 ms | current / ex57 (≥ 1.0) | like-for-like ms | current / it | "
             "torch._scaled_grouped_mm ms | current / torch (≥ 1.1) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    global SHOW_KERNELS
    SHOW_KERNELS = args.show_kernels
    passes, recipes = args.passes.split(","), args.recipes.split(",")
    for bad in [p for p in passes if p not in PASSES] + [r for r in recipes if r not in RECIPES]:
        ap.error(f"unknown pass or recipe {bad!r} (passes {', '.join(PASSES)}; recipes {', '.join(RECIPES)})")
    for name in args.shapes.split(","):
        E, T, K, N = SHAPES[name]
        flop = 2.0 * T * N * K
        for p in [p for p in PASSES if p in passes]:
            blk = moekit_pass_ms("fp8-block", p, E, T, K, N, args.reps) if "fp8-block" in recipes else None
            cur = moekit_pass_ms("fp8-current", p, E, T, K, N, args.reps) if "fp8-current" in recipes else None
            m, n, k = pass_mnk(p, T, E, K, N)
            # the stock examples (the targets) and, for the backward passes, the variants
            # that accumulate / scale as moekit's do (like for like)
            # (ex68f / ex68d: the scales' majors moekit's fprop / dgrad read; ex68r: B per row, wgrad)
            b_like = {"fprop": "ex68f", "dgrad": "ex68d", "wgrad": "ex68r"}[p]
            c_like = "ex57" if p == "fprop" else "ex57p"
            run = lambda b: peer(lambda: cutlass_ms(f"{args.cutlass}/{b}", m, n, k, E)) if args.cutlass else None
            ex68 = run("ex68") if blk is not None else None
            ex57 = run("ex57") if cur is not None else None
            ex68l = None if blk is None else run(b_like)
            ex57l = ex57 if c_like == "ex57" or cur is None else run(c_like)
            tsg = scaled_grouped_mm_ms(E, T, K, N, args.reps) if p == "fprop" and cur is not None else None
            fmt = lambda v: "—" if v is None else f"{v:.3f}"
            ours = lambda v: "—" if v is None else f"{v:.3f} ({flop / v / 1e9:.0f} TF)"
            ratio = lambda peer, mine: "—" if peer is None or mine is None else f"{peer / mine:.2f}"
            lines.append(f"| {name} | {p} | {ours(blk)} | {fmt(ex68)} | "
                         f"{ratio(ex68, blk)} | {fmt(ex68l)} ({b_like}) | {ratio(ex68l, blk)} | "
                         f"{ours(cur)} | {fmt(ex57)} | {ratio(ex57, cur)} | "
                         f"{fmt(ex57l)} ({c_like}) | {ratio(ex57l, cur)} | {fmt(tsg)} | {ratio(tsg, cur)} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
