#!/usr/bin/env bash
# ctest tools.compare_orders: tools/compare orders's summary (default / setting over the GEMM suite) on a
# fixed study log — the rows it must take, the clock row and the other tables it must not,
# and a log without a GEMM table, which must fail; then a whole run (check skipped) on stand-ins
# for ncu, nvidia-smi, test_sm90, moekit_bench and moekit: each setting reaches its runs only (a
# MOEKIT_SM90_STUDY value with commas as one variable), and the ncu rows, the step table, the test
# results and the summary come out. Usage: compare_orders_test.sh TOOLS_DIR
set -uo pipefail
tools_dir=$1
tool() { "$tools_dir/compare" orders "$@"; }
source "$(dirname "${BASH_SOURCE[0]}")/expect.sh"
cat >"$work/study.log" <<'LOG'
# sm90 settings against the default (tools/compare orders)

## GEMM suite, sm90 backend, TFLOP/s (median of 1 run(s) in turns; every run checked)

| shape | routing | pass | default | MOEKIT_SM90_STUDY=swizzle=1 | MOEKIT_SM90_STUDY=swizzle=4 | best / default |
|---|---|---|---|---|---|---|
| dsv3_fc1_E8 | uniform | fprop | 600.0 | 500.0 | 600.0 | 1.000 |
| dsv3_fc1_E8 | uniform | dgrad | 600.0 | 600.0 | 750.0 | 1.250 |
| small_E64 | skewed | wgrad | 100.0 | 125.0 | 100.0 | 1.250 |
| SM clock, MHz | | (median of the runs' busy samples) | 1425 | 1432 | 1500 | |

## dsv3 MLP step (fused; cuBLAS: GEMMs + SwiGLU kernels), skewed, 20 steps, ms (median per run, in turns)

| setting | turn 1 | turn 2 | mean | SM MHz | mean x GHz (M cycles) | fp64 check |
|---|---|---|---|---|---|---|
| default | 14.471 | 14.458 | 14.464 | 1425 | 20.61 | PASS, PASS |
LOG
out=$(tool --summary "$work/study.log")
line() { grep -F "default / $1," <<<"$out"; }
# Ratios default / setting: 1.2, 1.0, 0.8 (median 1.0); 1.0, 0.8, 1.0.
expect swizzle1 "$(line MOEKIT_SM90_STUDY=swizzle=1)" \
  "default / MOEKIT_SM90_STUDY=swizzle=1, GEMM suite TFLOP/s over 3 rows: median 1.000, min 0.800 (small_E64 skewed wgrad), max 1.200 (dsv3_fc1_E8 uniform fprop)"
expect swizzle4 "$(line MOEKIT_SM90_STUDY=swizzle=4)" \
  "default / MOEKIT_SM90_STUDY=swizzle=4, GEMM suite TFLOP/s over 3 rows: median 1.000, min 0.800 (dsv3_fc1_E8 uniform dgrad), max 1.000 (small_E64 skewed wgrad)"
expect lines "$(wc -l <<<"$out")" 2
sed -n '/^## dsv3/,$p' "$work/study.log" >"$work/no-gemm.log"
tool --summary "$work/no-gemm.log" >/dev/null 2>&1
expect "no GEMM table fails" "$?" 1

# A whole run on stand-ins. Settings: swizzle=1 (125 TFLOP/s, 800 µs, step 9 ms) and
# order=blocked,swizzle=2 with OTHER=x (80 TFLOP/s, 900 µs, step 11 ms, one test failing); a
# split value (MOEKIT_SM90_STUDY=order=blocked alone) would show 50 TFLOP/s. Default 100, 1000 µs,
# 10 ms; cuBLAS's step 12 ms.
mkdir -p "$work/bin" "$work/build/tests" "$work/build/bench" "$work/build/tools/moekit"
cat >"$work/bin/setting" <<'SH'
#!/usr/bin/env bash
# prints which setting the environment holds
case "${MOEKIT_SM90_STUDY:-}:${OTHER:-}" in
  :) echo default ;; swizzle=1:) echo s1 ;; order=blocked,swizzle=2:x) echo b2 ;; *) echo split ;;
