#!/usr/bin/env bash
# ctest tools.carry_build: tools/carry-build copies this build into a relocatable directory whose
# ctest list is the build's (less what it leaves out), and which, moved elsewhere and relocated,
# runs its tests from its own copies. Also where the source tree is no git checkout (a device
# call's copy): the copy's marker then says so.
# Usage: carry_build_test.sh TOOLS_DIR BUILD_DIR
set -uo pipefail
tool="$1/carry-build"
build="$2"
source "$(dirname "${BASH_SOURCE[0]}")/expect.sh"
count() { ctest --test-dir "$1" -N 2>/dev/null | sed -nE 's/^Total Tests: ([0-9]+)/\1/p'; }
"$tool" "$build" "$work/c" >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
expect "marker" "$(head -1 "$work/c/MOEKIT_CARRIED" | cut -d' ' -f1)" "commit"
left=$(grep -c . "$work/c/LEFT_OUT")
expect "this test left out" "$(grep -cx "tools.carry_build" "$work/c/LEFT_OUT")" "1"
expect "test count" "$(count "$work/c")" "$(( $(count "$build") - left ))"
mv "$work/c" "$work/d"
"$tool" --relocate "$work/d" || fail=1
# No test command of the moved copy names the build it came from; the gtest programs are its own.
commands=$(ctest --test-dir "$work/d" -N -V 2>/dev/null | grep "Test command:")
expect "no command in the build" "$(grep -c "$(cd "$build" && pwd)/" <<<"$commands")" "0"
expect "gtest programs in the copy" "$(grep -c "$work/d/tests/test_core " <<<"$commands")" \
  "$(ctest --test-dir "$build" -N -V 2>/dev/null | grep "Test command:" | grep -c "/tests/test_core ")"
# One fp64-reference test case, run by ctest from the moved copy; its programs load the copy's
# library with no LD_LIBRARY_PATH into a build (build-tree RUNPATHs are relative:
# CMAKE_BUILD_RPATH_USE_ORIGIN). Entries outside the build stay: a machine without OpenBLAS runs
# the carried one (tools/bootstrap's moekit-env.sh), whose libgfortran only LD_LIBRARY_PATH finds.
keep_path=$(tr ':' '\n' <<<"${LD_LIBRARY_PATH:-}" |
  awk -v b="$(cd "$build" && pwd)" -v w="$work" 'index($0, b "/deps/") == 1 || (index($0, b) != 1 && index($0, w) != 1)' | paste -sd:)
without_build() { env -u LD_LIBRARY_PATH ${keep_path:+LD_LIBRARY_PATH="$keep_path"} "$@"; }
without_build ctest --test-dir "$work/d" -R '^Reference\.HandComputedExample$' >"$work/run" 2>&1
expect "a test runs from the copy" "$(grep -c 'tests passed, 0 tests failed out of 1' "$work/run")" "1"
for prog in tests/test_core bench/moekit_bench tools/moekit/moekit; do
  [[ -e $work/d/$prog ]] || continue
  expect "$prog's library" \
    "$(realpath "$(without_build ldd "$work/d/$prog" | awk '/libmoekit/ {print $3}')")" \
    "$(realpath "$work/d/src/libmoekit.so.0")"
done
exit $fail
