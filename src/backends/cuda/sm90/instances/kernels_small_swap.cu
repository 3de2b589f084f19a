// The bf16 group-M instances with A and B swapped on the cooperative 256x64 tile with a 2x1 cluster
// (ConfigSmallSwap, kernel_common.cuh): kSmallM's plain fprop and dgrad when the output's columns
// fill 512-column slices (heuristics.h; heuristics.cpp, instance). Their own translation unit.
#include "backends/cuda/sm90/kernel/group_m_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_kmajor_small_swap, DType::BF16, true, ConfigSmallSwap, None,
                             "bf16 b:k-major swapped cooperative 256x64x64 cluster 2x1")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_nmajor_small_swap, DType::BF16, false, ConfigSmallSwap, None,
                             "bf16 b:n-major swapped cooperative 256x64x64 cluster 2x1")
}  // namespace moekit::cuda::sm90
