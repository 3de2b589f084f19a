// Tile-study instances (built with -DMOEKIT_SM90_TILE_STUDY=ON only; chosen at run time with
// MOEKIT_SM90_TILE=wide21): bf16 dgrad, plain and with the SwiGLU backward, on the cooperative
// 128x256x64 tile with a 2x1 cluster (ConfigWide21, kernel_common.cuh). Its fprop and group-K
// instances are in every build (kernels_fprop_wide21.cu, kernels_group_k_wide21.cu).
#define MOEKIT_SM90_TILE_STUDY 1
#include "cuda/sm90/kernel/group_m_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_nmajor_wide21, DType::BF16, false, ConfigWide21, None,
                             "bf16 b:n-major cooperative 128x256x64 cluster 2x1 (study)")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_dswiglu_wide21, DType::BF16, false, ConfigWide21, DSwiGlu,
                             "bf16 dgrad+SwiGLU backward cooperative 128x256x64 cluster 2x1 (study)")
}  // namespace moekit::cuda::sm90
