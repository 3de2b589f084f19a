// Bias op (grouped, optionally prob-scaled): the op contract on the bias primitives.
#include "moekit/ops/bias.h"

#include "core/checks.h"
#include "moekit/core/error.h"
#include "moekit/primitives/grouped_bias.h"
#include "moekit/primitives/grouped_gemm.h"
#include "primitives/bind.h"

namespace moekit {

Bias::Bias(const BiasConfig& config, const Context& ctx) : config_(config), ctx_(ctx) {
  if (config.groups <= 0)
    throw_invalid("groups", "a positive group count", std::to_string(config.groups));
  if (config.features <= 0)
    throw_invalid("features", "a positive feature count", std::to_string(config.features));
  if (!is_compute_dtype(config.dtype))
    throw_invalid("dtype", "f32, f16 or bf16", name(config.dtype));
  bias_ = Tensor::empty({config.groups, config.features}, config.dtype, ctx);
}

void Bias::set_bias(const Tensor& bias) {
  check_input("bias", bias, {config_.groups, config_.features}, config_.dtype, ctx_.device());
  bias_ = bias;
}

Shape Bias::output_shape(const Shape& input, DType dtype) const {
  if (input.size() != 2 || input[1] != config_.features) {
    throw_invalid("input", str("shape [*, ", config_.features, "]"), to_string(input));
  }
  if (dtype != config_.dtype)
    throw_invalid("input", str("dtype ", name(config_.dtype)), name(dtype));
  return input;
}

BoundForward Bias::bind_forward(const Tensor& x, const ExtraInputs& in, const OpArguments&, bool,
                               std::unique_ptr<OpContext>* saved) const {
  const Device dev = ctx_.device();
  check_input("input", x, {-1, config_.features}, config_.dtype, dev);
  const int64_t T = x.size(0);
  if (config_.scale_bias) check_input("probs", in.probs, {T}, DType::F32, dev);
  validate_splits(in.splits, config_.groups, T, dev);
  Tensor y = Tensor::empty(x.shape(), config_.dtype, ctx_);
  detail::Plan plan = detail::bind_bias_add(
      ctx_, x, bias_, config_.scale_bias ? in.probs : Tensor(), in.splits, y);
  if (saved) {
    auto s = std::make_unique<Saved>();
    if (config_.scale_bias) s->probs = in.probs;
    s->splits = in.splits;
    s->rows = T;
    s->probs_requires_grad = config_.scale_bias && in.probs_requires_grad;
    s->used = std::make_shared<bool>(false);
    *saved = std::move(s);
  }
  return {y, [plan = std::move(plan)] { plan.run(); }};
}

BoundBackward Bias::bind_backward(const OpContext& saved, const Tensor& dy, const Tensor&,
                                  Tensor& dprobs, const Deferral& defer) const {
  const auto* s = dynamic_cast<const Saved*>(&saved);
  if (!s) throw_invalid("saved", "a context recorded by Bias", "another op's context");
  check_backward_once(s->used);
  check_input("grad_output", dy, {s->rows, config_.features}, config_.dtype, ctx_.device());
  ParamGrads params;
  detail::Plan plan;
  if (config_.scale_bias) {
    if (requires_grad_ || s->probs_requires_grad) {
      Tensor db = requires_grad_ ? Tensor::empty(bias_.shape(), config_.dtype, ctx_) : Tensor();
      const bool accumulate = dprobs.defined();
      Tensor dp;
      if (s->probs_requires_grad)
        dp = accumulate ? dprobs : Tensor::empty({s->rows}, DType::F32, ctx_);
      plan = detail::bind_scaled_bias_grad(ctx_, dy, s->probs, bias_, s->splits, db, dp, accumulate);
      if (dp.defined()) dprobs = dp;
      params.bias = db;
    }
  } else if (requires_grad_) {
    params.bias = Tensor::empty(bias_.shape(), config_.dtype, ctx_);
    plan = detail::bind_bias_grad(ctx_, dy, s->splits, params.bias, false);
  }
  // d(x + b)/dx is the identity: dx is dy.
  return {dy, {params}, [plan = std::move(plan), used = defer.retain_saved ? BackwardOnce() : s->used](PendingWork&) {
            if (used) *used = true;
            plan.run();
          }};
}

}  // namespace moekit
