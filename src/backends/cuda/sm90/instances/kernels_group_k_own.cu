// The bf16 -> bf16 group-K (weight gradient) instance on moekit's own ping-pong kernel
// (ConfigLargeOwn, group_k_own.cuh): kLarge's tile with per-warpgroup epilogues, for groups
// of fewer than 1024 rows on average (heuristics.h, takes_group_k_own).
#include "backends/cuda/sm90/kernel/group_k_own.cuh"  // first: the kernel class ConfigLargeOwn names
#include "backends/cuda/sm90/kernel/group_k_kernel.cuh"

namespace moekit::cuda::sm90 {
// kLarge's tile, cluster, mainloop and scheduler on the own ping-pong kernel, whose consumer
// warpgroups run their epilogues side by side, each on its own D buffers, instead of in turns.
// kDBuffers 64x128 D buffers per warpgroup: one (its two subtiles in two rounds) leaves the
// mainloop 6 stages, as CUTLASS's kernel has; two left it 5, and were slower at 512 rows and on
// skewed routing (design/PERFORMANCE.md, "What holds each target": small_E64 wgrad). Here rather
// than in kernel_common.cuh: a change to it rebuilds this file alone.
struct ConfigLargeOwn : ConfigLarge {
  static constexpr bool kOwnKernel = true;
  static constexpr int kDBuffers = 1;
};

MOEKIT_SM90_GROUP_K_INSTANCE(group_k_bf16_bf16_own, DType::BF16, DType::BF16, ConfigLargeOwn,
                             "bf16 -> bf16 own pingpong 128x128x64 cluster 1x2, per-warpgroup epilogue, one D buffer")
}  // namespace moekit::cuda::sm90
