#!/usr/bin/env bash
# ctest tools.power_study: bench/studies/tools/power-study's table (energy per FLOP = W / TFLOP/s, medians over
# turns, ratios to the first variant, the operand part normal − constant) on fixed moekit_bench
# JSON, and the failures it must not hide: an unchecked result, a missing power reading.
# Usage: power_study_test.sh TOOLS_DIR
set -uo pipefail
tool="$1/power-study"
source "$(dirname "${BASH_SOURCE[0]}")/../../../tests/tools/expect.sh"
bench() {  # bench FILE DATA BACKEND TFLOPS MHZ WATTS [CHECK]
  cat >"$1" <<JSON
{"data": "$2", "results": [{"shape": "dsv3_fc1_E8", "routing": "uniform", "pass": "fprop",
  "backends": {"$3": {"tflops": $4, "sm_mhz": $5, "power_w": $6, "check": {"pass": ${7:-true}}}}}]}
JSON
}
bench "$work/a-n1.json" normal sm90 700 1500 700
bench "$work/a-n2.json" normal sm90 600 1400 690  # median of 650 TF/s, 695 W
bench "$work/a-c1.json" constant sm90 800 1860 480
bench "$work/b-n1.json" normal cublas 700 1550 693
bench "$work/b-c1.json" constant cublas 800 1830 440
out=$("$tool" --table sm90="$work/a-n1.json" sm90="$work/a-n2.json" sm90="$work/a-c1.json" \
      cublas="$work/b-n1.json" cublas="$work/b-c1.json")
row() { grep -F "| dsv3_fc1_E8 | uniform | fprop | $1 |" <<<"$out"; }
# sm90: 695 / 650 = 1.069, 480 / 800 = 0.600, operand part 0.469.
expect sm90 "$(row sm90)" \
  "| dsv3_fc1_E8 | uniform | fprop | sm90 | 650.0 | 1450 | 695 | 1.069 | 1.000 | 800.0 | 1860 | 480 | 0.600 | 1.000 | 0.469 |"
# cublas: 693 / 700 = 0.990 (/ 1.069 = 0.926), 440 / 800 = 0.550 (/ 0.600 = 0.917).
expect cublas "$(row cublas)" \
  "| dsv3_fc1_E8 | uniform | fprop | cublas | 700.0 | 1550 | 693 | 0.990 | 0.926 | 800.0 | 1830 | 440 | 0.550 | 0.917 | 0.440 |"
expect summary "$(grep '^cublas:' <<<"$out")" \
  "cublas: normal 0.926 (min 0.926, max 0.926), constant 0.917 (min 0.917, max 0.917)"
bench "$work/bad.json" normal sm90 700 1500 700 false
"$tool" --table sm90="$work/bad.json" >/dev/null 2>&1
expect "failed check fails" "$?" 1
bench "$work/nopower.json" normal sm90 700 1500 0
"$tool" --table sm90="$work/nopower.json" >/dev/null 2>&1
expect "no power reading fails" "$?" 1
"$tool" -- >/dev/null 2>&1
expect "no variant fails" "$?" 2
exit $fail
