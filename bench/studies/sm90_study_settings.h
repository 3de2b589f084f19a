// bench/studies/sm90_study_settings.h — the knobs of the sm90 heuristics a study may turn
// (src/backends/cuda/sm90/heuristics.cpp honours them; each -1: automatic), kept with the studies:
// the product never sets them (study_settings() returns every field -1 there). A study
// build (-DMOEKIT_SM90_STUDY_OVERRIDE=ON) fills them from MOEKIT_SM90_STUDY=key=value[,...],
// parsed by bench/studies/sm90_study_override.h (the keys, values and errors live there, with the
// studies; design/ARCHITECTURE.md, "Environment variables").
#pragma once

namespace moekit::cuda::sm90 {

/// Each field: -1 automatic (the key absent), else the index of the value in its key's list.
struct StudySettings {
  int config = -1;               // large | small: every group-M call on that configuration
  int order = -1;                // auto | cutlass | blocked | chunk2 | chunk4 | chunk8 | balanced
  int raster = -1;               // m | n
  int swizzle = -1;              // 1 | 2 | 4 | 8 | 16 | m4 | m8 | m16 (m: M fastest in a stripe)
  int k_order = -1;              // forward | alternate
  int pdl = -1;                  // 0 | 1: programmatic dependent launch of the GEMM
  int prebuilt_tensormaps = -1;  // 0 | 1: 0 leaves the TMA descriptors to CUTLASS
  int fprop_wide21 = -1;         // 0 | 1: 0 keeps bf16 fprop of deep K on kLarge's tile
  int small_swap = -1;           // 0 | 1: 0 keeps kSmallM's plain bf16 calls unswapped
  int group_k_wide = -1;         // 0 | 1: 0 keeps large-group bf16 wgrad on ping-pong 128x128
  int group_k_own = -1;          // 0 | 1: 0 never the own group-K kernel, 1 for every bf16 -> bf16 below the wide groups
  int fused_forward = -1;        // 0 | 1: 0 declines fc1 + SwiGLU in one kernel
  int fused_backward = -1;       // 0 | 1: 1 accepts fc2 dgrad + SwiGLU backward in one kernel
  int fp8_fast = -1;             // pingpong12 | pingpong21 | coop256: the tile of fp8-current's
                                 // fast-accumulation group-M GEMM (fprop; pingpong21 a study tile,
                                 // sm90_fp8_fast_study.cu; the other two the product's, forced)
};

/// The settings of this process: all automatic in a product build; a study build's parsed once
/// from MOEKIT_SM90_STUDY (heuristics.cpp), throwing on every call while the value is wrong.
const StudySettings& study_settings();

}  // namespace moekit::cuda::sm90
