#!/usr/bin/env bash
# ctest bench.selection: the shapes moekit_bench takes (--list, no GPU needed) — without --shapes
# the whole PERFORMANCE.md suite in its order (from 5ee7c7a to 2026-12-01 it took none, and
# tools/gpu-check's suite table came out empty), with --shapes the suite's named ones in suite
# order and then the custom ones as given. Usage: bench_selection_test.sh MOEKIT_BENCH
set -uo pipefail
bench="$1"
source "$(dirname "${BASH_SOURCE[0]}")/expect.sh"
expect "whole suite" "$("$bench" --list | cut -d' ' -f1 | tr '\n' ' ')" \
  "dsv3_fc1_E8 dsv3_fc2_E8 dsv3_fc1_E32 qwen3_fc1_E16 qwen3_fc2_E16 mixtral_fc1_E8 small_E64 "
expect "named, suite order, customs last" \
  "$("$bench" --list --shapes custom_E2_T64_K128_N256,small_E64,dsv3_fc2_E8)" \
  "dsv3_fc2_E8 E=8 T=32768 K=2048 N=7168
small_E64 E=64 T=4096 K=2048 N=1024
custom_E2_T64_K128_N256 E=2 T=64 K=128 N=256"
"$bench" --list --shapes no_such_shape >/dev/null 2>&1
expect "unknown shape refused" "$?" 2
"$bench" --list --data zeros >/dev/null 2>&1
expect "unknown --data refused" "$?" 2
exit $fail
