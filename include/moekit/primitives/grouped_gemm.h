// moekit/primitives/grouped_gemm.h — grouped GEMMs over rows grouped by expert, and bias grads.
//
// These are the backend-neutral primitives that ops are written on. Each validates its arguments
// (host metadata only) in one place, then dispatches to the first backend of its table that
// accepts the call (CUDA: sm90 kernels, then cuBLAS; CPU: CBLAS). Context::with_backend() or the
// environment variable MOEKIT_BACKEND forces one; when none accepts, the Unsupported error lists
// each backend's reason.
//
// Notation: splits give m_g rows to group g, off_g = sum_{j<g} m_j, S = sum m_g <= T.
// Accumulation is fp32 for every input dtype; rows [S, T) of row-grouped outputs are never
// written; empty groups launch no work.
#pragma once

#include "moekit/core/context.h"
#include "moekit/core/splits.h"
#include "moekit/core/tensor.h"

namespace moekit {

/// How the per-group matrix B_g enters a group-M GEMM.
enum class BOp {
  Transposed,  // B [G, N, K]: out_g = a_g · B_gᵀ   (fprop: B = weight [G, out, in])
  Plain,       // B [G, K, N]: out_g = a_g · B_g    (dgrad: B = weight [G, out, in], a = dy)
};

/// Group-M GEMM ("m-grouped, contiguous"): for each g,
///   out[off_g : off_g+m_g, :] = a[off_g : off_g+m_g, :] · op(B_g)  (+ bias[g, :])
/// a: [T, K], b: see BOp, out: [T, N] contiguous, bias: [G, N] or undefined.
/// a, b, out, bias share one compute dtype (f32, f16, bf16); out must not overlap a, b or bias.
void grouped_gemm_group_m(const Context& ctx, const Tensor& a, const Tensor& b, BOp op,
                          const Splits& splits, const Tensor& out, const Tensor& bias = {});

/// Group-K GEMM ("k-grouped"; the weight gradient): for each g,
///   dw[g] = dy[off_g : off_g+m_g, :]ᵀ · x[off_g : off_g+m_g, :]      (accumulate = false)
///   dw[g] += (same)                                                  (accumulate = true)
/// dy: [T, N], x: [T, K] (same compute dtype), dw: [G, N, K] contiguous, in the compute dtype or
/// f32 (f32 is required when accumulating: the Megatron main_grad). A group with m_g = 0 gets
/// exactly 0 (or is left unchanged when accumulating).
void grouped_gemm_group_k(const Context& ctx, const Tensor& dy, const Tensor& x,
                          const Splits& splits, const Tensor& dw, bool accumulate);

/// Grouped bias gradient: db[g, :] = sum over group g's rows of dy (fp32 accumulation), or
/// db[g, :] += that sum when accumulating (db must then be f32). dy: [T, N]; db: [G, N].
void grouped_bias_grad(const Context& ctx, const Tensor& dy, const Splits& splits,
                       const Tensor& db, bool accumulate);

}  // namespace moekit