esac
SH
cat >"$work/bin/nvidia-smi" <<'SH'
#!/usr/bin/env bash
[[ " $* " == *" -lms "* ]] && echo "1500, 600.0"
exit 0
SH
cat >"$work/bin/ncu" <<SH
#!/usr/bin/env bash
us=\$(case \$(setting) in default) echo 1000000 ;; s1) echo 800000 ;; b2) echo 900000 ;; *) echo 1 ;; esac)
echo '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
echo "\"0\",\"1\",\"moekit_bench\",\"h\",\"device_kernel\",\"1\",\"7\",\"(384, 1, 1)\",\"(132, 1, 1)\",\"0\",\"9.0\",\"s\",\"gpu__time_duration.sum\",\"\",\"\$us\""
SH
cat >"$work/build/tests/test_sm90" <<'SH'
#!/usr/bin/env bash
[[ $(setting) == b2 ]] && { echo "[  FAILED  ] CudaSm90.Something"; exit 1; }
exit 0
SH
cat >"$work/build/bench/moekit_bench" <<'SH'
#!/usr/bin/env bash
t=$(case $(setting) in default) echo 100 ;; s1) echo 125 ;; b2) echo 80 ;; *) echo 50 ;; esac)
while (( $# )); do [[ $1 == --json ]] && json=$2; shift; done
echo "{\"results\": [{\"shape\": \"small_E64\", \"routing\": \"uniform\", \"pass\": \"wgrad\", \"backends\": {\"sm90\": {\"tflops\": $t, \"check\": {\"pass\": true}}}}]}" >"$json"
SH
cat >"$work/build/tools/moekit/moekit" <<'SH'
#!/usr/bin/env bash
ms=$(case $(setting) in default) echo 10.0 ;; s1) echo 9.0 ;; b2) echo 11.0 ;; *) echo 1.0 ;; esac)
[[ ${MOEKIT_BACKEND:-} == cublas ]] && ms=12.0
echo "{\"step_ms\": $ms, \"check\": {\"passed\": true}}"
SH
chmod +x "$work"/bin/* "$work/build/tests/test_sm90" "$work/build/bench/moekit_bench" "$work/build/tools/moekit/moekit"
out=$(PATH="$work/bin:$PATH" GEMM_PROFILE_NCU="$work/bin/ncu" BUILD_DIR="$work/build" OUT="$work/run" \
  ORDER_STUDY_SKIP_CHECK=1 ORDER_STUDY_PROBLEMS="small_E64 wgrad" \
  ORDER_STUDY_SETTINGS="MOEKIT_SM90_STUDY=swizzle=1 MOEKIT_SM90_STUDY=order=blocked,swizzle=2,OTHER=x" "$tools_dir/compare" orders 2>&1)
expect "run status" "$?" 0
expect ncu "$(grep '^| µs ' <<<"$out")" "| µs | 1000.0 | 800.0 | 900.0 |"
expect "step default" "$(grep '^| default ' <<<"$out")" "| default | 10.000 | 10.000 | 10.000 | 1500 | 15.00 | PASS, PASS |"
expect "step b2" "$(grep -F '| MOEKIT_SM90_STUDY=order=blocked,swizzle=2,OTHER=x |' <<<"$out")" \
  "| MOEKIT_SM90_STUDY=order=blocked,swizzle=2,OTHER=x | 11.000 | 11.000 | 11.000 | 1500 | 16.50 | PASS, PASS |"
expect "step cublas" "$(grep '^| cublas ' <<<"$out")" "| cublas | 12.000 | 12.000 | 12.000 | 1500 | 18.00 | PASS, PASS |"
expect tests "$(grep '^test_sm90 with' <<<"$out")" "test_sm90 with MOEKIT_SM90_STUDY=swizzle=1: rc 0 (0 failure lines)
test_sm90 with MOEKIT_SM90_STUDY=order=blocked,swizzle=2,OTHER=x: rc 1 (1 failure lines)"
expect "summary s1" "$(grep -F 'default / MOEKIT_SM90_STUDY=swizzle=1,' <<<"$out")" \
  "default / MOEKIT_SM90_STUDY=swizzle=1, GEMM suite TFLOP/s over 1 rows: median 0.800, min 0.800 (small_E64 uniform wgrad), max 0.800 (small_E64 uniform wgrad)"
expect "summary b2" "$(grep -F 'default / MOEKIT_SM90_STUDY=order=blocked,swizzle=2,OTHER=x,' <<<"$out")" \
  "default / MOEKIT_SM90_STUDY=order=blocked,swizzle=2,OTHER=x, GEMM suite TFLOP/s over 1 rows: median 1.250, min 1.250 (small_E64 uniform wgrad), max 1.250 (small_E64 uniform wgrad)"
expect "GEMM clock" "$(grep '^| SM clock' "$work/run/study.log")" "| SM clock, MHz | | (median of the runs' busy samples) | 1500 | 1500 | 1500 | |"
exit $fail
