#!/usr/bin/env python3
"""torch._grouped_mm on the problems of an sm90_check --csv file, and the side-by-side table.

How to run (GPU machine):  sm90_check --csv sm90.csv && python3 bench/sm90_peers.py sm90.csv [--md out.md]

For each CSV row (shape, split, pass, T, k, n, counts, ...): random normal bf16 inputs, the same
counts, torch._grouped_mm(a [T, k], B [G, k, n], offs = cumsum(counts) int32) where B is the
weight seen as the GEMM needs it (fprop: W [G, n, k] transposed, a strided view like
nn.Linear's; dgrad: W [G, k, n] as stored). CUDA-event median of 30 runs after 5 warm-ups.
Prints one table whose last column is sm90 / torch._grouped_mm (ratio of TFLOP/s), then the
median ratio; --md writes the same table as markdown.
"""
import csv
import statistics
import sys

import torch


def time_ms(fn, iters=30, warmup=5):
    for _ in range(warmup):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(iters):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        ms.append(start.elapsed_time(stop))
    return statistics.median(ms)


def main():
    path = sys.argv[1]
    md = sys.argv[sys.argv.index("--md") + 1] if "--md" in sys.argv else None
    rows = list(csv.DictReader(open(path)))
    dev = torch.device("cuda")
    torch.manual_seed(0)
    out = []
    hdr = (f"{'shape':15} {'split':7} {'pass':5} {'sm90':>7} {'pipe':>7} {'alt':>7} {'dense':>7} {'loop':>7} "
           f"{'torch':>7} | {'/dense':>6} {'/loop':>6} {'/torch':>6}")
    print("TFLOP/s (sm90 = automatic config, alt = the other config)")
    print(hdr)
    ratios = []
    for r in rows:
        T, k, n = int(r["T"]), int(r["k"]), int(r["n"])
        counts = [int(c) for c in r["counts"].split(";")]
        G, S = len(counts), sum(counts)
        a = torch.randn(T, k, device=dev, dtype=torch.bfloat16)
        if r["pass"] == "fprop":
            w = torch.randn(G, n, k, device=dev, dtype=torch.bfloat16) / k**0.5
            b = w.transpose(-2, -1)  # [G, k, n], k contiguous
        else:
            b = torch.randn(G, k, n, device=dev, dtype=torch.bfloat16) / k**0.5
        offs = torch.tensor(counts, device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        flop = 2.0 * S * k * n
        tf = lambda ms: flop / (ms * 1e-3) / 1e12
        y = None
        try:
            y = torch._grouped_mm(a, b, offs=offs)
            # Sanity: the first row of the largest group against a plain matmul.
            g = max(range(G), key=lambda i: counts[i])
            row = sum(counts[:g])
            ref = (a[row : row + 1].float() @ b[g].float())
            err = ((y[row].float() - ref[0]).norm() / ref.norm()).item()
            t_torch = time_ms(lambda: torch._grouped_mm(a, b, offs=offs))
            torch_tf = tf(t_torch) if err < 2e-2 else float("nan")
        except Exception as e:  # noqa: BLE001 - report and keep going
            print(f"  torch._grouped_mm failed on {r['shape']} {r['split']} {r['pass']}: {e}")
            torch_tf = float("nan")
        sm, alt = tf(float(r["sm90_ms"])), tf(float(r["alt_ms"]))
        dense, loop = tf(float(r["dense_ms"])), tf(float(r["loop_ms"]))
        ratio = sm / torch_tf if torch_tf == torch_tf else float("nan")
        if ratio == ratio:
            ratios.append(ratio)
        pipe = tf(float(r["pipelined_ms"]))
        line = (f"{r['shape']:15} {r['split']:7} {r['pass']:5} {sm:7.1f} {pipe:7.1f} {alt:7.1f} {dense:7.1f} "
                f"{loop:7.1f} {torch_tf:7.1f} | {sm / dense:6.3f} {sm / loop:6.3f} {ratio:6.3f}"
                f"{'' if r['check'] == 'ok' else '  CHECK FAILED'}")
        print(line, flush=True)
        out.append((r, sm, alt, dense, loop, torch_tf, ratio))
        del a, b, y
        torch.cuda.empty_cache()
    if ratios:
        print(f"median sm90/torch._grouped_mm = {statistics.median(ratios):.3f} over {len(ratios)} "
              f"problems; min {min(ratios):.3f}")
    if md:
        with open(md, "w") as f:
            f.write("| shape | split | pass | sm90 cfg | sm90 | other cfg | dense cuBLAS | cuBLAS loop "
                    "| torch._grouped_mm | sm90/dense | sm90/loop | sm90/torch |\n")
            f.write("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
            for r, sm, alt, dense, loop, t, ratio in out:
                cfg = "large" if r["cfg"] == "0" else "small"
                f.write(f"| {r['shape']} | {r['split']} | {r['pass']} | {cfg} | {sm:.1f} | {alt:.1f} | "
                        f"{dense:.1f} | {loop:.1f} | {t:.1f} | {sm / dense:.3f} | {sm / loop:.3f} | "
                        f"{ratio:.3f} |\n")
            if ratios:
                f.write(f"\nmedian sm90/torch._grouped_mm = {statistics.median(ratios):.3f} "
                        f"(min {min(ratios):.3f}) over {len(ratios)} problems\n")


if __name__ == "__main__":
    main()
