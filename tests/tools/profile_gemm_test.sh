#!/usr/bin/env bash
# ctest tools.profile_gemm: tools/profile gemm's table on fixed ncu CSVs (one sm90 kernel against
# cuBLAS's per-group kernels: summed durations and bytes, duration-weighted clocks and
# percentages) and its ncu command lines with a stand-in ncu (the cuBLAS variant keeps the timed
# call's half of the launches), so its parsing and its cuBLAS variant are checked on machines
# without a GPU; a variant's settings reach ncu's environment (a MOEKIT_SM90_STUDY value with
# commas as one variable). Usage: profile_gemm_test.sh TOOLS_DIR
set -uo pipefail
tools_dir=$1
tool() { "$tools_dir/profile" gemm "$@"; }
source "$(dirname "${BASH_SOURCE[0]}")/expect.sh"
header='"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
line() {  # line ID KERNEL METRIC VALUE
  echo "\"$1\",\"1\",\"moekit_bench\",\"h\",\"$2\",\"1\",\"7\",\"(384, 1, 1)\",\"(132, 1, 1)\",\"0\",\"9.0\",\"Command line profiler metrics\",\"$3\",\"\",\"$4\""
}
{
  echo "==PROF== Connected to process 1"; echo "$header"
  line 0 device_kernel gpu__time_duration.sum 1000000
  line 0 device_kernel dram__bytes_read.sum "1,500,000,000"
  line 0 device_kernel sm__cycles_elapsed.avg.per_second 1400000000
  line 0 device_kernel smsp__average_warps_issue_stalled_wait_per_issue_active.ratio 2.0
  line 0 device_kernel lrc__request_sectors_op_read_coalescing_achieved_type_hardware.sum "2,000,000"
} >"$work/sm90.csv"
{
  echo "$header"
  line 3 nvjet_a gpu__time_duration.sum 600000
  line 3 nvjet_a dram__bytes_read.sum 700000000
  line 3 nvjet_a sm__cycles_elapsed.avg.per_second 1500000000
  line 3 nvjet_a smsp__average_warps_issue_stalled_wait_per_issue_active.ratio 1.0
  line 4 nvjet_a gpu__time_duration.sum 500000
  line 4 nvjet_a dram__bytes_read.sum 600000000
  line 4 nvjet_a sm__cycles_elapsed.avg.per_second 1600000000
  line 4 nvjet_a smsp__average_warps_issue_stalled_wait_per_issue_active.ratio 3.0
  line 3 nvjet_a lrc__request_sectors_op_read_coalescing_achieved_type_hardware.sum 6000000
  line 4 nvjet_a lrc__request_sectors_op_read_coalescing_achieved_type_hardware.sum 7000000
} >"$work/cublas.csv"
out=$(tool --table "t" sm90="$work/sm90.csv" cublas="$work/cublas.csv")
row() { grep -F "| $1 |" <<<"$out"; }
expect kernels "$(row "kernels profiled")" "| kernels profiled | 1.0 | 2.0 |"
expect time "$(row "µs")" "| µs | 1000.0 | 1100.0 |"
expect dram "$(row "DRAM read MB")" "| DRAM read MB | 1500.0 | 1300.0 |"
# (1500 * 600 + 1600 * 500) / 1100 = 1545.45; (1 * 600 + 3 * 500) / 1100 = 1.909
expect clock "$(row "SM MHz")" "| SM MHz | 1400.0 | 1545.5 |"
expect stall "$(row "stall wait")" "| stall wait | 2.0 | 1.9 |"
# 1000 µs at 1400 MHz; 600 µs at 1500 + 500 µs at 1600 MHz
expect cycles "$(row "SM cycles, M (µs × MHz)")" "| SM cycles, M (µs × MHz) | 1.4 | 1.7 |"
expect missing "$(row "L2 hit %")" "| L2 hit % | n/a | n/a |"
# Counts sum over the kernels: 2 M against 6 + 7 M merged sectors.
expect merged "$(row "read sectors the LRC merged (no L2 lookup), M")" \
  "| read sectors the LRC merged (no L2 lookup), M | 2.0 | 13.0 |"

# The ncu command lines: a stand-in ncu records its arguments and prints one kernel's CSV, or
# for the cuBLAS backend every kernel of two calls: IDs 3, 4 the check's GEMMs, 6, 7 the timed
# call's, among the bench's and moekit's own kernels (data, check, pointer arrays), which are dropped.
{
  echo "$header"
  line 1 "randn_bf16(__nv_bfloat16 *, unsigned long, unsigned long)" gpu__time_duration.sum 9000000
  line 2 "<unnamed>::write_gemm_pointers(GemmPointers, void **)" gpu__time_duration.sum 9000000
  for id in 3 4; do line $id nvjet_a gpu__time_duration.sum $((id * 100000)); done
  line 5 "count_nonfinite<__nv_bfloat16>(const T1 *, unsigned long, unsigned long long *)" gpu__time_duration.sum 9000000
  for id in 6 7; do line $id nvjet_a gpu__time_duration.sum $(((id - 1) * 100000)); done
  line 8 "<unnamed>::write_gemm_pointers(GemmPointers, void **)" gpu__time_duration.sum 9000000
} >"$work/cublas-both.csv"
cat >"$work/ncu" <<S
#!/usr/bin/env bash
echo "\$*" >>"$work/calls"
echo "study=\${MOEKIT_SM90_STUDY:-} other=\${OTHER:-}" >>"$work/envs"
if [[ "\$*" == *"--backends cublas"* ]]; then cat "$work/cublas-both.csv"; else cat "$work/sm90.csv"; fi
S
chmod +x "$work/ncu"
OUT="$work/out" GEMM_PROFILE_NCU="$work/ncu" BUILD_DIR="$work/build" \
  tool dsv3_fc1_E8 fprop uniform -- sm90 cublas >"$work/run.log" 2>&1
expect run-status "$?" "0"
calls=$(cat "$work/calls")
expect sm90-args "$(sed -n 1p <<<"$calls" | grep -o -- '-k regex:device_kernel --launch-skip 1 --launch-count 1')" \
  "-k regex:device_kernel --launch-skip 1 --launch-count 1"
expect cublas-all-launches "$(sed -n 2p <<<"$calls" | grep -c -- '--launch-\|-k ')" "0"
expect cublas-backend "$(sed -n 2p <<<"$calls" | grep -o -- '--backends cublas')" "--backends cublas"
# The timed call's half: IDs 6 and 7, 500 + 600 µs.
expect table "$(grep -c '^| µs | 1000.0 | 1100.0 |$' "$work/run.log")" "1"
expect kernels-kept "$(grep -c '^| kernels profiled | 1.0 | 2.0 |$' "$work/run.log")" "1"
expect all-kept "$(grep -c . "$work/out/gemm-profile/dsv3_fc1_E8-fprop-cublas.csv.all")" "9"
OUT="$work/out" GEMM_PROFILE_NCU="$work/ncu" tool small_E64 dgrad skewed -- cublas \
  >"$work/skewed.log" 2>&1
expect skewed-status "$?" "0"
# A variant's settings: MOEKIT_SM90_STUDY's value keeps its commas, OTHER=x is a second variable.
OUT="$work/out" GEMM_PROFILE_NCU="$work/ncu" BUILD_DIR="$work/build" \
  tool dsv3_fc1_E8 fprop -- b2:MOEKIT_SM90_STUDY=order=blocked,swizzle=2,OTHER=x >"$work/study.log" 2>&1
expect study-status "$?" "0"
expect study-env "$(tail -1 "$work/envs")" "study=order=blocked,swizzle=2 other=x"
exit $fail
