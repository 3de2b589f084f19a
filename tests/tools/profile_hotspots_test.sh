#!/usr/bin/env bash
# ctest tools.profile_hotspots: tools/profile hotspots' table on a fixed source-page CSV in the form ncu
# 2025 exports it (a "Kernel Name" line before the header; per-reason stall_* columns and their
# "(Not Issued)" twins, which must be left out) — order by samples, shares, top reasons — and a CSV
# without the samples column, which must fail; and a run on a stand-in ncu (GEMM_PROFILE_NCU) that
# records its arguments: the GEMM kernel by default, HOTSPOTS_KERNEL's filter and its own report
# name otherwise, and ncu's --warp-sampling-interval only with HOTSPOTS_SAMPLING; with
# HOTSPOTS_BACKEND=cublas, cuBLAS's kernels and a report name of their own; a run's VAR=VALUE,...
# settings in ncu's environment (a MOEKIT_SM90_STUDY value with commas as one); and the instruction mix;
# and --diff of two pages (one binary per instruction, two by their mixes); and --around.
# Usage: profile_hotspots_test.sh TOOLS_DIR
set -uo pipefail
tools_dir=$1
tool() { "$tools_dir/profile" hotspots "$@"; }
source "$(dirname "${BASH_SOURCE[0]}")/expect.sh"
cat >"$work/source.csv" <<'CSV'
"Kernel Name","void cutlass::device_kernel<...>",""
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","# Samples","Instructions Executed","stall_barrier","stall_long_sb","stall_wait","stall_barrier (Not Issued)","stall_long_sb (Not Issued)"
"0x7f00","      LDC R1, c[0x0][0x28]","10","10","10","1584","0","0","10","0","0"
"0x7f10","      @P0   BRA 0x7f40","1,500","1,400","1,500","63488","0","1,485","15","0","9,999"
"0x7f20","      WARPGROUP.DEPBAR.LE gsb0, 0x1","490","480","490","2048","450","0","40","9,999","0"
CSV
out=$(HOTSPOTS_TOP=2 tool --table "$work/source.csv")
expect head "$(sed -n 1p <<<"$out")" "3 SASS instructions, 2000 stall samples; top 2:"
expect first "$(sed -n 4p <<<"$out")" "| 75.0 | 0x7f10 | @P0   BRA 0x7f40 | long_sb 99%, wait 1% |"
expect second "$(sed -n 5p <<<"$out")" "| 24.5 | 0x7f20 | WARPGROUP.DEPBAR.LE gsb0, 0x1 | barrier 92%, wait 8% |"
# The instruction mix, by opcode (predicates dropped): BRA 63488 of 67120, DEPBAR 2048.
expect mix "$(sed -n 7p <<<"$out")" "instruction mix: 0.07 M warp instructions executed; top 2:"
expect "mix first" "$(sed -n 10p <<<"$out")" "| BRA | 0.063 | 94.6 |"
expect "mix second" "$(sed -n 11p <<<"$out")" "| WARPGROUP.DEPBAR.LE | 0.002 | 3.1 |"
expect lines "$(wc -l <<<"$out")" 11
# --around: the top hotspot with the instruction before it and those after it, in address order.
out=$(HOTSPOTS_TOP=1 HOTSPOTS_CONTEXT=1 tool --around "$work/source.csv")
expect "around head" "$(sed -n 2p <<<"$out")" "#1: 75.0% of the samples"
expect "around before" "$(sed -n 5p <<<"$out")" "|  | 0x7f00 | LDC R1, c[0x0][0x28] | 10 |"
expect "around hot" "$(sed -n 6p <<<"$out")" "| >> | 0x7f10 | @P0   BRA 0x7f40 | 1500 |"
expect "around after" "$(sed -n 7p <<<"$out")" "|  | 0x7f20 | WARPGROUP.DEPBAR.LE gsb0, 0x1 | 490 |"
expect "around lines" "$(wc -l <<<"$out")" 7
sed 's/Warp Stall Sampling (All Samples)/Samples/' "$work/source.csv" >"$work/no-samples.csv"
tool --table "$work/no-samples.csv" >/dev/null 2>&1
expect "no samples column fails" "$?" 1
# --diff A B: one kernel binary loaded at another address (its branch targets moved with it) compares
# per instruction, by offset; another binary (one instruction more) only by its instruction mix.
cat >"$work/a.csv" <<'CSV'
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed"
"0x1000","      LDC R1, c[0x0][0x28]","10","100"
"0x1010","      @P0   BRA 0x1000","300","2000"
"0x1020","      BAR.SYNC.DEFER_BLOCKING 0x1, 0x80","90","500"
CSV
cat >"$work/b.csv" <<'CSV'
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed"
"0x5000","      LDC R1, c[0x0][0x28]","12","100"
"0x5010","      @P0   BRA 0x5000","250","2600"
"0x5020","      BAR.SYNC.DEFER_BLOCKING 0x1, 0x80","200","500"
CSV
out=$(HOTSPOTS_TOP=2 tool --diff "$work/a.csv" "$work/b.csv")
expect "diff head" "$(sed -n 1p <<<"$out")" "A: 3 SASS instructions, 400 stall samples; B: 3, 462"
expect "diff one binary" "$(sed -n 3p <<<"$out")" "one binary: the instructions whose samples differ most (top 2):"
expect "diff first" "$(sed -n 6p <<<"$out")" "| 0x20 | BAR.SYNC.DEFER_BLOCKING 0x1, 0x80 | 90 | 200 | +110 |"
expect "diff second" "$(sed -n 7p <<<"$out")" "| 0x10 | @P0   BRA +0x0 | 300 | 250 | -50 |"
expect "diff mix first" "$(sed -n 12p <<<"$out")" "| BRA | 0.002 | 0.003 | +0.001 |"
sed '$a "0x5030","      EXIT","0","64"' "$work/b.csv" >"$work/c.csv"
out=$(HOTSPOTS_TOP=2 tool --diff "$work/a.csv" "$work/c.csv")
expect "diff two binaries" "$(sed -n 3p <<<"$out")" "two binaries: no per-instruction comparison"
expect "diff two binaries mix" "$(sed -n 8p <<<"$out")" "| BRA | 0.002 | 0.003 | +0.001 |"
# A stand-in ncu: the profiling run records its -k filter and -o report; --import prints the CSV.
cat >"$work/ncu" <<SH
#!/usr/bin/env bash
if [[ \$1 == --import ]]; then cat "$work/source.csv"; exit 0; fi
echo "study=\${MOEKIT_SM90_STUDY:-} other=\${OTHER:-}" >>"$work/ncu.env"
while (( \$# )); do
  case \$1 in
    -k) echo "k \$2" >>"$work/ncu.args" ;;
    -o) echo "o \${2##*/}" >>"$work/ncu.args" ;;
    --warp-sampling-interval) echo "s \$2" >>"$work/ncu.args" ;;
  esac
  shift
