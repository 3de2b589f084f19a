#!/usr/bin/env bash
# ctest tools.compare_env: tools/compare env with a stand-in moekit_bench whose time depends on the
# environment — each variant's settings reach its runs and only its runs (a MOEKIT_SM90_STUDY value
# with commas as one variable), medians per variant and their ratios to the first, a failing run's
# exit status — and its table of a fixed log (rows
# missing for one variant, lines that are not bench rows ignored), a variant on another build
# (its BUILD_DIR), its refusal of a log without rows, of no variants and of a name given twice.
# Usage: compare_env_test.sh TOOLS_DIR
set -uo pipefail
tools_dir=$1
tool() { "$tools_dir/compare" env "$@"; }
source "$(dirname "${BASH_SOURCE[0]}")/expect.sh"
mkdir -p "$work/build/bench"
cat >"$work/build/bench/moekit_bench" <<'SH'
#!/usr/bin/env bash
# stand-in: one wgrad row whose time is 0.100 ms, 0.090 with SWZ=8, 0.080 with SWZ=8 and ORD=c,
# 0.070 with MOEKIT_SM90_STUDY=swizzle=8,order=chunk4 and ORD=c
[[ ${FAIL:-} == 1 ]] && exit 4
ms=0.100
[[ ${SWZ:-} == 8 ]] && ms=0.090
[[ ${SWZ:-} == 8 && ${ORD:-} == c ]] && ms=0.080
[[ ${MOEKIT_SM90_STUDY:-} == swizzle=8,order=chunk4 && ${ORD:-} == c ]] && ms=0.070
echo "warm-up 5 calls, median of 20"
echo "small_E64       uniform  wgrad       64   4096   2048   1024 | sm90     $ms   171.0 PASS  1980 | sm90"
SH
chmod +x "$work/build/bench/moekit_bench"
out=$(BUILD_DIR="$work/build" OUT="$work/out" ENV_TURNS=2 tool base sw8:SWZ=8 both:SWZ=8,ORD=c 2>&1)
expect status "$?" 0
expect header "$(grep '^| shape' <<<"$out")" \
  "| shape | routing | pass | backend | base ms | sw8 ms | both ms | sw8 / base | both / base | turns |"
expect row "$(grep -F '| small_E64 |' <<<"$out")" \
  "| small_E64 | uniform | wgrad | sm90 | 0.1000 | 0.0900 | 0.0800 | 0.900 | 0.800 | 2/2/2 |"
expect turns "$(grep -c '^== turn ' "$work/out/env-turns.log")" 6
expect settings-logged "$(grep '^== turn 2 both' "$work/out/env-turns.log")" "== turn 2 both SWZ=8 ORD=c"
# The study override's value keeps its commas: entries not beginning with VAR= continue the one before.
out=$(BUILD_DIR="$work/build" OUT="$work/out4" ENV_TURNS=1 tool base st:MOEKIT_SM90_STUDY=swizzle=8,order=chunk4,ORD=c 2>&1)
expect "study row" "$(grep -F '| small_E64 |' <<<"$out")" \
  "| small_E64 | uniform | wgrad | sm90 | 0.1000 | 0.0700 | 0.700 | 1/1 |"
expect "study logged" "$(grep '^== turn 1 st' "$work/out4/env-turns.log")" \
  "== turn 1 st MOEKIT_SM90_STUDY=swizzle=8,order=chunk4 ORD=c"
# A variant's BUILD_DIR: that build's moekit_bench, for that variant only.
mkdir -p "$work/build2/bench"
sed 's/^ms=0.100$/ms=0.120/' "$work/build/bench/moekit_bench" >"$work/build2/bench/moekit_bench"
chmod +x "$work/build2/bench/moekit_bench"
out=$(BUILD_DIR="$work/build" OUT="$work/out3" ENV_TURNS=2 tool new old:BUILD_DIR="$work/build2" 2>&1)
expect "two builds" "$(grep -F '| small_E64 |' <<<"$out")" \
  "| small_E64 | uniform | wgrad | sm90 | 0.1000 | 0.1200 | 1.200 | 2/2 |"
BUILD_DIR="$work/build" OUT="$work/out2" ENV_TURNS=1 tool base bad:FAIL=1 >/dev/null 2>&1
expect "failing run" "$?" 1
BUILD_DIR="$work/build" tool >/dev/null 2>&1
expect "no variants" "$?" 2
BUILD_DIR="$work/build" tool a a:SWZ=8 >/dev/null 2>&1
expect "name twice" "$?" 2
BUILD_DIR="$work/nowhere" tool a >/dev/null 2>&1
expect "no build" "$?" 2
cat >"$work/fixed.log" <<'LOG'
== turn 1 own
small_E64       uniform  wgrad       64   4096   2048   1024 | sm90     0.1008   170.5 PASS  1980 | cublas   0.0889   193.2 PASS  1980 | cublas
small_E64       skewed   wgrad       64   4096   2048   1024 | sm90     0.1021   168.0 PASS  1980 | cublas   0.5000    34.0 PASS  1980 | sm90
== turn 1 cutlass MOEKIT_SM90_STUDY=group_k_own=0
shape           routing  pass         E      T      K      N | sm90         ms TFLOP/s chk    MHz | best
small_E64       uniform  wgrad       64   4096   2048   1024 | sm90     0.1024   168.0 PASS  1980 | cublas   0.0885   194.0 PASS  1980 | cublas
== turn 2 own
small_E64       uniform  wgrad       64   4096   2048   1024 | sm90     0.1004   171.0 PASS  1980 | cublas   0.0891   192.0 PASS  1980 | cublas
== turn 2 cutlass MOEKIT_SM90_STUDY=group_k_own=0
small_E64       uniform  wgrad       64   4096   2048   1024 | sm90     0.1000   172.0 PASS  1980 | cublas   0.0893   191.0 PASS  1980 | cublas
LOG
out=$(tool --table "$work/fixed.log")
expect "table status" "$?" 0
expect "uniform sm90" "$(grep -F '| uniform | wgrad | sm90 |' <<<"$out")" \
  "| small_E64 | uniform | wgrad | sm90 | 0.1006 | 0.1012 | 1.006 | 2/2 |"
expect "uniform cublas" "$(grep -F '| uniform | wgrad | cublas |' <<<"$out")" \
  "| small_E64 | uniform | wgrad | cublas | 0.0890 | 0.0889 | 0.999 | 2/2 |"
expect "one variant only" "$(grep -F '| skewed | wgrad | sm90 |' <<<"$out")" \
  "| small_E64 | skewed | wgrad | sm90 | 0.1021 | n/a | n/a | 1/0 |"
expect rows "$(wc -l <<<"$out")" 6
echo "no rows here" >"$work/empty.log"
tool --table "$work/empty.log" >/dev/null 2>&1
expect "no rows fails" "$?" 1
exit $fail
