#!/usr/bin/env bash
# ctest tools.sass: tools/profile sass check on a stand-in cuobjdump's fixed output — a GEMM kernel as the
# sm90 build makes it passes; one serialised (as nvcc's C7510 leaves it with CUTLASS's asserts on),
# an FP8 one (QGMMA) passes; one spilling and one without wgmma fail, naming why; a file with no GEMM kernel fails; no
# cuobjdump at all is a skip (77), never a pass. Then list, mix, dump and diff on the same output.
# Usage: sass_test.sh TOOLS_DIR
set -uo pipefail
tool="$1/lib/profile/sass"
source "$(dirname "${BASH_SOURCE[0]}")/expect.sh"
# The stand-in prints, for "-sass FILE" or "-res-usage FILE", the text of $work/FILE.sass or .res-usage.
cat >"$work/cuobjdump" <<'SH'
#!/usr/bin/env bash
cat "$(dirname "$0")/$(basename "$2").${1#-}"
SH
chmod +x "$work/cuobjdump"
gemm=_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIN6moekit4cuda4sm9024BlockedGroupProblemShapeMMA_64x128x16_F32BF16BF16_SSKernelPtrArrayTmaWarpSpecializedPingpong
setup=_ZN6moekit4cuda4sm9013group_m_setupEv
kernel() {  # kernel NAME INSTRUCTION... : one Function block of cuobjdump -sass
  printf '\t\tFunction : %s\n\t.headerflags\t@"EF_CUDA_SM90"\n' "$1"; shift
  local a=0
  for i in "$@"; do printf '        /*%04x*/                   %s ;   /* 0x0000000000000000 */\n' $((a += 16)) "$i"; done
}
res() {  # res NAME REG LOCAL STACK : one Function line of cuobjdump -res-usage
  printf ' Function %s:\n  REG:%s STACK:%s SHARED:1024 LOCAL:%s CONSTANT[0]:2432 TEXTURE:0\n' "$1" "$2" "$4" "$3"
}
batched=("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4].tnspA.tnspB, RZ, !UPT" "HGMMA.64x128x16.F32.BF16 R88, gdesc[UR4].tnspA.tnspB, R88, gsb0"
         "WARPGROUP.DEPBAR.LE gsb0, 0x0" "@P0 BRA 0x100" "STSM.16.M88.4 [R5+0x30000], R88" "EXIT")
{ kernel $gemm "${batched[@]}"; kernel $setup "LDG.E R4, desc[UR4][R2.64]" "EXIT"; } >"$work/good.sass"
{ res $gemm 168 0 0; res $setup 64 0 0; } >"$work/good.res-usage"
kernel $gemm "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4].tnspA.tnspB, RZ, !UPT, gsb0" "WARPGROUP.DEPBAR.LE gsb0, 0x0" \
  "HGMMA.64x128x16.F32.BF16 R88, gdesc[UR4].tnspA.tnspB, R88, gsb0" "WARPGROUP.DEPBAR.LE gsb0, 0x0" "EXIT" >"$work/serial.sass"
res $gemm 168 0 0 >"$work/serial.res-usage"
kernel $gemm "${batched[@]}" "STL [R1], R4" >"$work/spill.sass"
res $gemm 168 0 8 >"$work/spill.res-usage"
kernel $gemm "FFMA R1, R2, R3, R4" "EXIT" >"$work/nowgmma.sass"
fp8=${gemm/64x128x16_F32BF16BF16/64x128x32_F32E4M3E4M3}  # FP8 operands: wgmma is QGMMA in SASS
kernel $fp8 "QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR4].tnspB, RZ, !UPT" \
  "QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR8].tnspB, R24, gsb0" "WARPGROUP.DEPBAR.LE gsb0, 0x0" "EXIT" >"$work/fp8.sass"
res $fp8 168 0 0 >"$work/fp8.res-usage"
res $gemm 168 0 0 >"$work/nowgmma.res-usage"
cp "$work/good.sass" "$work/copy.sass"; cp "$work/good.res-usage" "$work/copy.res-usage"
kernel $setup "EXIT" >"$work/none.sass"; res $setup 64 0 0 >"$work/none.res-usage"
export CUOBJDUMP="$work/cuobjdump"

out=$("$tool" check "$work/good")
expect "good passes" "$?" 0
expect "good line" "$(grep -c '^ok   good: cutlass pingpong 64x128x16 F32BF16BF16 (REG 168): 2 wgmma, 1 waits' <<<"$out")" 1
expect "good summary" "$(tail -1 <<<"$out")" "sass: 1 GEMM kernels, max 168 registers, 0 failing"
out=$("$tool" check "$work/good" "$work/serial")
expect "serial fails" "$?" 1
expect "serial why" "$(grep -c '2 wgmma waits for 2 wgmmas: serialised' <<<"$out")" 1
out=$("$tool" check "$work/spill")
expect "spill fails" "$?" 1
expect "spill why" "$(grep -c 'local memory: LOCAL 0, STACK 8, 1 STL/LDL' <<<"$out")" 1
out=$("$tool" check "$work/fp8")
expect "fp8 passes" "$?" 0
expect "fp8 line" "$(grep -c '^ok   fp8: cutlass pingpong 64x128x32 F32E4M3E4M3 (REG 168): 2 wgmma, 1 waits' <<<"$out")" 1
out=$("$tool" check "$work/nowgmma")
expect "no wgmma fails" "$?" 1
expect "no wgmma why" "$(grep -c 'no wgmma' <<<"$out")" 1
"$tool" check "$work/none" >/dev/null
expect "no GEMM kernel fails" "$?" 1
CUOBJDUMP=/nonexistent "$tool" check "$work/good" >/dev/null
expect "no cuobjdump skips" "$?" 77

list=$("$tool" list "$work/good")
expect "list" "$(awk '{print $1, $3, $4, $6}' <<<"$list")" "0 168 6 2
1 64 2 0"
expect "list label" "$(grep -c 'cutlass pingpong 64x128x16 F32BF16BF16$' <<<"$list")" 1
expect "mix" "$("$tool" mix "$work/good" 0 | head -1)" "     2  HGMMA"
expect "dump by pattern" "$("$tool" dump "$work/good" setup | tail -2)" "LDG.E R4, desc[UR4][R2.64]
EXIT"
"$tool" dump "$work/good" GemmOrSetupNot >/dev/null 2>&1
expect "dump of no kernel fails" "$?" 1
expect "diff of the same kernel" "$("$tool" diff "$work/good" 0 "$work/copy" 0)" ""
diff=$("$tool" diff "$work/good" 0 "$work/spill" 0)
expect "diff shows the spill" "$(grep -c '^+STL \[R3\], R4$' <<<"$diff")" 1
exit $fail
