// bench/studies/sm90_fp8_fast_study.h — the tiles a study may give fp8-current's fast-accumulation
// group-M GEMM (the forward), beside the product's ping-pong 128x128x128 cluster 1x2: CUTLASS
// example 57's two (cooperative 256x128x128 cluster 1x2, ping-pong 128x128x128 cluster 2x1).
// Compiled into the library by a study build only (-DMOEKIT_SM90_STUDY_OVERRIDE=ON;
// sm90_fp8_fast_study.cu), picked by MOEKIT_SM90_STUDY=fp8_fast=pingpong21|coop256
// (device/grouped_gemm_sm90.cpp). The question (design/PERFORMANCE.md, issue 40): is the tile why
// fp8-current's fprop runs at 0.70-1.04x of example 57 (c31ad62, H100)?
#pragma once

#include "backends/cuda/sm90/instances/fp8_instances.h"

namespace moekit::cuda::sm90 {
extern const Fp8GroupMInstance fp8_group_m_e4m3_fast_pingpong21, fp8_group_m_e4m3_fast_coop256;
}  // namespace moekit::cuda::sm90
