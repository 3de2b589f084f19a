// GroupedLinearOp: GroupedLinear (unchanged) as a basic op, plus the prob-scaled bias option.
#include "moekit/ops/grouped_linear_op.h"

#include "moekit/core/checks.h"
#include "moekit/core/error.h"
#include "moekit/primitives/grouped_bias.h"

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
  return {{"weight", linear_.weight()}, {"bias", bias()}, {"main_grad", linear_.main_grad()}};
}

Tensor GroupedLinearOp::op_forward(const Tensor& x, const ExtraInputs& in, const OpArguments& args,
                                   bool input_requires_grad,
                                   std::unique_ptr<OpContext>* saved) const {
  const Device dev = context().device();
  if (options_.scale_bias) {
    // Checked before the GEMM writes anything (a failed call writes nothing).
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
  Tensor y = linear_.forward(x, in.splits,
                             {.output = args.output, .input_requires_grad = input_requires_grad},
                             s ? &s->linear : nullptr);
  if (options_.scale_bias) grouped_bias_add(context(), y, scaled_bias_, in.probs, in.splits, y);
  if (s) {
    if (options_.scale_bias) {
      s->probs = in.probs;
      s->probs_requires_grad = in.probs_requires_grad;
    }
    *saved = std::move(s);
  }
  return y;
}

OpGrads GroupedLinearOp::op_backward(const OpContext& saved, const Tensor& dy,
                                     const Tensor& grad_input, Tensor& dprobs,
                                     const Deferral& defer) const {
  const auto* s = dynamic_cast<const Saved*>(&saved);
  if (!s) throw_invalid("saved", "a context recorded by GroupedLinearOp", "another op's context");
  GroupedLinear::Grads g = linear_.backward(s->linear, dy,
                                            {.grad_input = grad_input,
                                             .defer_weight_grads = defer.weight_grads,
                                             .deferred_sm_margin = defer.sm_margin});
  OpGrads grads{g.input, {g.weight, g.bias}, std::move(g.weight_grads)};
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
      grouped_scaled_bias_grad(ctx, dy, s->probs, scaled_bias_, s->linear.splits, db, dp,
                               accumulate);
      if (dp.defined()) dprobs = dp;
      grads.params.bias = db;
    }
  }
  return grads;
}

}  // namespace moekit
