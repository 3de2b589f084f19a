// Internal: the argument bundles that primitives pass to their backends (already validated).
#pragma once

#include <vector>

#include "moekit/core/context.h"
#include "moekit/core/splits.h"
#include "moekit/core/tensor.h"
#include "moekit/primitives/grouped_gemm.h"

namespace moekit::detail {

/// grouped_gemm_group_m: out[rows of g] = a[rows of g] · op(b[g]) (+ bias[g]).
struct GroupMArgs {
  const Context& ctx;
  const Tensor& a;      // [T, K]
  const Tensor& b;      // [G, N, K] (Transposed) or [G, K, N] (Plain)
  BOp op;
  const Splits& splits;
  const Tensor& out;    // [T, N]
  const Tensor& bias;   // [G, N] or undefined
  int64_t groups, rows, k, n;
};

/// grouped_gemm_group_k: dw[g] (+)= dy[rows of g]ᵀ · x[rows of g].
struct GroupKArgs {
  const Context& ctx;
  const Tensor& dy;     // [T, N]
  const Tensor& x;      // [T, K]
  const Splits& splits;
  const Tensor& dw;     // [G, N, K]
  bool accumulate;
  int64_t groups, rows, k, n;
};

/// grouped_bias_grad: db[g] (+)= column sums of dy[rows of g].
struct BiasGradArgs {
  const Context& ctx;
  const Tensor& dy;     // [T, N]
  const Splits& splits;
  const Tensor& db;     // [G, N]
  bool accumulate;
  int64_t groups, rows, n;
};

}  // namespace moekit::detail
