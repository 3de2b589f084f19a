#!/usr/bin/env bash
# ctest tools.order_study: tools/compare orders's summary (default / setting over the GEMM suite) on a
# fixed tile-study log — the rows it must take, the clock row and the other tables it must not,
# and a log without a GEMM table, which must fail. Usage: order_study_test.sh TOOLS_DIR
set -uo pipefail
tools_dir=$1
tool() { "$tools_dir/compare" orders "$@"; }
source "$(dirname "${BASH_SOURCE[0]}")/expect.sh"
cat >"$work/study.log" <<'LOG'
# sm90 tile study (tools/compare tiles)

## GEMM suite, sm90 backend, TFLOP/s (median of 1 run(s) in turns; every run checked)

| shape | routing | pass | default | MOEKIT_SM90_SWIZZLE=1 | MOEKIT_SM90_SWIZZLE=4 | best / default |
|---|---|---|---|---|---|---|
| dsv3_fc1_E8 | uniform | fprop | 600.0 | 500.0 | 600.0 | 1.000 |
| dsv3_fc1_E8 | uniform | dgrad | 600.0 | 600.0 | 750.0 | 1.250 |
| small_E64 | skewed | wgrad | 100.0 | 125.0 | 100.0 | 1.250 |
| SM clock, MHz | | (median of the runs' busy samples) | 1425 | 1432 | 1500 | |

## dsv3 MLP step (fused; cuBLAS: GEMMs + SwiGLU kernels), skewed, 20 steps, ms (median per run, in turns)

| tile | turn 1 | turn 2 | mean | SM MHz | mean x GHz (M cycles) | fp64 check |
|---|---|---|---|---|---|---|
| default | 14.471 | 14.458 | 14.464 | 1425 | 20.61 | PASS, PASS |
LOG
out=$(tool --summary "$work/study.log")
line() { grep -F "default / $1," <<<"$out"; }
# Ratios default / setting: 1.2, 1.0, 0.8 (median 1.0); 1.0, 0.8, 1.0.
expect swizzle1 "$(line MOEKIT_SM90_SWIZZLE=1)" \
  "default / MOEKIT_SM90_SWIZZLE=1, GEMM suite TFLOP/s over 3 rows: median 1.000, min 0.800 (small_E64 skewed wgrad), max 1.200 (dsv3_fc1_E8 uniform fprop)"
expect swizzle4 "$(line MOEKIT_SM90_SWIZZLE=4)" \
  "default / MOEKIT_SM90_SWIZZLE=4, GEMM suite TFLOP/s over 3 rows: median 1.000, min 0.800 (dsv3_fc1_E8 uniform dgrad), max 1.000 (small_E64 skewed wgrad)"
expect lines "$(wc -l <<<"$out")" 2
sed -n '/^## dsv3/,$p' "$work/study.log" >"$work/no-gemm.log"
tool --summary "$work/no-gemm.log" >/dev/null 2>&1
expect "no GEMM table fails" "$?" 1
exit $fail
