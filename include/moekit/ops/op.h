// moekit/ops/op.h — the interface of a basic operation that Sequential runs (SPEC §4).
//
// A basic op has a forward that returns its output and fills its own saved context, and a
// backward that walks back from that context. Sequential passes each op the extra inputs it takes
// (splits, routing probs) and the per-op caller buffers routed to it (OpArguments). Ops are held
// by handle (std::shared_ptr); the handle is also a key of a Sequential's op_args.
// Concrete ops: GroupedLinearOp (ops/grouped_linear_op.h), SwiGLU and ScaledSwiGLU
// (ops/activation.h), Bias (ops/bias.h). Ops above the backends contain no backend code.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/core/context.h"
#include "moekit/core/pending.h"
#include "moekit/core/splits.h"
#include "moekit/core/tensor.h"
#include "moekit/ops/bound.h"

namespace moekit {

/// The per-op caller buffers that a Sequential routes (SPEC §3–§4).
enum class OpArgument { Output, GradInput };
/// "output" or "grad_input".
std::string_view name(OpArgument argument);

/// Per-op arguments of one Sequential call (see OpArgs in ops/sequential.h).
struct OpArguments {
  Tensor output;      // receives the op's output y [T, out] during forward; returned aliased
  Tensor grad_input;  // receives the op's input gradient dx [T, in]: bound at forward (validated
                      // then), written during backward
};

/// What a Sequential passes to its ops besides the activation flowing through them.
struct ExtraInputs {
  Splits splits;                    // rows per group (GroupedLinear, Bias; activations use S)
  Tensor probs;                     // [T] f32 routing weight per row (ScaledSwiGLU, scale_bias)
  bool input_requires_grad = true;  // backward returns dx of the Sequential's input
  bool probs_requires_grad = true;  // backward returns dprobs (when probs are given)
  bool save_for_backward = true;    // false: inference — nothing is kept, the tape is empty
};

/// What one op's forward keeps for its backward; each op derives its own.
struct OpContext {
  virtual ~OpContext() = default;
};

/// What a backward may leave running past its return (SPEC §1b): its options'
/// defer_weight_grads and deferred_sm_margin.
struct Deferral {
  bool weight_grads = false;
  int sm_margin = 0;
  bool retain_saved = false;  // the saved context stays usable for another backward
};

struct OpGrads {
  Tensor input;  // dx [T, in] (undefined when the op's input does not require grad)
  ParamGrads params;
  PendingWork weight_grads;  // deferred weight gradients (moekit/core/pending.h), if any
};

/// A named tensor an op holds (parameter or gradient buffer): caller buffers may not overlap it.
struct OpTensor {
  std::string name;
  Tensor tensor;
  bool written_by_backward = false;  // e.g. a main_grad: may not overlap the backward's inputs
};

class Op {
 public:
  virtual ~Op() = default;

  /// Type name used in messages: "GroupedLinear", "ScaledSwiGLU", "SwiGLU", "Bias".
  virtual std::string_view kind() const = 0;
  virtual const Context& context() const = 0;
  /// Group count the op needs splits for (-1: it takes splits but any G, for S; 0: no splits).
  virtual int64_t split_groups() const { return 0; }
  /// Whether the op takes the routing probs [T] as an extra input.
  virtual bool takes_probs() const { return false; }
  /// Whether OpArguments' `argument` may name this op.
  virtual bool accepts(OpArgument argument) const {
    (void)argument;
    return false;
  }
  /// Shape of the output for an input of `input` shape and `dtype`; throws InvalidArgument naming
  /// `input` when the op cannot take it (lets Sequential check a whole chain before any work).
  virtual Shape output_shape(const Shape& input, DType dtype) const = 0;
  /// Parameters and gradient buffers the op holds (for overlap checks of caller buffers).
  virtual std::vector<OpTensor> tensors() const { return {}; }

  /// Binds the forward of x [T, in] (moekit/ops/bound.h: every check, every backend chosen, the
  /// output allocated or the caller's buffer; run() queues the work). `input_requires_grad`
  /// false: backward need not compute dx. `saved` non-null: receives what bind_backward needs
  /// (training); null: inference.
  virtual BoundForward bind_forward(const Tensor& x, const ExtraInputs& in,
                                    const OpArguments& args, bool input_requires_grad,
                                    std::unique_ptr<OpContext>* saved) const = 0;
  /// Binds the backward from dy [T, out]. `grad_input`: caller buffer for dx (undefined:
  /// allocated). `dprobs` [T] f32 is in/out: undefined — an op with a probs gradient creates it;
  /// defined — the op adds its part (rows [0, S)); either way it is the tensor run() writes.
  /// `defer`: as GroupedLinear's options defer_weight_grads and deferred_sm_margin — run() may
  /// leave the weight gradients running, handed to its PendingWork.
  virtual BoundBackward bind_backward(const OpContext& saved, const Tensor& dy,
                                      const Tensor& grad_input, Tensor& dprobs,
                                      const Deferral& defer) const = 0;

  /// bind_forward, then run.
  Tensor op_forward(const Tensor& x, const ExtraInputs& in, const OpArguments& args,
                    bool input_requires_grad, std::unique_ptr<OpContext>* saved) const {
    BoundForward bound = bind_forward(x, in, args, input_requires_grad, saved);
    bound.run();
    return bound.output;
  }
  /// bind_backward, then run.
  OpGrads op_backward(const OpContext& saved, const Tensor& dy, const Tensor& grad_input,
                      Tensor& dprobs, const Deferral& defer) const {
    BoundBackward bound = bind_backward(saved, dy, grad_input, dprobs, defer);
    OpGrads grads{bound.input, bound.params.empty() ? ParamGrads{} : bound.params[0], {}};
    bound.run(grads.weight_grads);
    return grads;
  }
};

/// An op handle: the op's identity in a Sequential and a key of its op_args.
using OpHandle = std::shared_ptr<Op>;

}  // namespace moekit
