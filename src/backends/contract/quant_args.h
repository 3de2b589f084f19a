// Internal: the argument bundles of the quantize primitives and the quantized grouped GEMMs
// (already validated), as passed to their backends. This is the hook the sm_90a FP8 grouped GEMMs
// plug into (ARCHITECTURE.md "Quantized recipes"): an entry of the quantized GEMM tables takes
// these bundles, whose QuantizedTensors carry the copies and scales the kernels read.
#pragma once

#include <cstdint>

#include "moekit/core/context.h"
#include "moekit/core/splits.h"
#include "moekit/core/tensor.h"
#include "moekit/primitives/quantize.h"

namespace moekit::detail {

/// quantize: the copies q.usage names, from x [T, C] grouped by splits; with db, also the column
/// sums of each group's rows (a bias gradient, fp32 sums rounded once; 0 for an empty group).
struct QuantizeArgs {
  Context ctx;
  Tensor x;  // [T, C]
  Splits splits;
  QuantizedTensor q;  // allocated, written by the backend
  int64_t groups, rows, cols;
  Tensor db;  // [G, C] or undefined
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

}  // namespace moekit::detail
