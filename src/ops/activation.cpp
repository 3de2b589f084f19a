// SwiGLU / ScaledSwiGLU ops: the op contract (SPEC §4–§5) on the activation primitives.
#include "moekit/ops/activation.h"

#include "core/checks.h"
#include "moekit/core/error.h"
#include "primitives/bind.h"

namespace moekit {
namespace {

Shape glu_output_shape(const Shape& input, DType dtype, GluLayout layout) {
  if (input.size() != 2) throw_invalid("input", "a 2-D tensor [T, 2F]", to_string(input));
  if (!is_compute_dtype(dtype)) throw_invalid("input", "dtype f32, f16 or bf16", name(dtype));
  const int64_t width = input[1];
  if (width % 2 != 0) {
    throw_invalid("input", "an even column count 2F (gate and linear parts)",
                  str(width, " columns"));
  }
  if (layout == GluLayout::Interleaved32 && width % (2 * kGluInterleaveBlock) != 0) {
    throw_invalid("input",
                  str("2F a multiple of ", 2 * kGluInterleaveBlock,
                      " for the interleaved GLU layout (blocks of ", kGluInterleaveBlock,
                      " gate and ", kGluInterleaveBlock, " linear columns)"),
                  str("2F = ", width));
  }
  return {input[0], width / 2};
}

void check_input_tensor(const Tensor& h, Device dev) {
  if (!h.defined() || h.dim() != 2) throw_invalid("input", "a 2-D tensor [T, 2F]", h.describe());
  check_input("input", h, {h.size(0), h.size(1)}, h.dtype(), dev);
}

template <class Saved>
const Saved& saved_of(const OpContext& saved, std::string_view op) {
  const auto* s = dynamic_cast<const Saved*>(&saved);
  if (!s) throw_invalid("saved", str("a context recorded by ", op), "another op's context");
  return *s;
}

}  // namespace

// ---------------------------------------------------------------- SwiGLU
SwiGLU::SwiGLU(const SwiGLUConfig& config, const Context& ctx) : config_(config), ctx_(ctx) {}

Shape SwiGLU::output_shape(const Shape& input, DType dtype) const {
  return glu_output_shape(input, dtype, config_.layout);
}

BoundForward SwiGLU::bind_forward(const Tensor& h, const ExtraInputs& in, const OpArguments&, bool,
                                  std::unique_ptr<OpContext>* saved) const {
  check_input_tensor(h, ctx_.device());
  const Shape out = output_shape(h.shape(), h.dtype());
  Tensor z = Tensor::empty(out, h.dtype(), ctx_);
  detail::Plan plan = detail::bind_swiglu_forward(ctx_, h, Tensor(), in.splits, config_.layout, z);
  if (saved) {
    auto s = std::make_unique<Saved>();
    s->input = h;
    s->splits = in.splits;
    s->used = std::make_shared<bool>(false);
    *saved = std::move(s);
  }
  return {z, [plan = std::move(plan)] { plan.run(); }};
}

BoundBackward SwiGLU::bind_backward(const OpContext& saved, const Tensor& dz, const Tensor&,
                                    Tensor&, const Deferral& defer) const {
  const Saved& s = saved_of<Saved>(saved, "SwiGLU");
  if (!s.input.defined()) {
    throw_invalid("saved", "the context filled by forward(..., &saved)", "an empty context");
  }
  check_backward_once(s.used);
  Tensor dh = Tensor::empty(s.input.shape(), s.input.dtype(), ctx_);
  detail::Plan plan = detail::bind_swiglu_backward(ctx_, s.input, Tensor(), dz, s.splits,
                                                   config_.layout, dh, Tensor(), false);
  return {dh, {ParamGrads{}}, [plan = std::move(plan), used = defer.retain_saved ? BackwardOnce() : s.used](PendingWork&) {
            if (used) *used = true;
            plan.run();
          }};
}

Tensor SwiGLU::forward(const Tensor& h, const Splits& splits, Saved* saved) const {
  std::unique_ptr<OpContext> context;
  BoundForward bound = bind_forward(h, {.splits = splits}, {}, true, saved ? &context : nullptr);
  bound.run();
  if (saved) *saved = static_cast<Saved&>(*context);
  return bound.output;
}

Tensor SwiGLU::backward(const Saved& saved, const Tensor& dz) const {
  Tensor none;
  return op_backward(saved, dz, Tensor(), none, {}).input;
}

// ---------------------------------------------------------------- ScaledSwiGLU
ScaledSwiGLU::ScaledSwiGLU(const SwiGLUConfig& config, const Context& ctx)
    : config_(config), ctx_(ctx) {}

Shape ScaledSwiGLU::output_shape(const Shape& input, DType dtype) const {
  return glu_output_shape(input, dtype, config_.layout);
}

BoundForward ScaledSwiGLU::bind_forward(const Tensor& h, const ExtraInputs& in,
                                        const OpArguments&, bool,
                                        std::unique_ptr<OpContext>* saved) const {
  check_input_tensor(h, ctx_.device());
  const Shape out = output_shape(h.shape(), h.dtype());
  check_input("probs", in.probs, {h.size(0)}, DType::F32, ctx_.device());
  Tensor z = Tensor::empty(out, h.dtype(), ctx_);
  detail::Plan plan = detail::bind_swiglu_forward(ctx_, h, in.probs, in.splits, config_.layout, z);
  if (saved) {
    auto s = std::make_unique<Saved>();
    s->input = h;
    s->probs = in.probs;
    s->splits = in.splits;
    s->probs_requires_grad = in.probs_requires_grad;
    s->valid = true;
    s->used = std::make_shared<bool>(false);
    *saved = std::move(s);
  }
  return {z, [plan = std::move(plan)] { plan.run(); }};
}

BoundBackward ScaledSwiGLU::bind_backward(const OpContext& saved, const Tensor& dz, const Tensor&,
                                          Tensor& dprobs, const Deferral& defer) const {
  const Saved& s = saved_of<Saved>(saved, "ScaledSwiGLU");
  if (!s.valid) {
    throw_invalid("saved", "the context filled by forward(..., &saved)", "an empty context");
  }
  check_backward_once(s.used);
  const int64_t T = s.input.size(0);
  Tensor dh = Tensor::empty(s.input.shape(), s.input.dtype(), ctx_);
  const bool accumulate = dprobs.defined();
  if (accumulate) {  // checked before anything is written (a failed call writes nothing)
    check_buffer_written("grad_probs", dprobs, s.probs_requires_grad,
                         "the probs do not require grad");
    check_caller_buffer("grad_probs", dprobs, {T}, DType::F32, ctx_.device(),
                        {{"grad_output", dz},
                         {"input", s.input},
                         {"probs", s.probs},
                         {"splits", s.splits.device_counts()}});
  }
  Tensor dp;
  if (s.probs_requires_grad) dp = accumulate ? dprobs : Tensor::empty({T}, DType::F32, ctx_);
  detail::Plan plan = detail::bind_swiglu_backward(ctx_, s.input, s.probs, dz, s.splits,
                                                   config_.layout, dh, dp, accumulate);
  if (dp.defined()) dprobs = dp;
  return {dh, {ParamGrads{}}, [plan = std::move(plan), used = defer.retain_saved ? BackwardOnce() : s.used](PendingWork&) {
            if (used) *used = true;
            plan.run();
          }};
}

Tensor ScaledSwiGLU::forward(const Tensor& h, const Tensor& probs, const Splits& splits,
                             const ForwardOptions& options, Saved* saved) const {
  std::unique_ptr<OpContext> context;
  BoundForward bound =
      bind_forward(h, {.splits = splits, .probs = probs, .probs_requires_grad = options.probs_requires_grad},
                   {}, true, saved ? &context : nullptr);
  bound.run();
  if (saved) *saved = static_cast<Saved&>(*context);
  return bound.output;
}

ScaledSwiGLU::Grads ScaledSwiGLU::backward(const Saved& saved, const Tensor& dz,
                                           const BackwardOptions& options) const {
  Tensor dprobs = options.grad_probs;
  Tensor dh = op_backward(saved, dz, Tensor(), dprobs, {}).input;
  return {dh, dprobs};
}

}  // namespace moekit
