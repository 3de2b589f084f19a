#!/usr/bin/env python3
"""Peers of moekit_bench, timed on the same shapes and splits, and the side-by-side merge.

How to run (GPU machine, torch 2.x with CUDA):
    moekit_bench --json moekit.json                      # writes the splits it used
    python3 bench/peers.py run --splits moekit.json --out peers.json
    python3 bench/peers.py merge moekit.json peers.json --results-dir bench/results
or both peer steps at once:
    python3 bench/peers.py all moekit.json --out peers.json --results-dir bench/results

Peers, per configuration (shape x routing x pass, bf16 in/out, fp32 accumulation):
  grouped_mm  torch._grouped_mm (fprop: x [T,K] with W^T [G,K,N]; dgrad: dy with W [G,N,K];
              wgrad: dy^T [N,T] with x [T,K], offsets along T; wgrad_f32: the same with
              out_dtype=float32 — or, where torch lacks it, a bf16 result widened — added into
              an fp32 main_grad [G,N,K]: main_grad.add_(...), two kernels)
  loop        one torch.mm per non-empty expert (cuBLAS per group), writing into row slices
              (wgrad_f32: each expert's fp32 product added into its main_grad slice)
  dense       one torch.mm with the same total FLOPs (S rows, or reduction length S for wgrad)
Timing: CUDA events around each run, warm-up, median of --iters runs, random normal inputs.
Each peer's result is checked against the loop peer (fp32-accumulated cuBLAS) on a few rows.

merge prints one table with a column per moekit backend (moekit_bench times each one it has,
side by side) whose last column is the best moekit backend / torch._grouped_mm, the
device/host-split and caller/internal-buffer ratios when moekit_bench measured them, and writes
<results-dir>/<date>-<gpu>.md and .json.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import sys

# moekit_bench's recipe columns (quantized GEMMs, not the bf16 computation the peers run)
RECIPES = ("fp8-current", "fp8-block", "mxfp8", "nvfp4")


def _torch():
    import torch  # imported lazily: `merge` needs no GPU

    return torch


def f32_products(torch, dev):
    """bf16 x bf16 -> fp32 products as this torch offers them: (grouped(a, b, offs), mm(a, b),
    label). out_dtype=float32 where supported, else the bf16 result widened (rounded once to bf16
    first: what a user of that torch gets)."""
    dy = torch.randn(32, 16, device=dev, dtype=torch.bfloat16)  # the wgrad call's layout:
    x = torch.randn(32, 16, device=dev, dtype=torch.bfloat16)   # dy^T [N, T], x [T, K], offs on T
    offs = torch.tensor([16, 32], device=dev, dtype=torch.int32)
    a, b = dy.t()[:, :16], x[:16]
    try:
        torch._grouped_mm(dy.t(), x, offs=offs, out_dtype=torch.float32)
        grouped, g_label = (lambda x, y, o: torch._grouped_mm(x, y, offs=o, out_dtype=torch.float32)), "out_dtype=float32"
    except (TypeError, RuntimeError):
        grouped, g_label = (lambda x, y, o: torch._grouped_mm(x, y, offs=o).float()), "bf16 out widened"
    try:
        torch.mm(a, b, out_dtype=torch.float32)
        mm, m_label = (lambda x, y: torch.mm(x, y, out_dtype=torch.float32)), "out_dtype=float32"
    except (TypeError, RuntimeError):
        mm, m_label = (lambda x, y: torch.mm(x, y).float()), "bf16 out widened"
    return grouped, mm, f"grouped_mm {g_label}, mm {m_label}"


_NVML = []  # [(library, device handle)] once loaded; [None] when NVML is not there


def sm_clock_mhz():
    """The SM clock now (NVML through ctypes, as moekit_bench reads it), or None."""
    import ctypes

    if not _NVML:
        _NVML.append(None)
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            bus = _torch().cuda.get_device_properties(0)
            handle = ctypes.c_void_p()
            bus_id = "%08x:%02x:%02x.0" % (bus.pci_domain_id, bus.pci_bus_id, bus.pci_device_id)
            if lib.nvmlInit_v2() == 0 and lib.nvmlDeviceGetHandleByPciBusId_v2(
                    bus_id.encode(), ctypes.byref(handle)) == 0:
                _NVML[0] = (lib, handle)
        except (OSError, AttributeError):
            pass
    if _NVML[0] is None:
        return None
    lib, handle = _NVML[0]
    mhz = ctypes.c_uint()
    return mhz.value if lib.nvmlDeviceGetClockInfo(handle, 1, ctypes.byref(mhz)) == 0 else None


def time_ms(fn, iters, warmup, warmup_ms, back_to_back=0):
    """Median and min of `iters` timed calls, after `warmup` calls and then at least `warmup_ms`
    of calls (sustained load, as moekit_bench warms up: both time under the power cap), and the
    SM clock halfway through the timed calls (None without NVML). With back_to_back=N also the
    median per call of N calls enqueued back to back between two events (max(3, iters // 4)
    times): Python's and the launch's per-call overhead hidden behind the GPU's work, as
    moekit_bench --timing back-to-back does; else None."""
    import time

    torch = _torch()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < warmup_ms:
        fn()
        torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    ms, mhz = [], None
    for i in range(iters):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        ms.append(start.elapsed_time(stop))
        if i == iters // 2:
            mhz = sm_clock_mhz()
    b2b = None
    if back_to_back:
        per_call = []
        for _ in range(max(3, iters // 4)):
            start.record()
            for _ in range(back_to_back):
                fn()
            stop.record()
            stop.synchronize()
            per_call.append(start.elapsed_time(stop) / back_to_back)
        b2b = statistics.median(per_call)
    return statistics.median(ms), min(ms), mhz, b2b


def run_peers(args):
    torch = _torch()
    with open(args.splits) as f:
        bench = json.load(f)
    dev = torch.device("cuda")
    torch.manual_seed(args.seed)
    configs = bench["results"]
    shapes = {}
    for r in configs:
        shapes.setdefault(r["shape"], r)
    out = {
        "tool": "bench/peers.py",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "iters": args.iters,
        "warmup": args.warmup,
        "warmup_ms": args.warmup_ms,
        "results": [],
    }
    print(f"peers: torch {torch.__version__} CUDA {torch.version.cuda} on {out['gpu']}")
    grouped_f32 = mm_f32 = None
    if any(c["pass"] == "wgrad_f32" for c in configs):
        grouped_f32, mm_f32, out["wgrad_f32_products"] = f32_products(torch, dev)
        print(f"wgrad_f32 peers: {out['wgrad_f32_products']}")
    print(f"{'shape':15} {'routing':8} {'pass':6} {'grouped_mm':>11} {'loop':>9} {'dense':>9}  (TFLOP/s)")
    for name, first in shapes.items():
        E, T, K, N = first["E"], first["T"], first["K"], first["N"]
        x = torch.randn(T, K, device=dev, dtype=torch.bfloat16)
        w = torch.randn(E, N, K, device=dev, dtype=torch.bfloat16)
        dy = torch.randn(T, N, device=dev, dtype=torch.bfloat16)
        y = torch.empty(T, N, device=dev, dtype=torch.bfloat16)
        dx = torch.empty(T, K, device=dev, dtype=torch.bfloat16)
        dw = torch.empty(E, N, K, device=dev, dtype=torch.bfloat16)
        main_grad = None  # wgrad_f32: fp32 [E, N, K], allocated when that pass runs
        for r in [c for c in configs if c["shape"] == name]:
            counts = r["counts"]
            S = sum(counts)
            offs_list, acc = [], 0
            for c in counts:
                acc += c
                offs_list.append(acc)
            offs = torch.tensor(offs_list, device=dev, dtype=torch.int32)
            bounds = [(g, o - c, o) for g, (c, o) in enumerate(zip(counts, offs_list)) if c > 0]
            p = r["pass"]
            flops = 2.0 * S * N * K
            wt = w.transpose(1, 2)  # [G, K, N], column-major per expert

            if p == "fprop":
                def gmm():
                    return torch._grouped_mm(x, wt, offs=offs)

                def loop():
                    for g, a, b in bounds:
                        torch.mm(x[a:b], w[g].t(), out=y[a:b])
                    return y

                def dense():
                    return torch.mm(x[:S], w[0].t())
            elif p == "dgrad":
                def gmm():
                    return torch._grouped_mm(dy, w, offs=offs)

                def loop():
                    for g, a, b in bounds:
                        torch.mm(dy[a:b], w[g], out=dx[a:b])
                    return dx

                def dense():
                    return torch.mm(dy[:S], w[0])
            elif p == "wgrad_f32":
                dyt = dy.t()  # [N, T]
                if main_grad is None:
                    main_grad = torch.randn(E, N, K, device=dev, dtype=torch.float32)

                def gmm_delta():
                    return grouped_f32(dyt, x, offs)

                def gmm():
                    return main_grad.add_(gmm_delta())

                def loop_delta():
                    d = torch.zeros(E, N, K, device=dev, dtype=torch.float32)
                    for g, a, b in bounds:
                        d[g] = mm_f32(dyt[:, a:b], x[a:b])
                    return d

                def loop():
                    for g, a, b in bounds:
                        main_grad[g].add_(mm_f32(dyt[:, a:b], x[a:b]))
                    return main_grad

                def dense():
                    return torch.mm(dyt[:, :S], x[:S])
            else:
                dyt = dy.t()  # [N, T]

                def gmm():
                    return torch._grouped_mm(dyt, x, offs=offs)

                def loop():
                    for g, a, b in bounds:
                        torch.mm(dyt[:, a:b], x[a:b], out=dw[g])
                    return dw

                def dense():
                    return torch.mm(dyt[:, :S], x[:S])

            row = {k: r[k] for k in ("shape", "E", "T", "K", "N", "routing", "pass")}
            # What the grouped_mm peer is checked on: its output, or (wgrad_f32) the product it
            # adds, against the loop's.
            accumulating = p == "wgrad_f32"
            ref = (loop_delta() if accumulating else loop()).float()
            for label, fn in (("grouped_mm", gmm), ("loop", loop), ("dense", dense)):
                try:
                    med, mn, mhz, b2b = time_ms(fn, args.iters, args.warmup, args.warmup_ms,
                                                back_to_back=16 if label == "grouped_mm" else 0)
                    entry = {"median_ms": med, "min_ms": mn, "tflops": flops / (med * 1e-3) / 1e12}
                    if b2b:
                        entry["b2b_median_ms"] = b2b
                        entry["b2b_tflops"] = flops / (b2b * 1e-3) / 1e12
                    if mhz:
                        entry["sm_mhz"] = mhz
                    if label == "grouped_mm":
                        got = (gmm_delta() if accumulating else fn()).float()
                        if p in ("wgrad", "wgrad_f32"):
                            idx = [g for g, _, _ in bounds]
                            err = (got[idx] - ref[idx]).norm() / ref[idx].norm()
                        else:
                            err = (got[:S] - ref[:S]).norm() / ref[:S].norm()
                        entry["rel_err_vs_loop"] = float(err)
                    row[label] = entry
                except Exception as e:  # a peer that cannot run this shape: recorded, not fatal
                    row[label] = {"error": f"{type(e).__name__}: {e}"[:300]}
            out["results"].append(row)

            def fmt(e):
                return f"{e['tflops']:9.1f}" if "tflops" in e else f"{'n/a':>9}"

            print(f"{name:15} {r['routing']:8} {p:6} {fmt(row['grouped_mm']):>11} {fmt(row['loop'])} {fmt(row['dense'])}")
            sys.stdout.flush()
        del x, w, dy, y, dx, dw, main_grad
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}")
    return out


def _backend_runs(mk, r):
    """{backend: entry} of one moekit_bench result; older files (one backend per run) map to
    the backend they were run with."""
    if "backends" in r and isinstance(r["backends"], dict):
        return r["backends"]
    return {mk.get("backend", "auto"): {k: r[k] for k in ("median_ms", "min_ms", "tflops", "check") if k in r}}


def merge(moekit_json, peers_json, results_dir, stem=None):
    with open(moekit_json) as f:
        mk = json.load(f)
    with open(peers_json) as f:
        pe = json.load(f)
    key = lambda r: (r["shape"], r["routing"], r["pass"])
    peers = {key(r): r for r in pe["results"]}

    def tf(e):
        return e.get("tflops") if isinstance(e, dict) else None

    names = mk.get("backends") if isinstance(mk.get("backends"), list) else None
    if not names:
        names = []
        for r in mk["results"]:
            for b in _backend_runs(mk, r):
                if b not in names:
                    names.append(b)
    passes = ("fprop", "dgrad", "wgrad", "wgrad_f32")
    rows = []
    ratios = {p: [] for p in passes}                       # best moekit backend / grouped_mm
    ratios_b2b = {p: [] for p in passes}                   # the same, grouped_mm back to back
    per_cycle = {p: [] for p in passes}                    # the same, per SM clock cycle
    per_backend = {b: {p: [] for p in passes} for b in names}  # each backend / grouped_mm
    per_recipe = {}                                        # each recipe column / moekit's headline
    for r in mk["results"]:
        p = peers.get(key(r), {})
        g, l, d = tf(p.get("grouped_mm")), tf(p.get("loop")), tf(p.get("dense"))
        runs = _backend_runs(mk, r)
        ok = {b: e for b, e in runs.items() if "tflops" in e and e.get("check", {}).get("pass")}
        # best: of the backends of the bf16 computation (a recipe column quantizes: its own ratios)
        ok16 = [b for b in ok if b not in RECIPES]
        best = max(ok16, key=lambda b: ok[b]["tflops"]) if ok16 else None
        best_tf = ok[best]["tflops"] if best else None
        # The headline is what a user gets: the automatic choice with device splits ("auto"),
        # when the run has it; else (older runs) the best backend.
        user = "auto" if "auto" in names else best
        user_tf = ok[user]["tflops"] if user in ok else None
        ratio = user_tf / g if (user_tf and g) else None
        if ratio:
            ratios[r["pass"]].append(ratio)
        g_b2b = p.get("grouped_mm", {}).get("b2b_tflops") if isinstance(p.get("grouped_mm"), dict) else None
        if user_tf and g_b2b:
            ratios_b2b[r["pass"]].append(user_tf / g_b2b)
        # The SM clocks each was timed at (moekit_bench and this script read them halfway through
        # the timed calls): under the power cap a kernel's clock is part of its speed.
        best_mhz = ok[user].get("sm_mhz") if user in ok else None
        g_mhz = p.get("grouped_mm", {}).get("sm_mhz") if isinstance(p.get("grouped_mm"), dict) else None
        if ratio and best_mhz and g_mhz:
            per_cycle[r["pass"]].append(ratio * g_mhz / best_mhz)
        for b, e in ok.items():
            if g:
                per_backend.setdefault(b, {q: [] for q in passes})[r["pass"]].append(e["tflops"] / g)
            if b in RECIPES and user_tf:
                per_recipe.setdefault(b, {q: [] for q in passes})[r["pass"]].append(e["tflops"] / user_tf)
        checks = [e.get("check", {}).get("pass") for e in runs.values() if "tflops" in e]
        rows.append({
            "shape": r["shape"], "routing": r["routing"], "pass": r["pass"],
            "E": r["E"], "T": r["T"], "K": r["K"], "N": r["N"],
            "backends": {b: ({"skipped": e["skipped"]} if "skipped" in e else
                             {"ms": e.get("median_ms"), "tflops": e.get("tflops"),
                              "check": "PASS" if e.get("check", {}).get("pass") else "FAIL"})
                         for b, e in runs.items()},
            "best_backend": best, "best_tflops": best_tf,
            "best_mhz": best_mhz, "grouped_mm_mhz": g_mhz,
            "moekit_check": "PASS" if checks and all(checks) else "FAIL",
            "grouped_mm_tflops": g, "grouped_mm_b2b_tflops": g_b2b, "loop_tflops": l, "dense_tflops": d,
            "best_vs_loop": best_tf / l if (best_tf and l) else None,
            "best_vs_dense": best_tf / d if (best_tf and d) else None,
            "best_vs_grouped_mm": best_tf / g if (best_tf and g) else None,
            "headline_backend": user, "headline_vs_grouped_mm": ratio,
        })

    def f1(v):
        return "n/a" if v is None else f"{v:.1f}"

    def f2(v):
        return "n/a" if v is None else f"{v:.2f}"

    def cell(x, b):
        e = x["backends"].get(b)
        if e is None:
            return "-"        # the primitive has no entry for this backend (wgrad: no sm90)
        if "skipped" in e:
            return "skipped"  # the backend refused the call (reason in the JSON)
        return f1(e["tflops"]) + ("" if e["check"] == "PASS" else " FAIL")

    def mhz_cell(x):
        a, b = x.get("best_mhz"), x.get("grouped_mm_mhz")
        return f"{a or '-'} / {b or '-'}"

    header = ("| shape | routing | pass | " + " | ".join(f"moekit {b} TFLOP/s" for b in names) +
              " | check | best | dense cuBLAS | cuBLAS loop | torch._grouped_mm | best moekit/grouped_mm"
              " | headline moekit/grouped_mm | SM MHz headline / grouped_mm |")
    ncol = 3 + len(names) + 8
    lines = [header, "|" + "---|" * ncol]
    for x in rows:
        lines.append(f"| {x['shape']} | {x['routing']} | {x['pass']} | " +
                     " | ".join(cell(x, b) for b in names) +
                     f" | {x['moekit_check']} | {x['best_backend'] or 'none'} | {f1(x['dense_tflops'])} | "
                     f"{f1(x['loop_tflops'])} | {f1(x['grouped_mm_tflops'])} | "
                     f"{f2(x['best_vs_grouped_mm'])} | {f2(x['headline_vs_grouped_mm'])} | {mhz_cell(x)} |")
    med = lambda v: statistics.median(v) if v else None
    summary = {q: med(v) for q, v in ratios.items()}
    summary_backends = {b: {q: med(v) for q, v in d.items()} for b, d in per_backend.items()}
    who = ("moekit auto (the automatic backend, device splits: what a user gets)" if "auto" in names
           else "best moekit")
    headline = f"median {who}/torch._grouped_mm: " + ", ".join(
        f"{q} {f2(v)}" for q, v in summary.items())
    per_lines = [f"median moekit {b}/torch._grouped_mm: " + ", ".join(
        f"{q} {f2(v)}" for q, v in d.items() if v is not None) for b, d in summary_backends.items()]
    user_label = "auto" if "auto" in names else "best"
    per_lines += [f"median moekit {b}/moekit {user_label} (bf16): " + ", ".join(
        f"{q} {f2(med(v))}" for q, v in d.items() if v) for b, d in per_recipe.items()]
    summary_b2b = {q: med(v) for q, v in ratios_b2b.items() if v}
    if summary_b2b:
        per_lines.append(f"median {who}/torch._grouped_mm timed back to back (16 calls between "
                         "two events: Python's call overhead hidden): " + ", ".join(
                             f"{q} {f2(v)}" for q, v in summary_b2b.items()))
    summary_per_cycle = {q: med(v) for q, v in per_cycle.items() if v}
    if summary_per_cycle:
        per_lines.append(f"median {who}/torch._grouped_mm per SM clock cycle (each at the clock "
                         "it was timed at): " + ", ".join(
                             f"{q} {f2(v)}" for q, v in summary_per_cycle.items()))
    comps = mk.get("comparisons", [])
    comp_lines = []
    if comps:
        comp_lines = ["", "Same computation, two paths (the first backend, forced; medians in turns; "
                      "PERFORMANCE.md: device/host and caller/internal should be 1.00; alone/back-to-back shows "
                      "the per-call host and launch latency of a call timed alone):", "",
                      "| shape | routing | pass | comparison | first ms | second ms | ratio | outputs |",
                      "|---|---|---|---|---|---|---|---|"]
        for c in comps:
            comp_lines.append(f"| {c['shape']} | {c['routing']} | {c['pass']} | {c['a']} / {c['b']} | "
                              f"{c['a_ms']:.4f} | {c['b_ms']:.4f} | {c['ratio']:.3f} | "
                              f"{'bit-identical' if c['identical'] else 'DIFFER'}"
                              f"{'; ' + c['note'] if c.get('note') else ''} |")
    batching = mk.get("cublas_batching")
    md = [f"# moekit grouped GEMM vs peers — {mk['gpu']}", "",
          f"- date: {mk['date']} (moekit), {pe['date']} (peers)",
          f"- moekit commit: {mk['commit']}",
          f"- GPU: {mk['gpu']} ({mk.get('sm_count', '?')} SMs); clocks before [sm, mem, max sm, power, temp, driver]: "
          f"{mk.get('clocks_before', '')}; after: {mk.get('clocks_after', '')}",
          f"- torch {pe.get('torch')} (CUDA {pe.get('cuda')}); bf16 in/out (wgrad_f32: bf16 in, added "
          f"into an fp32 main_grad; torch peers: {pe.get('wgrad_f32_products', 'not run')}), fp32 accumulation, "
          f"median of {mk['iters']} runs after {mk['warmup']} warm-up calls and "
          f"{mk.get('warmup_ms', 0):.0f} ms of warm-up load (peers: {pe.get('warmup_ms', 0):.0f} ms), CUDA events",
          f"- moekit backends, each forced with Context::with_backend and timed in the same process "
          f"({'each alone, as the peers' if mk.get('timing') == 'alone' else 'in turns'}): {', '.join(names)} (\"sm90\" = the Hopper CUTLASS grouped kernels, group-M and group-K; "
          f"\"cublas\" = cuBLAS per group, or batched/grouped calls for many small groups"
          + (f", MOEKIT_CUBLAS_BATCHING={batching}" if batching and batching != "auto" else "") +
          "). \"-\": the primitive has no such backend; "
          "\"best\" = the faster backend that passed its check; the last column is that one "
          "over torch._grouped_mm. TFLOP/s = 2·S·N·K / time",
          "", *lines, "", headline, *per_lines, *comp_lines, ""]
    text = "\n".join(md)
    print(text)
    if results_dir:
        os.makedirs(results_dir, exist_ok=True)
        if stem is None:
            gpu = re.sub(r"[^A-Za-z0-9]+", "-", mk["gpu"]).strip("-").lower()
            stem = f"{mk['date'][:10]}-{gpu}"
        with open(os.path.join(results_dir, stem + ".md"), "w") as f:
            f.write(text)
        with open(os.path.join(results_dir, stem + ".json"), "w") as f:
            json.dump({"moekit": mk, "peers": pe, "merged": rows,
                       "median_ratio_vs_grouped_mm": summary,
                       "median_ratio_vs_grouped_mm_per_backend": summary_backends,
                       "median_ratio_vs_grouped_mm_per_cycle": summary_per_cycle,
                       "median_ratio_vs_grouped_mm_back_to_back": summary_b2b},
                      f, separators=(",", ":"))
        print(f"wrote {os.path.join(results_dir, stem)}.{{md,json}}")
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="time the torch peers on moekit_bench's splits")
    r.add_argument("--splits", required=True, help="moekit_bench --json output")
    r.add_argument("--out", required=True)
    m = sub.add_parser("merge", help="side-by-side table from the two JSON files")
    m.add_argument("moekit")
    m.add_argument("peers")
    m.add_argument("--results-dir", default="")
    m.add_argument("--stem", default=None)
    a = sub.add_parser("all", help="run, then merge")
    a.add_argument("moekit")
    a.add_argument("--out", required=True)
    a.add_argument("--results-dir", default="")
    a.add_argument("--stem", default=None)
    for p in (r, a):
        p.add_argument("--iters", type=int, default=20)
        p.add_argument("--warmup", type=int, default=5)
        p.add_argument("--warmup-ms", type=float, default=500.0,
                       help="then at least this long of calls before timing (sustained load)")
        p.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    if args.cmd == "run":
        run_peers(args)
    elif args.cmd == "merge":
        merge(args.moekit, args.peers, args.results_dir, args.stem)
    else:
        args.splits = args.moekit
        run_peers(args)
        merge(args.moekit, args.out, args.results_dir, args.stem)


if __name__ == "__main__":
    main()
