// moekit/ops/grouped_mlp.h — the fused grouped MLP: fc1 → scaled SwiGLU → fc2 (SPEC §5).
//
// Math. Splits give m_g rows to group g (off_g = Σ_{j<g} m_j, S = Σ m_g ≤ T); per row t of g:
//   h   = x_t · W1_gᵀ + b1_g                    x [T, H], W1 [G, 2F, H], b1 [G, 2F]   h [T, 2F]
//   z   = p_t · silu(a) ⊙ b                     a, b: gate/linear parts of h (GluLayout) z [T, F]
//   y   = z · W2_gᵀ + p_t · b2_g                W2 [G, H, F], b2 [G, H] (prob-scaled)   y [T, H]
// Backward from dy [T, H]:
//   dz = dy · W2_g      dW2_g = Σ dyᵀz      db2_g = Σ p_t·dy_t
//   dp_t = Σ_j dz_tj·(silu(a)⊙b)_tj + dy_t·b2_g                                   dp [T] f32
//   da = p·dz⊙b⊙silu'(a)   db_lin = p·dz⊙silu(a)   (dh in h's layout)
//   dW1_g = Σ dhᵀx      db1_g = Σ dh      dx = dh · W1_g
// p [T] f32 is the routing weight of each row. Biases are optional; b2 is always prob-scaled.
// dtypes: x, weights, biases share one (f32, f16, bf16); accumulation fp32.
// Rows [S, T) of y, dx and dp are never written; zero-row groups get dW = 0 (main_grad
// unchanged), db = 0. main_grad and the frozen flag of each layer are honoured (fc1/fc2's
// GroupedLinear). Caller buffers as SPEC §3: ForwardOptions::output receives y [T, H] and
// BackwardOptions::grad_input receives dx [T, H]; each is returned aliased, rows [S, T) untouched.
//
// The fused op is made of three basic ops and shares their parameters: fc1, a GroupedLinearOp
// [in H, out 2F] with an optional plain bias b1; a ScaledSwiGLU; fc2, a GroupedLinearOp
// [in F, out H] with no bias or a prob-scaled one (GroupedLinearOpOptions::scale_bias). A
// Sequential of exactly those ops runs as this op (its fuser uses mismatch() to decide). It is
// written on primitives only, and calls the same primitives in the same order as the unfused
// Sequential: on the CPU the two agree bit for bit; a GPU backend may fuse the activation and the
// prob scaling into GEMM epilogues (results then agree within the dtype's tolerance).
//
//   GroupedMLP mlp({.groups = E, .hidden = H, .ffn = F, .dtype = DType::BF16,
//                   .fc2_bias = true, .layout = GluLayout::Interleaved32}, ctx);
//   GroupedMLP::Saved saved;
//   Tensor y = mlp.forward(x, probs, splits, {.output = y_buf}, &saved);   // y aliases y_buf
//   auto g = mlp.backward(saved, dy, {.grad_input = dx_buf});            // g.input aliases dx_buf
#pragma once

#include <memory>
#include <string>

#include "moekit/core/pending.h"
#include "moekit/ops/activation.h"
#include "moekit/ops/grouped_linear_op.h"

namespace moekit {

struct GroupedMLPConfig {
  int64_t groups = 0;                    // G experts on this rank
  int64_t hidden = 0;                    // H: fc1 in_features, fc2 out_features
  int64_t ffn = 0;                       // F: fc2 in_features (fc1 out_features = 2F)
  DType dtype = DType::BF16;             // activations and parameters
  bool fc1_bias = false;                 // b1 [G, 2F]
  bool fc2_bias = false;                 // b2 [G, H], scaled by p_t
  GluLayout layout = GluLayout::Halves;  // gate/linear columns of fc1's output
  /// Quantized recipe of fc1 and fc2 (SPEC §6d). With one every GEMM runs on quantized operands
  /// (x, z, dy and dh quantized by the op, each weight's copies cached by its layer), bit for bit
  /// the quantized ops one by one, keeping every promise of this class (output / grad_input
  /// caller buffers, checks, deferral). Alignment: hidden, ffn and every group's rows as the
  /// recipe's rules.
  Recipe recipe = {};
};

struct GroupedMLPForwardOptions {
  Tensor output;                    // optional caller buffer for y: [T, out], activation dtype
  bool input_requires_grad = true;  // false: backward computes no dx
  bool probs_requires_grad = true;  // false: backward computes no dp
};
struct GroupedMLPBackwardOptions {
  Tensor grad_input;  // optional caller buffer for dx: [T, H], activation dtype
  Tensor grad_probs;  // optional [T] f32 already holding a probs gradient: dp is added to it
                      // (rows [0, S)) and it is returned as Grads::probs
  /// true: return once dx and dp are queued; fc1's and fc2's weight gradients may still be
  /// running on a side stream — Grads::weight_grads holds them until wait()
  /// (moekit/core/pending.h).
  bool defer_weight_grads = false;
  int deferred_sm_margin = 0;  // as GroupedLinearBackwardOptions::deferred_sm_margin
  bool retain_saved = false;   // as GroupedLinearBackwardOptions::retain_saved
};

class GroupedMLP {
 public:
  /// New fc1, activation and fc2 ops with fresh parameters (uninitialised, like GroupedLinear).
  GroupedMLP(const GroupedMLPConfig& config, const Context& ctx);
  /// Fuses existing ops, sharing their parameters. Throws InvalidArgument with the reason when
  /// they do not form the pattern (see mismatch()).
  GroupedMLP(std::shared_ptr<GroupedLinearOp> fc1, std::shared_ptr<ScaledSwiGLU> activation,
             std::shared_ptr<GroupedLinearOp> fc2);

