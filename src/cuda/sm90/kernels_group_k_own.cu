// The bf16 -> bf16 group-K (weight gradient) instance on moekit's own ping-pong kernel
// (ConfigLargeOwn, group_k_pingpong.cuh): kLarge's tile with per-warpgroup epilogues, for groups
// of fewer than 1024 rows on average (grouped_gemm_sm90.cpp, the group-K instance choice).
#include "cuda/sm90/group_k_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_K_INSTANCE(group_k_bf16_bf16_own, DType::BF16, DType::BF16, ConfigLargeOwn,
                             "bf16 -> bf16 own pingpong 128x128x64 cluster 1x2, per-warpgroup epilogue, one D buffer")
}  // namespace moekit::cuda::sm90
