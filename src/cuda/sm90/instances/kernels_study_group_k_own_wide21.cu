// The bf16 -> bf16 group-K (weight gradient) instance on moekit's own kernel with the cooperative
// 128x256 tile and a 2x1 cluster (ConfigWide21Own, group_k_own.cuh): both consumer warpgroups on
// every tile, each storing its 64x256 half through its own D buffer. Study build only
// (MOEKIT_SM90_TILE_STUDY; MOEKIT_SM90_GROUP_K_OWN=wide21, grouped_gemm_sm90.cpp): on the H200 it
// tied the own ping-pong kernel on small_E64's wgrad and lost on skewed routing
// (bench/results/2026-12-02-nvidia-h200-d94bd31-group-k-own-wide21.md).
#include "cuda/sm90/kernel/group_k_own.cuh"  // first: the kernel class ConfigWide21Own names
#include "cuda/sm90/kernel/group_k_kernel.cuh"

namespace moekit::cuda::sm90 {
// ConfigWide21's tile, cluster (x's block multicast to the M pair: 0.5 operand bytes from the L2
// per dW byte, against 0.75 on ConfigLargeOwn's 128x128 tile with A multicast) and mainloop on
// the own kernel. Its epilogue collective is built with the ping-pong epilogue schedule for its
// 64x128 subtile — a warpgroup's half-tile row block, the box of the prebuilt D descriptors; the
// kernel uses its types and parameters only. One 64x128 D buffer per warpgroup (the half's two
// subtiles in two rounds) leaves the mainloop 4 stages of 48 KB; in moekit_bandwidth_probe's
// model of this schedule one buffer and 4 stages wrote small_E64's dW in 81.3 µs, two and 3 in
// 83.6 (bench/results/2026-12-02-nvidia-h200-3cfb396-operand-residency.md, rows #28, #31).
struct ConfigWide21Own : ConfigWide21 {
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
  static constexpr bool kOwnKernel = true;
  static constexpr int kDBuffers = 1;
  static constexpr int kMinStages = 4;
};

MOEKIT_SM90_GROUP_K_INSTANCE(group_k_bf16_bf16_own_wide21, DType::BF16, DType::BF16, ConfigWide21Own,
                             "bf16 -> bf16 own cooperative 128x256x64 cluster 2x1, per-warpgroup epilogue, one D buffer")
}  // namespace moekit::cuda::sm90
