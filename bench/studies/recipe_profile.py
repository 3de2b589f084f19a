#!/usr/bin/env python3
"""bench/studies/recipe_profile.py — where a quantized GroupedLinear step spends its GPU time
(issue 40's bandwidth targets): one layer of the qwen3 preset's fc1 shape (E 16, 16384 rows,
K 4096, N 3072, bf16, device counts) forward + backward under each recipe given, after a
warm-up, traced by torch.profiler: milliseconds per step per kernel, largest first. A study.

    PYTHONPATH=build/python python3 bench/studies/recipe_profile.py [none fp8-block mxfp8 ...]

A name ending in "+bias" gives the layer a bias (its gradient: grouped_bias_grad's kernel on the
bf16 path, fused into dy's quantize on the fp8-current / fp8-block paths).
"""
import sys

import torch

import moekit.torch as mt
from moekit.torch.recipe import Float8BlockScaling, Float8CurrentScaling, MXFP8BlockScaling, \
    NVFP4BlockScaling

RECIPES = {"fp8-block": Float8BlockScaling, "mxfp8": MXFP8BlockScaling,
           "nvfp4": NVFP4BlockScaling, "fp8-current": Float8CurrentScaling,
           "fp8-current-pow2": lambda: Float8CurrentScaling(use_power_2_scales=True)}


def main():
    names = sys.argv[1:] or ["none", "fp8-block", "mxfp8"]
    E, T, K, N = 16, 16384, 4096, 3072
    layers = {b: mt.GroupedLinear(E, K, N, bias=b, params_dtype=torch.bfloat16, device="cuda")
              for b in (False, True)}
    x = torch.randn(T, K, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    dy = torch.randn(T, N, dtype=torch.bfloat16, device="cuda")
    splits = torch.full((E,), T // E, dtype=torch.int32, device="cuda")
    from torch.profiler import ProfilerActivity, profile
    for name in names:
        recipe, bias = name.removesuffix("+bias"), name.endswith("+bias")
        layer = layers[bias]

        def step():
            x.grad = None
            for p in layer.parameters():
                p.grad = None
            if recipe == "none":
                layer(x, splits).backward(dy)
            else:
                with mt.autocast(recipe=RECIPES[recipe]()):
                    layer(x, splits).backward(dy)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        by = {}
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                n, ms = by.get(ev.name, (0, 0.0))
                by[ev.name] = (n + 1, ms + ev.device_time / 1e3)
        total = sum(ms for _, ms in by.values()) / 3
        print(f"== {name}: {total:.3f} ms of kernels per step")
        for k, (n, ms) in sorted(by.items(), key=lambda kv: -kv[1][1])[:12]:
            print(f"  {ms / 3:8.3f} ms  x{n // 3:<3} {k[:120]}")


def scaled_grouped_mm_ms(E, T, K, N, reps=20):
    """torch._scaled_grouped_mm (rowwise e4m3, fast accumulation, uniform groups) on an fprop of
    E groups, T rows, K -> N: milliseconds per call (CUDA events, after warm-up); None when this
    torch has no _scaled_grouped_mm. The per-tensor FP8 peer of issue 40's targets
    (fp8_gemm_peers.py uses it too)."""
    fn = getattr(torch, "_scaled_grouped_mm", None)
    if fn is None:
        return None
    a = torch.randn(T, K, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(E, N, K, device="cuda").to(torch.float8_e4m3fn).transpose(-2, -1)
    sa, sb = torch.ones(T, device="cuda"), torch.ones(E, N, device="cuda")
    offs = torch.arange(T // E, T + 1, T // E, device="cuda", dtype=torch.int32)
    call = lambda: fn(a, b, sa, sb, offs=offs, out_dtype=torch.bfloat16, use_fast_accum=True)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def scaled_grouped_mm_peer(E=16, T=16384, K=4096, N=3072):
    """The peer on the layer's fprop shape, printed."""
    try:
        ms = scaled_grouped_mm_ms(E, T, K, N)
    except Exception as e:  # a signature this torch does not take: say so
        print(f"== torch._scaled_grouped_mm: {type(e).__name__}: {e}")
        return
    if ms is None:
        print("== torch._scaled_grouped_mm: not in this torch")
        return
    print(f"== torch._scaled_grouped_mm fprop E{E} T{T} K{K} N{N}: {ms:.3f} ms, "
          f"{2 * T * K * N / ms / 1e9:.0f} TFLOP/s")


if __name__ == "__main__":
    main()
    scaled_grouped_mm_peer()
