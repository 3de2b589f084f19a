#!/usr/bin/env bash
# ctest tools.balance_model: bench/studies/tools/balance-model on schedules small enough to count by hand.
# Usage: balance_model_test.sh TOOLS_DIR
set -uo pipefail
tool="$1/balance-model"
source "$(dirname "${BASH_SOURCE[0]}")/../../../tests/tools/expect.sh"
row() { grep "^| $1 |"; }
# Groups of 64 and 128 rows, two units each, two clusters: unit costs 1, 1, 1.1, 1.1. CUTLASS's
# order gives each cluster 1 + 1.1; blocked gives one 2 and the other 2.2 (mean 2.1). Uniform
# (96 rows each: two blocks) costs 1.1 per unit, 2.2 per cluster in either order.
out=$("$tool" --counts 64,128 --units-per-group 2 --clusters 2 --orders cutlass,blocked)
expect "cutlass" "$(row cutlass <<<"$out")" "| cutlass | 1.000 | 0.955 |"
expect "blocked" "$(row blocked <<<"$out")" "| blocked | 1.048 | 1.000 |"
# An empty group has no units; 192 rows are 3 blocks (cost 1 + 0.5·2 = 2): units 1, 1, 2, 2 in
# chunks of 2 give the clusters 2 and 4. Uniform (86, 85, 85 rows: 2 blocks, 1.5 a unit, six
# units) gives 6 and 3.
out=$("$tool" --counts 0,64,192 --units-per-group 2 --clusters 2 --extra 0.5 --orders chunk2)
expect "chunk2, empty group" "$(row chunk2 <<<"$out")" "| chunk2 | 1.333 | 0.667 |"
# Snake: four groups of one unit, 64 to 256 rows (costs 1, 2, 3, 4 with --extra 1), two clusters.
# CUTLASS's order gives them 1 + 3 and 2 + 4 (mean 5); snake deals the second wave in reverse:
# 1 + 4 and 2 + 3. Uniform (160 rows: cost 3 each) gives 6 per cluster either way.
out=$("$tool" --counts 64,128,192,256 --units-per-group 1 --clusters 2 --extra 1 --orders cutlass,snake)
expect "cutlass, rising costs" "$(row cutlass <<<"$out")" "| cutlass | 1.200 | 1.000 |"
expect "snake, rising costs" "$(row snake <<<"$out")" "| snake | 1.000 | 0.833 |"
# Largest first: the same as listing the groups that way.
expect "heavy first" "$("$tool" --counts 64,192 --units-per-group 2 --clusters 2 --orders blocked --heavy-first | row blocked)" \
  "$("$tool" --counts 192,64 --units-per-group 2 --clusters 2 --orders blocked | row blocked)"
# Counts from a moekit_bench --json row.
cat >"$work/m.json" <<'JSON'
{"results": [{"shape": "small_E64", "routing": "skewed", "pass": "wgrad", "counts": [64, 128]}]}
JSON
expect "json" "$("$tool" --json "$work/m.json" --units-per-group 2 --clusters 2 --orders cutlass | row cutlass)" \
  "| cutlass | 1.000 | 0.955 |"
# Bad arguments name themselves.
msg=$("$tool" --counts 1,2 --orders chunk1 2>&1); rc=$?
expect "bad order" "$rc:$msg" "1:balance-model: --orders takes cutlass, blocked, snake or chunkC (C >= 2), got 'chunk1'"
msg=$("$tool" --counts 1,-2 2>&1); rc=$?
expect "negative count" "$rc:$msg" "1:balance-model: counts must be >= 0, got [1, -2]"
exit $fail
