// SwiGLU / ScaledSwiGLU ops: the op contract (SPEC §4–§5) on the activation primitives.
#include "moekit/ops/activation.h"

#include "moekit/core/checks.h"
#include "moekit/core/error.h"

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

}  // namespace

// ---------------------------------------------------------------- SwiGLU
SwiGLU::SwiGLU(const SwiGLUConfig& config, const Context& ctx) : config_(config), ctx_(ctx) {}

Shape SwiGLU::output_shape(const Shape& input, DType dtype) const {
  return glu_output_shape(input, dtype, config_.layout);
}

Tensor SwiGLU::forward(const Tensor& h, const Splits& splits, Saved* saved) const {
  check_input_tensor(h, ctx_.device());
  const Shape out = output_shape(h.shape(), h.dtype());
  Tensor z = Tensor::empty(out, h.dtype(), ctx_);
  swiglu_forward(ctx_, h, Tensor(), splits, config_.layout, z);
  if (saved) {
    saved->input = h;
    saved->splits = splits;
  }
  return z;
}

Tensor SwiGLU::backward(const Saved& saved, const Tensor& dz) const {
  if (!saved.input.defined()) {
    throw_invalid("saved", "the context filled by forward(..., &saved)", "an empty context");
  }
  Tensor dh = Tensor::empty(saved.input.shape(), saved.input.dtype(), ctx_);
  swiglu_backward(ctx_, saved.input, Tensor(), dz, saved.splits, config_.layout, dh, Tensor(),
                  false);
  return dh;
}

Tensor SwiGLU::op_forward(const Tensor& x, const ExtraInputs& in, const OpArguments&, bool,
                          std::unique_ptr<OpContext>* saved) const {
  if (!saved) return forward(x, in.splits);
  auto s = std::make_unique<Saved>();
  Tensor z = forward(x, in.splits, s.get());
  *saved = std::move(s);
  return z;
}

OpGrads SwiGLU::op_backward(const OpContext& saved, const Tensor& dy, const Tensor&, Tensor&,
                            const Deferral&) const {
  const auto* s = dynamic_cast<const Saved*>(&saved);
  if (!s) throw_invalid("saved", "a context recorded by SwiGLU", "another op's context");
  return {backward(*s, dy), {}};
}

// ---------------------------------------------------------------- ScaledSwiGLU
ScaledSwiGLU::ScaledSwiGLU(const SwiGLUConfig& config, const Context& ctx)
    : config_(config), ctx_(ctx) {}

Shape ScaledSwiGLU::output_shape(const Shape& input, DType dtype) const {
  return glu_output_shape(input, dtype, config_.layout);
}

Tensor ScaledSwiGLU::forward(const Tensor& h, const Tensor& probs, const Splits& splits,
                             const ForwardOptions& options, Saved* saved) const {
  check_input_tensor(h, ctx_.device());
  const Shape out = output_shape(h.shape(), h.dtype());
  check_input("probs", probs, {h.size(0)}, DType::F32, ctx_.device());
  Tensor z = Tensor::empty(out, h.dtype(), ctx_);
  swiglu_forward(ctx_, h, probs, splits, config_.layout, z);
  if (saved) {
    saved->input = h;
    saved->probs = probs;
    saved->splits = splits;
    saved->probs_requires_grad = options.probs_requires_grad;
    saved->valid = true;
  }
  return z;
}

ScaledSwiGLU::Grads ScaledSwiGLU::backward(const Saved& saved, const Tensor& dz,
                                           const BackwardOptions& options) const {
  if (!saved.valid) {
    throw_invalid("saved", "the context filled by forward(..., &saved)", "an empty context");
  }
  const int64_t T = saved.input.size(0);
  Grads grads;
  grads.input = Tensor::empty(saved.input.shape(), saved.input.dtype(), ctx_);
  const bool accumulate = options.grad_probs.defined();
  if (accumulate) {  // checked before anything is written (a failed call writes nothing)
    check_buffer_written("grad_probs", options.grad_probs, saved.probs_requires_grad,
                         "the probs do not require grad");
    check_caller_buffer("grad_probs", options.grad_probs, {T}, DType::F32, ctx_.device(),
                        {{"grad_output", dz},
                         {"input", saved.input},
                         {"probs", saved.probs},
                         {"splits", saved.splits.device_counts()}});
  }
  if (saved.probs_requires_grad) {
    grads.probs = accumulate ? options.grad_probs : Tensor::empty({T}, DType::F32, ctx_);
  }
  swiglu_backward(ctx_, saved.input, saved.probs, dz, saved.splits, config_.layout, grads.input,
                  grads.probs, accumulate);
  return grads;
}

Tensor ScaledSwiGLU::op_forward(const Tensor& x, const ExtraInputs& in, const OpArguments&, bool,
                                std::unique_ptr<OpContext>* saved) const {
  const ForwardOptions options{.probs_requires_grad = in.probs_requires_grad};
  if (!saved) return forward(x, in.probs, in.splits, options);
  auto s = std::make_unique<Saved>();
  Tensor z = forward(x, in.probs, in.splits, options, s.get());
  *saved = std::move(s);
  return z;
}

OpGrads ScaledSwiGLU::op_backward(const OpContext& saved, const Tensor& dy, const Tensor&,
                                  Tensor& dprobs, const Deferral&) const {
  const auto* s = dynamic_cast<const Saved*>(&saved);
  if (!s) throw_invalid("saved", "a context recorded by ScaledSwiGLU", "another op's context");
  Grads g = backward(*s, dy, {.grad_probs = dprobs});
  if (g.probs.defined()) dprobs = g.probs;
  return {g.input, {}};
}

}  // namespace moekit
