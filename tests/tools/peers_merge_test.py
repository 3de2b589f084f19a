"""ctest tools.peers_merge: bench/peers.py's merge of a moekit_bench and a peers JSON (what
tools/gpu-check turns into its summary) on a fixed pair of files: the best backend per row, the
ratio to torch._grouped_mm, its medians, and the per-clock-cycle medians from the SM clocks both
tools record, and the ratio to torch._grouped_mm timed back to back. No GPU, no torch. Usage: python3 peers_merge_test.py PATH/TO/peers.py"""
import importlib.util
import io
import json
import os
import sys
import tempfile
from contextlib import redirect_stdout

spec = importlib.util.spec_from_file_location("peers", sys.argv[1])
peers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peers)


def run(check, sm):
    return {"median_ms": 1.0, "tflops": sm[0], "sm_mhz": sm[1], "check": {"pass": check}}


shape = {"E": 8, "T": 1024, "K": 512, "N": 256}
mk = {"tool": "moekit_bench", "date": "2026-11-30T00:00:00Z", "commit": "test", "gpu": "GPU",
      "backends": ["sm90", "cublas"], "timing": "alone", "iters": 20, "warmup": 5,
      "warmup_ms": 500, "results": [
          # fprop: sm90 best (600 at 1400 MHz), torch 500 at 1600 MHz -> 1.20, per cycle 1.371
          dict(shape, shape="s", routing="uniform", **{"pass": "fprop"},
               backends={"sm90": run(True, (600, 1400)), "cublas": run(True, (550, 1500))}),
          # dgrad: sm90 faster but failed its check -> cublas is best: 440 / 400 = 1.10
          dict(shape, shape="s", routing="uniform", **{"pass": "dgrad"},
               backends={"sm90": run(False, (700, 1400)), "cublas": run(True, (440, 1500))}),
      ]}
pe = {"tool": "bench/peers.py", "date": "2026-11-30T00:01:00Z", "warmup_ms": 500, "results": [
    {"shape": "s", "routing": "uniform", "pass": "fprop",
     "grouped_mm": {"tflops": 500, "sm_mhz": 1600, "b2b_tflops": 480}, "loop": {"tflops": 450},
     "dense": {"tflops": 650}},
    {"shape": "s", "routing": "uniform", "pass": "dgrad",
     "grouped_mm": {"tflops": 400, "sm_mhz": 1500}, "loop": {"tflops": 420}, "dense": {"tflops": 640}},
]}
failures = []


def merged_docs(mk_doc, pe_doc):
    """peers.merge of the two documents: (its summary, what it printed, the merged JSON)."""
    with tempfile.TemporaryDirectory() as d:
        for name, doc in (("mk.json", mk_doc), ("pe.json", pe_doc)):
            with open(os.path.join(d, name), "w") as f:
                json.dump(doc, f)
        out = io.StringIO()
        with redirect_stdout(out):
            summary = peers.merge(os.path.join(d, "mk.json"), os.path.join(d, "pe.json"), d, "t")
        with open(os.path.join(d, "t.json")) as f:
            return summary, out.getvalue(), json.load(f)


def expect(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else f": {detail}"))
    if not cond:
        failures.append(name)


summary, text, merged = merged_docs(mk, pe)

rows = {r["pass"]: r for r in merged["merged"]}
expect("fprop best", rows["fprop"]["best_backend"] == "sm90", rows["fprop"]["best_backend"])
expect("dgrad best skips a failed check", rows["dgrad"]["best_backend"] == "cublas",
       rows["dgrad"]["best_backend"])
expect("fprop ratio", abs(summary["fprop"] - 1.2) < 1e-9, summary["fprop"])
expect("dgrad ratio", abs(summary["dgrad"] - 1.1) < 1e-9, summary["dgrad"])
per_cycle = merged["median_ratio_vs_grouped_mm_per_cycle"]
expect("fprop per cycle", abs(per_cycle["fprop"] - 1.2 * 1600 / 1400) < 1e-9, per_cycle)
expect("dgrad per cycle", abs(per_cycle["dgrad"] - 1.1) < 1e-9, per_cycle)
expect("headline", "median best moekit/torch._grouped_mm: fprop 1.20, dgrad 1.10" in text, text)
expect("timing named", "each alone, as the peers" in text, text)
expect("clock column", "| 1400 / 1600 |" in text, text)
# torch timed back to back too (its Python call overhead hidden): 600 / 480 = 1.25, fprop only
expect("back-to-back ratio", merged["median_ratio_vs_grouped_mm_back_to_back"] == {"fprop": 1.25},
       merged["median_ratio_vs_grouped_mm_back_to_back"])
expect("back-to-back line", "timed back to back (16 calls between two events: Python's call overhead "
       "hidden): fprop 1.25" in text, text)

# With an "auto" column (the automatic choice on device splits), the headline is that column,
# not the best backend: auto 540 (ran sm90) vs torch 500 -> 1.08, although sm90 forced did 600.
mk_auto = dict(mk, backends=["auto", "sm90", "cublas"])
mk_auto["results"] = [dict(mk["results"][0], backends=dict(mk["results"][0]["backends"],
                                                            auto=dict(run(True, (540, 1400)), ran="sm90")))]
pe_auto = dict(pe, results=[pe["results"][0]])
summary, text, _ = merged_docs(mk_auto, pe_auto)
expect("auto headline ratio", abs(summary["fprop"] - 540 / 500) < 1e-9, summary)
expect("auto headline named", "median moekit auto (the automatic backend, device splits" in text, text)

# A recipe column (fp8-block: quantized GEMMs) is never "best" of the bf16 computation, and gets
# its own ratio to the headline: fp8-block 1080 vs auto 540 -> 2.00; best stays sm90 (600).
mk_fp8 = dict(mk_auto, backends=["auto", "sm90", "cublas", "fp8-block"])
mk_fp8["results"] = [dict(mk_auto["results"][0], backends=dict(
    mk_auto["results"][0]["backends"], **{"fp8-block": dict(run(True, (1080, 1400)), ran="cuda-fp8")}))]
summary, text, merged = merged_docs(mk_fp8, pe_auto)
expect("recipe column not best", merged["merged"][0]["best_backend"] == "sm90",
       merged["merged"][0]["best_backend"])
expect("recipe headline unchanged", abs(summary["fprop"] - 540 / 500) < 1e-9, summary)
expect("recipe ratio to the headline", "median moekit fp8-block/moekit auto (bf16): fprop 2.00" in text, text)
sys.exit(1 if failures else 0)
