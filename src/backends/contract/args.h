// Internal: the argument bundles that primitives pass to their backends (already validated).
// They hold their tensors by value (shared handles), so a bound call (backend_table.h) owns them.
#pragma once

#include <vector>

#include "moekit/core/context.h"
#include "moekit/core/splits.h"
#include "moekit/core/tensor.h"
#include "moekit/primitives/grouped_gemm.h"

namespace moekit::detail {

/// grouped_gemm_group_m: out[rows of g] = a[rows of g] · op(b[g]) (+ bias[g]).
struct GroupMArgs {
  Context ctx;
  Tensor a;      // [T, K]
  Tensor b;      // [G, N, K] (Transposed) or [G, K, N] (Plain)
  BOp op;
  Splits splits;
  Tensor out;    // [T, N]
  Tensor bias;   // [G, N] or undefined
  int64_t groups, rows, k, n;
};

/// grouped_gemm_group_k: dw[g] (+)= dy[rows of g]ᵀ · x[rows of g].
struct GroupKArgs {
  Context ctx;
  Tensor dy;     // [T, N]
  Tensor x;      // [T, K]
  Splits splits;
  Tensor dw;     // [G, N, K]
  bool accumulate;
  int64_t groups, rows, k, n;
};

/// grouped_bias_grad: db[g] (+)= column sums of dy[rows of g].
struct BiasGradArgs {
  Context ctx;
  Tensor dy;     // [T, N]
  Splits splits;
  Tensor db;     // [G, N]
  bool accumulate;
  int64_t groups, rows, n;
};

}  // namespace moekit::detail
