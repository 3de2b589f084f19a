// Tile-study instances (built with -DMOEKIT_SM90_TILE_STUDY=ON only; chosen at run time with
// MOEKIT_SM90_TILE=wideepi): the bf16 group-K (both dw dtypes) on the cooperative 128x256x64 tile
// with the epilogue subtile chosen like the ping-pong tile's (ConfigWideTunedEpilogue,
// kernel_common.cuh). Their own translation unit, so they compile beside the other studies.
#define MOEKIT_SM90_TILE_STUDY 1
#include "cuda/sm90/group_k_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_K_INSTANCE(group_k_bf16_f32_wideepi, DType::BF16, DType::F32, ConfigWideTunedEpilogue,
                             "bf16 -> f32 cooperative 128x256x64 cluster 1x2, epilogue 128x64 (study)")
MOEKIT_SM90_GROUP_K_INSTANCE(group_k_bf16_bf16_wideepi, DType::BF16, DType::BF16, ConfigWideTunedEpilogue,
                             "bf16 -> bf16 cooperative 128x256x64 cluster 1x2, epilogue 128x128 (study)")
}  // namespace moekit::cuda::sm90