  /// "" when (fc1, activation, fc2) form the fusible pattern, else the reason: GroupedLinear →
  /// ScaledSwiGLU → GroupedLinear, equal group counts, fc1 out == 2 × fc2 in, one dtype and
  /// device, fc1 without scale_bias, fc2 with no bias or a prob-scaled one, and fc1 out a
  /// multiple of 64 for the interleaved layout, one recipe on both layers (none, or the same kind
  /// and options). (fc2's out_features may differ from fc1's in_features; SPEC §5's y [T, H] is
  /// the usual case.)
  static std::string mismatch(const Op& fc1, const Op& activation, const Op& fc2);
  /// Whether fc1 and fc2 run a quantized recipe (GroupedMLPConfig::recipe or their ops').
  bool quantized() const;

  const std::shared_ptr<GroupedLinearOp>& fc1() const { return fc1_; }
  const std::shared_ptr<ScaledSwiGLU>& activation() const { return act_; }
  const std::shared_ptr<GroupedLinearOp>& fc2() const { return fc2_; }
  /// The context it runs on (fc1's).
  const Context& context() const { return fc1_->context(); }
  int64_t groups() const { return fc1_->config().groups; }
  int64_t in_features() const { return fc1_->config().in; }    // H (x's width)
  int64_t ffn() const { return fc2_->config().in; }            // F
  int64_t out_features() const { return fc2_->config().out; }  // y's width (H in SPEC §5)
  DType dtype() const { return fc1_->config().dtype; }
  GluLayout layout() const { return act_->config().layout; }

  using ForwardOptions = GroupedMLPForwardOptions;
  struct Saved : OpContext {
    Tensor input;  // x [T, H]
    Tensor h;      // fc1 output [T, 2F]
    Tensor z;      // activation output [T, F]
    Tensor probs;  // p [T] f32
    Splits splits;
    bool input_requires_grad = false;
    bool probs_requires_grad = false;
    bool valid = false;
    BackwardOnce used;  // set by the backward: one backward per forward
    // With a recipe (z is then not kept): the quantized copies the backward reads — x's
    // columnwise (fc1's dW), z's columnwise (fc2's dW), each weight's columnwise (dx, dz).
    QuantizedTensor x_q, z_q, w1_q, w2_q;
  };
  /// y [T, out] of x [T, H] and probs [T] f32. Pass `saved` to train (nullptr: inference).
  Tensor forward(const Tensor& x, const Tensor& probs, const Splits& splits,
                 const ForwardOptions& options = {}, Saved* saved = nullptr) const;

  using BackwardOptions = GroupedMLPBackwardOptions;
  struct Grads {
    Tensor input;    // dx [T, H] (undefined when the input does not require grad)
    Tensor probs;    // dp [T] f32 (undefined when probs do not require grad)
    ParamGrads fc1;  // dW1 (or fc1's main_grad), db1
    ParamGrads fc2;  // dW2 (or fc2's main_grad), db2
    PendingWork weight_grads;  // with defer_weight_grads: wait() before reading fc1/fc2.weight
  };
  /// From dy [T, out]. Validation (host metadata) before any work, as SPEC §3. One backward per
  /// forward unless options.retain_saved (as GroupedLinear).
  Grads backward(const Saved& saved, const Tensor& dy, const BackwardOptions& options = {}) const;

  /// forward / backward bound, not run (moekit/ops/bound.h). bind_backward's params are
  /// {fc1, activation (none), fc2}.
  BoundForward bind_forward(const Tensor& x, const Tensor& probs, const Splits& splits,
                            const ForwardOptions& options, Saved* saved) const;
  BoundBackward bind_backward(const Saved& saved, const Tensor& dy,
                              const BackwardOptions& options) const;

 private:
  Grads backward_outputs(const Saved& saved, const BackwardOptions& options) const;
  BoundForward bind_forward_quantized(const Tensor& x, const Tensor& probs, const Splits& splits,
                                      const ForwardOptions& options, Saved* saved) const;
  BoundBackward bind_backward_quantized(const Saved& saved, const Tensor& dy,
                                        const BackwardOptions& options) const;

  std::shared_ptr<GroupedLinearOp> fc1_;
  std::shared_ptr<ScaledSwiGLU> act_;
  std::shared_ptr<GroupedLinearOp> fc2_;
};

}  // namespace moekit
