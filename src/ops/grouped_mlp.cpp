// GroupedMLP: the fused fc1 → scaled SwiGLU → fc2 (SPEC §5), written on primitives only.
//
// It calls the same primitives, in the same order and with the same arguments, as the unfused
// Sequential of its three ops (GroupedLinear's forward/backward, ScaledSwiGLU's, and
// GroupedLinearOp's prob-scaled bias) — each part on its own op's context — so on a backend the
// fused and unfused results are bit-identical. What fusion buys is that the whole block is one
// op: validation happens once up front, the intermediates h [T, 2F] and z [T, F] are private (no
// caller buffers, nothing else may hold them), and a GPU backend can replace a sequence of these
// calls by fused kernels without touching the ops. Today: fc1 + activation go through
// grouped_gemm_swiglu (on sm90 with the Interleaved32 layout, SwiGLU in fc1's GEMM epilogue; its
// h and z have the bits of the two separate calls) when fc1 and the activation share a context;
// in backward, fc2's dgrad + activation backward go through grouped_gemm_dswiglu (on sm90 with
// Interleaved32, the SwiGLU backward in fc2's dgrad epilogue: dz never leaves registers, dh is
// bit-identical, dprobs equal up to the order of its fp32 additions).
#include "moekit/ops/grouped_mlp.h"

#include <string_view>

#include <span>

#include "core/side_stream.h"
#include "core/checks.h"
#include "moekit/core/error.h"
#include "moekit/ops/fusion.h"
#include "moekit/primitives/activation.h"
#include "moekit/primitives/grouped_bias.h"
#include "moekit/primitives/grouped_gemm.h"
#include "primitives/bind.h"

