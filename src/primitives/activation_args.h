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
  const Context& ctx;
  const Tensor& h;      // [T, 2F]
  const Tensor& probs;  // [T] f32 or undefined (p_t = 1)
  const Splits& splits;
  GluLayout layout;
  const Tensor& z;  // [T, F]
  int64_t rows, f;
};

/// grouped_gemm_swiglu: h = x·w_gᵀ (+ bias_g) per group, then z = swiglu(h, probs).
struct GemmSwigluArgs {
  const Context& ctx;
  const Tensor& x;      // [T, K]
  const Tensor& w;      // [G, 2F, K]
  const Splits& splits;
  const Tensor& bias;   // [G, 2F] or undefined
  const Tensor& probs;  // [T] f32 or undefined
  GluLayout layout;
  const Tensor& h;  // [T, 2F]
  const Tensor& z;  // [T, F]
  int64_t groups, rows, k, f;
};

/// grouped_gemm_dswiglu: dz = dy·w_g per group, then swiglu_backward(h, probs, dz).
struct GemmDSwigluArgs {
  const Context& ctx;
  const Tensor& dy;     // [T, H]
  const Tensor& w;      // [G, H, F]
  const Splits& splits;
  const Tensor& h;      // [T, 2F]
  const Tensor& probs;  // [T] f32 or undefined
  GluLayout layout;
  const Tensor& dh;      // [T, 2F]
  const Tensor& dprobs;  // [T] f32 or undefined
  bool accumulate_dprobs;
  int64_t groups, rows, k, f;  // k = H (the GEMM's reduction), f = F (its N)
};

/// swiglu_backward: dh (da, db in h's layout) and optionally dprobs (written or accumulated).
struct SwigluBackwardArgs {
  const Context& ctx;
  const Tensor& h;      // [T, 2F]
  const Tensor& probs;  // [T] f32 or undefined
  const Tensor& dz;     // [T, F]
  const Splits& splits;
  GluLayout layout;
  const Tensor& dh;      // [T, 2F]
  const Tensor& dprobs;  // [T] f32 or undefined
  bool accumulate_dprobs;
  int64_t rows, f;
};

/// grouped_bias_add: out[t] = x[t] + s_t · bias[g(t)] (out may be x).
struct BiasAddArgs {
  const Context& ctx;
  const Tensor& x;      // [T, N]
  const Tensor& bias;   // [G, N]
  const Tensor& probs;  // [T] f32 or undefined (s_t = 1)
  const Splits& splits;
  const Tensor& out;  // [T, N]
  int64_t groups, rows, n;
};

/// grouped_scaled_bias_grad: db[g] = Σ p_t·dy[t]; dprobs[t] (+)= dy[t]·bias[g(t)].
struct ScaledBiasGradArgs {
  const Context& ctx;
  const Tensor& dy;     // [T, N]
  const Tensor& probs;  // [T] f32
  const Tensor& bias;   // [G, N]
  const Splits& splits;
  const Tensor& db;      // [G, N] or undefined
  const Tensor& dprobs;  // [T] f32 or undefined
  bool accumulate_dprobs;
  int64_t groups, rows, n;
};

}  // namespace moekit::detail
