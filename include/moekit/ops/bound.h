// moekit/ops/bound.h — an op call bound before any work (ARCHITECTURE.md "Bind once, run below").
//
// Binding checks every argument of the call and chooses every backend it will use; the output
// and gradient tensors exist afterwards (allocated, or the caller's buffers) but hold nothing
// yet; run() then only queues the work. Sequential binds every stage of a call before it runs
// any, so a call that fails anywhere has written nothing.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "moekit/core/pending.h"
#include "moekit/core/tensor.h"

namespace moekit {

/// Gradients of an op's parameters (undefined when it has none, or they are frozen).
struct ParamGrads {
  Tensor weight;  // dW (or the op's main_grad when it accumulates there)
  Tensor bias;    // db
};

struct BoundForward {
  Tensor output;              // the op's output (written by run())
  std::function<void()> run;  // queues the work
};

struct BoundBackward {
  Tensor input;                    // dx (undefined when the input does not require grad)
  std::vector<ParamGrads> params;  // per op covered: one for a basic op, three for a fused MLP
  /// Queues the work; weight gradients left running (deferred) are handed to `pending`.
  std::function<void(PendingWork& pending)> run;
  Tensor probs;  // dp [T] f32 when the call computes it (Op::bind_backward: also via dprobs)
};

/// Marks a saved context used by its backward (one backward per forward, as PyTorch's graph
/// without retain_graph): shared by the copies of the context.
using BackwardOnce = std::shared_ptr<bool>;

}  // namespace moekit