namespace moekit {
namespace {

GroupedLinearConfig fc1_config(const GroupedMLPConfig& c) {
  return {.groups = c.groups,
          .in = c.hidden,
          .out = 2 * c.ffn,
          .dtype = c.dtype,
          .bias = c.fc1_bias,
          .recipe = c.recipe};
}
GroupedLinearConfig fc2_config(const GroupedMLPConfig& c) {
  return {.groups = c.groups,
          .in = c.ffn,
          .out = c.hidden,
          .dtype = c.dtype,
          .bias = c.fc2_bias,
          .recipe = c.recipe};
}

bool same_recipe(const Recipe& a, const Recipe& b) {
  return a.kind == b.kind && a.fp8_format == b.fp8_format && a.power_2_scales == b.power_2_scales &&
         a.amax_epsilon == b.amax_epsilon && a.margin == b.margin;
}

// Where a layer's weight gradient goes, as in GroupedLinear::backward: its main_grad (added
// into) or a new tensor on the layer's context.
Tensor weight_grad_buffer(const GroupedLinear& layer) {
  if (layer.main_grad().defined()) return layer.main_grad();
  return Tensor::empty(layer.weight().shape(), layer.config().dtype, layer.context());
}

// The weight gradient of a layer exactly as GroupedLinear::backward computes it, bound on `ctx`
// (the layer's context or its side stream).
detail::Plan bind_weight_grad(const Context& ctx, const GroupedLinear& layer, const Tensor& dy,
                              const Tensor& x, const Splits& splits, const Tensor& dw) {
  return detail::bind_group_k(ctx, dy, x, splits, dw, /*accumulate=*/layer.main_grad().defined());
}

// What a bound backward of the grouped MLP runs: its two side streams and the calls bound.
struct MlpBackwardWork {
  std::unique_ptr<detail::SideStream> side1, side2;
  detail::Plan quantize2, dw2, dz, db2, dswiglu, quantize1, dw1, dx, db1;  // quantize*: recipes
  bool defer = false;
  int sm_margin = 0;  // deferred weight gradients leave this many SMs (BackwardOptions)
  std::vector<Tensor> held2, held1;
  // Where a weight gradient runs: its side stream; deferred, with the options' SM margin
  // (detail::deferred_context).
  Context on(const detail::SideStream& side) const {
    return defer ? detail::deferred_context(side.context(), sm_margin) : side.context();
  }
  BackwardOnce used;
};

// The work of one bound backward: whether deferred, and each layer's side stream (fc2's when it
// has a weight gradient; fc1's when its weight gradient runs beside dx or deferred).
std::shared_ptr<MlpBackwardWork> backward_work(const GroupedLinear& l1, const GroupedLinear& l2,
                                               bool input_requires_grad,
                                               const GroupedMLP::BackwardOptions& options) {
  auto w = std::make_shared<MlpBackwardWork>();
  w->defer = options.defer_weight_grads;
  w->sm_margin = options.deferred_sm_margin;
  w->side2 = std::make_unique<detail::SideStream>(l2.context(), l2.weight_requires_grad());
  w->side1 = std::make_unique<detail::SideStream>(
      l1.context(), l1.weight_requires_grad() && (w->defer || input_requires_grad));
  return w;
}

// The bound backward of the grouped MLP from its bound calls: every output on its op's stream,
// each layer's weight gradient on its side stream (forked once what it reads exists: dy's copies
// for fc2, dh or its copies for fc1), joined at the end — or, deferred, after the input-gradient
// chain, joined by the caller's handle.
BoundBackward finish_backward(const std::shared_ptr<MlpBackwardWork>& w, const GroupedMLP::Grads& grads) {
  BoundBackward bound;
  bound.input = grads.input;
  bound.params = {grads.fc1, ParamGrads{}, grads.fc2};
  bound.probs = grads.probs;
  bound.run = [w](PendingWork& pending) {
    if (w->used) *w->used = true;
    auto fc2_weight_grad = [&] {
      if (w->dw2.empty()) return;
      w->side2->fork();
      w->dw2.run();
    };
    auto fc1_weight_grad = [&] {
      if (w->dw1.empty()) return;
      w->side1->fork();
      w->dw1.run();
    };
    w->quantize2.run();
    if (!w->defer) fc2_weight_grad();
    w->dz.run();
    w->db2.run();
    w->dswiglu.run();
    w->quantize1.run();
    if (!w->defer) fc1_weight_grad();
    w->dx.run();
    w->db1.run();
    if (w->defer) {
      fc2_weight_grad();
      fc1_weight_grad();
      detail::defer(pending, std::move(w->side2), std::move(w->held2));
      detail::defer(pending, std::move(w->side1), std::move(w->held1));
    } else {
      w->side1->join();
      w->side2->join();
    }
  };
  return bound;
}

}  // namespace

GroupedMLP::GroupedMLP(const GroupedMLPConfig& config, const Context& ctx)
    : GroupedMLP(
          std::make_shared<GroupedLinearOp>(fc1_config(config), ctx),
          std::make_shared<ScaledSwiGLU>(SwiGLUConfig{.layout = config.layout}, ctx),
          std::make_shared<GroupedLinearOp>(
              fc2_config(config), ctx, GroupedLinearOpOptions{.scale_bias = config.fc2_bias})) {}

GroupedMLP::GroupedMLP(std::shared_ptr<GroupedLinearOp> fc1,
                       std::shared_ptr<ScaledSwiGLU> activation,
                       std::shared_ptr<GroupedLinearOp> fc2)
    : fc1_(std::move(fc1)), act_(std::move(activation)), fc2_(std::move(fc2)) {
  if (!fc1_ || !act_ || !fc2_) throw_invalid("ops", "three non-null ops", "a null op");
  const std::string reason = mismatch(*fc1_, *act_, *fc2_);
  if (!reason.empty()) throw_invalid("ops", "fc1 → ScaledSwiGLU → fc2 of a grouped MLP", reason);
}


bool GroupedMLP::quantized() const { return fc1_->config().recipe.enabled(); }

std::string GroupedMLP::mismatch(const Op& fc1_op, const Op& act_op, const Op& fc2_op) {
  const auto* fc1 = dynamic_cast<const GroupedLinearOp*>(&fc1_op);
  const auto* act = dynamic_cast<const ScaledSwiGLU*>(&act_op);
  const auto* fc2 = dynamic_cast<const GroupedLinearOp*>(&fc2_op);
  if (!fc1) return str("fc1 is a ", fc1_op.kind(), ", not a GroupedLinear");
  if (!act) return str("the activation is a ", act_op.kind(), ", not a ScaledSwiGLU");
  if (!fc2) return str("fc2 is a ", fc2_op.kind(), ", not a GroupedLinear");
  const GroupedLinearConfig &c1 = fc1->config(), &c2 = fc2->config();
  if (c1.groups != c2.groups) return str("fc1 has ", c1.groups, " groups, fc2 ", c2.groups);
  if (c1.out != 2 * c2.in) {
    return str("fc1 out_features (", c1.out, ") is not 2 × fc2 in_features (2 × ", c2.in, ")");
  }
  if (c1.dtype != c2.dtype) return str("fc1 is ", name(c1.dtype), ", fc2 ", name(c2.dtype));
  if (!same_recipe(c1.recipe, c2.recipe)) {
    return str("fc1 has recipe ", c1.recipe.name(), ", fc2 ", c2.recipe.name(),
               " (or other options): a fused grouped MLP runs one recipe on both layers (the ops "
               "run unfused, each with its recipe)");
  }
  if (!(fc1->context().device() == fc2->context().device()) ||
      !(fc1->context().device() == act->context().device())) {
    return "the ops are on different devices";
  }
  if (fc1->scale_bias()) return "fc1 has a prob-scaled bias (the grouped MLP's b1 is plain)";
  if (c2.bias && !fc2->scale_bias()) {
    return "fc2 has a plain bias; the grouped MLP's b2 is scaled by the routing prob "
           "(GroupedLinearOpOptions::scale_bias)";
  }
  if (act->config().layout == GluLayout::Interleaved32 && c1.out % (2 * kGluInterleaveBlock) != 0) {
    return str("fc1 out_features (", c1.out, ") is not a multiple of ", 2 * kGluInterleaveBlock,
               " as the interleaved GLU layout requires");
  }
  return "";
}

BoundForward GroupedMLP::bind_forward(const Tensor& x, const Tensor& probs,
                                      const Splits& given_splits, const ForwardOptions& options,
                                      Saved* saved) const {
  const GroupedLinear &l1 = fc1_->linear(), &l2 = fc2_->linear();
  const Device dev = context().device();
  const DType dt = dtype();
  const int64_t F = ffn();
  // ---- validation, host metadata only, before any work
  check_input("input", x, {-1, in_features()}, dt, dev);
  const int64_t T = x.size(0);
  check_input("probs", probs, {T}, DType::F32, dev);
  validate_splits(given_splits, groups(), T, dev);
  if (options.output.defined()) {
    check_caller_buffer("output", options.output, {T, out_features()}, dt, dev,
                        {{"input", x},
                         {"probs", probs},
                         {"splits", given_splits.device_counts()},
                         {"fc1 weight", l1.weight()},
                         {"fc1 bias", fc1_->bias()},
                         {"fc2 weight", l2.weight()},
                         {"fc2 bias", fc2_->bias()},
                         {"fc1 main_grad", l1.main_grad()},
                         {"fc2 main_grad", l2.main_grad()}});
  }
  if (quantized()) return bind_forward_quantized(x, probs, given_splits, options, saved);
  // ---- fc1: h = x·W1ᵀ + b1 (as GroupedLinear::forward), then the activation:
  //      z = p ⊙ silu(a) ⊙ b (as ScaledSwiGLU::forward) — one primitive when they share a context
  // Resolved once: every kernel of the forward and (through saved) of the backward reads one copy.
  const Splits splits = resolve_splits(context(), given_splits);
  Tensor h = Tensor::empty({T, 2 * F}, dt, l1.context());
  Tensor z = Tensor::empty({T, F}, dt, act_->context());
  detail::Plan plan;
  if (l1.context().same_context(act_->context())) {
    plan = detail::bind_gemm_swiglu(l1.context(), x, l1.weight(), splits, l1.bias(), probs,
                                    layout(), h, z);
  } else {
    plan = detail::bind_group_m(l1.context(), x, l1.weight(), BOp::Transposed, splits, h, l1.bias());
    plan.then(detail::bind_swiglu_forward(act_->context(), h, probs, splits, layout(), z));
  }
  // ---- fc2: y = z·W2ᵀ, then + p ⊙ b2 in place (as GroupedLinearOp with scale_bias)
  Tensor y = options.output.defined() ? options.output
                                      : Tensor::empty({T, out_features()}, dt, l2.context());
  plan.then(detail::bind_group_m(l2.context(), z, l2.weight(), BOp::Transposed, splits, y, l2.bias()));
  if (fc2_->scale_bias()) {
    plan.then(detail::bind_bias_add(l2.context(), y, fc2_->bias(), probs, splits, y));
  }
  if (saved) {
    saved->input = x;
    saved->h = h;
    saved->z = z;
    saved->probs = probs;
    saved->splits = splits;
    saved->input_requires_grad = options.input_requires_grad;
    saved->probs_requires_grad = options.probs_requires_grad;
    saved->valid = true;
    saved->used = std::make_shared<bool>(false);
  }
  return {y, [plan = std::move(plan)] { plan.run(); }};
}

Tensor GroupedMLP::forward(const Tensor& x, const Tensor& probs, const Splits& splits,
                           const ForwardOptions& options, Saved* saved) const {
  Saved s;
  BoundForward bound = bind_forward(x, probs, splits, options, saved ? &s : nullptr);
  bound.run();
  if (saved) *saved = std::move(s);
  return bound.output;
}

// The backward's outputs: dprobs (the caller's grad_probs, else new), each layer's weight
// gradient (its main_grad, else new) and bias gradients, dx (the caller's grad_input, else new) —
// each only when asked for.
GroupedMLP::Grads GroupedMLP::backward_outputs(const Saved& s, const BackwardOptions& options) const {
  const GroupedLinear &l1 = fc1_->linear(), &l2 = fc2_->linear();
  const DType dt = dtype();
  const int64_t T = s.input.size(0);
  Grads grads;
  if (s.probs_requires_grad) {
    grads.probs = options.grad_probs.defined() ? options.grad_probs
                                               : Tensor::empty({T}, DType::F32, context());
  }
  const bool dw2 = l2.weight_requires_grad(), dw1 = l1.weight_requires_grad();
  if (dw2) grads.fc2.weight = weight_grad_buffer(l2);
  if (dw2 && fc2_->scale_bias()) grads.fc2.bias = Tensor::empty(fc2_->bias().shape(), dt, l2.context());
  if (dw1) grads.fc1.weight = weight_grad_buffer(l1);
  if (dw1 && l1.bias().defined()) grads.fc1.bias = Tensor::empty(l1.bias().shape(), dt, l1.context());
  if (s.input_requires_grad) {
    grads.input = options.grad_input.defined() ? options.grad_input
                                               : Tensor::empty({T, in_features()}, dt, l1.context());
  }
  return grads;
}

BoundBackward GroupedMLP::bind_backward(const Saved& s, const Tensor& dy,
                                        const BackwardOptions& options) const {
  if (!s.valid)
    throw_invalid("saved", "the context filled by forward(..., &saved)", "an empty context");
  check_backward_once(s.used);
  const GroupedLinear &l1 = fc1_->linear(), &l2 = fc2_->linear();
  const Device dev = context().device();
  const DType dt = dtype();
  const int64_t T = s.input.size(0);
  // ---- validation, host metadata only, before any work
  check_input("grad_output", dy, {T, out_features()}, dt, dev);
  check_sm_margin("deferred_sm_margin", options.deferred_sm_margin, context());
  // Every buffer the call writes (grad_input, grad_probs, each main_grad it accumulates into)
  // against everything the call reads and the other buffers it writes.
  auto check_written = [&](const char* name, const Tensor& buffer, const Shape& shape, DType type) {
    auto other = [&](const char* n, const Tensor& t) {
      return std::string_view(name) == n ? Tensor() : t;
    };
    check_caller_buffer(name, buffer, shape, type, dev,
                        {{"grad_output", dy},
                         {"input", s.input},
                         {"probs", s.probs},
                         {"splits", s.splits.device_counts()},
                         {"fc1 weight", l1.weight()},
                         {"fc1 bias", fc1_->bias()},
                         {"fc2 weight", l2.weight()},
                         {"fc2 bias", fc2_->bias()},
                         {"fc1 main_grad", other("fc1 main_grad", l1.main_grad())},
                         {"fc2 main_grad", other("fc2 main_grad", l2.main_grad())},
                         {"grad_input", other("grad_input", options.grad_input)},
                         {"grad_probs", other("grad_probs", options.grad_probs)}});
  };
  if (options.grad_input.defined()) {
    check_buffer_written("grad_input", options.grad_input, s.input_requires_grad,
                         "the input does not require grad");
    check_written("grad_input", options.grad_input, {T, in_features()}, dt);
  }
  const bool accumulate_dp = options.grad_probs.defined();
  if (accumulate_dp) {
    check_buffer_written("grad_probs", options.grad_probs, s.probs_requires_grad,
                         "the probs do not require grad");
    check_written("grad_probs", options.grad_probs, {T}, DType::F32);
  }
  for (const GroupedLinear* l : {&l1, &l2}) {
    if (l->main_grad().defined() && l->weight_requires_grad()) {
      check_written(l == &l1 ? "fc1 main_grad" : "fc2 main_grad", l->main_grad(),
                    l->weight().shape(), DType::F32);
    }
  }

  if (quantized()) return bind_backward_quantized(s, dy, options);
  // Every output on its op's stream first. Then, as GroupedLinear::backward does, each layer's
  // weight gradient on a side stream (core/side_stream.h) beside the input-gradient chain:
  // fc2's beside fc2's dgrad and the activation's backward, fc1's (once dh exists) beside fc1's
  // dgrad; both joined at the end. Deferred: the whole input-gradient chain first, then both
  // weight gradients after it, joined by the caller's handle. Everything is bound here, before
  // any of it runs.
  Grads grads = backward_outputs(s, options);
  const bool dw2 = l2.weight_requires_grad(), dw1 = l1.weight_requires_grad();
  Tensor dh = Tensor::empty({T, 2 * ffn()}, dt, act_->context());
  const auto w = backward_work(l1, l2, s.input_requires_grad, options);
  if (dw2) w->dw2 = bind_weight_grad(w->on(*w->side2), l2, dy, s.z, s.splits, grads.fc2.weight);
  if (dw1) w->dw1 = bind_weight_grad(w->on(*w->side1), l1, dh, s.input, s.splits, grads.fc1.weight);

  bool dp_written = accumulate_dp;
  // ---- fc2 (as GroupedLinear::backward, then the scaled bias as GroupedLinearOp) and the
  //      activation (as ScaledSwiGLU::backward). When fc2 and the activation share a context,
  //      fc2's input gradient and the activation's backward are one primitive
  //      (grouped_gemm_dswiglu), which runs after the bias gradient so that dprobs gets the
  //      bias part first, as in the unfused order.
  const bool one_call = l2.context().same_context(act_->context());
  Tensor dz;
  if (!one_call) {
    dz = Tensor::empty({T, ffn()}, dt, l2.context());
    w->dz = detail::bind_group_m(l2.context(), dy, l2.weight(), BOp::Plain, s.splits, dz);
  }
  if (fc2_->scale_bias() && (dw2 || s.probs_requires_grad)) {
    w->db2 = detail::bind_scaled_bias_grad(l2.context(), dy, s.probs, fc2_->bias(), s.splits,
                                           grads.fc2.bias, grads.probs, dp_written);
    dp_written = dp_written || grads.probs.defined();
  }
  if (one_call) {
    w->dswiglu = detail::bind_gemm_dswiglu(l2.context(), dy, l2.weight(), s.splits, s.h, s.probs,
                                           layout(), dh, grads.probs, dp_written);
  } else {
    w->dswiglu = detail::bind_swiglu_backward(act_->context(), s.h, s.probs, dz, s.splits,
                                              layout(), dh, grads.probs, dp_written);
  }
  // ---- fc1 (as GroupedLinear::backward)
  if (s.input_requires_grad) {
    w->dx = detail::bind_group_m(l1.context(), dh, l1.weight(), BOp::Plain, s.splits, grads.input);
  }
  if (grads.fc1.bias.defined()) {
    w->db1 = detail::bind_bias_grad(l1.context(), dh, s.splits, grads.fc1.bias, false);
  }
  const Tensor counts = s.splits.device_counts();
  const Tensor copy = s.splits.device_copy();
  w->held2 = {dy, s.z, counts, copy, grads.fc2.weight};
  w->held1 = {dh, s.input, counts, copy, grads.fc1.weight};
  if (!options.retain_saved) w->used = s.used;

  return finish_backward(w, grads);
}

// With a recipe: the same calls as the unfused quantized ops (GroupedLinear with the recipe,
// ScaledSwiGLU), each on its op's context, so every result equals the quantized ops one by one;
// the op quantizes x and z itself and keeps only the copies the backward reads (z is not saved).
// SwiGLU fused into z's quantize (and its backward into dh's) was measured slower than the two
// kernels on Hopper and is not built (design/PERFORMANCE.md, "The quantized grouped MLP").
BoundForward GroupedMLP::bind_forward_quantized(const Tensor& x, const Tensor& probs,
                                                const Splits& given_splits,
                                                const ForwardOptions& options, Saved* saved) const {
  const GroupedLinear &l1 = fc1_->linear(), &l2 = fc2_->linear();
  const Recipe& recipe = l1.config().recipe;
  l1.check_recipe_rows(given_splits);
  const Splits splits = resolve_splits(context(), given_splits);
  const int64_t T = x.size(0), F = ffn(), G = groups();
  const bool train = saved != nullptr;
  // The copies a backward reads (as GroupedLinear::bind_forward chooses them).
  detail::Plan plan;
  // ---- fc1: h = x·W1ᵀ + b1 on quantized x and W1
  const QuantizedTensor x_q = allocate_quantized(l1.context(), recipe.spec(QuantRole::Input), x.dtype(),
                                                 T, in_features(), G, usage_for(true, train && l1.weight_requires_grad()));
  plan.then(detail::bind_quantize(l1.context(), x, splits, x_q));
  const QuantizedTensor w1_q = l1.bind_quantized_weight(plan, usage_for(true, train && options.input_requires_grad));
  Tensor h = Tensor::empty({T, 2 * F}, dtype(), l1.context());
  plan.then(detail::bind_group_m_quantized(l1.context(), x_q, w1_q, BOp::Transposed, splits, h, l1.bias()));
  // ---- the activation, then fc2's input copies: z = p ⊙ silu(a) ⊙ b, quantized
  const QuantizedTensor z_q = allocate_quantized(l2.context(), recipe.spec(QuantRole::Input), dtype(),
                                                 T, F, G, usage_for(true, train && l2.weight_requires_grad()));
  const Tensor z = Tensor::empty({T, F}, dtype(), act_->context());
  plan.then(detail::bind_swiglu_forward(act_->context(), h, probs, splits, layout(), z));
  plan.then(detail::bind_quantize(l2.context(), z, splits, z_q));
  // ---- fc2: y = z·W2ᵀ, then + p ⊙ b2 in place
  const QuantizedTensor w2_q = l2.bind_quantized_weight(plan, usage_for(true, train));
  Tensor y = options.output.defined() ? options.output
                                      : Tensor::empty({T, out_features()}, dtype(), l2.context());
  plan.then(detail::bind_group_m_quantized(l2.context(), z_q, w2_q, BOp::Transposed, splits, y, l2.bias()));
  if (fc2_->scale_bias()) {
    plan.then(detail::bind_bias_add(l2.context(), y, fc2_->bias(), probs, splits, y));
  }
  if (saved) {
    saved->input = x;
    saved->h = h;
    saved->probs = probs;
    saved->splits = splits;
    saved->input_requires_grad = options.input_requires_grad;
    saved->probs_requires_grad = options.probs_requires_grad;
    saved->x_q = x_q;
    saved->z_q = z_q;
    saved->w1_q = w1_q;
    saved->w2_q = w2_q;
    saved->valid = true;
    saved->used = std::make_shared<bool>(false);
  }
  return {y, [plan = std::move(plan)] { plan.run(); }};
}

// With a recipe: the bf16 path's calls (bind_backward) with each GEMM on quantized operands — dy
// and dh quantized for their layer (rowwise for the input gradient, columnwise for the weight
// gradient), z's and x's columnwise copies from the forward.
BoundBackward GroupedMLP::bind_backward_quantized(const Saved& s, const Tensor& dy,
                                                  const BackwardOptions& options) const {
  const GroupedLinear &l1 = fc1_->linear(), &l2 = fc2_->linear();
  const Recipe& recipe = l1.config().recipe;
  const DType dt = dtype();
  const int64_t T = s.input.size(0), F = ffn(), G = groups();
  const bool accumulate_dp = options.grad_probs.defined();
  Grads grads = backward_outputs(s, options);
  const bool dw2 = l2.weight_requires_grad(), dw1 = l1.weight_requires_grad();
  const auto w = backward_work(l1, l2, s.input_requires_grad, options);
  // ---- fc2: dy quantized (rowwise for dz, columnwise for dW2); the scaled bias's gradients
  const QuantizedTensor dy_q = allocate_quantized(l2.context(), recipe.spec(QuantRole::GradOutput), dt,
                                                  T, out_features(), G, usage_for(true, dw2));
  w->quantize2 = detail::bind_quantize(l2.context(), dy, s.splits, dy_q);
  if (dw2) {
    w->dw2 = detail::bind_group_k_quantized(w->on(*w->side2), dy_q, s.z_q, s.splits,
                                            grads.fc2.weight, l2.main_grad().defined());
  }
  const Tensor dz = Tensor::empty({T, F}, dt, l2.context());
  w->dz = detail::bind_group_m_quantized(l2.context(), dy_q, s.w2_q, BOp::Plain, s.splits, dz);
  bool dp_written = accumulate_dp;
  if (fc2_->scale_bias() && (dw2 || s.probs_requires_grad)) {
    w->db2 = detail::bind_scaled_bias_grad(l2.context(), dy, s.probs, fc2_->bias(), s.splits,
                                           grads.fc2.bias, grads.probs, dp_written);
    dp_written = dp_written || grads.probs.defined();
  }
  // ---- the activation's backward, then fc1's grad_output copies of dh
  const Tensor dh = Tensor::empty({T, 2 * F}, dt, act_->context());
  w->dswiglu = detail::bind_swiglu_backward(act_->context(), s.h, s.probs, dz, s.splits, layout(),
                                            dh, grads.probs, dp_written);
  QuantizedTensor dh_q;
  if (dw1 || s.input_requires_grad) {
    dh_q = allocate_quantized(l1.context(), recipe.spec(QuantRole::GradOutput), dt, T, 2 * F, G,
                              usage_for(s.input_requires_grad, dw1));
    // db1 (defined only with dW1, so dh is quantized whenever it is) from the same read of dh.
    w->quantize1 = detail::bind_quantize(l1.context(), dh, s.splits, dh_q, grads.fc1.bias);
  }
  if (dw1) {
    w->dw1 = detail::bind_group_k_quantized(w->on(*w->side1), dh_q, s.x_q, s.splits,
                                            grads.fc1.weight, l1.main_grad().defined());
  }
  if (s.input_requires_grad) {
    w->dx = detail::bind_group_m_quantized(l1.context(), dh_q, s.w1_q, BOp::Plain, s.splits, grads.input);
  }
  const Tensor counts = s.splits.device_counts();
  const Tensor copy = s.splits.device_copy();
  w->held2 = {counts, copy, grads.fc2.weight};
  w->held1 = {counts, copy, grads.fc1.weight};
  auto hold = [](std::vector<Tensor>& held, const QuantizedTensor& q) {  // what a deferred dW reads
    if (q.has_columnwise()) held.insert(held.end(), {q.columnwise, q.columnwise_scale_inv, q.group_scale_inv});
  };
  hold(w->held2, dy_q);
  hold(w->held2, s.z_q);
  hold(w->held1, dh_q);
  hold(w->held1, s.x_q);
  if (!options.retain_saved) w->used = s.used;
  return finish_backward(w, grads);
}

GroupedMLP::Grads GroupedMLP::backward(const Saved& s, const Tensor& dy,
                                       const BackwardOptions& options) const {
  BoundBackward bound = bind_backward(s, dy, options);
  Grads grads{bound.input, bound.probs, bound.params[0], bound.params[2], {}};
  bound.run(grads.weight_grads);
  return grads;
}

}  // namespace moekit

