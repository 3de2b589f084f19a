B=build-carry
tools/carry-build --relocate $B >/dev/null
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
F='*cuda*:*Cuda*:*CUDA*:*Sm90*:*sm90*:*Gpu*:*GPU*:-CudaRuntime.RuntimeErrorNamesCallAndStatus'
for s in 0 4; do (GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$s timeout 150 $CS --tool racecheck $B/tests/test_grouped_mlp --gtest_filter="$F" > $OUT/rc$s.log 2>&1; echo "shard $s/8 exit $?" >> $OUT/rc$s.log) & done; wait
for s in 0 4; do grep -E "RACECHECK SUMMARY|PASSED|FAILED|tests ran|exit" $OUT/rc$s.log; done
