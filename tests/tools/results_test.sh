#!/usr/bin/env bash
# ctest tools.results: tools/lib/moekit_results.py's readers that tools/gpu-check's verdict rests
# on, on fixed inputs: ctest's JUnit file (failures, ctest skips, a GoogleTest skip hidden in a
# passing entry, allowed skips), compute-sanitizer logs, a moekit_bench table and its JSON.
set -uo pipefail
results="$1/lib/moekit_results.py"
source "$(dirname "${BASH_SOURCE[0]}")/expect.sh"
cat >"$work/ok.xml" <<'XML'
<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="(empty)" tests="2" failures="0" disabled="0" skipped="0">
  <testcase name="A.one" classname="A.one" time="0.1" status="run"><system-out>[  PASSED  ] 1 test.</system-out></testcase>
  <testcase name="B.two" classname="B.two" time="0.1" status="run"><system-out>[       OK ] B.two</system-out></testcase>
</testsuite>
XML
expect "all pass" "$(python3 "$results" ctest-junit "$work/ok.xml")" "2 pass, 0 fail, 0 skipped (0 unexpected) (of 2)"
cat >"$work/bad.xml" <<'XML'
<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="(empty)" tests="4" failures="1" disabled="0" skipped="1">
  <testcase name="A.one" classname="A.one" time="0.1" status="run"><system-out>ok</system-out></testcase>
  <testcase name="A.fails" classname="A.fails" time="0.1" status="fail"><failure message="Failed"/><system-out>x</system-out></testcase>
  <testcase name="tools.sass" classname="tools.sass" time="0.1" status="notrun"><skipped message="Skipped"/></testcase>
  <testcase name="Cuda.hidden" classname="Cuda.hidden" time="0.1" status="run"><system-out>[  SKIPPED ] Cuda.hidden (0 ms)</system-out></testcase>
</testsuite>
XML
out=$(python3 "$results" ctest-junit "$work/bad.xml"); rc=$?
expect "counts" "$(head -1 <<<"$out")" "1 pass, 1 fail, 2 skipped (2 unexpected) (of 4)"
expect "names" "$(tail -n +2 <<<"$out" | paste -sd,)" "FAILED  A.fails,SKIPPED tools.sass,SKIPPED Cuda.hidden"
expect "exit" "$rc" "1"
out=$(python3 "$results" ctest-junit "$work/bad.xml" '^tools\.'); rc=$?
expect "allowed skip" "$(head -1 <<<"$out")" "1 pass, 1 fail, 2 skipped (1 unexpected) (of 4)"
cat >"$work/san.log" <<'LOG'
== memcheck test_a --gtest_filter=* shard 1/2 (limit 60s)
========= ERROR SUMMARY: 0 errors
== exit 0
== memcheck test_a --gtest_filter=* shard 2/2 (limit 60s)
========= ERROR SUMMARY: 3 errors
== exit 1
== racecheck test_a --gtest_filter=* shard 1/1 (limit 60s)
========= RACECHECK SUMMARY: 5 hazards displayed (1 error, 4 warnings)
== exit 0
LOG
expect "memcheck" "$(python3 "$results" sanitizer-summary "$work/san.log" memcheck)" "3"
expect "racecheck" "$(python3 "$results" sanitizer-summary "$work/san.log" racecheck)" "5"
expect "no summary" "$(python3 "$results" sanitizer-summary "$work/san.log" initcheck)" "no summary"
cat >"$work/race.log" <<'LOG'
== racecheck test_b --gtest_filter=* shard 1/1 (limit 60s)
========= Error: Race reported between Write access at void nvjet_sm90_tst_128x256(...)+0x1b0
=========     and Read access at void nvjet_sm90_tst_128x256(...)+0x1c0 [64 hazards]
=========
========= Warning: Race reported between Write access at void moekit::sm90::kernel(...)+0x10
=========     and Read access at void moekit::sm90::kernel(...)+0x20 [2 hazards]
=========
========= Error: Race reported between Read access at void nvjet_sm90_tst_64x8(...)+0x50
=========     and Write access at void nvjet_sm90_tst_64x8(...)+0x70 [8 hazards]
========= RACECHECK SUMMARY: 3 hazards displayed (2 errors, 1 warning)
== exit 0
LOG
out=$(python3 "$results" sanitizer-summary "$work/race.log" racecheck nvjet)
expect "racecheck, cuBLAS's set apart" "$(paste -sd, <<<"$out")" "1,foreign 2"
expect "racecheck, nothing set apart" "$(python3 "$results" sanitizer-summary "$work/race.log" racecheck)" "3"
cat >"$work/bench.log" <<'LOG'
small_E64 uniform fprop 64 8192 2048 1024 | sm90 0.100 171.8 PASS 1980 | cublas 0.090 190.9 PASS 1980 | cublas
small_E64 skewed fprop 64 8192 2048 1024 | sm90 0.110 156.2 PASS 1965 | cublas 0.120 143.2 PASS 1980 | sm90
LOG
expect "best" "$(python3 "$results" bench-best "$work/bench.log")" "  small_E64 fprop        190.9 cublas @1980 / 156.2 sm90 @1965"
echo '{"results": [{}, {}, {}]}' >"$work/m.json"
expect "rows" "$(python3 "$results" bench-rows-json "$work/m.json")" "3"
expect "rows of nothing" "$(python3 "$results" bench-rows-json "$work/missing.json")" "0"
printf '| read | 268.4 | 65.7 | 4.084 |\n| write | 268.4 | 68.0 | 3.947 |\n| copy | 268.4 | 1.0 | 2.0 |\n' >"$work/bw.log"
expect "bandwidth" "$(python3 "$results" bandwidth-summary "$work/bw.log")" "read 4.084 TB/s, write 3.947 TB/s (268 MB, one kernel)"
exit $fail
