// The compiled instances of the sm90 group-M grouped GEMM with SwiGLU fused into its epilogue
// (fc1 of the grouped MLP: GroupMProblem::glu_z; swiglu_epilogue.cuh): bf16 and f16, each on the
// two tile configurations of the plain fprop instances (kernels_bf16.cu, kernels_f16.cu), whose
// mainloop they share, so that h has the same bits fused or not.
#include "backends/cuda/sm90/kernel/group_m_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_swiglu_large, DType::BF16, true, ConfigLarge, SwiGlu,
                             "bf16 b:k-major pingpong 128x128x64 cluster 1x2 +swiglu")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_swiglu_small, DType::BF16, true, ConfigSmallM, SwiGlu,
                             "bf16 b:k-major pingpong 64x128x64 cluster 1x1 +swiglu")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_f16_swiglu_large, DType::F16, true, ConfigLarge, SwiGlu,
                             "f16 b:k-major pingpong 128x128x64 cluster 1x2 +swiglu")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_f16_swiglu_small, DType::F16, true, ConfigSmallM, SwiGlu,
                             "f16 b:k-major pingpong 64x128x64 cluster 1x1 +swiglu")
}  // namespace moekit::cuda::sm90
