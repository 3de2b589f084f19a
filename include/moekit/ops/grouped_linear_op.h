// moekit/ops/grouped_linear_op.h — GroupedLinear as a basic op of a Sequential.
//
// Why two classes: GroupedLinear is the layer a user drives directly (forward/backward with
// typed options and Saved, as TE's GroupedLinear module); the Op interface is Sequential's
// (type-erased saved contexts, extra inputs, routed op_args) and GroupedLinearOp also owns the
// prob-scaled bias, which needs the routing probs the plain layer does not take. Both bind the
// same calls (GroupedLinear::bind_forward / bind_backward).
// Wraps a GroupedLinear (ops/grouped_linear.h: its math, its caller-buffer contract and its
// main_grad all apply unchanged) so that Sequential can run it, route per-op `output` and
// `grad_input` buffers to it, and fuse it (fc1/fc2 of the grouped MLP, ops/grouped_mlp.h).
//
// Option scale_bias (TE's GroupedLinear(scale_bias=True)): the bias is scaled by the routing prob
// of each row, an extra input p [T] f32 —
//   forward   y[t] = x[t] · W_gᵀ + p_t · b_g
//   backward  db_g = Σ_{t in g} p_t · dy_t,   dp_t = Σ_n dy_tn · b_gn   (dx, dW as GroupedLinear)
// This is fc2 of the grouped MLP (SPEC §5: y = z·W2ᵀ + p_t·b2_g). It runs as the GEMM (into y)
// followed by grouped_bias_add in place, i.e. the scaled bias is added after the GEMM's rounding;
// the fused grouped MLP calls the same primitives, so fused and unfused agree bit for bit on a
// backend. The layer then holds no bias of its own (its config has bias = false): the op does.
//
//   auto fc2 = std::make_shared<GroupedLinearOp>(
//       GroupedLinearConfig{.groups = E, .in = F, .out = H, .dtype = DType::BF16, .bias = true},
//       ctx, GroupedLinearOpOptions{.scale_bias = true});
//   fc2->linear().set_main_grad(main_grad);     // weight, main_grad, frozen flag: the layer's
#pragma once

#include "moekit/ops/grouped_linear.h"
#include "moekit/ops/op.h"

namespace moekit {

struct GroupedLinearOpOptions {
  bool scale_bias = false;  // y = x·Wᵀ + p_t·b (needs config.bias; takes the routing probs)
};

class GroupedLinearOp final : public Op {
 public:
  /// Allocates the parameters on ctx's device, uninitialised (like GroupedLinear).
  GroupedLinearOp(const GroupedLinearConfig& config, const Context& ctx,
                  const GroupedLinearOpOptions& options = {});

  /// The configuration as given (bias = true when the op has a bias, scaled or not).
  const GroupedLinearConfig& config() const { return config_; }
  bool scale_bias() const { return options_.scale_bias; }
  /// The layer: weight, per-expert views, main_grad, frozen flag (and its bias unless scale_bias).
  GroupedLinear& linear() { return linear_; }
  const GroupedLinear& linear() const { return linear_; }
  /// The bias [G, N] (scaled or not), undefined without one.
  const Tensor& bias() const;
  void set_bias(const Tensor& bias);

  struct Saved : OpContext {
    GroupedLinear::Saved linear;
    Tensor probs;  // [T] f32 (scale_bias)
    bool probs_requires_grad = false;
  };

  std::string_view kind() const override { return "GroupedLinear"; }
  const Context& context() const override { return linear_.context(); }
  int64_t split_groups() const override { return config_.groups; }
  bool takes_probs() const override { return options_.scale_bias; }
  bool accepts(OpArgument) const override { return true; }  // output and grad_input
  Shape output_shape(const Shape& input, DType dtype) const override;
  std::vector<OpTensor> tensors() const override;
  BoundForward bind_forward(const Tensor& x, const ExtraInputs& in, const OpArguments& args,
                            bool input_requires_grad,
                            std::unique_ptr<OpContext>* saved) const override;
  BoundBackward bind_backward(const OpContext& saved, const Tensor& dy, const Tensor& grad_input,
                              Tensor& dprobs, const Deferral& defer) const override;

 private:
  GroupedLinearConfig config_;
  GroupedLinearOpOptions options_;
  GroupedLinear linear_;  // config_ with bias = config_.bias && !scale_bias
  Tensor scaled_bias_;    // [G, N] when scale_bias
};

}  // namespace moekit
