// moekit/ops/sequential.h — a chain of basic ops, fused where a known pattern allows (SPEC §4).
//
// Sequential(ops) runs its ops in order on x [T, *]. Extra inputs (splits, routing probs) go to
// the ops that take them. forward returns the output and a Tape of what backward needs;
// backward(tape, dy) walks it in reverse and returns dx, dprobs (summed over every op that takes
// the probs) and each op's parameter gradients.
//
// Per-op arguments (OpArgs) are keyed by op handle or by position (index into the Sequential)
// and carry the op's caller buffers: `output` (receives the op's output during forward; it is
// returned aliased) and `grad_input` (receives the op's input gradient; bound at forward, where it
// is validated, and written during backward). Every caller buffer follows SPEC §3 (shape of the
// op's output resp. input with the tail, activation dtype, device, contiguous, overlapping no
// input, parameter or other caller buffer); the whole call — keys, placements, shapes of the op
// chain, extra inputs, buffers, and every stage bound (ops/bound.h) — is validated before any op
// runs, so a failed call writes nothing; backward binds every stage before running any, too. Errors, each naming the op and the argument: a handle that is not in this Sequential;
// a position out of range; an argument the op does not accept (only GroupedLinear accepts
// `output` and `grad_input`); one argument given twice (by handle and by position).
//
// Fuser: every fusion registered in ops/fusion.h is tried at each position; the library's is the
// grouped MLP — GroupedLinear → ScaledSwiGLU → GroupedLinear that GroupedMLP::mismatch() accepts
// runs as the fused GroupedMLP; op_args still name fc1/fc2 by handle or position. In a fused MLP `output`
// is accepted only on fc2 and `grad_input` only on fc1 (the intermediate [T, 2F] / [T, F] tensors
// are not materialised for the caller) — any other placement is an error that says so. Anything
// else runs unfused. Fusion never changes results on the CPU (bit-identical); it can be turned off
// (SequentialOptions::fuse, set_fusion) and queried (fused(), plan()).
//
//   auto fc1 = std::make_shared<GroupedLinearOp>(GroupedLinearConfig{.groups = E, .in = H,
//                                                .out = 2 * F, .dtype = DType::BF16}, ctx);
//   auto act = std::make_shared<ScaledSwiGLU>(SwiGLUConfig{}, ctx);
//   auto fc2 = std::make_shared<GroupedLinearOp>(GroupedLinearConfig{.groups = E, .in = F,
//                                                .out = H, .dtype = DType::BF16}, ctx);
//   Sequential mlp({fc1, act, fc2});                       // mlp.fused() == true
//   OpArgs args;
//   args[fc2].output = y_buf;                              // by handle
//   args[0].grad_input = dx_buf;                           // by position
//   auto [y, tape] = mlp.forward(x, {.splits = splits, .probs = probs}, args);   // y aliases y_buf
//   SequentialGrads g = mlp.backward(tape, dy);            // g.input aliases dx_buf; g.probs
#pragma once

#include <concepts>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "moekit/ops/fusion.h"
#include "moekit/ops/op.h"

namespace moekit {

/// Per-op arguments of one Sequential call, keyed by op handle or by position.
class OpArgs {
 public:
  /// The arguments for the op at `position` (0-based index into the Sequential).
  OpArguments& operator[](int64_t position);
  /// The arguments for the op `op` (a handle of one of the Sequential's ops).
  template <std::derived_from<Op> T>
  OpArguments& operator[](const std::shared_ptr<T>& op) {
    return by_handle(std::static_pointer_cast<const Op>(op));
  }

  struct Entry {
    std::shared_ptr<const Op> op;  // keyed by handle (null when keyed by position)
    int64_t position = -1;         // keyed by position
    OpArguments args;
  };
  /// In insertion order; references returned by operator[] stay valid as entries are added.
  const std::deque<Entry>& entries() const { return entries_; }
  bool empty() const { return entries_.empty(); }

 private:
  OpArguments& by_handle(std::shared_ptr<const Op> op);
  std::deque<Entry> entries_;
};

/// What Sequential::forward keeps for backward. A cheap handle (copies share the record).
class Tape {
 public:
  struct Record;  // defined in sequential.cpp
  /// True when nothing was recorded (inference, or a default-constructed tape).
  bool empty() const { return record_ == nullptr; }

 private:
  friend class Sequential;
  std::shared_ptr<const Record> record_;
};

struct SequentialOptions {
  bool fuse = true;  // replace registered patterns by fused ops (ops/fusion.h: GroupedMLP)
};

struct SequentialOutput {
  Tensor output;  // the last op's output (the caller's buffer when one was routed to it)
  Tape tape;      // empty when ExtraInputs::save_for_backward is false
};

struct SequentialBackwardOptions {
  /// true: every op that can returns with its weight gradients still running on a side stream;
  /// SequentialGrads::weight_grads holds them all until wait() (moekit/core/pending.h).
  bool defer_weight_grads = false;
  int deferred_sm_margin = 0;  // as GroupedLinearBackwardOptions::deferred_sm_margin
  /// One backward per tape (as PyTorch without retain_graph); true: the tape stays usable.
  bool retain_tape = false;
};

struct SequentialGrads {
  Tensor input;                    // dx (undefined when the input does not require grad)
  Tensor probs;                    // dp [T] f32, summed over the ops that take the probs
  std::vector<ParamGrads> params;  // params[i]: gradients of the op at position i
  PendingWork weight_grads;        // with defer_weight_grads: wait() before reading params
};

class Sequential {
 public:
  /// Ops in order (non-null, each object at most once, all on one device).
  explicit Sequential(std::vector<OpHandle> ops, const SequentialOptions& options = {});

  const std::vector<OpHandle>& ops() const { return ops_; }
  int64_t size() const { return static_cast<int64_t>(ops_.size()); }
  /// Position of `op` in this Sequential, or -1.
  int64_t position_of(const Op& op) const;

  /// Turns the fuser on or off (re-plans; tapes already recorded keep their plan).
  void set_fusion(bool enabled);
  bool fusion_enabled() const { return fuse_; }
  /// Whether any ops run fused under the current setting.
  bool fused() const;
  /// How the ops run, e.g. "GroupedMLP(0-2)" or "GroupedLinear(0), ScaledSwiGLU(1), Bias(2)".
  std::string plan() const;

  SequentialOutput forward(const Tensor& x, const ExtraInputs& inputs = {},
                           const OpArgs& args = {}) const;
  SequentialGrads backward(const Tape& tape, const Tensor& dy,
                           const SequentialBackwardOptions& options = {}) const;

  /// A run of ops executed together: one basic op, or a fused op over [begin, end).
  struct Stage {
    int64_t begin = 0, end = 0;
    std::shared_ptr<const FusedOp> fused;  // null for a basic op
  };
  const std::vector<Stage>& stages() const { return stages_; }

 private:
  void replan();

  std::vector<OpHandle> ops_;
  bool fuse_ = true;
  std::vector<Stage> stages_;
};

}  // namespace moekit
