#!/usr/bin/env bash
# bench/sm90_check.sh — builds and runs sm90_check (bench/sm90_check.cu) and the torch peers.
#
#   bench/sm90_check.sh build [build-dir]   CPU or GPU machine: links bench/sm90_check from the
#                                           moekit_sm90 objects of a CMake build tree (build them
#                                           first: cmake --build <dir> --target moekit_sm90) into
#                                           <build-dir>/sm90_check. No libmoekit, no OpenBLAS.
#   bench/sm90_check.sh test [build-dir]    GPU machine: the gtest suite test_sm90 of a full build
#                                           tree (library + tests), then compute-sanitizer memcheck
#                                           on two of its cases; OpenBLAS from .carry/ when the
#                                           machine has none.
#   bench/sm90_check.sh run [build-dir]     GPU machine: SASS check of the objects (HGMMA count),
#                                           sm90_check (fuzz, graph, suite → CSV), torch peers
#                                           (bench/sm90_peers.py); logs and tables under $OUT.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmd=${1:-build}
build=${2:-$root/build-sm90}
objdir=$build/src/CMakeFiles/moekit_sm90.dir/cuda/sm90
export PATH=/usr/local/cuda/bin:$PATH
case $cmd in
  build)
    cutlass=${MOEKIT_CUTLASS_DIR:-$root/.cutlass}
    [[ $build/sm90_explore.o -nt $root/bench/sm90_explore.cu && $build/sm90_explore.o -nt $root/src/cuda/sm90/group_m_kernel.cuh ]] ||
      nvcc -std=c++20 -O3 -DNDEBUG --expt-relaxed-constexpr -diag-suppress=2908 \
        -gencode=arch=compute_90a,code=sm_90a -I"$root/src" -I"$root/include" \
        -isystem "$cutlass/include" -isystem "$cutlass/tools/util/include" \
        -c "$root/bench/sm90_explore.cu" -o "$build/sm90_explore.o"
    nvcc -std=c++20 -O2 -gencode=arch=compute_90a,code=sm_90a -I"$root/src" -I"$root/include" \
      "$root/bench/sm90_check.cu" "$root/src/cuda/sm90/grouped_gemm_sm90.cpp" \
      "$root/src/core/error.cpp" "$root/src/core/dtype.cpp" "$objdir"/*.o "$build/sm90_explore.o" \
      -lcublas -o "$build/sm90_check"
    echo "built $build/sm90_check" ;;
  test)
    out=${OUT:-$build/sm90-out}
    mkdir -p "$out"
    lib=$build/src
    [[ -e $lib/libmoekit.so.0 ]] || ln -sf "$(basename "$(ls "$lib"/libmoekit.so.0.*)")" "$lib/libmoekit.so.0"
    extra=
    if ! ldconfig -p | grep -q "libopenblas.so.0" && [[ -f $root/.carry/openblas.tar.xz ]]; then
      mkdir -p /tmp/sm90-deps && tar -xJf "$root/.carry/openblas.tar.xz" -C /tmp/sm90-deps
      extra=/tmp/sm90-deps/openblas/lib
    fi
    export LD_LIBRARY_PATH=$lib:$extra:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
    timeout 120 "$build/tests/test_sm90" 2>&1 | tee "$out/test_sm90.log" | grep -E "^\[ *(OK|FAILED|SKIPPED|PASSED) |tests? ran|FAIL" || true
    timeout "${SM90_SANITIZER_TIMEOUT:-150}" compute-sanitizer --tool memcheck --error-exitcode 9 \
      "$build/tests/test_sm90" --gtest_filter='*Bf16FpropBiasI32ZeroGroupsTail*:*F16DgradI64Tail*:*GraphCaptured*' \
      >"$out/memcheck.log" 2>&1
    echo "memcheck exit $? ($(grep -c 'Invalid' "$out/memcheck.log") invalid accesses): $(tail -1 "$out/memcheck.log")" ;;
  run)
    out=${OUT:-$build/sm90-out}
    mkdir -p "$out"
    export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$out/gpu.txt"
    for o in "$objdir"/*.o; do
      sass=$(cuobjdump --dump-sass "$o")
      printf '%-32s HGMMA %5d  HMMA %4d  STL %3d  LDL %3d\n' "$(basename "$o")" \
        "$(grep -c HGMMA <<<"$sass")" "$(grep -c 'HMMA' <<<"$sass" | awk '{print $1}')" \
        "$(grep -c 'STL' <<<"$sass")" "$(grep -c 'LDL' <<<"$sass")"
    done | tee "$out/sass.txt"
    timeout "${SM90_CHECK_TIMEOUT:-300}" "$build/sm90_check" --csv "$out/sm90.csv" ${SM90_CHECK_ARGS:-} 2>&1 | tee "$out/check.log" || echo "sm90_check FAILED (exit ${PIPESTATUS[0]})"
    python3 "$root/bench/sm90_peers.py" "$out/sm90.csv" --md "$out/table.md" 2>&1 | tee "$out/peers.log" ;;
  *) echo "usage: $0 build|test|run [build-dir]" >&2; exit 2 ;;
esac
