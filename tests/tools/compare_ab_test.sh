#!/usr/bin/env bash
# ctest tools.compare_ab: tools/compare ab's table from a fixed turns log (medians per side, new / base,
# rows missing on one side, lines that are not bench rows ignored), its refusal of a log without
# rows, and --prepare's usage and commit checks.
# Usage: compare_ab_test.sh TOOLS_DIR
set -uo pipefail
tools_dir=$1
tool() { "$tools_dir/compare" ab "$@"; }
source "$(dirname "${BASH_SOURCE[0]}")/expect.sh"
cat >"$work/turns.log" <<'LOG'
== turn 1 new
warm-up 5 calls and >= 500 ms, median of 20 runs per backend
small_E64       uniform  fprop       64   4096   2048   1024 | sm90      0.100   171.8 PASS  1980 | sm90
small_E64       uniform  wgrad       64   4096   2048   1024 | sm90      0.120   143.0 PASS  1980 | sm90
== turn 1 base
small_E64       uniform  fprop       64   4096   2048   1024 | sm90      0.104   165.2 PASS  1980 | sm90
small_E64       uniform  wgrad       64   4096   2048   1024 | sm90      0.125   137.4 PASS  1980 | sm90
small_E64       skewed   fprop       64   4096   2048   1024 | sm90      0.110   156.0 PASS  1980 | sm90
== turn 2 new
small_E64       uniform  fprop       64   4096   2048   1024 | sm90      0.096   179.0 PASS  1980 | sm90
small_E64       uniform  wgrad       64   4096   2048   1024 | sm90      0.118   145.6 PASS  1980 | sm90
== turn 2 base
small_E64       uniform  fprop       64   4096   2048   1024 | sm90      0.100   171.8 PASS  1980 | sm90
small_E64       uniform  wgrad       64   4096   2048   1024 | sm90      0.118   145.6 PASS  1980 | sm90
== turn 3 new
small_E64       uniform  fprop       64   4096   2048   1024 | sm90      0.098   175.3 PASS  1980 | sm90
== turn 3 base
small_E64       uniform  fprop       64   4096   2048   1024 | sm90      0.102   168.4 PASS  1980 | sm90
LOG
out=$(tool --table "$work/turns.log")
expect status "$?" 0
expect header "$(sed -n 1p <<<"$out")" "| shape | routing | pass | backend | new ms | base ms | new / base | turns |"
expect fprop "$(grep -F '| uniform | fprop |' <<<"$out")" \
  "| small_E64 | uniform | fprop | sm90 | 0.0980 | 0.1020 | 0.961 | 3/3 |"
expect wgrad "$(grep -F '| uniform | wgrad |' <<<"$out")" \
  "| small_E64 | uniform | wgrad | sm90 | 0.1190 | 0.1215 | 0.979 | 2/2 |"
expect one-side "$(grep -F '| skewed | fprop |' <<<"$out")" \
  "| small_E64 | skewed | fprop | sm90 | n/a | 0.1100 | n/a | 0/1 |"
expect rows "$(wc -l <<<"$out")" 5
echo "no rows here" >"$work/empty.log"
tool --table "$work/empty.log" >/dev/null 2>&1
expect "no rows fails" "$?" 1
tool --prepare >/dev/null 2>&1
expect "prepare without commit" "$?" 2
tool --prepare no-such-commit-here >/dev/null 2>&1
expect "prepare unknown commit" "$?" 2
exit $fail
