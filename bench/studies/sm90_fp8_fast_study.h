// bench/studies/sm90_fp8_fast_study.h — the tile a study may give fp8-current's fast-accumulation
// group-M GEMM (the forward) beside the product's two (ping-pong 128x128x128 cluster 1x2;
// cooperative 256x128x128 cluster 1x2 for groups of >= 256 rows, heuristics.h): CUTLASS example
// 57's ping-pong, 128x128x128 cluster 2x1. Compiled into the library by a study build only
// (-DMOEKIT_SM90_STUDY_OVERRIDE=ON; sm90_fp8_fast_study.cu), picked by
// MOEKIT_SM90_STUDY=fp8_fast=pingpong21 (pingpong12 / coop256 force the product's two;
// device/grouped_gemm_sm90.cpp). Measured 2026-12-06 on an H100 (PERFORMANCE.md): the 2x1 cluster
// won only qwen3_fc2 (3%), so it stayed a study.
#pragma once

#include "backends/cuda/sm90/instances/fp8_instances.h"

namespace moekit::cuda::sm90 {
extern const Fp8GroupMInstance fp8_group_m_e4m3_fast_pingpong21;
}  // namespace moekit::cuda::sm90
