// Tile-study instance (built with -DMOEKIT_SM90_TILE_STUDY=ON only; chosen at run time with
// MOEKIT_SM90_TILE=coop128): the bf16 -> bf16 group-K of < 2048 rows per group (small_E64, qwen3)
// on a cooperative 128x128 tile, cluster 1x2, with one 128x128 epilogue pass per tile, in place of
// kLarge's ping-pong 128x128 with two 64x128 passes. small_E64's wgrad has one K block per tile and
// lives in its epilogue (94.2 µs writing 268 MB at 59% of DRAM peak against cuBLAS's 85.0 at 66%,
// ncu at 9267e00); on ping-pong the two warpgroups' epilogues take turns, here both warpgroups
// stage their 64 rows at once and one TMA store per tile leaves, while the producer loads the next
// tiles' single K blocks (4+ stages). The question: does halving the passes per byte (and running
// them on 256 threads) beat the ping-pong overlap for a one-K-block GEMM? (A 128x128 subtile on the
// ping-pong tile does not compile in CUTLASS 4.2; the cooperative 128x256 tile with a 128x128
// subtile, study `wideepi` at 5e0fcd6, lost 4-12% — twice the bytes per tile, half the tiles.)
#define MOEKIT_SM90_TILE_STUDY 1
#include "cuda/sm90/group_k_kernel.cuh"

namespace moekit::cuda::sm90 {
struct ConfigCoop128 : ConfigLarge {  // its tile and cluster, cooperative
  using Schedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
  using EpilogueTile = cute::Shape<cute::_128, cute::_128>;
  static constexpr int kMinStages = 4;
};
MOEKIT_SM90_GROUP_K_INSTANCE(group_k_bf16_bf16_coop128, DType::BF16, DType::BF16, ConfigCoop128,
                             "bf16 -> bf16 cooperative 128x128x64 cluster 1x2, epilogue 128x128 (study)")
}  // namespace moekit::cuda::sm90
