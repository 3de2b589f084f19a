#!/usr/bin/env bash
# ctest tools.bootstrap: tools/bootstrap asks no package registry when the machine has everything
# (the GPU machine has cmake from pip, not dpkg: issue 39), and names the Debian packages of what
# is neither on the machine nor in the deps folder. apt-get and dpkg-query are stand-ins that
# record their calls and fail; configure only (--configure), CPU only.
# Usage: bootstrap_test.sh TOOLS_DIR
set -uo pipefail
tool="$1/bootstrap"
source "$(dirname "${BASH_SOURCE[0]}")/expect.sh"
mkdir -p "$work/bin"
for cmd in apt-get dpkg-query; do
  printf '#!/bin/sh\necho "%s $*" >>"%s/calls"\nexit 1\n' "$cmd" "$work" >"$work/bin/$cmd"
  chmod +x "$work/bin/$cmd"
done
# 1. Everything there (the system's, or the deps folder's where the suite was built with one):
# configured, no registry asked.
PATH="$work/bin:$PATH" MOEKIT_BUILD_DIR="$work/b" MOEKIT_WITH_CUDA=OFF "$tool" --configure >"$work/log1" 2>&1
rc=$?
expect "configures" "$rc" "0"
((rc)) && tail -20 "$work/log1"
expect "no registry asked" "$(cat "$work/calls" 2>/dev/null)" ""
expect "a build directory" "$([[ -f $work/b/CMakeCache.txt && -f $work/b/moekit-env.sh ]] && echo yes)" "yes"
# 2. Nothing taken from the system, and an empty deps folder: the libraries' Debian packages are
# named, and the script stops (as root: after apt-get failed; else before it).
mkdir -p "$work/empty"
PATH="$work/bin:$PATH" MOEKIT_BUILD_DIR="$work/b2" MOEKIT_WITH_CUDA=OFF MOEKIT_FORCE_DEPS=1 \
  MOEKIT_DEPS_DIR="$work/empty" "$tool" --configure >"$work/log2" 2>&1
expect "stops" "$?" "1"
for pkg in libopenblas-dev libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev; do
  expect "names $pkg" "$(grep -c -- "$pkg" "$work/log2" | awk '{print ($1 > 0)}')" "1"
done
expect "no dpkg asked" "$(grep -c '^dpkg-query' "$work/calls" 2>/dev/null)" "0"
exit $fail
