// The compiled f16 instances of the sm90 grouped GEMMs: group-M (group_m_kernel.cuh) for both
// B layouts (K-major: fprop, N-major: dgrad) × both tile configurations, and group-K
// (group_k_kernel.cuh, the weight gradient) into an f32 or a f16 dw. All six share one translation
// unit on purpose: the headers and the CuTe machinery common to all instances cost most of a TU's
// compile time: one instance alone costs about two thirds of four.
#include "backends/cuda/sm90/kernel/group_k_kernel.cuh"
#include "backends/cuda/sm90/kernel/group_m_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_f16_kmajor_large, DType::F16, true, ConfigLarge, None,
                             "f16 b:k-major pingpong 128x128x64 cluster 1x2")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_f16_kmajor_small, DType::F16, true, ConfigSmallM, None,
                             "f16 b:k-major pingpong 64x128x64 cluster 1x1")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_f16_nmajor_large, DType::F16, false, ConfigWide, None,
                             "f16 b:n-major cooperative 128x256x64 cluster 1x2")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_f16_nmajor_small, DType::F16, false, ConfigSmallM, None,
                             "f16 b:n-major pingpong 64x128x64 cluster 1x1")
MOEKIT_SM90_GROUP_K_INSTANCE(group_k_f16_f32, DType::F16, DType::F32, ConfigLarge,
                             "f16 -> f32 pingpong 128x128x64 cluster 1x2")
MOEKIT_SM90_GROUP_K_INSTANCE(group_k_f16_f16, DType::F16, DType::F16, ConfigLarge,
                             "f16 -> f16 pingpong 128x128x64 cluster 1x2")
}  // namespace moekit::cuda::sm90
