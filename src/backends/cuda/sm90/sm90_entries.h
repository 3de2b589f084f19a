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
#include "backends/contract/quant_args.h"

namespace moekit::cuda {

// The entries this backend exports to the primitives' tables, one per primitive (defined
// beside the functions they name).
extern const detail::Backend<detail::GroupMArgs> kSm90GroupM;
extern const detail::Backend<detail::GroupKArgs> kSm90GroupK;
extern const detail::Backend<detail::GemmSwigluArgs> kSm90GemmSwiglu;
extern const detail::Backend<detail::GemmDSwigluArgs> kSm90GemmDSwiglu;
// "cuda-fp8": the quantized grouped GEMMs of recipes with per-group scales (fp8-current) on the
// native FP8 kernels (device/fp8_gemm_sm90.h): bf16 outputs (f32 or bf16 dw), sm_90.
extern const detail::Backend<detail::QuantGroupMArgs> kFp8QuantGroupM;
extern const detail::Backend<detail::QuantGroupKArgs> kFp8QuantGroupK;

}  // namespace moekit::cuda
