// The compiled FP8 forward instances of large groups (kernel/fp8_kernel.cuh, fp8-current, fast
// accumulation, ConfigFp8FastCoop256), bf16 and f16 outputs: a TU of their own, so they compile
// beside the other FP8 instances.
#include "backends/cuda/sm90/kernel/fp8_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_FP8_GROUP_M_INSTANCE(fp8_group_m_e4m3_fast_coop256, E4M3, E4M3, DType::BF16, ConfigFp8FastCoop256,
                                 Fp8PerGroupScales,
                                 "e4m3 x e4m3 -> bf16 cooperative 256x128x128 cluster 1x2, fast accumulation")
MOEKIT_SM90_FP8_GROUP_M_INSTANCE(fp8_group_m_e4m3_fast_coop256_f16, E4M3, E4M3, DType::F16, ConfigFp8FastCoop256,
                                 Fp8PerGroupScales,
                                 "e4m3 x e4m3 -> f16 cooperative 256x128x128 cluster 1x2, fast accumulation")
}  // namespace moekit::cuda::sm90
