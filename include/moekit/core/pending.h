// moekit/core/pending.h — GPU work an op has queued and left for the caller to order: the
// weight gradients of a backward called with `defer_weight_grads` (SPEC §1b).
//
// Such a backward returns once dx is queued on the op's stream; the weight gradients run on a
// side stream after it, so the caller's next work on dx (the expert-parallel dispatch's backward,
// the previous layer) need not wait for them. The returned handle holds that work and keeps what
// it reads and writes allocated (dy, the saved activations, internal temporaries, the weight
// gradients), even when the caller drops its own handles. wait() makes the op's stream wait for
// the work (the host never blocks); after it the weight gradients may be read on that stream.
// Until then the caller must not read the weight gradients, nor write dy, the forward's input or
// a main_grad through memory it owns. Dropping the handle waits too, so no work is ever left
// unordered; a handle that holds nothing (CPU contexts, nothing to overlap, no side stream) is
// already done. A later backward that joins (not deferred) on the same context also waits for
// it: the side stream is one per context, in order. Under a CUDA graph capture, wait() (or drop
// the handle) before the capture ends: a capture with unjoined side work is invalid.
//
//   auto g = fc.backward(saved, dy, {.defer_weight_grads = true});
//   dispatch_backward(g.input);     // starts as soon as dx is written
//   g.weight_grads.wait();          // the op's stream now waits for dW
//   optimizer_step(g.weight);
#pragma once

#include <memory>

namespace moekit {
namespace detail {
struct PendingAccess;  // src/core/side_stream.h
}

class PendingWork {
 public:
  PendingWork();
  ~PendingWork();  // wait(), errors ignored
  PendingWork(PendingWork&& other) noexcept;
  PendingWork& operator=(PendingWork&& other) noexcept;  // waits for this handle's work first
  PendingWork(const PendingWork&) = delete;
  PendingWork& operator=(const PendingWork&) = delete;

  /// Whether work is queued that no stream has been made to wait for.
  bool pending() const;
  /// The stream of every op that queued the work waits for it; what it held is released.
  void wait();
  /// Takes over `other`'s work (Sequential gathers its ops' into one handle).
  void merge(PendingWork&& other);

 private:
  friend struct detail::PendingAccess;
  struct State;  // src/core/side_stream.h
  State& state();
  std::unique_ptr<State> state_;
};

}  // namespace moekit
