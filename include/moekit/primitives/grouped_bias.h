// moekit/primitives/grouped_bias.h — per-group bias, optionally scaled by a per-row weight.
//
// Rows are grouped by expert (splits: m_g rows for group g, off_g = Σ_{j<g} m_j, S = Σ m_g ≤ T);
// g(t) is the group of row t. With routing probs p [T] (fp32) or without them (s_t = 1):
//   add    out[t, :] = x[t, :] + s_t · bias[g(t), :]                           out [T, N]
//   grad   db[g, :]  = Σ_{t in g} p_t · dy[t, :]          (fp32 accumulation)   db  [G, N]
//          dp_t      = Σ_n dy[t, n] · bias[g(t), n]       (fp32, n in order)    dp  [T] f32
// The scaled form is fc2's bias in the grouped MLP (SPEC §5: y = z·W2ᵀ + p_t·b2_g); the
// unscaled bias gradient is grouped_bias_grad() in grouped_gemm.h.
// Only rows [0, S) are read or written; rows [S, T) of out and dp are never written. Math is fp32
// with one rounding into the output dtype. Validation (host metadata only) before any work, then
// backend dispatch (see grouped_gemm.h).
#pragma once

#include "moekit/core/context.h"
#include "moekit/core/splits.h"
#include "moekit/core/tensor.h"

namespace moekit {

/// out = x + s ⊙ bias[group] on rows [0, S). x, out: [T, N] and bias: [G, N] share one compute
/// dtype; probs: [T] f32 or undefined (s_t = 1). `out` may be `x` itself (in place: same data and
/// shape); otherwise it must not overlap x, bias or probs.
void grouped_bias_add(const Context& ctx, const Tensor& x, const Tensor& bias, const Tensor& probs,
                      const Splits& splits, const Tensor& out);

/// Gradients of out = x + p ⊙ bias[group] with respect to the bias and the probs:
///   db[g] = Σ_{t in g} p_t·dy[t] (db defined: written, in db's dtype — the compute dtype or f32);
///   dp_t  = Σ_n dy[t, n]·bias[g(t), n] (dprobs defined: written, or added to what it holds when
///           accumulate_dprobs — the row sum is formed first, then added once).
/// dy: [T, N] compute dtype, probs: [T] f32, bias: [G, N] in dy's dtype. At least one of db,
/// dprobs is defined; zero-row groups get db_g = 0.
void grouped_scaled_bias_grad(const Context& ctx, const Tensor& dy, const Tensor& probs,
                              const Tensor& bias, const Splits& splits, const Tensor& db,
                              const Tensor& dprobs, bool accumulate_dprobs);

}  // namespace moekit
