// Internal: work that may run beside a context's own stream — an op's weight gradients beside
// its input-gradient chain. Each persistent grouped GEMM ends in a partial last wave; a GEMM on
// a second stream fills the SMs that wave leaves idle, which one stream cannot (PERFORMANCE.md,
// "The MLP's backward on two streams": whole backward passes 2–3% faster, bit-identical).
//
//   SideStream side(ctx);
//   grouped_gemm_group_k(side.fork(), ...);   // ordered after everything queued on ctx so far
//   grouped_gemm_group_m(ctx, ...);           // may run beside it
//   side.join();                              // ctx's stream waits for the side's work
//
// Rules for callers: every buffer the side work writes or that must outlive it is allocated on
// ctx before fork() (the side's allocator orders memory on the side stream only); side work
// writes nothing that ctx's work between fork() and join() reads or writes. join() runs in the
// destructor too (errors then ignored), so no side work is left unordered when an op throws.
//
// Deferred (PendingWork, moekit/core/pending.h): a backward asked to defer its weight gradients
// queues its input-gradient chain first, forks after it, and hands the unjoined SideStream to the
// caller's handle with the tensors the side work reads and writes (detail::defer); the handle
// joins.
//
// The side stream is CUDA only, one per CUDA context (its resources: a stream of the same
// priority, cuBLAS handles and workspace, the owner's error word), made on first use. Without one
// — a CPU context, MOEKIT_SIDE_STREAM=0 (for A/B runs), or a graph capture under way before the
// context first made it (making it allocates) — fork() returns ctx itself: the same work, in
// order on one stream.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "moekit/core/context.h"
#include "moekit/core/pending.h"

namespace moekit::detail {

class SideStream {
 public:
  /// `wanted` = false: no side stream (e.g. nothing to run beside the side work).
  explicit SideStream(const Context& ctx, bool wanted = true);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  /// The context to queue side work on, ordered after everything queued on ctx so far.
  const Context& fork();
  /// The context fork() returns, without ordering anything (to bind side work before it runs).
  const Context& context() const { return side_ ? *side_ : ctx_; }
  /// ctx's stream waits for all side work queued so far.
  void join();
  /// Whether side work was queued since the last join.
  bool forked() const { return forked_; }

 private:
  Context ctx_;
  std::optional<Context> side_;
  bool forked_ = false;  // side work queued since the last join
};

/// The context deferred work runs on: `side` (SideStream::fork()) with SM margin `sms` when that
/// is larger than its own (a backward's deferred_sm_margin; SPEC §1b).
Context deferred_context(const Context& side, int sms);

/// The internals of a PendingWork handle (its State), for the functions here.
struct PendingAccess {
  static PendingWork::State& state(PendingWork& p) { return p.state(); }
};

/// Hands `side`'s unjoined work to `pending` (backward with defer_weight_grads), with the tensors
/// it reads and writes, which stay allocated until the join. Nothing is kept when nothing was
/// forked.
void defer(PendingWork& pending, std::unique_ptr<SideStream> side, std::vector<Tensor> held);

}  // namespace moekit::detail

namespace moekit {

struct PendingWork::State {
  std::vector<std::unique_ptr<detail::SideStream>> sides;  // each joined by wait()
  std::vector<Tensor> held;  // what the side work reads and writes: released after the joins
};

}  // namespace moekit
