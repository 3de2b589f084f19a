#!/usr/bin/env python3
"""bench/python_step.py — the grouped MLP step (forward + backward) driven from Python through
moekit.torch, on exactly the problem a `moekit run --json` ran, beside that C++ run and beside the
same MLP in torch ops (torch._grouped_mm, bench/mlp_peer.py). Issue 43's targets: moekit.torch
within 3% of `moekit run` (Python overhead), and >= 1.15x the torch MLP.

    moekit run --preset qwen3 --steps 20 --json > run.json        # build/tools/moekit/moekit
    PYTHONPATH=build/python python3 bench/python_step.py run.json [--steps 20] [--out t.md]

The moekit.torch step: ops.Sequential(GroupedLinear(E, H, 2F), ScaledSwiGLU(32), GroupedLinear(E,
F, H)) in bf16 with device split counts (an int32 tensor), x [T, H] with the run's tail, probs [T]
f32, y and dx into caller buffers (op_kwargs), y.backward(dy, inputs=[probs, W1, W2]) through
autograd (bf16 weight gradients, as `moekit run`; dx is written into its buffer and not copied into
a leaf's x.grad, see the step). Timed as both peers: host wall clock around one forward + backward
followed by a device synchronisation, median of --steps after warm-up. `--device cpu` runs a
CPU problem (a dry run of this script; no torch peer).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from moekit.torch import ops


def moekit_torch_step(run, device):
    """(step, mlp): one forward + backward of the run's problem through moekit.torch."""
    E, H, F = len(run["counts"]), run["hidden"], run["ffn"]
    counts = run["counts"]
    S = sum(counts)
    T = S + run.get("tail", 0)
    bf16 = torch.bfloat16
    g = torch.Generator(device=device).manual_seed(0)
    fc1 = ops.GroupedLinear(E, H, 2 * F, bias=False, device=device, dtype=bf16)
    act = ops.ScaledSwiGLU(glu_interleave_size=32 if run.get("glu", "interleaved32") ==
                           "interleaved32" else None)
    fc2 = ops.GroupedLinear(E, F, H, bias=False, device=device, dtype=bf16)
    mlp = ops.Sequential(fc1, act, fc2)
    # The data of `moekit run` (tools/moekit/expert_step.cpp): weights N(0, 1/fan_in), x and dy
    # N(0, 1), probs U(0.05, 1). Under the board's power cap a GEMM's speed depends on its data's
    # bits, so both peers multiply numbers drawn the same way.
    with torch.no_grad():
        fc1.weight.normal_(0.0, H ** -0.5, generator=g)
        fc2.weight.normal_(0.0, F ** -0.5, generator=g)
    x = torch.randn(T, H, device=device, dtype=bf16, generator=g).requires_grad_()
    probs = (torch.rand(T, device=device, generator=g) * 0.95 + 0.05).requires_grad_()
    dy = torch.randn(T, H, device=device, dtype=bf16, generator=g)
    splits = torch.tensor(counts, dtype=torch.int32, device=device)
    y_buf = torch.empty(T, H, device=device, dtype=bf16)
    dx_buf = torch.empty(T, H, device=device, dtype=bf16)

    def step():
        for p in (x, probs, fc1.weight, fc2.weight):
            p.grad = None
        y = mlp(x, splits, probs, splits,
                op_kwargs={fc2: {"output": y_buf.detach()}, fc1: {"grad_input": dx_buf.detach()}})
        # dx goes into dx_buf and stops there, as in `moekit run` (and as an expert layer's input
        # gradient goes on to the dispatch backward, x being no leaf there). A leaf x would add
        # AccumulateGrad's clone of the buffer into x.grad (torch steals a gradient only when
        # nothing else references it; the caller holds dx_buf): a [T, H] copy the C++ step does
        # not make (~0.09 ms at qwen3 on an H100's bandwidth). Measured on the CPU, 2026-12-06:
        # with `inputs` no aten::copy_ in the step; without, one.
        y.backward(dy, inputs=[probs, fc1.weight, fc2.weight])

    return step, mlp


