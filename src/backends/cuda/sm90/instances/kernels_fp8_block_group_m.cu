// The compiled block-scaled FP8 group-M instances (kernel/fp8_kernel.cuh, fp8-block): fprop (the
// weight's 128x128 scales K-major) and dgrad (read transposed: MN-major), e4m3 or e5m2 gradients.
#include "backends/cuda/sm90/kernel/fp8_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_FP8_GROUP_M_INSTANCE(fp8_block_group_m_fprop, E4M3, E4M3, DType::BF16, ConfigFp8Block, Fp8FpropBlockScales,
                                 "e4m3 x e4m3 -> bf16 cooperative 128x128x128 cluster 1x2, 1x128 x 128x128 block scales")
MOEKIT_SM90_FP8_GROUP_M_INSTANCE(fp8_block_group_m_dgrad_e4m3, E4M3, E4M3, DType::BF16, ConfigFp8Block, Fp8DgradBlockScales,
                                 "e4m3 x e4m3 -> bf16 cooperative 128x128x128 cluster 1x2, 1x128 x 128x128 block scales (Wt)")
MOEKIT_SM90_FP8_GROUP_M_INSTANCE(fp8_block_group_m_dgrad_e5m2, E5M2, E4M3, DType::BF16, ConfigFp8Block, Fp8DgradBlockScales,
                                 "e5m2 x e4m3 -> bf16 cooperative 128x128x128 cluster 1x2, 1x128 x 128x128 block scales (Wt)")
}  // namespace moekit::cuda::sm90
