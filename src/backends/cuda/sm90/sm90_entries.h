// Internal: the "sm90" entries of the primitive tables (src/primitives/grouped_gemm.cpp) — the
// Hopper grouped GEMMs of grouped_gemm_sm90.h behind detail::GroupMArgs / GroupKArgs.
//
//   "sm90"  grouped_gemm_group_m and grouped_gemm_group_k: bf16/f16 inputs, K and N multiples of
//           8, on an sm_90 device (group-K: dw in f32 or the input dtype). Device splits are read
//           on the device (no host synchronisation; graph-capturable); host splits are copied to
//           the device on the context's stream first. Workspace comes from the context's
//           stream-ordered allocator.
//           grouped_gemm_swiglu: the group-M kernel with SwiGLU in its epilogue (h and z from one
//           launch), for the Interleaved32 layout; bit-identical to group-M + swiglu_forward.
#pragma once

#include <string>

#include "backends/contract/activation_args.h"
#include "backends/contract/args.h"
#include "backends/contract/backend_table.h"

namespace moekit::cuda {

std::string sm90_group_m_rejects(const detail::GroupMArgs& args);
void sm90_group_m_run(const detail::GroupMArgs& args);
std::string sm90_group_k_rejects(const detail::GroupKArgs& args);
void sm90_group_k_run(const detail::GroupKArgs& args);
// grouped_gemm_swiglu with SwiGLU in the group-M kernel's epilogue (GluLayout::Interleaved32).
std::string sm90_gemm_swiglu_rejects(const detail::GemmSwigluArgs& args);
void sm90_gemm_swiglu_run(const detail::GemmSwigluArgs& args);
// grouped_gemm_dswiglu with the SwiGLU backward in the group-M dgrad kernel's epilogue.
std::string sm90_gemm_dswiglu_rejects(const detail::GemmDSwigluArgs& args);
void sm90_gemm_dswiglu_run(const detail::GemmDSwigluArgs& args);
// Automatic choice only: uniform host splits of small groups go to cuBLAS's batched GEMMs.
std::string sm90_group_m_declines(const detail::GroupMArgs& args);
std::string sm90_group_k_declines(const detail::GroupKArgs& args);
std::string sm90_gemm_swiglu_declines(const detail::GemmSwigluArgs& args);
std::string sm90_gemm_dswiglu_declines(const detail::GemmDSwigluArgs& args);


// The entries this backend exports to the primitives' tables (one per primitive).
inline constexpr detail::Backend<detail::GroupMArgs> kSm90GroupM{"sm90", sm90_group_m_rejects, sm90_group_m_run, sm90_group_m_declines};
inline constexpr detail::Backend<detail::GroupKArgs> kSm90GroupK{"sm90", sm90_group_k_rejects, sm90_group_k_run, sm90_group_k_declines};
inline constexpr detail::Backend<detail::GemmSwigluArgs> kSm90GemmSwiglu{"sm90", sm90_gemm_swiglu_rejects, sm90_gemm_swiglu_run, sm90_gemm_swiglu_declines};
inline constexpr detail::Backend<detail::GemmDSwigluArgs> kSm90GemmDSwiglu{"sm90", sm90_gemm_dswiglu_rejects, sm90_gemm_dswiglu_run, sm90_gemm_dswiglu_declines};

}  // namespace moekit::cuda
