set -u
S=$SECONDS
B=build-carry
BUILD_DIR=$B GPU_CHECK_STEPS=none tools/gpu-check > /dev/null 2>&1
export LD_LIBRARY_PATH=$PWD/$B/deps/openblas/lib
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
echo "== consumer 16 (+$((SECONDS-S)) s)"
timeout 150 $B/bench/moekit_overlap_probe --presets qwen3,dsv3 --two-streams 0 --consumer 16 --margins 8,16,24,32 --steps 5 --turns 3 --warmup-ms 300 2>&1 | tee $OUT/m16.txt | grep "^| [qd]"
echo "== consumer 32 (+$((SECONDS-S)) s)"
timeout 150 $B/bench/moekit_overlap_probe --presets qwen3,dsv3 --two-streams 0 --consumer 32 --margins 16,32,48 --steps 5 --turns 3 --warmup-ms 300 2>&1 | tee $OUT/m32.txt | grep "^| [qd]"
echo "end +$((SECONDS-S)) s"
