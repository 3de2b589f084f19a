// Tile-study instances (built with -DMOEKIT_SM90_TILE_STUDY=ON only; MOEKIT_SM90_TILE=pp22):
// fc1 + SwiGLU and fc2 dgrad + SwiGLU backward, bf16, on the ping-pong 128x128x64 tile with a
// 2x2 cluster (ConfigLarge22), so that the study tile runs the same fused MLP step as kLarge.
#define MOEKIT_SM90_TILE_STUDY 1
#include "cuda/sm90/group_m_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_swiglu_pp22, DType::BF16, true, ConfigLarge22, SwiGlu,
                             "bf16 fc1+SwiGLU pingpong 128x128x64 cluster 2x2 (study)")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_dswiglu_pp22, DType::BF16, false, ConfigLarge22, DSwiGlu,
                             "bf16 dgrad+SwiGLU backward pingpong 128x128x64 cluster 2x2 (study)")
}  // namespace moekit::cuda::sm90
