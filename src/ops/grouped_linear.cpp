// GroupedLinear: validation of the op's contract (SPEC §2–§3), then primitives. No backend code.
#include "moekit/ops/grouped_linear.h"

#include "core/side_stream.h"
#include "moekit/core/checks.h"
#include "moekit/core/error.h"
#include "moekit/primitives/grouped_gemm.h"

namespace moekit {

GroupedLinear::GroupedLinear(const GroupedLinearConfig& config, const Context& ctx)
    : config_(config), ctx_(ctx) {
  if (config.groups <= 0) throw_invalid("groups", "a positive group count", std::to_string(config.groups));
  if (config.in <= 0) throw_invalid("in", "a positive in_features", std::to_string(config.in));
  if (config.out <= 0) throw_invalid("out", "a positive out_features", std::to_string(config.out));
  if (!is_compute_dtype(config.dtype)) {
    throw_invalid("dtype", "f32, f16 or bf16 (fp8 needs a quantized recipe)", name(config.dtype));
  }
  weight_ = Tensor::empty({config.groups, config.out, config.in}, config.dtype, ctx);
  if (config.bias) bias_ = Tensor::empty({config.groups, config.out}, config.dtype, ctx);
}

Tensor GroupedLinear::weight(int64_t g) const { return weight_.index(g); }

void GroupedLinear::set_weight(const Tensor& weight) {
  check_input("weight", weight, {config_.groups, config_.out, config_.in}, config_.dtype,
              ctx_.device());
  weight_ = weight;
}

void GroupedLinear::set_bias(const Tensor& bias) {
  if (!config_.bias) throw_invalid("bias", "no bias (the layer was configured with bias = false)", bias.describe());
  check_input("bias", bias, {config_.groups, config_.out}, config_.dtype, ctx_.device());
  bias_ = bias;
}

void GroupedLinear::set_main_grad(const Tensor& main_grad) {
  if (main_grad.defined()) {
    check_input("main_grad", main_grad, {config_.groups, config_.out, config_.in}, DType::F32,
                ctx_.device());
  }
  main_grad_ = main_grad;
}

Tensor GroupedLinear::forward(const Tensor& x, const Splits& splits,
                              const ForwardOptions& options, Saved* saved) const {
  const Device dev = ctx_.device();
  check_input("input", x, {-1, config_.in}, config_.dtype, dev);
  const int64_t T = x.size(0);
  validate_splits(splits, config_.groups, T, dev);
  Tensor y;
  if (options.output.defined()) {
    check_caller_buffer("output", options.output, {T, config_.out}, config_.dtype, dev,
                        {{"input", x}, {"weight", weight_}, {"bias", bias_},
                         {"splits", splits.device_counts()}, {"main_grad", main_grad_}});
    y = options.output;
  } else {
    y = Tensor::empty({T, config_.out}, config_.dtype, ctx_);
  }
  grouped_gemm_group_m(ctx_, x, weight_, BOp::Transposed, splits, y, bias_);
  if (saved) *saved = Saved{x, splits, options.input_requires_grad, true};
  return y;
}

GroupedLinear::Grads GroupedLinear::backward(const Saved& saved, const Tensor& dy,
                                             const BackwardOptions& options) const {
  if (!saved.valid) throw_invalid("saved", "the context filled by forward(..., &saved)", "an empty context");
  const Device dev = ctx_.device();
  const int64_t T = saved.input.size(0);
  check_input("grad_output", dy, {T, config_.out}, config_.dtype, dev);
  check_sm_margin("deferred_sm_margin", options.deferred_sm_margin, ctx_);
  const bool need_dx = saved.input_requires_grad;
  const bool need_dw = weight_requires_grad_;
  if (options.grad_input.defined()) {
    check_buffer_written("grad_input", options.grad_input, need_dx, "the input does not require grad");
    check_caller_buffer("grad_input", options.grad_input, {T, config_.in}, config_.dtype, dev,
                        {{"grad_output", dy}, {"weight", weight_}, {"input", saved.input},
                         {"splits", saved.splits.device_counts()}, {"main_grad", main_grad_}});
  }
  if (main_grad_.defined() && need_dw) {
    // main_grad is written too: it may not alias what the call reads.
    check_caller_buffer("main_grad", main_grad_, {config_.groups, config_.out, config_.in},
                        DType::F32, dev,
                        {{"grad_output", dy}, {"weight", weight_}, {"input", saved.input},
                         {"splits", saved.splits.device_counts()}});
  }

  // Every output on this context's stream first; then the weight gradient on a side stream
  // (core/side_stream.h), beside the input gradient when there is one.
  Grads grads;
  if (need_dx) {
    grads.input = options.grad_input.defined() ? options.grad_input
                                               : Tensor::empty({T, config_.in}, config_.dtype, ctx_);
  }
  if (need_dw) {
    grads.weight = main_grad_.defined() ? main_grad_ : Tensor::empty(weight_.shape(), config_.dtype, ctx_);
    if (bias_.defined()) grads.bias = Tensor::empty(bias_.shape(), config_.dtype, ctx_);
  }
  // Joined (default): dW forked first, so its CTAs start with dx's and fill the SMs dx's last
  // wave leaves. Deferred: dx (and db) first at full width, dW after it, joined by the caller.
  auto side = std::make_unique<detail::SideStream>(ctx_, need_dx && need_dw);
  const bool defer = options.defer_weight_grads;
  auto weight_grad = [&] {
    if (need_dw) {
      const Context& on = side->fork();
      grouped_gemm_group_k(defer ? detail::deferred_context(on, options.deferred_sm_margin) : on,
                           dy, saved.input, saved.splits, grads.weight,
                           /*accumulate=*/main_grad_.defined());
    }
  };
  if (!defer) weight_grad();
  if (need_dx) grouped_gemm_group_m(ctx_, dy, weight_, BOp::Plain, saved.splits, grads.input);
  if (grads.bias.defined()) grouped_bias_grad(ctx_, dy, saved.splits, grads.bias, false);
  if (defer) {
    weight_grad();
    detail::defer(grads.weight_grads, std::move(side),
                  {dy, saved.input, saved.splits.device_counts(), grads.weight});
  } else {
    side->join();
  }
  return grads;
}

}  // namespace moekit