// ---------------------------------------------------------------- the fusion (ops/fusion.h)
namespace moekit {
namespace {

class GroupedMLPFusion final : public FusedOp {
 public:
  explicit GroupedMLPFusion(std::shared_ptr<const GroupedMLP> mlp) : mlp_(std::move(mlp)) {}

  std::string_view kind() const override { return "GroupedMLP"; }
  int64_t size() const override { return 3; }
  std::string accepts(OpArgument argument, int64_t index) const override {
    if (argument == OpArgument::Output) {
      return index == 2 ? "" : "'output' only on fc2 (the last op) of a fused grouped MLP";
    }
    return index == 0 ? "" : "'grad_input' only on fc1 (the first op) of a fused grouped MLP";
  }
  std::string role(int64_t index) const override {
    static constexpr const char* kRole[] = {"fc1", "the activation", "fc2"};
    return kRole[index];
  }
  BoundForward bind_forward(const Tensor& x, const ExtraInputs& in,
                            std::span<const OpArguments> args, bool input_requires_grad,
                            std::unique_ptr<OpContext>* saved) const override {
    const GroupedMLP::ForwardOptions options{.output = args[2].output,
                                             .input_requires_grad = input_requires_grad,
                                             .probs_requires_grad = in.probs_requires_grad};
    auto s = saved ? std::make_unique<GroupedMLP::Saved>() : nullptr;
    BoundForward bound = mlp_->bind_forward(x, in.probs, in.splits, options, s.get());
    if (saved) *saved = std::move(s);
    return bound;
  }
  BoundBackward bind_backward(const OpContext& saved, const Tensor& dy,
                              std::span<const Tensor> grad_inputs, Tensor& dprobs,
                              const Deferral& defer) const override {
    const auto* s = dynamic_cast<const GroupedMLP::Saved*>(&saved);
    if (!s) throw_invalid("saved", "a context recorded by GroupedMLP", "another op's context");
    BoundBackward bound = mlp_->bind_backward(*s, dy,
                                              {.grad_input = grad_inputs[0],
                                               .grad_probs = dprobs,
                                               .defer_weight_grads = defer.weight_grads,
                                               .deferred_sm_margin = defer.sm_margin,
                                               .retain_saved = defer.retain_saved});
    if (bound.probs.defined()) dprobs = bound.probs;
    return bound;
  }

 private:
  std::shared_ptr<const GroupedMLP> mlp_;
};

std::shared_ptr<const FusedOp> match_grouped_mlp(std::span<const OpHandle> ops) {
  if (ops.size() < 3 || !GroupedMLP::mismatch(*ops[0], *ops[1], *ops[2]).empty()) return nullptr;
  return std::make_shared<GroupedMLPFusion>(std::make_shared<const GroupedMLP>(
      std::dynamic_pointer_cast<GroupedLinearOp>(ops[0]),
      std::dynamic_pointer_cast<ScaledSwiGLU>(ops[1]),
      std::dynamic_pointer_cast<GroupedLinearOp>(ops[2])));
}

// The library's fusion, registered when the library loads.
const bool kGroupedMLPRegistered = [] {
  register_fusion("GroupedMLP", match_grouped_mlp);
  return true;
}();

}  // namespace
}  // namespace moekit
