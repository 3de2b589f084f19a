// Internal: the argument bundles of the quantize primitives and the quantized grouped GEMMs
// (already validated), as passed to their backends. This is the hook the sm_90a FP8 grouped GEMMs
// plug into (ARCHITECTURE.md "Quantized recipes"): an entry of the quantized GEMM tables takes
// these bundles, whose QuantizedTensors carry the copies and scales the kernels read.
#pragma once

#include <cstdint>

#include "moekit/core/context.h"
#include "moekit/core/splits.h"
#include "moekit/core/tensor.h"
#include "moekit/primitives/activation.h"
#include "moekit/primitives/quantize.h"

namespace moekit::detail {

/// quantize: the copies q.usage names, from x [T, C] grouped by splits.
struct QuantizeArgs {
  Context ctx;
  Tensor x;  // [T, C]
  Splits splits;
  QuantizedTensor q;  // allocated, written by the backend
  int64_t groups, rows, cols;
};

/// dequantize: one copy of q into out (f32; [T, C] rowwise, [C, T] columnwise).
struct DequantizeArgs {
  Context ctx;
  QuantizedTensor q;
  Splits splits;
  QuantUsage which;
  Tensor out;
};

/// grouped_gemm_group_m_quantized: out[rows of g] = dq(a.rowwise) · dq(b_g)ᵀ (+ bias[g]).
struct QuantGroupMArgs {
  Context ctx;
  QuantizedTensor a;  // [T, K'] rowwise
  QuantizedTensor b;  // the weight [G·N, K]: rowwise (fprop) or columnwise (dgrad)
  BOp op;
  Splits splits;
  Tensor out;                  // [T, N']
  Tensor bias;                 // [G, N'] or undefined
  int64_t groups, rows, k, n;  // k = the reduction (K fprop, N dgrad), n = out's columns
};

/// grouped_gemm_group_k_quantized: dw[g] (+)= dq(dy.columnwise)_g · dq(x.columnwise)_gᵀ.
struct QuantGroupKArgs {
  Context ctx;
  QuantizedTensor dy;  // [T, N] columnwise
  QuantizedTensor x;   // [T, K] columnwise
  Splits splits;
  Tensor dw;  // [G, N, K]
  bool accumulate;
  int64_t groups, rows, k, n;
};

/// swiglu_quantize: q's copies of z = p·silu(a)·b [T, F] made from h [T, 2F] (z is not stored).
struct SwigluQuantizeArgs {
  Context ctx;
  Tensor h;      // [T, 2F]
  Tensor probs;  // [T] f32 or undefined
  Splits splits;
  GluLayout layout;
  QuantizedTensor q;  // allocated for [T, F], written by the backend
  int64_t groups, rows, cols;  // cols = F
};

/// swiglu_backward_quantize: q's copies of dh [T, 2F] made from h, dz [T, F] and probs (dh is
/// not stored); dprobs written or added to as swiglu_backward's.
struct SwigluBackwardQuantizeArgs {
  Context ctx;
  Tensor h;       // [T, 2F]
  Tensor probs;   // [T] f32 or undefined
  Tensor dz;      // [T, F]
  Splits splits;
  GluLayout layout;
  QuantizedTensor q;  // allocated for [T, 2F], written by the backend
  Tensor dprobs;      // [T] f32 or undefined
  bool accumulate_dprobs;
  int64_t groups, rows, F;
};

}  // namespace moekit::detail
