// The router primitives (moekit/primitives/router.h): validation in one place, then dispatch to
// the first backend of the table that accepts (CUDA: src/backends/cuda/router.cu; CPU:
// src/backends/cpu/cpu_router.cpp).
#include "moekit/primitives/router.h"

#include "backends/contract/backend_table.h"
#include "backends/contract/router_args.h"
#include "backends/cpu/cpu_router.h"
#include "core/checks.h"
#include "moekit/core/error.h"
#include "primitives/bind.h"
#ifdef MOEKIT_HAS_CUDA
#include "backends/cuda/cuda_router.h"
#endif

namespace moekit {
namespace {
using detail::Backend;

const Backend<detail::RouterTopkArgs> kRouterTopk[] = {
#ifdef MOEKIT_HAS_CUDA
    cuda::kRouterTopk,
#endif
    cpu::kRouterTopk,
};
const Backend<detail::RouterTopkBackwardArgs> kRouterTopkBackward[] = {
#ifdef MOEKIT_HAS_CUDA
    cuda::kRouterTopkBackward,
#endif
    cpu::kRouterTopkBackward,
};
const detail::RegisterBackendNames kRegisterRouterTopk(kRouterTopk);
const detail::RegisterBackendNames kRegisterRouterTopkBackward(kRouterTopkBackward);

bool same_view(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.data() == b.data() && a.shape() == b.shape() &&
         a.strides() == b.strides() && a.dtype() == b.dtype() && a.device() == b.device();
}

struct RouterShape {
  int64_t T, H, E;
};

// x [T, H] and gate [E, H] in one compute dtype on ctx's device; 1 ≤ k ≤ E.
RouterShape check_router_inputs(const Context& ctx, const Tensor& x, const Tensor& gate,
                                const RouterOptions& o) {
  const Device dev = ctx.device();
  if (!x.defined() || x.dim() != 2) throw_invalid("x", "a 2-D tensor [T, H]", x.describe());
  if (!is_compute_dtype(x.dtype())) throw_invalid("x", "dtype f32, f16 or bf16", name(x.dtype()));
  if (!gate.defined() || gate.dim() != 2)
    throw_invalid("gate", "a 2-D tensor [E, H]", gate.describe());
  const RouterShape s{x.size(0), x.size(1), gate.size(0)};
  check_input("x", x, {s.T, s.H}, x.dtype(), dev);
  check_input("gate", gate, {s.E, s.H}, x.dtype(), dev);
  if (s.E < 1) throw_invalid("gate", "at least one expert (E >= 1)", gate.describe());
  if (o.topk < 1 || o.topk > s.E)
    throw_invalid("topk", str("1 <= topk <= E = ", s.E), std::to_string(o.topk));
  return s;
}

}  // namespace

detail::Plan detail::bind_router_topk(const Context& ctx, const Tensor& x, const Tensor& gate,
                                      const RouterOptions& options, const Tensor& topk_idx,
                                      const Tensor& topk_weights, const Tensor& scores) {
  const RouterShape s = check_router_inputs(ctx, x, gate, options);
  const Device dev = ctx.device();
  const int64_t k = options.topk;
  check_caller_buffer("topk_idx", topk_idx, {s.T, k}, DType::I64, dev, {{"x", x}, {"gate", gate}});
  check_caller_buffer("topk_weights", topk_weights, {s.T, k}, DType::F32, dev,
                      {{"x", x}, {"gate", gate}, {"topk_idx", topk_idx}});
  check_caller_buffer(
      "scores", scores, {s.T, s.E}, DType::I64, dev,
      {{"x", x}, {"gate", gate}, {"topk_idx", topk_idx}, {"topk_weights", topk_weights}});
  return detail::bind<detail::RouterTopkArgs>(
      "router_topk", kRouterTopk, ctx,
      {ctx, x, gate, options, topk_idx, topk_weights, scores, s.T, s.H, s.E});
}

void router_topk(const Context& ctx, const Tensor& x, const Tensor& gate,
                 const RouterOptions& options, const Tensor& topk_idx, const Tensor& topk_weights,
                 const Tensor& scores) {
  detail::bind_router_topk(ctx, x, gate, options, topk_idx, topk_weights, scores).run();
}

detail::Plan detail::bind_router_topk_backward(
    const Context& ctx, const Tensor& x, const Tensor& gate, const Tensor& scores,
    const Tensor& topk_idx, const Tensor& grad_topk_weights, const Tensor& grad_expert_input,
    const RouterOptions& options, const Tensor& grad_gate, const Tensor& grad_input) {
  const RouterShape s = check_router_inputs(ctx, x, gate, options);
  const Device dev = ctx.device();
  const int64_t k = options.topk;
  const DType dt = x.dtype();
  check_input("scores", scores, {s.T, s.E}, DType::I64, dev);
  check_input("topk_idx", topk_idx, {s.T, k}, DType::I64, dev);
  check_input("grad_topk_weights", grad_topk_weights, {s.T, k}, DType::F32, dev);
  if (grad_expert_input.defined())
    check_input("grad_expert_input", grad_expert_input, {s.T, s.H}, dt, dev);
  check_caller_buffer("grad_gate", grad_gate, {s.E, s.H}, dt, dev,
                      {{"x", x},
                       {"gate", gate},
                       {"scores", scores},
                       {"topk_idx", topk_idx},
                       {"grad_topk_weights", grad_topk_weights},
                       {"grad_expert_input", grad_expert_input}});
  // grad_input may be grad_expert_input itself (in place), and overlaps nothing else.
  const Tensor none;
  check_caller_buffer(
      "grad_input", grad_input, {s.T, s.H}, dt, dev,
      {{"x", x},
       {"gate", gate},
       {"scores", scores},
       {"topk_idx", topk_idx},
       {"grad_topk_weights", grad_topk_weights},
       {"grad_expert_input", same_view(grad_input, grad_expert_input) ? none : grad_expert_input},
       {"grad_gate", grad_gate}});
  // The CUDA entry's d logits [T, E] fp64, between its kernels (the CPU keeps one row at a time).
  Tensor grad_logits;
  if (dev.is_cuda()) grad_logits = Tensor::empty({s.T, s.E}, DType::I64, ctx);
  return detail::bind<detail::RouterTopkBackwardArgs>(
      "router_topk_backward", kRouterTopkBackward, ctx,
      {ctx, x, gate, scores, topk_idx, grad_topk_weights, grad_expert_input, options, grad_gate,
       grad_input, grad_logits, s.T, s.H, s.E});
}

void router_topk_backward(const Context& ctx, const Tensor& x, const Tensor& gate,
                          const Tensor& scores, const Tensor& topk_idx,
                          const Tensor& grad_topk_weights, const Tensor& grad_expert_input,
                          const RouterOptions& options, const Tensor& grad_gate,
                          const Tensor& grad_input) {
  detail::bind_router_topk_backward(ctx, x, gate, scores, topk_idx, grad_topk_weights,
                                    grad_expert_input, options, grad_gate, grad_input)
      .run();
}

}  // namespace moekit
