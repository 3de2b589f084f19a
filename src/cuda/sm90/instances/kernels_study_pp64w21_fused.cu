// Tile-study instances (built with -DMOEKIT_SM90_TILE_STUDY=ON only; MOEKIT_SM90_TILE=pp64w21):
// fc1 + SwiGLU and fc2 dgrad + SwiGLU backward, bf16, on the ping-pong 64x256x64 tile with a
// 2x1 cluster (ConfigPingPong64W21), so that the study tile runs the same fused MLP step as kLarge.
#define MOEKIT_SM90_TILE_STUDY 1
#include "cuda/sm90/kernel/group_m_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_swiglu_pp64w21, DType::BF16, true, ConfigPingPong64W21, SwiGlu,
                             "bf16 fc1+SwiGLU pingpong 64x256x64 cluster 2x1 (study)")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_dswiglu_pp64w21, DType::BF16, false, ConfigPingPong64W21, DSwiGlu,
                             "bf16 dgrad+SwiGLU backward pingpong 64x256x64 cluster 2x1 (study)")
}  // namespace moekit::cuda::sm90
