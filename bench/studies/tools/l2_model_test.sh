#!/usr/bin/env bash
# ctest tools.l2_model: bench/studies/tools/l2-model on problems small enough to count by hand — one tile (its
# A and B blocks once), two N tiles sharing the A block (read once while it stays in L2), and an
# L2 too small to keep it (read twice) unless the second tile walks K backwards, or unless the
# output's lines push it out, a cluster along M — on a measured one (dsv3 fc2 wgrad, stripes 1 and 8: the
# model's numbers when it was calibrated), and with per-group rows and widths. Usage:
# l2_model_test.sh TOOLS_DIR
set -uo pipefail
tool="$1/l2-model"
source "$(dirname "${BASH_SOURCE[0]}")/../../../tests/tools/expect.sh"
# 128x128 tiles, one 64-deep K block: A and B blocks of 16384 bytes each.
expect "one tile" "$("$tool" 1 128 64 128 128x128 1 --stripes 1)" "stripe 1: 0.033 MB"
expect "A shared" "$("$tool" 1 128 64 256 128x128 1 --stripes 1)" "stripe 1: 0.049 MB"
# Two K blocks, one cluster, two N tiles, an L2 of one block: every block is read whenever used.
expect "A evicted" "$("$tool" 1 128 128 256 128x128 1 --stripes 1 --clusters 1 --l2-mb 0.016384)" \
  "stripe 1: 0.131 MB"
# The same two N tiles in an L2 of two blocks: walking K forward the second tile finds nothing
# (8 blocks read); walking it backwards (--alternate-k: the second tile a cluster takes) it
# starts on the A block the first read last (7).
expect "forward K" "$("$tool" 1 128 128 256 128x128 1 --stripes 1 --clusters 1 --l2-mb 0.032768)" \
  "stripe 1: 0.131 MB"
expect "alternating K" \
  "$("$tool" 1 128 128 256 128x128 1 --stripes 1 --clusters 1 --l2-mb 0.032768 --alternate-k)" \
  "stripe 1: 0.115 MB"
# A 2x1 cluster: two M tiles share the B block (256 rows: 2 A + 1 B); with 128 rows the second
# CTA's tile lies past the rows and reads no A.
expect "2x1 cluster" "$("$tool" 1 256 64 128 128x128 2x1 --stripes 1)" "stripe 1: 0.049 MB"
expect "2x1 past the rows" "$("$tool" 1 128 64 128 128x128 2x1 --stripes 1)" "stripe 1: 0.033 MB"
expect "fc2 wgrad" "$("$tool" 8 7168 4096 2048 128x256 2 --stripes 1,8)" \
  "stripe 1: 1905.590 MB
stripe 8: 1056.834 MB"
# The output's lines (--out-bytes): the same two N tiles in an L2 of three blocks keep the A block
# (3 blocks read), unless the first tile's 32 KB of bf16 output pushes it out (4).
expect "output left out" "$("$tool" 1 128 64 256 128x128 1 --stripes 1 --clusters 1 --l2-mb 0.049152)" \
  "stripe 1: 0.049 MB"
expect "output in the L2" \
  "$("$tool" 1 128 64 256 128x128 1 --stripes 1 --clusters 1 --l2-mb 0.049152 --out-bytes 2)" "stripe 1: 0.066 MB"
# Per-group rows and widths (skewed routing): the same widths everywhere are the uniform run's.
expect "per-group widths" "$("$tool" 2 512,1024 4096 2048 128x128 2 --widths 8,8)" \
  "widths 8,8: $("$tool" 2 512,1024 4096 2048 128x128 2 --stripes 8 | sed 's/^stripe 8: //')"
"$tool" 3 512,1024 4096 2048 128x128 2 >/dev/null 2>&1
expect "rows per group counted" "$?" 2
exit $fail
