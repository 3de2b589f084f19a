#!/usr/bin/env python3
"""bench/studies/python_step_profile.py — where moekit.torch's grouped MLP step spends the time
that `moekit run` does not (issue 43's Python-overhead target). A study, not a benchmark.

    PYTHONPATH=build/python python3 bench/studies/python_step_profile.py run.json

For the problem of a `moekit run --json` output: the step of bench/python_step.py timed as there
(wall with a device sync) beside its host enqueue time (until step() returns), on torch's default
stream and on a side stream, then one torch.profiler trace of 5 steps: GPU kernel time per step
(sum of kernel durations) and the CUDA runtime calls the host made, each with its count; and,
for moekit.torch and the bare bindings, where a per-step-synced step's GPU waits for the host
(idle_gaps: the lead before the first kernel, idle gaps between kernels, the tail).
"""
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from python_step import moekit_torch_step  # noqa: E402


def timed(step, n=20):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    wall, enq = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        enq.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(wall), statistics.median(enq)


def idle_gaps(label, step, n=5):
    """Where a per-step-synced step's GPU waits for the host: over n profiled steps (each
    step() + synchronize inside one record_function), the median time from the step's start to
    its first kernel (lead), the GPU's idle time between its kernels (idle) and from its last
    kernel to the sync's return (tail), and the step's largest idle gaps, each named by the kernel
    the GPU waited for. torch.profiler puts host and kernel times on one clock."""
    from torch.profiler import ProfilerActivity, profile, record_function
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            with record_function("idle_gaps_step"):
                step()
                torch.cuda.synchronize()
    evs = prof.events()
    steps = sorted((ev for ev in evs if ev.name == "idle_gaps_step" and
                    ev.device_type == torch.autograd.DeviceType.CPU), key=lambda ev: ev.time_range.start)
    kernels = sorted((ev for ev in evs if ev.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda ev: ev.time_range.start)
    rows, worst = [], []
    for st in steps:
        ks = [k for k in kernels if st.time_range.start <= k.time_range.start < st.time_range.end]
        if not ks:
            continue
        lead = ks[0].time_range.start - st.time_range.start
        gaps, end = [], ks[0].time_range.end
        for k in ks[1:]:
            g = k.time_range.start - end
            if g > 0:
                gaps.append((g, k.name))
            end = max(end, k.time_range.end)
        tail = st.time_range.end - end
        busy = sum(k.time_range.end - k.time_range.start for k in ks)
        rows.append((st.time_range.end - st.time_range.start, lead, sum(g for g, _ in gaps), tail,
                     busy, len(ks)))
        worst.append(sorted(gaps, reverse=True)[:6])
    med = [statistics.median(v) / 1e3 for v in zip(*rows)]
    print(f"{label}: per synced step (median of {len(rows)}): wall {med[0]:.3f} ms = lead "
          f"{med[1]:.3f} (step start to first kernel) + kernels and idle gaps + tail {med[3]:.3f} "
          f"(last kernel to sync return); idle between kernels {med[2]:.3f} ms; kernel time "
          f"{med[4]:.3f} ms over {rows[0][5]} kernels")
    for g, name in worst[len(worst) // 2]:
        print(f"    idle {g / 1e3:7.3f} ms before {name[:100]}")


def main():
    with open(sys.argv[1]) as f:
        run = json.loads(f.read().strip().splitlines()[-1])
    print(f"moekit run: step {run['step_ms']:.3f} ms, enqueue {run.get('enqueue_ms', float('nan')):.3f} ms")
    step, mlp = moekit_torch_step(run, "cuda")
    w, e = timed(step)
    print(f"moekit.torch, default stream: step {w:.3f} ms, enqueue {e:.3f} ms")
    # The same layer, data and buffers driven through the bindings alone (no autograd, no
    # moekit.torch): what is left of the gap is the wrapper's, the rest is the GPU's.
    from moekit import _moekit
    from moekit.torch._common import context_for, dl
    fc1, fc2 = mlp[0], mlp[2]
    _, ctx = context_for(torch.device("cuda"))
    E, H, F = len(run["counts"]), run["hidden"], run["ffn"]
    T = sum(run["counts"]) + run.get("tail", 0)
    o1 = _moekit.GroupedLinearOp(ctx, E, H, 2 * F, "bf16")
    act = _moekit.ScaledSwiGLU(ctx, "interleaved32") if run.get("glu", "interleaved32") == \
        "interleaved32" else _moekit.ScaledSwiGLU(ctx)
    o2 = _moekit.GroupedLinearOp(ctx, E, F, H, "bf16")
    o1.set_weight(dl(fc1.weight))
    o2.set_weight(dl(fc2.weight))
    seq = _moekit.Sequential([o1, act, o2])
    bf16 = torch.bfloat16
    x = torch.randn(T, H, device="cuda", dtype=bf16)
    probs = torch.rand(T, device="cuda") * 0.95 + 0.05
    dy = torch.randn(T, H, device="cuda", dtype=bf16)
    counts = torch.tensor(run["counts"], dtype=torch.int32, device="cuda")
    splits = _moekit.Splits.device(dl(counts))
    y_buf, dx_buf = torch.empty_like(x), torch.empty_like(x)

    def raw_step_on(seq, o1, o2, host=None):
        t0 = time.perf_counter()
        _, tape = seq.forward(dl(x), splits, probs=dl(probs),
                              op_args=[(o2, dl(y_buf), None), (o1, None, dl(dx_buf))], save=True)
        t1 = time.perf_counter()
        seq.backward(tape, dl(dy), defer_weight_grads=False)
        if host is not None:
            host.append(((t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3))

    host = []
    w, e = timed(lambda: raw_step_on(seq, o1, o2, host))
    f, b = (statistics.median(v) for v in zip(*host))
    print(f"bindings only (no autograd):  step {w:.3f} ms, enqueue {e:.3f} ms "
          f"(forward call {f:.3f}, backward call {b:.3f}) on torch's stream {ctx.stream:#x}")
    # The same on a stream moekit makes (non-blocking), not the legacy default stream.
    own = _moekit.Context.cuda(torch.cuda.current_device(), 0)
    p1 = _moekit.GroupedLinearOp(own, E, H, 2 * F, "bf16")
    p2 = _moekit.GroupedLinearOp(own, E, F, H, "bf16")
    p1.set_weight(dl(fc1.weight))
    p2.set_weight(dl(fc2.weight))
    act2 = _moekit.ScaledSwiGLU(own, "interleaved32") if run.get("glu", "interleaved32") == \
        "interleaved32" else _moekit.ScaledSwiGLU(own)
    seq2 = _moekit.Sequential([p1, act2, p2])
    torch.cuda.synchronize()
    host = []

    def own_step():
        raw_step_on(seq2, p1, p2, host)
        own.synchronize()
    w, e = timed(own_step)
    f, b = (statistics.median(v) for v in zip(*host))
    print(f"bindings only, moekit's own stream: step {w:.3f} ms (forward call {f:.3f}, "
          f"backward call {b:.3f})")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        step2, _ = moekit_torch_step(run, "cuda")
        w, e = timed(step2)
    print(f"moekit.torch, side stream:    step {w:.3f} ms, enqueue {e:.3f} ms")
    from torch.profiler import ProfilerActivity, profile
    idle_gaps("moekit.torch", step)
    idle_gaps("bindings only", lambda: raw_step_on(seq, o1, o2))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    kernels = [ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(ev.device_time for ev in kernels) / 1e3 / 5
    print(f"GPU kernel time per step (profiled): {total:.3f} ms over {len(kernels) // 5} kernels")
    by_name = {}
    for ev in kernels:
        by_name.setdefault(ev.name, [0, 0.0])
        by_name[ev.name][0] += 1
        by_name[ev.name][1] += ev.device_time / 1e3
    for name, (n, ms) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
        print(f"  {ms / 5:8.3f} ms/step  x{n // 5:<3} {name[:110]}")
    print("host CUDA runtime calls per step:")
    api = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CPU and ev.name.startswith("cuda"):
            api.setdefault(ev.name, [0, 0.0])
            api[ev.name][0] += 1
            api[ev.name][1] += ev.cpu_time_total / 1e3
    for name, (n, ms) in sorted(api.items(), key=lambda kv: -kv[1][1]):
        print(f"  {ms / 5:8.3f} ms/step  x{n / 5:<5.1f} {name}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
