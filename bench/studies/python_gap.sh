#!/usr/bin/env bash
# bench/studies/python_gap.sh — issue 43's Python gap, in one device call (bench/studies/python_gap.py):
#
#   BUILD_DIR=build-carry bench/studies/python_gap.sh [python_gap.py options]
#
# Builds what the study needs against the build's libmoekit (a carried build's Python module at
# BUILD_DIR/python-module when it is not there yet, as tools/gpu-check does, and the study module
# python_gap_ext at BUILD_DIR/python-gap; ~30 s each on 16 cores), then runs python_gap.py in one
# process. Table: $OUT/python-gap.md (OUT defaults to .). `moekit run` itself runs before and after
# it (--moekit).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=$(cd "${BUILD_DIR:-build-carry}" && pwd)
OUT=${OUT:-$ROOT}
JOBS=${JOBS:-$(nproc)}
# OpenBLAS's run-time libraries where the machine has none (tools/gpu-check, step 2).
if [[ ! -f $BUILD/moekit-env.sh ]] && ! ldconfig -p 2>/dev/null | grep -q "libopenblas.so.0" &&
   [[ -f $ROOT/.deps/openblas.tar.xz ]]; then
  mkdir -p "$BUILD/deps" && tar -xJf "$ROOT/.deps/openblas.tar.xz" -C "$BUILD/deps"
  echo "export LD_LIBRARY_PATH=$BUILD/deps/openblas/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" >"$BUILD/moekit-env.sh"
fi
# shellcheck disable=SC1091
[[ -f $BUILD/moekit-env.sh ]] && source "$BUILD/moekit-env.sh"
# The system g++, not $CXX (tools/gpu-check, 6b: the image's /opt/gcc links its own libstdc++ into
# shared objects, which crashes beside the one torch loads).
cxx=(); [[ -x /usr/bin/g++ ]] && cxx=(-DCMAKE_CXX_COMPILER=/usr/bin/g++)
gen() { command -v ninja >/dev/null && [[ ! -f $1/CMakeCache.txt ]] && echo "-G Ninja" || true; }
pyb=$BUILD/python-module
if ! ls "$pyb"/python/moekit/_moekit*.so >/dev/null 2>&1; then
  if [[ -d $BUILD/python/moekit ]] && ls "$BUILD"/python/moekit/_moekit*.so >/dev/null 2>&1; then
    pyb=$BUILD  # a build made on this machine holds the module itself
  else
    echo "python_gap.sh: building moekit._moekit against $BUILD/src/libmoekit.so.0" >&2
    # shellcheck disable=SC2046
    cmake -S "$ROOT/python" -B "$pyb" $(gen "$pyb") "${cxx[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DMOEKIT_LIBRARY="$BUILD/src/libmoekit.so.0" >/dev/null && cmake --build "$pyb" -j "$JOBS" >/dev/null
  fi
fi
ext=$BUILD/python-gap
echo "python_gap.sh: building python_gap_ext" >&2
# shellcheck disable=SC2046
cmake -S "$ROOT/bench/studies/python_gap" -B "$ext" $(gen "$ext") "${cxx[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DMOEKIT_LIBRARY="$BUILD/src/libmoekit.so.0" >/dev/null && cmake --build "$ext" -j "$JOBS" >/dev/null
export PYTHONPATH=$pyb/python:$ext${PYTHONPATH:+:$PYTHONPATH}
moekit=()
[[ -x $BUILD/tools/moekit/moekit ]] && moekit=(--moekit "$BUILD/tools/moekit/moekit")
python3 "$ROOT/bench/studies/python_gap.py" "${moekit[@]}" --out "$OUT/python-gap.md" "$@"
