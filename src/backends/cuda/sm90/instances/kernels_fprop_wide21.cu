// The bf16 fprop instances on the cooperative 128x256 tile with a 2x1 cluster (ConfigWide21), plain
// and with SwiGLU in the epilogue: kLarge's fprop for K >= 4096 (heuristics.h; heuristics.cpp, instance).
#include "backends/cuda/sm90/kernel/group_m_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_kmajor_wide21, DType::BF16, true, ConfigWide21Epi64, None,
                             "bf16 b:k-major cooperative 128x256x64 cluster 2x1, epilogue 128x64")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_swiglu_wide21, DType::BF16, true, ConfigWide21, SwiGlu,
                             "bf16 fc1+SwiGLU cooperative 128x256x64 cluster 2x1")
}  // namespace moekit::cuda::sm90
