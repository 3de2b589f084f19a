// bench/studies/sm90_fp8_fast_study.cu — the study tile of fp8-current's fast-accumulation
// group-M GEMM (sm90_fp8_fast_study.h). A study build's translation unit of moekit_sm90
// (src/backends/cuda/sm90/sources.cmake); the product never compiles it.
#include "backends/cuda/sm90/kernel/fp8_kernel.cuh"
#include "sm90_fp8_fast_study.h"

namespace moekit::cuda::sm90 {
namespace {
// Example 57's ping-pong: 128x128x128, cluster 2x1 (the product's is 1x2).
struct ConfigFp8FastPingpong21 {
  using Schedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8FastAccum;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
  using Tile = cute::Shape<cute::_128, cute::_128, cute::_128>;
  using Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
};
}  // namespace
MOEKIT_SM90_FP8_GROUP_M_INSTANCE(fp8_group_m_e4m3_fast_pingpong21, E4M3, E4M3, DType::BF16, ConfigFp8FastPingpong21,
                                 Fp8PerGroupScales,
                                 "e4m3 x e4m3 -> bf16 pingpong 128x128x128 cluster 2x1, fast accumulation (study)")
}  // namespace moekit::cuda::sm90
