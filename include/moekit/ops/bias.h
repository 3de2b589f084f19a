// moekit/ops/bias.h — a per-expert bias over rows grouped by expert, optionally prob-scaled.
//
// Math. Parameter b [G, N]; splits give m_g rows to group g; s_t = p_t (scale_bias, the
// routing weight of row t, an extra input) or 1:
//   forward   y[t] = x[t] + s_t · b[g(t)]                       x, y [T, N]
//   backward  dx = dy (returned as is: the gradient of an add is the identity, no copy)
//             db[g] = Σ_{t in g} s_t · dy[t]   (fp32 accumulation)          db [G, N]
//             dp_t  = Σ_n dy[t, n] · b[g(t), n]  (scale_bias only)      dp [T] f32
// Rows [S, T) of y are never written. Zero-row groups get db_g = 0. Accepts no per-op caller
// buffers. (fc2's prob-scaled bias in the grouped MLP is GroupedLinearOp's scale_bias option, which
// keeps the fusible pattern at three ops; this op is for biases elsewhere in a Sequential.)
//
//   auto bias = std::make_shared<Bias>(BiasConfig{.groups = E, .features = H, .dtype = DType::BF16,
//                                                 .scale_bias = true}, ctx);
#pragma once

#include "moekit/ops/op.h"

namespace moekit {

struct BiasConfig {
  int64_t groups = 0;           // G
  int64_t features = 0;         // N
  DType dtype = DType::BF16;    // activations and the bias
  bool scale_bias = false;  // y = x + p_t · b_g (takes the routing probs)
};

class Bias final : public Op {
 public:
  /// Allocates the bias on ctx's device, uninitialised: fill it, or set_bias().
  Bias(const BiasConfig& config, const Context& ctx);
  const BiasConfig& config() const { return config_; }
  const Tensor& bias() const { return bias_; }  // [G, N]
  /// Uses caller storage for the bias (validated: shape, dtype, device, contiguity).
  void set_bias(const Tensor& bias);
  /// Frozen (false): backward computes no db.
  void set_requires_grad(bool requires_grad) { requires_grad_ = requires_grad; }
  bool requires_grad() const { return requires_grad_; }

  struct Saved : OpContext {
    Tensor probs;  // [T] f32 (scale_bias)
    Splits splits;
    int64_t rows = 0;
    bool probs_requires_grad = false;
    BackwardOnce used;  // set by the backward (one per forward)
  };

  std::string_view kind() const override { return "Bias"; }
  const Context& context() const override { return ctx_; }
  int64_t split_groups() const override { return config_.groups; }
  bool takes_probs() const override { return config_.scale_bias; }
  Shape output_shape(const Shape& input, DType dtype) const override;
  std::vector<OpTensor> tensors() const override { return {{"bias", bias_}}; }
  BoundForward bind_forward(const Tensor& x, const ExtraInputs& in, const OpArguments& args,
                            bool input_requires_grad,
                            std::unique_ptr<OpContext>* saved) const override;
  BoundBackward bind_backward(const OpContext& saved, const Tensor& dy, const Tensor& grad_input,
                              Tensor& dprobs, const Deferral& defer) const override;

 private:
  BiasConfig config_;
  Context ctx_;
  Tensor bias_;
  bool requires_grad_ = true;
};

}  // namespace moekit
