// Internal: the argument bundles of the activation and grouped-bias primitives (already
// validated), as passed to their backends. Row counts: `rows` = T (rows presented); the backend
// finds S = Σ splits itself (device counts are read on the device).
#pragma once

#include <cstdint>

#include "moekit/core/context.h"
#include "moekit/core/splits.h"
#include "moekit/core/tensor.h"
#include "moekit/primitives/activation.h"

namespace moekit::detail {

/// swiglu_forward: z[t] = p_t · silu(a[t]) ⊙ b[t] for t in [0, S).
struct SwigluForwardArgs {
  Context ctx;
  Tensor h;      // [T, 2F]
  Tensor probs;  // [T] f32 or undefined (p_t = 1)
  Splits splits;
  GluLayout layout;
  Tensor z;  // [T, F]
  int64_t rows, f;
};

/// grouped_gemm_swiglu: h = x·w_gᵀ (+ bias_g) per group, then z = swiglu(h, probs).
struct GemmSwigluArgs {
  Context ctx;
  Tensor x;      // [T, K]
  Tensor w;      // [G, 2F, K]
  Splits splits;
  Tensor bias;   // [G, 2F] or undefined
  Tensor probs;  // [T] f32 or undefined
  GluLayout layout;
  Tensor h;  // [T, 2F]
  Tensor z;  // [T, F]
  int64_t groups, rows, k, f;
};

/// grouped_gemm_dswiglu: dz = dy·w_g per group, then swiglu_backward(h, probs, dz).
struct GemmDSwigluArgs {
  Context ctx;
  Tensor dy;     // [T, H]
  Tensor w;      // [G, H, F]
  Splits splits;
  Tensor h;      // [T, 2F]
  Tensor probs;  // [T] f32 or undefined
  GluLayout layout;
  Tensor dh;      // [T, 2F]
  Tensor dprobs;  // [T] f32 or undefined
  bool accumulate_dprobs;
  int64_t groups, rows, k, f;  // k = H (the GEMM's reduction), f = F (its N)
};

/// swiglu_backward: dh (da, db in h's layout) and optionally dprobs (written or accumulated).
struct SwigluBackwardArgs {
  Context ctx;
  Tensor h;      // [T, 2F]
  Tensor probs;  // [T] f32 or undefined
  Tensor dz;     // [T, F]
  Splits splits;
  GluLayout layout;
  Tensor dh;      // [T, 2F]
  Tensor dprobs;  // [T] f32 or undefined
  bool accumulate_dprobs;
  int64_t rows, f;
};

/// grouped_bias_add: out[t] = x[t] + s_t · bias[g(t)] (out may be x).
struct BiasAddArgs {
  Context ctx;
  Tensor x;      // [T, N]
  Tensor bias;   // [G, N]
  Tensor probs;  // [T] f32 or undefined (s_t = 1)
  Splits splits;
  Tensor out;  // [T, N]
  int64_t groups, rows, n;
};

/// grouped_scaled_bias_grad: db[g] = Σ p_t·dy[t]; dprobs[t] (+)= dy[t]·bias[g(t)].
struct ScaledBiasGradArgs {
  Context ctx;
  Tensor dy;     // [T, N]
  Tensor probs;  // [T] f32
  Tensor bias;   // [G, N]
  Splits splits;
  Tensor db;      // [G, N] or undefined
  Tensor dprobs;  // [T] f32 or undefined
  bool accumulate_dprobs;
  int64_t groups, rows, n;
};

}  // namespace moekit::detail
