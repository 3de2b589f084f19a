// GroupedLinearOp: GroupedLinear (unchanged) as a basic op, plus the prob-scaled bias option.
#include "moekit/ops/grouped_linear_op.h"

#include "core/checks.h"
#include "moekit/core/error.h"
#include "moekit/primitives/grouped_bias.h"
#include "primitives/bind.h"

namespace moekit {
namespace {

GroupedLinearConfig layer_config(const GroupedLinearConfig& config,
                                 const GroupedLinearOpOptions& options) {
  if (options.scale_bias && !config.bias) {
    throw_invalid("scale_bias", "a layer with a bias (config.bias = true)", "bias = false");
  }
  GroupedLinearConfig layer = config;
  if (options.scale_bias) layer.bias = false;  // the op adds the (scaled) bias itself
  return layer;
}

}  // namespace

GroupedLinearOp::GroupedLinearOp(const GroupedLinearConfig& config, const Context& ctx,
                                 const GroupedLinearOpOptions& options)
    : config_(config), options_(options), linear_(layer_config(config, options), ctx) {
  if (options.scale_bias)
    scaled_bias_ = Tensor::empty({config.groups, config.out}, config.dtype, ctx);
}

const Tensor& GroupedLinearOp::bias() const {
  return options_.scale_bias ? scaled_bias_ : linear_.bias();
}

void GroupedLinearOp::set_bias(const Tensor& bias) {
  if (!options_.scale_bias) return linear_.set_bias(bias);
  check_input("bias", bias, {config_.groups, config_.out}, config_.dtype, context().device());
  scaled_bias_ = bias;
}

Shape GroupedLinearOp::output_shape(const Shape& input, DType dtype) const {
  if (input.size() != 2 || input[1] != config_.in) {
    throw_invalid("input", str("shape [*, ", config_.in, "]"), to_string(input));
  }
  if (dtype != config_.dtype)
    throw_invalid("input", str("dtype ", name(config_.dtype)), name(dtype));
  return {input[0], config_.out};
}

std::vector<OpTensor> GroupedLinearOp::tensors() const {
  return {{"weight", linear_.weight()},
          {"bias", bias()},
          {"main_grad", linear_.main_grad(), linear_.weight_requires_grad()}};
}

BoundForward GroupedLinearOp::bind_forward(const Tensor& x, const ExtraInputs& in,
                                           const OpArguments& args, bool input_requires_grad,
                                           std::unique_ptr<OpContext>* saved) const {
  const Device dev = context().device();
  if (options_.scale_bias) {
    check_input("input", x, {-1, config_.in}, config_.dtype, dev);
    check_input("probs", in.probs, {x.size(0)}, DType::F32, dev);
    if (args.output.defined()) {
      for (const NamedTensor& t :
           {NamedTensor{"probs", in.probs}, NamedTensor{"bias", scaled_bias_}}) {
        if (overlaps(args.output, t.tensor)) {
          throw_invalid("output", "memory that overlaps no input of the call",
                        str("memory overlapping input '", t.name, "' (", t.tensor.describe(), ")"));
        }
      }
    }
  }
  auto s = saved ? std::make_unique<Saved>() : nullptr;
  BoundForward bound = linear_.bind_forward(
      x, in.splits, {.output = args.output, .input_requires_grad = input_requires_grad},
      s ? &s->linear : nullptr);
  if (options_.scale_bias) {
    detail::Plan bias = detail::bind_bias_add(context(), bound.output, scaled_bias_, in.probs,
                                              in.splits, bound.output);
    bound.run = [gemm = std::move(bound.run), bias = std::move(bias)] {
      gemm();
      bias.run();
    };
  }
  if (s) {
    if (options_.scale_bias) {
      s->probs = in.probs;
      s->probs_requires_grad = in.probs_requires_grad;
    }
    *saved = std::move(s);
  }
  return bound;
}

BoundBackward GroupedLinearOp::bind_backward(const OpContext& saved, const Tensor& dy,
                                             const Tensor& grad_input, Tensor& dprobs,
                                             const Deferral& defer) const {
  const auto* s = dynamic_cast<const Saved*>(&saved);
  if (!s) throw_invalid("saved", "a context recorded by GroupedLinearOp", "another op's context");
  BoundBackward bound = linear_.bind_backward(s->linear, dy,
                                              {.grad_input = grad_input,
                                               .defer_weight_grads = defer.weight_grads,
                                               .deferred_sm_margin = defer.sm_margin,
                                               .retain_saved = defer.retain_saved});
  if (options_.scale_bias) {
    const bool need_db = linear_.weight_requires_grad();
    if (need_db || s->probs_requires_grad) {
      const Context& ctx = context();
      Tensor db = need_db ? Tensor::empty(scaled_bias_.shape(), config_.dtype, ctx) : Tensor();
      const bool accumulate = dprobs.defined();
      Tensor dp;
      if (s->probs_requires_grad) {
        dp = accumulate ? dprobs : Tensor::empty({dy.size(0)}, DType::F32, ctx);
      }
      detail::Plan bias = detail::bind_scaled_bias_grad(ctx, dy, s->probs, scaled_bias_,
                                                        s->linear.splits, db, dp, accumulate);
      if (dp.defined()) dprobs = dp;
      bound.params[0].bias = db;
      bound.run = [linear = std::move(bound.run), bias = std::move(bias)](PendingWork& pending) {
        linear(pending);
        bias.run();
      };
    }
  }
  return bound;
}

}  // namespace moekit