done
SH
chmod +x "$work/ncu"
GEMM_PROFILE_NCU="$work/ncu" OUT="$work/out" BUILD_DIR="$work" tool small_E64 fprop >"$work/run1.log" 2>&1
expect "default run" "$?" 0
HOTSPOTS_KERNEL=regex:setup GEMM_PROFILE_NCU="$work/ncu" OUT="$work/out" BUILD_DIR="$work" \
  tool small_E64 fprop skewed >"$work/run2.log" 2>&1
expect "setup run" "$?" 0
HOTSPOTS_SAMPLING=0 GEMM_PROFILE_NCU="$work/ncu" OUT="$work/out" BUILD_DIR="$work" \
  tool small_E64 dgrad >"$work/run3.log" 2>&1
expect "sampling run" "$?" 0
HOTSPOTS_BACKEND=cublas GEMM_PROFILE_NCU="$work/ncu" OUT="$work/out" BUILD_DIR="$work" \
  tool small_E64 wgrad >"$work/run4.log" 2>&1
expect "cublas run" "$?" 0
expect "ncu arguments" "$(tr '\n' ' ' <"$work/ncu.args")" \
  "k regex:device_kernel o small_E64-fprop-uniform k regex:setup o small_E64-fprop-skewed-setup k regex:device_kernel s 0 o small_E64-dgrad-uniform k regex:nvjet|gemm|cutlass|xmma o small_E64-wgrad-uniform-cublas "
expect "setup title" "$(grep '^#' "$work/run2.log")" \
  "# small_E64 skewed fprop (default), kernel regex:setup: SASS hotspots"
# The run's settings: MOEKIT_SM90_STUDY's value keeps its commas, OTHER=x is a second variable.
GEMM_PROFILE_NCU="$work/ncu" OUT="$work/out" BUILD_DIR="$work" \
  tool small_E64 fprop uniform MOEKIT_SM90_STUDY=order=blocked,swizzle=2,OTHER=x >"$work/run5.log" 2>&1
expect "study run" "$?" 0
expect "study env" "$(tail -1 "$work/ncu.env")" "study=order=blocked,swizzle=2 other=x"
expect "study title" "$(grep '^#' "$work/run5.log")" \
  "# small_E64 uniform fprop (MOEKIT_SM90_STUDY=order=blocked,swizzle=2 OTHER=x), kernel regex:device_kernel: SASS hotspots"
exit $fail
