// moekit/primitives/router.h — the MoE router: logits, scores and top-k of each token, and the
// router's backward (SPEC §7, the MoE layer).
//
// Math, per token t (x [T, H], gate Wg [E, H], both in one compute dtype f32 / f16 / bf16):
//   logits  l_e = Σ_h x[t, h]·Wg[e, h]          fp64, h ascending (a sequential dot, no tree)
//   scores  s = softmax(l) or sigmoid(l)         fp64; softmax: m = max l, z = Σ_e exp(l_e − m)
//                                                (e ascending), s_e = exp(l_e − m) / z
//   top-k   e_0..e_{k-1}: the k largest s_e in descending order, ties broken by the lower e
//   weights w_j = s_{e_j}, or s_{e_j} / Σ_i s_{e_i} (normalize), rounded once to f32
// Backward, from g_j = d w_j (f32) and dx_e [T, H] (the gradient of x through the experts):
//   d s_{e_j} = g_j, or (g_j − Σ_i g_i·s_{e_i}/Z) / Z with Z = Σ_i s_{e_i} (normalize); 0 elsewhere
//   d l_e     = s_e·(d s_e − Σ_e' d s_e'·s_e') (softmax), d s_e·s_e·(1 − s_e) (sigmoid)
//   dWg[e, h] = Σ_t d l[t, e]·x[t, h]            (t ascending), rounded once to the dtype
//   dx[t, h]  = dx_e[t, h] + Σ_e d l[t, e]·Wg[e, h]   (e ascending), rounded once to the dtype
// Every sum is fp64 in the stated order with no fused multiply-add, on every backend, so the CPU
// and CUDA entries compute the same logits bit for bit; they differ only by the fp64 exp (glibc's
// vs the device's, each within one fp64 ulp), which changes a top-k choice only when two scores
// lie within an fp64 ulp or so of each other, and a weight or gradient only when that ulp moves
// its final rounding to f32 / the dtype. Results do not depend on T (each token's routing is its
// own), so they are the same for every world size of expert parallelism.
//
// Why not a GEMM for the logits: moekit's GEMM primitives write the compute dtype (bf16 logits
// would tie and flip top-k choices the fp64 router of the CPU never makes) and sum in an order
// each backend chooses. An fp64 router keeps one routing on every device. Cost: T·E·H fp64 FMAs
// (4096 tokens × 128 experts × 7168: ~4 GFLOP fp64, ~0.1–0.3 ms on an H200); a tensor-core logits
// path with an f32 output is the optimisation when that matters (SPEC §7).
//
// No host synchronisation on any backend (capturable on CUDA); T = 0 does nothing.
#pragma once

#include <cstdint>

#include "moekit/core/context.h"
#include "moekit/core/tensor.h"

namespace moekit {

enum class RouterScore { Softmax, Sigmoid };

struct RouterOptions {
  int64_t topk = 1;  // k, 1 ≤ k ≤ E
  RouterScore score = RouterScore::Softmax;
  bool normalize = false;  // weights divided by the sum of the k chosen scores
};

/// Forward: topk_idx [T, k] i64, topk_weights [T, k] f32 and scores [T, E] — the fp64 scores for
/// the backward, stored in an i64 tensor (moekit has no f64 dtype; the bytes are IEEE doubles).
/// x [T, H], gate [E, H]: one compute dtype, contiguous, on ctx's device; every output a
/// contiguous buffer on ctx's device overlapping no input or other output.
void router_topk(const Context& ctx, const Tensor& x, const Tensor& gate,
                 const RouterOptions& options, const Tensor& topk_idx, const Tensor& topk_weights,
                 const Tensor& scores);

/// Backward: grad_gate [E, H] and grad_input [T, H] (both in x's dtype) from the forward's scores
/// and topk_idx, grad_topk_weights [T, k] f32 and grad_expert_input [T, H] (dx_e, x's dtype;
/// undefined: 0). grad_input may be grad_expert_input itself (the same view: updated in place);
/// otherwise no output overlaps an input or the other output.
void router_topk_backward(const Context& ctx, const Tensor& x, const Tensor& gate,
                          const Tensor& scores, const Tensor& topk_idx,
                          const Tensor& grad_topk_weights, const Tensor& grad_expert_input,
                          const RouterOptions& options, const Tensor& grad_gate,
                          const Tensor& grad_input);

}  // namespace moekit
