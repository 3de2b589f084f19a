// moekit/primitives/activation.h — SwiGLU activation primitives over rows grouped by expert.
//
// h [T, 2F] holds, per row, a gate part `a` [F] and a linear part `b` [F] in one of two column
// layouts (GluLayout). With routing probs p [T] (fp32; "scaled SwiGLU", SPEC §5) or without them
// (plain SwiGLU, p_t = 1):
//   forward   z[t, j]  = p_t · silu(a[t, j]) · b[t, j]                           z  [T, F]
//   backward  da[t, j] = p_t · dz[t, j] · b[t, j] · silu'(a[t, j])                dh [T, 2F],
//             db[t, j] = p_t · dz[t, j] · silu(a[t, j])                              h's layout
//             dp_t     = Σ_j dz[t, j] · silu(a[t, j]) · b[t, j]                  dp [T] f32
// with silu(a) = a·σ(a) and silu'(a) = σ(a)·(1 + a·(1 − σ(a))).
//
// Only valid rows are touched: S = Σ splits (the backend computes it; the group structure itself
// does not matter to an elementwise op), rows [0, S) are read and written, rows [S, T) of z, dh and
// dp are never written. Math is fp32 for every dtype with one rounding into the output dtype; the
// dp row sum runs over j in order (fp32), so results are bit-reproducible on a backend.
// Validation (host metadata only) happens before any work; then the first backend of the
// primitive's table that accepts the call runs (see grouped_gemm.h for the dispatch rules).
#pragma once

#include <cstdint>
#include <string_view>

#include "moekit/core/context.h"
#include "moekit/core/splits.h"
#include "moekit/core/tensor.h"

namespace moekit {

/// Column layout of the gate (a) and linear (b) parts in a GLU input h [T, 2F].
enum class GluLayout {
  Halves,         // h = [a | b]: a_j at column j, b_j at column F + j (default; TE's SwiGLU)
  Interleaved32,  // blocks of 32 columns alternating gate, linear: a_j at column 64·⌊j/32⌋ + j%32,
                  // b_j 32 columns further (TE's glu_interleave_size = 32: one GEMM tile of fc1
                  // then holds matching gate and linear columns). Requires 2F % 64 == 0.
};
inline constexpr int64_t kGluInterleaveBlock = 32;

/// "halves" or "interleaved32".
std::string_view name(GluLayout layout);

/// Column of h holding a_j (gate) / b_j (linear) for a GLU of width F (h has 2F columns).
constexpr int64_t glu_gate_column(int64_t j, int64_t /*F*/, GluLayout layout) {
  if (layout == GluLayout::Halves) return j;
  return 2 * kGluInterleaveBlock * (j / kGluInterleaveBlock) + j % kGluInterleaveBlock;
}
constexpr int64_t glu_linear_column(int64_t j, int64_t F, GluLayout layout) {
  if (layout == GluLayout::Halves) return F + j;
  return glu_gate_column(j, F, layout) + kGluInterleaveBlock;
}

/// SwiGLU forward: z = p ⊙ silu(a) ⊙ b on rows [0, S).
/// h: [T, 2F] (f32, f16 or bf16), probs: [T] f32 or undefined (plain SwiGLU), z: [T, F] in h's
/// dtype, contiguous, overlapping no input. Interleaved32 requires 2F % 64 == 0.
void swiglu_forward(const Context& ctx, const Tensor& h, const Tensor& probs, const Splits& splits,
                    GluLayout layout, const Tensor& z);

/// SwiGLU backward on rows [0, S): dh (da and db in h's layout) and, when `dprobs` is defined,
/// dp_t = Σ_j dz[t, j]·silu(a[t, j])·b[t, j] — written (accumulate_dprobs = false) or added to
/// what dprobs holds (accumulate_dprobs = true; the sum is formed first, then added once).
/// h: [T, 2F], probs: [T] f32 or undefined, dz: [T, F] in h's dtype, dh: [T, 2F] in h's dtype,
/// dprobs: [T] f32 or undefined (requires probs). dh and dprobs overlap no input and each other.
void swiglu_backward(const Context& ctx, const Tensor& h, const Tensor& probs, const Tensor& dz,
                     const Splits& splits, GluLayout layout, const Tensor& dh, const Tensor& dprobs,
                     bool accumulate_dprobs);

/// fc1 of a grouped MLP and its activation in one call:
///   h = x·w_gᵀ (+ bias_g) per group   exactly as grouped_gemm_group_m(ctx, x, w, BOp::Transposed,
///                                       splits, h, bias), then
///   z = p ⊙ silu(a) ⊙ b               exactly as swiglu_forward(ctx, h, probs, splits, layout, z).
/// x: [T, K], w: [G, 2F, K], bias: [G, 2F] or undefined (all one compute dtype), probs: [T] f32 or
/// undefined, h: [T, 2F] and z: [T, F] in that dtype, contiguous, overlapping no input nor each
/// other. Both outputs are written on rows [0, S) only. Where the GEMM runs on the sm90 kernels
/// (automatic choice, or "sm90" forced) and the layout is GluLayout::Interleaved32 (one 64-column
/// epilogue subtile then holds whole gate/linear pairs), z is computed in the GEMM's epilogue:
/// one launch, no second pass over h, and h and z bit-identical to the two calls. Otherwise the
/// two primitives run one after the other, each choosing its backend.
void grouped_gemm_swiglu(const Context& ctx, const Tensor& x, const Tensor& w,
                         const Splits& splits, const Tensor& bias, const Tensor& probs,
                         GluLayout layout, const Tensor& h, const Tensor& z);

/// fc2's input gradient in a grouped MLP and the activation's backward in one call:
///   dz = dy·w_g per group                as grouped_gemm_group_m(ctx, dy, w, BOp::Plain, splits,
///                                        dz) — not returned: only the activation needs it —
///   dh, dprobs from h, probs and dz      as swiglu_backward(ctx, h, probs, dz, splits, layout,
///                                        dh, dprobs, accumulate_dprobs).
/// dy: [T, H], w: [G, H, F] (fc2's weight), h: [T, 2F], dh: [T, 2F] (one compute dtype), probs /
/// dprobs: [T] f32 or undefined (dprobs requires probs); dh and dprobs overlap no input nor each
/// other. Where the GEMM runs on the sm90 kernels and the layout is Interleaved32, dz lives in the
/// GEMM's registers only and dh and dprobs are computed in its epilogue: dh bit-identical to the
/// two calls, dprobs equal up to the order of its fp32 additions (the epilogue sums per
/// 128-column tile, then the tiles in order). Otherwise the two calls run with a temporary dz.
void grouped_gemm_dswiglu(const Context& ctx, const Tensor& dy, const Tensor& w,
                          const Splits& splits, const Tensor& h, const Tensor& probs,
                          GluLayout layout, const Tensor& dh, const Tensor& dprobs,
                          bool accumulate_dprobs);

}  // namespace moekit
