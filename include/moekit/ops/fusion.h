// moekit/ops/fusion.h — fused ops over a range of a Sequential's ops, and the fuser's registry
// (SPEC §4).
//
// A fusion looks at a Sequential's ops from some position on and, when they start its pattern,
// returns a FusedOp covering a prefix of them. Sequential's fuser tries every registered fusion
// at each position, in registration order, and runs a matched range as one stage; it knows no
// fusion by name. The fused op answers which per-op arguments (op_args) it accepts on which of
// its ops, and binds its forward and backward like a basic op (moekit/ops/bound.h). The library
// registers the grouped MLP (GroupedLinear → ScaledSwiGLU → GroupedLinear, ops/grouped_mlp.h).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "moekit/ops/op.h"

namespace moekit {

class FusedOp {
 public:
  virtual ~FusedOp() = default;
  /// Name in plan() and messages, e.g. "GroupedMLP".
  virtual std::string_view kind() const = 0;
  /// Number of basic ops it covers.
  virtual int64_t size() const = 0;
  /// "" when per-op argument `argument` may name its op at `index` (0-based within the range),
  /// else what it accepts, for the error's "expected" part.
  virtual std::string accepts(OpArgument argument, int64_t index) const = 0;
  /// The role of its op at `index` in messages ("fc1", "the activation", "fc2").
  virtual std::string role(int64_t index) const = 0;
  /// As Op::bind_forward; `args[i]` holds the arguments routed to its i-th op.
  virtual BoundForward bind_forward(const Tensor& x, const ExtraInputs& in,
                                    std::span<const OpArguments> args, bool input_requires_grad,
                                    std::unique_ptr<OpContext>* saved) const = 0;
  /// As Op::bind_backward; `grad_inputs[i]` is the grad_input bound to its i-th op at forward.
  /// BoundBackward::params has one entry per op covered.
  virtual BoundBackward bind_backward(const OpContext& saved, const Tensor& dy,
                                      std::span<const Tensor> grad_inputs, Tensor& dprobs,
                                      const Deferral& defer) const = 0;
};

/// Given a Sequential's ops from one position to the end, the fused op over a prefix of them, or
/// null when they do not start the fusion's pattern.
using FusionMatcher = std::shared_ptr<const FusedOp> (*)(std::span<const OpHandle> ops);

/// Registers a fusion for every Sequential planned afterwards (tried in registration order).
void register_fusion(std::string_view name, FusionMatcher match);

}  // namespace moekit
