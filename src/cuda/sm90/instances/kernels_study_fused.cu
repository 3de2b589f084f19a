// Tile-study instances with the fused SwiGLU epilogues (built with -DMOEKIT_SM90_TILE_STUDY=ON
// only): fc1 + SwiGLU and fc2 dgrad + SwiGLU backward, bf16, on the cooperative 256x128 (coop)
// tile, fc1 + SwiGLU on the 128x256 (wide) one (the dgrad is on it in every build), and the
// backward on the ping-pong 128x128 (pingpong: its epilogue overlaps the other warpgroup's
// mainloop), so that a study tile runs the same fused MLP step as kLarge
// (MOEKIT_SM90_TILE=coop|wide|pingpong). Cooperative tiles take 128-row epilogue subtiles (group_m_kernel.cuh,
// kFusedEpiRows). Their own translation unit, beside kernels_study.cu and kernels_study_wide.cu.
#define MOEKIT_SM90_TILE_STUDY 1
#include "cuda/sm90/kernel/group_m_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_swiglu_coop, DType::BF16, true, ConfigCoop, SwiGlu,
                             "bf16 fc1+SwiGLU cooperative 256x128x64 cluster 1x2 (study)")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_dswiglu_coop, DType::BF16, false, ConfigCoop, DSwiGlu,
                             "bf16 dgrad+SwiGLU backward cooperative 256x128x64 cluster 1x2 (study)")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_dswiglu_pingpong, DType::BF16, false, ConfigLarge, DSwiGlu,
                             "bf16 dgrad+SwiGLU backward pingpong 128x128x64 cluster 1x2 (study)")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_swiglu_wide, DType::BF16, true, ConfigWide, SwiGlu,
                             "bf16 fc1+SwiGLU cooperative 128x256x64 cluster 1x2 (study)")
}  // namespace moekit::cuda::sm90
