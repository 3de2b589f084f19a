// Tile-study instances (built with -DMOEKIT_SM90_TILE_STUDY=ON only; MOEKIT_SM90_TILE=wide21):
// fc2 dgrad + SwiGLU backward, bf16, on the cooperative 128x256x64 tile with a 2x1 cluster
// (ConfigWide21), so that the study tile runs the same fused MLP step as kLarge (fc1 + SwiGLU on
// it is in every build: kernels_fprop_wide21.cu).
#define MOEKIT_SM90_TILE_STUDY 1
#include "cuda/sm90/group_m_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_dswiglu_wide21, DType::BF16, false, ConfigWide21, DSwiGlu,
                             "bf16 dgrad+SwiGLU backward cooperative 128x256x64 cluster 2x1 (study)")
}  // namespace moekit::cuda::sm90
