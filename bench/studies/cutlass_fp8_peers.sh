#!/usr/bin/env bash
# bench/studies/cutlass_fp8_peers.sh — builds issue 40's stock-CUTLASS FP8 peers, timing only:
# example 57 (per-tensor FP8 grouped GEMM, e4m3 x e5m2, its cooperative and ping-pong kernels) and
# example 68 (block-scaled FP8 grouped GEMM, Sm90BlockwiseScaleConfig<1,128,128>, the mainloop
# moekit's fp8-block GEMMs use), from the CUTLASS source the build's headers come from; and the
# like-for-like variants of moekit's passes: ex57p (promoted accumulation, not FastAccum), ex68r
# (B scaled per row: Sm90BlockwiseScaleConfig<1,1,128>, moekit's wgrad), ex68f and ex68d (the
# scales' majors of moekit's fprop, A and B K-major, and dgrad, A K-major and B MN-major; stock
# ex68 reads both MN-major).
#
#   bench/studies/cutlass_fp8_peers.sh DIR      # any machine with nvcc (no GPU needed)
#
# Source: $CUTLASS_SOURCE (a CUTLASS checkout: include/, tools/util/include/, examples/), else the
# pip package nvidia-cutlass==4.2.0.0's cutlass_library/source of this python3. Each example is
# copied to DIR and the copy's host reference check (hours on the CPU at the suite's sizes) is
# replaced by `passed = true` — the examples' own timing loop is unchanged: `iterations` runs of
# initialize() + run() between two events. Nothing built here is committed. Flags as moekit's sm90
# kernels (-DNDEBUG: CUTLASS's asserts serialise the wgmma pipeline; -O3 -arch=sm_90a).
# bench/studies/fp8_gemm_peers.py --cutlass DIR runs them beside moekit on the suite's shapes.
set -euo pipefail
out=${1:?usage: cutlass_fp8_peers.sh DIR}
src=${CUTLASS_SOURCE:-$(python3 -c 'import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), "source"))')}
[[ -f $src/include/cutlass/cutlass.h && -d $src/examples ]] || { echo "cutlass_fp8_peers.sh: no CUTLASS source at $src" >&2; exit 2; }
mkdir -p "$out"
build() {  # build NAME EXAMPLE_DIR FILE [FROM TO]...: the copy with each FROM (a fixed string) replaced by TO
  local name=$1 dir=$src/examples/$2 file=$3
  local copy=$out/$name.cu
  shift 3
  cp "$dir/$file" "$copy"
  grep -q 'result.passed = verify(options);' "$copy" || { echo "cutlass_fp8_peers.sh: $file has no 'result.passed = verify(options);' to skip" >&2; exit 3; }
  sed -i 's/result.passed = verify(options);/result.passed = true;  \/\/ timing only (cutlass_fp8_peers.sh)/' "$copy"
  while (($#)); do
    grep -qF -- "$1" "$copy" || { echo "cutlass_fp8_peers.sh: $file has no '$1' to change" >&2; exit 3; }
    python3 - "$copy" "$1" "$2" <<'PY'
import sys
p, a, b = sys.argv[1:]
s = open(p).read()
open(p, "w").write(s.replace(a, b))
PY
    shift 2
  done
  echo "cutlass_fp8_peers.sh: building $name from $dir" >&2
  nvcc -std=c++17 -O3 -DNDEBUG -arch=sm_90a --expt-relaxed-constexpr -diag-suppress=2908 \
    -I"$src/include" -I"$src/tools/util/include" -I"$src/examples/common" -I"$dir" \
    -o "$out/$name" "$copy"
}
ex68_dir=68_hopper_fp8_warp_specialized_grouped_gemm_with_blockwise_scaling
pids=()
build ex57 57_hopper_grouped_gemm 57_hopper_grouped_gemm.cu & pids+=($!)
# ex57p: example 57 with the promoted schedules (the accumulators promoted to fp32 every few MMA
# k-blocks: what moekit's fp8-current dgrad and wgrad do, TE's split accumulator), not FastAccum
build ex57p 57_hopper_grouped_gemm 57_hopper_grouped_gemm.cu \
  KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum KernelPtrArrayTmaWarpSpecializedCooperative \
  KernelPtrArrayTmaWarpSpecializedPingpongFP8FastAccum KernelPtrArrayTmaWarpSpecializedPingpong & pids+=($!)
build ex68 $ex68_dir $ex68_dir.cu & pids+=($!)
# ex68r: example 68 with B scaled per row too (1x128 blocks along K for both operands: moekit's
# fp8-block wgrad, where both dy and x carry 128x1 blocks along the rows)
build ex68r $ex68_dir $ex68_dir.cu "constexpr int ScaleGranularityN = 128;" "constexpr int ScaleGranularityN = 1;" & pids+=($!)
# ex68f / ex68d: the scale layouts moekit's fprop and dgrad read (fp8_kernel.cuh's
# Fp8FpropBlockScales <1,128> K / K and Fp8DgradBlockScales <1,128> K / MN: the 1x128 row scales
# as the quantize writes them, [row, k block])
sfa_sfb="cutlass::detail::Sm90BlockwiseScaleConfig<ScaleGranularityM, ScaleGranularityN, ScaleGranularityK>;"
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done  # the first four, then two more (each nvcc takes GBs)
pids=()
build ex68f $ex68_dir $ex68_dir.cu "$sfa_sfb" \
  "cutlass::detail::Sm90BlockwiseScaleConfig<ScaleGranularityM, ScaleGranularityN, ScaleGranularityK, cute::GMMA::Major::K, cute::GMMA::Major::K>;" & pids+=($!)
build ex68d $ex68_dir $ex68_dir.cu "$sfa_sfb" \
  "cutlass::detail::Sm90BlockwiseScaleConfig<ScaleGranularityM, ScaleGranularityN, ScaleGranularityK, cute::GMMA::Major::K, cute::GMMA::Major::MN>;" & pids+=($!)
for p in "${pids[@]}"; do wait "$p" || rc=1; done
(( rc == 0 )) || { echo "cutlass_fp8_peers.sh: a build failed" >&2; exit 1; }
ls -la "$out"/ex57 "$out"/ex57p "$out"/ex68 "$out"/ex68r "$out"/ex68f "$out"/ex68d
