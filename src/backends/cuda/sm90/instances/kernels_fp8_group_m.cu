// The compiled FP8 group-M instances (kernel/fp8_kernel.cuh; one translation unit: the CUTLASS
// headers dominate a TU's compile time).
#include "backends/cuda/sm90/kernel/fp8_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_FP8_GROUP_M_INSTANCE(fp8_group_m_e4m3_fast, E4M3, E4M3, DType::BF16, ConfigFp8Fast, Fp8PerGroupScales,
                                 "e4m3 x e4m3 -> bf16 pingpong 128x128x128 cluster 1x2, fast accumulation")
MOEKIT_SM90_FP8_GROUP_M_INSTANCE(fp8_group_m_e4m3_promoted, E4M3, E4M3, DType::BF16, ConfigFp8, Fp8PerGroupScales,
                                 "e4m3 x e4m3 -> bf16 cooperative 128x128x128 cluster 1x2, promoted accumulation")
MOEKIT_SM90_FP8_GROUP_M_INSTANCE(fp8_group_m_e5m2_promoted, E5M2, E4M3, DType::BF16, ConfigFp8, Fp8PerGroupScales,
                                 "e5m2 x e4m3 -> bf16 cooperative 128x128x128 cluster 1x2, promoted accumulation")
}  // namespace moekit::cuda::sm90
