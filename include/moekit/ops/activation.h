// moekit/ops/activation.h — SwiGLU and ScaledSwiGLU (the activation of a MoE expert MLP).
//
// Math (SPEC §5). The input h [T, 2F] holds a gate part a and a linear part b per row, in the
// column layout of SwiGLUConfig::layout (GluLayout: [a | b] halves, or interleaved blocks of 32
// columns — TE's glu_interleave_size = 32 — which needs 2F % 64 == 0). σ is the logistic sigmoid.
//   SwiGLU        z = silu(a) ⊙ b                 dh = (dz ⊙ b ⊙ silu'(a), dz ⊙ silu(a))
//   ScaledSwiGLU  z = p_t · silu(a) ⊙ b           dh = p_t · (same),
//                                                 dp_t = Σ_j dz_tj · (silu(a) ⊙ b)_tj
// with silu(a) = a·σ(a), silu'(a) = σ(a)·(1 + a·(1 − σ(a))); p [T] f32 is the routing weight of
// each row (an extra input). z [T, F] is in h's dtype, dp is f32; math is fp32 with one rounding.
// Only rows [0, S) (S = Σ splits) are read or written: rows [S, T) of z, dh and dp are never
// written (internally allocated, they stay uninitialised).
//
//   SwiGLUConfig config{.layout = GluLayout::Interleaved32};
//   auto act = std::make_shared<ScaledSwiGLU>(config, ctx);
//   ScaledSwiGLU::Saved saved;
//   Tensor z = act->forward(h, probs, splits, {}, &saved);
//   auto g = act->backward(saved, dz);                      // g.input: dh, g.probs: dp
#pragma once

#include "moekit/ops/op.h"
#include "moekit/primitives/activation.h"

namespace moekit {

struct SwiGLUConfig {
  GluLayout layout = GluLayout::Halves;  // column layout of the gate and linear parts in h
};

/// z = silu(a) ⊙ b. Takes splits (for S); accepts no per-op caller buffers.
class SwiGLU final : public Op {
 public:
  SwiGLU(const SwiGLUConfig& config, const Context& ctx);
  const SwiGLUConfig& config() const { return config_; }

  struct Saved : OpContext {
    Tensor input;  // h [T, 2F]
    Splits splits;
    BackwardOnce used;  // set by the backward (one per forward)
  };
  /// z [T, F] of h [T, 2F]. Pass `saved` to train (nullptr: inference).
  Tensor forward(const Tensor& h, const Splits& splits, Saved* saved = nullptr) const;
  /// dh [T, 2F] from dz [T, F].
  Tensor backward(const Saved& saved, const Tensor& dz) const;

  std::string_view kind() const override { return "SwiGLU"; }
  const Context& context() const override { return ctx_; }
  int64_t split_groups() const override { return -1; }
  Shape output_shape(const Shape& input, DType dtype) const override;
  BoundForward bind_forward(const Tensor& x, const ExtraInputs& in, const OpArguments& args,
                            bool input_requires_grad,
                            std::unique_ptr<OpContext>* saved) const override;
  BoundBackward bind_backward(const OpContext& saved, const Tensor& dy, const Tensor& grad_input,
                              Tensor& dprobs, const Deferral& defer) const override;

 private:
  SwiGLUConfig config_;
  Context ctx_;
};

struct ScaledSwiGLUForwardOptions {
  bool probs_requires_grad = true;  // false: backward computes no dp
};
struct ScaledSwiGLUBackwardOptions {
  Tensor grad_probs;  // optional [T] f32 already holding a probs gradient: dp is added to it
                      // (rows [0, S)) and it is returned as Grads::probs
};

/// z = p ⊙ silu(a) ⊙ b with the per-row routing prob p; backward also returns dp.
/// Takes splits (for S) and probs; accepts no per-op caller buffers.
class ScaledSwiGLU final : public Op {
 public:
  ScaledSwiGLU(const SwiGLUConfig& config, const Context& ctx);
  const SwiGLUConfig& config() const { return config_; }

  using ForwardOptions = ScaledSwiGLUForwardOptions;
  struct Saved : OpContext {
    Tensor input;  // h [T, 2F]
    Tensor probs;  // p [T] f32
    Splits splits;
    bool probs_requires_grad = false;
    bool valid = false;
    BackwardOnce used;  // set by the backward (one per forward)
  };
  /// z [T, F] of h [T, 2F] and probs [T] f32. Pass `saved` to train (nullptr: inference).
  Tensor forward(const Tensor& h, const Tensor& probs, const Splits& splits,
                 const ForwardOptions& options = {}, Saved* saved = nullptr) const;

  using BackwardOptions = ScaledSwiGLUBackwardOptions;
  struct Grads {
    Tensor input;  // dh [T, 2F]
    Tensor probs;  // dp [T] f32 (undefined when probs do not require grad)
  };
  Grads backward(const Saved& saved, const Tensor& dz, const BackwardOptions& options = {}) const;

  std::string_view kind() const override { return "ScaledSwiGLU"; }
  const Context& context() const override { return ctx_; }
  int64_t split_groups() const override { return -1; }
  bool takes_probs() const override { return true; }
  Shape output_shape(const Shape& input, DType dtype) const override;
  BoundForward bind_forward(const Tensor& x, const ExtraInputs& in, const OpArguments& args,
                            bool input_requires_grad,
                            std::unique_ptr<OpContext>* saved) const override;
  BoundBackward bind_backward(const OpContext& saved, const Tensor& dy, const Tensor& grad_input,
                              Tensor& dprobs, const Deferral& defer) const override;

 private:
  SwiGLUConfig config_;
  Context ctx_;
};

}  // namespace moekit
