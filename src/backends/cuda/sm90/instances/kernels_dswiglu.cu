// The compiled instances of the sm90 group-M dgrad GEMM with the SwiGLU backward fused into its
// epilogue (fc2's dgrad of the grouped MLP: GroupMProblem::dglu_dh; swiglu_epilogue.cuh): bf16
// and f16, each on the two tile configurations of the plain dgrad instances, whose mainloop they
// share, so that dz has the same bits fused or not.
#include "backends/cuda/sm90/kernel/group_m_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_dswiglu_large, DType::BF16, false, ConfigWide, DSwiGlu,
                             "bf16 b:n-major cooperative 128x256x64 cluster 1x2 +dswiglu")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_dswiglu_small, DType::BF16, false, ConfigSmallM, DSwiGlu,
                             "bf16 b:n-major pingpong 64x128x64 cluster 1x1 +dswiglu")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_f16_dswiglu_large, DType::F16, false, ConfigWide, DSwiGlu,
                             "f16 b:n-major cooperative 128x256x64 cluster 1x2 +dswiglu")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_f16_dswiglu_small, DType::F16, false, ConfigSmallM, DSwiGlu,
                             "f16 b:n-major pingpong 64x128x64 cluster 1x1 +dswiglu")
}  // namespace moekit::cuda::sm90
