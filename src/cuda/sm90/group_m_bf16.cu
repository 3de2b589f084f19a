// The compiled bf16 instances of the sm90 group-M grouped GEMM (see group_m_kernel.cuh): both
// B layouts (K-major: fprop, N-major: dgrad) × both tile configurations. Four instances share one
// translation unit on purpose: the headers and the CuTe machinery common to all instances cost
// most of a TU's compile time (1 instance ≈ 100 s, 4 instances ≈ 150 s of CPU with nvcc 13.0; see bench/results).
#include "cuda/sm90/group_m_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_kmajor_large, DType::BF16, true, ConfigLarge,
                             "bf16 b:k-major pingpong 128x128x64 cluster 1x2")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_kmajor_small, DType::BF16, true, ConfigSmallM,
                             "bf16 b:k-major pingpong 64x128x64 cluster 1x1")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_nmajor_large, DType::BF16, false, ConfigLarge,
                             "bf16 b:n-major pingpong 128x128x64 cluster 1x2")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_nmajor_small, DType::BF16, false, ConfigSmallM,
                             "bf16 b:n-major pingpong 64x128x64 cluster 1x1")
}  // namespace moekit::cuda::sm90
