// Internal: the primitives' bind functions (ARCHITECTURE.md "Bind once, run below"). Each checks
// every argument (host metadata only) and chooses every backend the call will use, before any
// work; the returned Plan's run() only queues the work. The public primitives
// (moekit/primitives/*.h) are bind(...).run(); an op binds every primitive of a call first, then
// runs them, so a call that fails writes nothing.
#pragma once

#include "moekit/primitives/activation.h"
#include "moekit/primitives/grouped_bias.h"
#include "moekit/primitives/grouped_gemm.h"
#include "moekit/primitives/quantize.h"
#include "moekit/primitives/router.h"
#include "backends/contract/backend_table.h"

namespace moekit::detail {

Plan bind_group_m(const Context& ctx, const Tensor& a, const Tensor& b, BOp op,
                  const Splits& splits, const Tensor& out, const Tensor& bias = {});
Plan bind_group_k(const Context& ctx, const Tensor& dy, const Tensor& x, const Splits& splits,
                  const Tensor& dw, bool accumulate);
Plan bind_bias_grad(const Context& ctx, const Tensor& dy, const Splits& splits, const Tensor& db,
                    bool accumulate);
Plan bind_bias_add(const Context& ctx, const Tensor& x, const Tensor& bias, const Tensor& probs,
                   const Splits& splits, const Tensor& out);
Plan bind_scaled_bias_grad(const Context& ctx, const Tensor& dy, const Tensor& probs,
                           const Tensor& bias, const Splits& splits, const Tensor& db,
                           const Tensor& dprobs, bool accumulate_dprobs);
Plan bind_swiglu_forward(const Context& ctx, const Tensor& h, const Tensor& probs,
                         const Splits& splits, GluLayout layout, const Tensor& z);
Plan bind_swiglu_backward(const Context& ctx, const Tensor& h, const Tensor& probs,
                          const Tensor& dz, const Splits& splits, GluLayout layout,
                          const Tensor& dh, const Tensor& dprobs, bool accumulate_dprobs);
Plan bind_gemm_swiglu(const Context& ctx, const Tensor& x, const Tensor& w, const Splits& splits,
                      const Tensor& bias, const Tensor& probs, GluLayout layout, const Tensor& h,
                      const Tensor& z);
Plan bind_gemm_dswiglu(const Context& ctx, const Tensor& dy, const Tensor& w,
                       const Splits& splits, const Tensor& h, const Tensor& probs,
                       GluLayout layout, const Tensor& dh, const Tensor& dprobs,
                       bool accumulate_dprobs);

/// Quantize x into q (allocated by allocate_quantized for x's shape and the splits' groups). With
/// db ([G, C], not accumulated): also db[g] = the column sums of group g's rows of x, the bias
/// gradient of a layer whose output gradient x is — from the quantize's own read of x where its
/// kernel can (the GPU's one-read fp8-current and fp8-block kernels), else by grouped_bias_grad's.
Plan bind_quantize(const Context& ctx, const Tensor& x, const Splits& splits,
                   const QuantizedTensor& q, const Tensor& db = {});
Plan bind_group_m_quantized(const Context& ctx, const QuantizedTensor& a, const QuantizedTensor& b,
                            BOp op, const Splits& splits, const Tensor& out, const Tensor& bias = {});
Plan bind_group_k_quantized(const Context& ctx, const QuantizedTensor& dy, const QuantizedTensor& x,
                            const Splits& splits, const Tensor& dw, bool accumulate);

/// The router (moekit/primitives/router.h). The backward allocates the CUDA entry's [T, E] fp64
/// d-logits workspace here, at bind.
Plan bind_router_topk(const Context& ctx, const Tensor& x, const Tensor& gate,
                      const RouterOptions& options, const Tensor& topk_idx,
                      const Tensor& topk_weights, const Tensor& scores);
Plan bind_router_topk_backward(const Context& ctx, const Tensor& x, const Tensor& gate,
                               const Tensor& scores, const Tensor& topk_idx,
                               const Tensor& grad_topk_weights, const Tensor& grad_expert_input,
                               const RouterOptions& options, const Tensor& grad_gate,
                               const Tensor& grad_input);

}  // namespace moekit::detail
