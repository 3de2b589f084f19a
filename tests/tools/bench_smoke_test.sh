#!/usr/bin/env bash
# ctest bench.smoke: moekit_bench end to end on two small shapes outside the suite (custom_E…
# names, every pass, both routings, the sm90 and cuBLAS backends, --json): exit status 0, every
# backend that ran passed its check, and the JSON holds every result with its shape — what
# tools/gpu-check's bench step and tools/compare orders read. (A result that kept a pointer into the
# run loop's list of shapes crashed the --json write after the last row: 5ee7c7a to this test.)
# Needs a GPU: without one it exits 77, which ctest reports as skipped.
# Usage: bench_smoke_test.sh MOEKIT_BENCH
set -uo pipefail
bench=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "no GPU (nvidia-smi -L failed): skipped"
  exit 77
fi
shapes=custom_E3_T200_K64_N48,custom_E5_T333_K136_N72
"$bench" --shapes "$shapes" --routing uniform,skewed --passes fprop,dgrad,wgrad,wgrad_f32 \
  --backends sm90,cublas --iters 2 --warmup 1 --warmup-ms 0 --compare none \
  --json "$work/out.json" >"$work/log" 2>&1
rc=$?
cat "$work/log"
[[ $rc == 0 ]] || { echo "FAIL: moekit_bench exited $rc"; exit 1; }
python3 - "$work/out.json" "$shapes" <<'PY'
import json, re, sys
doc = json.load(open(sys.argv[1]))
shapes = sys.argv[2].split(",")
want = {(s, r, p) for s in shapes for r in ("uniform", "skewed")
        for p in ("fprop", "dgrad", "wgrad", "wgrad_f32")}
seen, bad = set(), []
for r in doc["results"]:
    seen.add((r["shape"], r["routing"], r["pass"]))
    m = re.fullmatch(r"custom_E(\d+)_T(\d+)_K(\d+)_N(\d+)", r["shape"])
    if not m:
        bad.append(f"shape name {r['shape']!r}")
    elif (r["E"], r["T"], r["K"], r["N"]) != tuple(int(x) for x in m.groups()):
        bad.append(f"{r['shape']}: sizes {r['E']} {r['T']} {r['K']} {r['N']}")
    ran = {name: b for name, b in r["backends"].items() if "skipped" not in b}
    if not ran:
        bad.append(f"{r['shape']} {r['routing']} {r['pass']}: no backend ran")
    for name, b in ran.items():
        if not b["check"]["pass"]:
            bad.append(f"{r['shape']} {r['routing']} {r['pass']} {name}: check failed {b['check']}")
if seen != want:
    bad.append(f"results: missing {sorted(want - seen)}, unexpected {sorted(seen - want)}")
for b in bad:
    print("FAIL:", b)
print(f"{len(doc['results'])} results, {len(bad)} problems")
sys.exit(1 if bad else 0)
PY
