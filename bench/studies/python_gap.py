#!/usr/bin/env python3
"""bench/studies/python_gap.py — where the grouped-MLP step driven from Python loses to `moekit run`
(issue 43: python / C++ 1.097 on the H200 at qwen3, cause not established). A study, not a benchmark.

    bench/studies/python_gap.sh [--moekit build-carry/tools/moekit/moekit]   # builds the study module
    PYTHONPATH=<module>/python:<ext dir> python3 bench/studies/python_gap.py [--preset qwen3]

One process, one data set (drawn as bench/python_step.py draws it), every driver of the same step
timed in turns (rounds in rotating order, after --warmup-ms of sustained load), so the GPU's state
(clocks under the power cap) is the same for all of them — the earlier comparisons ran the peers
in separate processes or one after the other, and this GPU slows ~12% over the first second of load.
The drivers (rows of the table):

  cli           python_gap_ext.CppStep: tools/moekit/expert_step.cpp's step from C++ — moekit's own
                stream, every tensor in moekit's pool, i64 counts, the last results held
  cpp-torchmem  the same, the data viewed in torch's memory (caching allocator) instead
  cpp-legacy    the same as cli on the legacy default stream (torch's default stream, handle 1)
  cpp-i32       the same as cli with int32 counts (the Python benches' dtype)
  cpp-nohold    the same as cli, each step's results dropped at its end (as Python callers do)
  cpp-as-bind   from C++ with everything the bare bindings have: legacy stream, torch memory,
                i32 counts, results dropped
  bind          the bare bindings (moekit._moekit.Sequential forward/backward) on torch's stream,
                as bench/studies/python_step_profile.py's "bindings only"
  bind-own      the same on a stream of moekit's own
  torch         moekit.torch (ops.Sequential + autograd), as bench/python_step.py
  torch-mg      moekit.torch with main_grad (fp32 dW accumulation) on a side stream, eager
  torch-mg-graph  the same step captured with torch.cuda.graph, replayed: no host work at all

Columns: wall = host clock around step + stream sync (what both benches report; median per block,
median over rounds); gpu = the same step with the host far ahead (a torch.cuda._sleep queued first,
then K steps back to back between two events: the GPU's own time per step, no launch latency);
enqueue = host time until step() returns; host-gap = wall - gpu (what host work and launch
latency add). Ratios are to the cli row of the same column. With torch.profiler (CUPTI) the CUDA
runtime calls per step of cli, bind and torch: cudaFuncSetAttribute is called by the sm90 GEMMs
only when their Params cache (kernel_common.cuh, cached_params: 4 keys per kernel, keyed by the
workspace pointer among others) misses, so its count per step is the number of misses.

--device cpu runs the C++ and Python drivers on the CPU with a small problem (a dry run, and the
host cost per binding call); --moekit PROG also runs `moekit run` itself before and after.
MOEKIT_SM90_STABLE_WORKSPACE=1 in the environment (a build that has it) gives every sm90 call on a
stream one workspace (src/backends/cuda/sm90/sm90_entries.cpp): the Params cache then hits.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time
import json

import torch

from moekit import _moekit
from moekit.torch import ops
from moekit.torch._common import context_for, dl

import python_gap_ext
from gpu_sleep import sleep_cycles_per_ms

# hidden, ffn, experts, tokens (as tools/moekit/main.cpp's presets; tail 64)
PRESETS = {"qwen3": (4096, 1536, 16, 16384), "dsv3": (7168, 2048, 8, 32768),
           "tiny": (256, 512, 8, 8192), "cpu-mini": (64, 64, 4, 64)}
TAIL = 64
BF16 = torch.bfloat16


class Data:
    """The step's tensors, drawn as bench/python_step.py (and tools/moekit/expert_step.cpp) draw them."""

    def __init__(self, preset, device):
        H, F, E, S = PRESETS[preset]
        self.H, self.F, self.E = H, F, E
        self.counts = [S // E + (1 if e < S % E else 0) for e in range(E)]
        T = S + TAIL
        self.T = T
        g = torch.Generator(device=device).manual_seed(0)
        self.w1 = torch.empty(E, 2 * F, H, device=device, dtype=BF16).normal_(0.0, H ** -0.5, generator=g)
        self.w2 = torch.empty(E, H, F, device=device, dtype=BF16).normal_(0.0, F ** -0.5, generator=g)
        self.x = torch.randn(T, H, device=device, dtype=BF16, generator=g)
        self.probs = torch.rand(T, device=device, generator=g) * 0.95 + 0.05
        self.dy = torch.randn(T, H, device=device, dtype=BF16, generator=g)
        self.counts32 = torch.tensor(self.counts, dtype=torch.int32, device=device)
        self.counts64 = self.counts32.to(torch.int64)
        self.y_buf = torch.full((T, H), 7.0, device=device, dtype=BF16)
        self.dx_buf = torch.full((T, H), 7.0, device=device, dtype=BF16)


class Driver:
    def __init__(self, name, step, stream=None, sync=None, timed=None):
        self.name, self.step, self.stream = name, step, stream
        self.sync = sync or (stream.synchronize if stream is not None else (lambda: None))
        self.timed = timed  # the C++ loop, for the cli row
        self.wall, self.gpu, self.enq, self.ahead = [], [], [], []


def cpp_driver(name, d, device, stream, own_memory, hold, i64):
    cs = python_gap_ext.CppStep(
        device, stream, d.E, d.H, d.F, d.x, d.dy, d.probs, d.counts64 if i64 else d.counts32,
        d.w1, d.w2, d.y_buf, d.dx_buf, own_memory, hold)
    s = None
    if device == "cuda":
        s = torch.cuda.default_stream() if cs.stream == 1 else torch.cuda.ExternalStream(cs.stream)
    drv = Driver(name, cs.run_once, s, cs.synchronize, cs.timed)
    drv.cpp = cs
    return drv


def bindings_driver(name, d, device, own_stream):
    if device == "cuda" and own_stream:
        ctx = _moekit.Context.cuda(torch.cuda.current_device(), 0)
        s = torch.cuda.ExternalStream(ctx.stream)
    else:
        _, ctx = context_for(torch.device(device))
        s = torch.cuda.current_stream() if device == "cuda" else None
    o1 = _moekit.GroupedLinearOp(ctx, d.E, d.H, 2 * d.F, "bf16")
    act = _moekit.ScaledSwiGLU(ctx, "interleaved32")
    o2 = _moekit.GroupedLinearOp(ctx, d.E, d.F, d.H, "bf16")
    o1.set_weight(dl(d.w1))
    o2.set_weight(dl(d.w2))
    seq = _moekit.Sequential([o1, act, o2])
    splits = _moekit.Splits.device(dl(d.counts32))

    def step():  # bench/studies/python_step_profile.py's raw step
        _, tape = seq.forward(dl(d.x), splits, probs=dl(d.probs),
                              op_args=[(o2, dl(d.y_buf), None), (o1, None, dl(d.dx_buf))], save=True)
        seq.backward(tape, dl(d.dy), defer_weight_grads=False)

    drv = Driver(name, step, s, ctx.synchronize if device == "cuda" else None)
    drv.keep = (seq, o1, o2, act, splits, ctx)
    return drv


def torch_driver(name, d, device, main_grad=False, stream=None):
    fc1 = ops.GroupedLinear(d.E, d.H, 2 * d.F, bias=False, device=device, dtype=BF16,
                            accumulate_into_main_grad=main_grad)
    act = ops.ScaledSwiGLU(glu_interleave_size=32)
    fc2 = ops.GroupedLinear(d.E, d.F, d.H, bias=False, device=device, dtype=BF16,
                            accumulate_into_main_grad=main_grad)
    with torch.no_grad():
        fc1.weight.copy_(d.w1)
        fc2.weight.copy_(d.w2)
    if main_grad:
        for fc in (fc1, fc2):
            fc.weight.main_grad = torch.zeros(fc.weight.shape, device=device)
    mlp = ops.Sequential(fc1, act, fc2)
    x = d.x.clone().requires_grad_()
    probs = d.probs.clone().requires_grad_()
    y_buf, dx_buf = d.y_buf.clone(), d.dx_buf.clone()
    params = (x, probs) if main_grad else (x, probs, fc1.weight, fc2.weight)

    def step():  # bench/python_step.py's step
        for p in params:
            p.grad = None
        y = mlp(x, d.counts32, probs, d.counts32,
                op_kwargs={fc2: {"output": y_buf.detach()}, fc1: {"grad_input": dx_buf.detach()}})
        y.backward(d.dy)

    if stream is None:
        s = torch.cuda.current_stream() if device == "cuda" else None
        drv = Driver(name, step, s)
    else:
        def on_stream():
            with torch.cuda.stream(stream):
                step()
        drv = Driver(name, on_stream, stream)
    drv.keep = (mlp, x, probs, y_buf, dx_buf, step)
    return drv


def graph_driver(name, eager):
    """eager's step (on its side stream) captured in a CUDA graph; the driver replays it."""
    s = eager.stream
    step = eager.keep[-1]
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    s.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        step()
    s.synchronize()

    def replay():
        with torch.cuda.stream(s):
            graph.replay()
    drv = Driver(name, replay, s)
    drv.keep = (graph, eager)
    return drv


def wall_block(drv, n):
    for _ in range(2):  # after another driver: its Params cache entries, its pool blocks
        drv.step()
    drv.sync()
    wall, enq = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        drv.step()
        t1 = time.perf_counter()
        drv.sync()
        t2 = time.perf_counter()
        wall.append((t2 - t0) * 1e3)
        enq.append((t1 - t0) * 1e3)
    drv.wall.append(statistics.median(wall))
    drv.enq.append(statistics.median(enq))


def gpu_block(drv, k, sleep_ms, cycles_per_ms):
    drv.step()
    drv.sync()
    e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    with torch.cuda.stream(drv.stream):
        e[0].record()
        torch.cuda._sleep(int(sleep_ms * cycles_per_ms))
        e[1].record()
    t0 = time.perf_counter()
    for _ in range(k):
        drv.step()
    host_ms = (time.perf_counter() - t0) * 1e3
    with torch.cuda.stream(drv.stream):
        e[2].record()
    drv.sync()
    e[2].synchronize()
    drv.gpu.append(e[1].elapsed_time(e[2]) / k)
    drv.ahead.append(host_ms < e[0].elapsed_time(e[1]))  # every step queued before the sleep ended


def runtime_calls(drv, steps=4):
    """CUDA runtime calls per step (torch.profiler / CUPTI), after a warm-up of this driver."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        drv.step()
    drv.sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            drv.step()
        drv.sync()
    calls, kernels = {}, 0
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            kernels += 1
        elif ev.name.startswith("cuda") or ev.name.startswith("cu"):
            calls[ev.name] = calls.get(ev.name, 0) + 1
    return {k: v / steps for k, v in calls.items()}, kernels / steps


def moekit_cli(prog, preset, steps, warmup_ms):
    out = subprocess.run([prog, "run", "--device", "cuda", "--preset", preset, "--steps", str(steps),
                          "--warmup-ms", str(int(warmup_ms)), "--no-check", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default=None, help="qwen3 (default on CUDA), dsv3, tiny, cpu-mini (CPU default)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per wall block")
    ap.add_argument("--gpu-steps", type=int, default=6, help="back-to-back steps per gpu block")
    ap.add_argument("--sleep-ms", type=float, default=12.0, help="the sleep before a gpu block")
    ap.add_argument("--warmup-ms", type=float, default=1500.0, help="sustained load before round 1")
    ap.add_argument("--only", help="comma-separated driver names")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--moekit", help="the moekit program: `moekit run` before and after, for reference")
    ap.add_argument("--out", help="also write the table (markdown) here")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("python_gap.py: torch sees no CUDA device (--device cpu for a dry run)")
        return 2
    preset = args.preset or ("qwen3" if cuda else "cpu-mini")
    lines = []

    def say(s=""):
        print(s, flush=True)
        lines.append(s)

    use_cli = args.moekit and cuda and preset in ("qwen3", "dsv3", "tiny")  # the CLI's presets
    cli_before = moekit_cli(args.moekit, preset, 20, args.warmup_ms) if use_cli else None
    d = Data(preset, args.device)
    dev = args.device
    if cuda:  # drawn on torch's stream; the drivers on other streams copy or read them
        torch.cuda.synchronize()
    drivers = [
        cpp_driver("cli", d, dev, 0, own_memory=True, hold=True, i64=True),
        cpp_driver("cpp-torchmem", d, dev, 0, own_memory=False, hold=True, i64=True),
        cpp_driver("cpp-legacy", d, dev, 1, own_memory=True, hold=True, i64=True),
        cpp_driver("cpp-i32", d, dev, 0, own_memory=True, hold=True, i64=False),
        cpp_driver("cpp-nohold", d, dev, 0, own_memory=True, hold=False, i64=True),
        cpp_driver("cpp-as-bind", d, dev, 1, own_memory=False, hold=False, i64=False),
        bindings_driver("bind", d, dev, own_stream=False),
        bindings_driver("bind-own", d, dev, own_stream=True),
        torch_driver("torch", d, dev),
    ]
    if cuda:
        side = torch.cuda.Stream()
        mg = torch_driver("torch-mg", d, dev, main_grad=True, stream=side)
        drivers.append(mg)
        try:  # a failed capture costs its row, not the run
            drivers.append(graph_driver("torch-mg-graph", mg))
        except Exception as e:  # noqa: BLE001
            print(f"python_gap.py: the CUDA-graph row left out: {type(e).__name__}: {e}", flush=True)
            torch.cuda.synchronize()
    if args.only:
        keep = set(args.only.split(",")) | {"cli"}
        drivers = [v for v in drivers if v.name in keep]
    cli = drivers[0]
    plan = cli.cpp.plan()
    torch.cuda.synchronize() if cuda else None
    cyc = sleep_cycles_per_ms() if cuda else 0.0
    t0 = time.perf_counter()  # sustained load, as `moekit run --warmup-ms`
    while (time.perf_counter() - t0) * 1e3 < args.warmup_ms:
        cli.step()
        cli.sync()
    cli_loop = []
    n = len(drivers)
    for r in range(args.rounds):
        for i in range(n):
            drv = drivers[(i + r) % n]
            wall_block(drv, args.steps)
            if cuda:
                gpu_block(drv, args.gpu_steps, args.sleep_ms, cyc)
            if drv is cli:  # the C++ loop itself (tools/moekit/main.cpp), beside the Python loop
                v = cli.timed(args.steps)
                cli_loop.append(statistics.median(v[:args.steps]))
    med = statistics.median
    name = torch.cuda.get_device_name() if cuda else "cpu"
    H, F, E = d.H, d.F, d.E
    say(f"# python_gap: the grouped-MLP step per driver, one process, in turns — {name}")
    say()
    say(f"torch {torch.__version__}; preset {preset} (E {E}, S {sum(d.counts)} + {TAIL} tail rows, "
        f"H {H}, F {F}, bf16, uniform), plan {plan}; {args.rounds} rounds in rotating order after "
        f"{args.warmup_ms:.0f} ms of load; wall: median of {args.steps} steps per block"
        + (f"; gpu: {args.gpu_steps} steps back to back behind a {args.sleep_ms:.0f} ms sleep" if cuda else "")
        + "; medians over rounds.")
    say()
    ref_w, ref_g = med(cli.wall), (med(cli.gpu) if cuda else None)
    if cuda:
        say("| driver | wall ms | wall / cli | gpu ms | gpu / cli | host-gap ms | enqueue ms | host ahead |")
        say("|---|---|---|---|---|---|---|---|")
    else:
        say("| driver | wall ms | wall / cli | enqueue ms |")
        say("|---|---|---|---|")
    for drv in drivers:
        w = med(drv.wall)
        if cuda:
            g = med(drv.gpu)
            say(f"| {drv.name} | {w:.3f} | {w / ref_w:.3f} | {g:.3f} | {g / ref_g:.3f} | {w - g:.3f} | "
                f"{med(drv.enq):.3f} | {sum(drv.ahead)}/{len(drv.ahead)} |")
        else:
            say(f"| {drv.name} | {w:.3f} | {w / ref_w:.3f} | {med(drv.enq):.3f} |")
    say(f"| cli, C++ loop (main.cpp's) | {med(cli_loop):.3f} | {med(cli_loop) / ref_w:.3f} |"
        + (" | | | | | |" if cuda else " |"))
    if cli_before:
        cli_after = moekit_cli(args.moekit, preset, 20, args.warmup_ms)
        say()
        say(f"`moekit run --preset {preset} --steps 20 --warmup-ms {args.warmup_ms:.0f} --no-check`: "
            f"{cli_before['step_ms']:.3f} ms before, {cli_after['step_ms']:.3f} ms after "
            f"(enqueue {cli_before['enqueue_ms']:.3f} / {cli_after['enqueue_ms']:.3f} ms)")
    if cuda and not args.no_profile:
        say()
        say("CUDA runtime calls per step (torch.profiler); cudaFuncSetAttribute = sm90 Params-cache misses:")
        say()
        wanted = ("cudaFuncSetAttribute", "cudaMallocFromPoolAsync", "cudaFreeAsync",
                  "cudaLaunchKernelExC", "cudaLaunchKernel", "cudaEventRecord", "cudaStreamWaitEvent",
                  "cudaMemcpyAsync", "cudaMemsetAsync", "cudaStreamSynchronize", "cudaDeviceSynchronize")
        rows = {}
        for drv in drivers:
            if drv.name in ("cli", "cpp-as-bind", "bind", "torch"):
                try:
                    rows[drv.name] = runtime_calls(drv)
                except Exception as e:  # noqa: BLE001
                    print(f"python_gap.py: no runtime calls for {drv.name}: {type(e).__name__}: {e}")
        say("| call | " + " | ".join(rows) + " |")
        say("|---|" + "---|" * len(rows))
        names = sorted({k for c, _ in rows.values() for k in c},
                       key=lambda k: (k not in wanted, wanted.index(k) if k in wanted else 0, k))
        for k in names:
            say(f"| {k} | " + " | ".join(f"{rows[r][0].get(k, 0):g}" for r in rows) + " |")
        say("| (GPU kernels) | " + " | ".join(f"{rows[r][1]:g}" for r in rows) + " |")
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