def moekit_torch_ms(run, steps, device, warmup=3, warmup_ms=0.0):
    step, mlp = moekit_torch_step(run, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < warmup_ms:  # sustained load, as `moekit run --warmup-ms`
        step()
        sync()
    ms = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync()
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms), mlp.plan()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a `moekit run --json` output (its last line is the JSON)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", help="also write the table (markdown) here")
    ap.add_argument("--moekit", help="the moekit program: run it again after the Python step "
                    "(same preset, routing, --steps, --warmup-ms) and compare with that run")
    ap.add_argument("--warmup-ms", type=float, default=0.0,
                    help="sustained load before timing, each peer (give `moekit run` the same)")
    ap.add_argument("--turns", type=int, default=1,
                    help="the peers in turns this many times (moekit.torch, `moekit run` again "
                    "with --moekit, torch ops); a row per turn and, last, the median of the turns' "
                    "ratios: lent machines' hosts differ, and one turn's ratio moves by a few %%")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("python_step.py: torch sees no CUDA device (--device cpu for a dry run)")
        return 2
    with open(args.run) as f:
        run = json.loads(f.read().strip().splitlines()[-1])
    if args.device == "cuda":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from mlp_peer import torch_mlp_ms
    rows = []  # (moekit run ms, moekit.torch ms, torch ops ms or None) per turn
    for _ in range(max(1, args.turns)):
        py_ms, plan = moekit_torch_ms(run, args.steps, args.device, warmup_ms=args.warmup_ms)
        cpp_ms = run["step_ms"]
        if args.moekit:
            # `moekit run` again, right after the Python step, under the same sustained load: a
            # GPU that has been busy runs slower (power cap) than the one the first run found.
            again = json.loads(subprocess.run(
                [args.moekit, "run", "--device", args.device, "--preset", run["preset"],
                 "--routing", run["routing"], "--steps", str(args.steps), "--warmup-ms",
                 str(int(args.warmup_ms)), "--json"],
                check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
            if again["counts"] != run["counts"]:
                raise SystemExit("python_step.py: --moekit's run has other counts than the run given")
            print(f"moekit run: {cpp_ms:.3f} ms before, {again['step_ms']:.3f} ms after the Python step")
            cpp_ms = again["step_ms"]
        torch_ms = None
        if args.device == "cuda":
            torch_ms = torch_mlp_ms(torch, run["hidden"], run["ffn"], list(run["counts"]), args.steps,
                                    warmup_ms=args.warmup_ms)
        rows.append((cpp_ms, py_ms, torch_ms))

    def row(cpp_ms, py_ms, torch_ms, py_ratio=None, torch_ratio=None):
        py_ratio = py_ms / cpp_ms if py_ratio is None else py_ratio
        if torch_ms is not None and torch_ratio is None:
            torch_ratio = torch_ms / py_ms
        return (f"| {cpp_ms:.3f} | {py_ms:.3f} | {py_ratio:.3f} | "
                f"{'-' if torch_ms is None else f'{torch_ms:.3f}'} | "
                f"{'-' if torch_ratio is None else f'{torch_ratio:.2f}'} |")
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    lines = [
        f"# grouped MLP step from Python (moekit.torch) vs C++ (`moekit run`) vs torch ops — {name}",
        "",
        f"torch {torch.__version__}; preset {run['preset']}, routing {run['routing']}, E "
        f"{len(run['counts'])}, S {sum(run['counts'])} (+{run.get('tail', 0)} tail rows), H "
        f"{run['hidden']}, F {run['ffn']}, bf16; plan {plan}; host wall clock per step with a "
        f"device sync, median of {args.steps} steps (moekit run: its own --steps); "
        f"{len(rows)} turn(s), a row each" + (", then the medians of the turns (times) and of "
                                              "their ratios" if len(rows) > 1 else "") + ".",
        "",
        "| moekit run ms | moekit.torch ms | python / C++ (target <= 1.03) | torch ops ms | "
        "torch / moekit.torch (target >= 1.15) |",
        "|---|---|---|---|---|",
    ] + [row(*r) for r in rows]
    if len(rows) > 1:
        med = statistics.median
        torch_all = [r[2] for r in rows if r[2] is not None]
        lines.append(row(med(r[0] for r in rows), med(r[1] for r in rows),
                         med(torch_all) if torch_all else None,
                         py_ratio=med(r[1] / r[0] for r in rows),
                         torch_ratio=med(r[2] / r[1] for r in rows) if torch_all else None))
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
