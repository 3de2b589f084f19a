#!/usr/bin/env python3
"""bench/studies/python_host_wait.py — where does a moekit.torch grouped-MLP step wait on the GPU?
(issue 43: in bench/studies/python_gap.py the host is never ahead of the GPU for moekit.torch,
although its enqueue is shorter than the sleep queued first; the bare bindings are.) A study.

    PYTHONPATH=<build>/python:bench python3 bench/studies/python_host_wait.py [--sleep-ms 200]

The qwen3 problem of bench/python_step.py (E16, 16384 + 64 rows, H 4096, F 1536, bf16, device
counts), 3 warm-up steps, then one step enqueued behind a torch.cuda._sleep of --sleep-ms: the
host time of forward and backward, the step under cProfile (autograd on the calling thread, so the
custom Functions' backward is seen) — a call that waits on the device has the sleep in its
cumulative time — and torch's sync debug mode (warns on a synchronising torch op).
"""
import argparse
import cProfile
import pstats
import time
import warnings

import torch

from gpu_sleep import sleep_cycles_per_ms
from python_step import moekit_torch_step


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sleep-ms", type=float, default=200.0)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    run = {"counts": [1024] * 16, "hidden": 4096, "ffn": 1536, "tail": 64, "glu": "interleaved32"}
    step, mlp = moekit_torch_step(run, "cuda")
    for _ in range(3):
        step()
    cyc = sleep_cycles_per_ms()
    torch.autograd.set_multithreading_enabled(False)  # backward on this thread: cProfile sees it
    step()
    torch.cuda.synchronize()
    # 1. host time of the whole step behind the sleep, and of an idle-GPU step
    for behind in (False, True):
        torch.cuda.synchronize()
        if behind:
            torch.cuda._sleep(int(args.sleep_ms * cyc))
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        print(f"step enqueue {'behind a ' + str(args.sleep_ms) + ' ms sleep' if behind else 'on an idle GPU'}:"
              f" {(t1 - t0) * 1e3:.3f} ms")
    # 2. the step under cProfile behind the sleep, torch's sync debug mode on
    torch.cuda.synchronize()
    torch.cuda._sleep(int(args.sleep_ms * cyc))
    torch.cuda.set_sync_debug_mode("warn")
    pr = cProfile.Profile()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pr.enable()
        step()
        pr.disable()
    torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    for w in caught:
        print(f"sync warning: {w.filename}:{w.lineno}: {w.message}")
    if not caught:
        print("sync warnings: none (no synchronising torch op)")
    # pstats prints seconds to 3 decimals: too coarse for a 1.5 ms step; microseconds here.
    st = pstats.Stats(pr).stats  # (file, line, name) -> (cc, nc, tottime, cumtime, callers)
    rows = sorted(st.items(), key=lambda kv: kv[1][2], reverse=True)[:args.top]
    print(f"{'self us':>9} {'cum us':>9} {'calls':>6}  function")
    for (file, line, name), (cc, nc, tt, ct, _) in rows:
        where = name if file == "~" else f"{file.split('/')[-1]}:{line}({name})"
        print(f"{tt * 1e6:9.1f} {ct * 1e6:9.1f} {nc:6d}  {where}")


if __name__ == "__main__":
    main()
