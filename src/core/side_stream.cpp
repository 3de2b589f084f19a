#include "core/side_stream.h"

#include "core/env.h"
#include "core/runtime.h"

namespace moekit::detail {
namespace {

// MOEKIT_SIDE_STREAM=0|1 (unset: 1), read once.
bool side_stream_enabled() {
  static const bool on = env_choice("MOEKIT_SIDE_STREAM", {"0", "1"}) != 0;
  return on;
}

}  // namespace

SideStream::SideStream(const Context& ctx, bool wanted) : ctx_(ctx) {
  if (!wanted || !ctx.device().is_cuda() || !side_stream_enabled()) return;
  if (auto impl = cuda_side_context(ctx)) side_.emplace(ContextAccess::make(std::move(impl)));
}

SideStream::~SideStream() {
  try {
    join();
  } catch (...) {  // already failing, or the device is lost: nothing left to order
  }
}

const Context& SideStream::fork() {
  if (!side_) return ctx_;
  cuda_order_after(*side_, ctx_);
  forked_ = true;
  return *side_;
}

void SideStream::join() {
  if (!forked_) return;
  forked_ = false;
  cuda_order_after(ctx_, *side_);
}

Context deferred_context(const Context& side, int sms) {
  return sms > side.sm_margin() ? side.with_sm_margin(sms) : side;
}

void defer(PendingWork& pending, std::unique_ptr<SideStream> side, std::vector<Tensor> held) {
  if (!side || !side->forked()) return;  // nothing queued beside the op's stream
  auto& state = PendingAccess::state(pending);
  state.sides.push_back(std::move(side));
  for (auto& t : held) {
    if (t.defined()) state.held.push_back(std::move(t));
  }
}

}  // namespace moekit::detail

namespace moekit {

PendingWork::PendingWork() = default;

PendingWork::~PendingWork() {
  try {
    wait();
  } catch (...) {  // already failing, or the device is lost: nothing left to order
  }
}

PendingWork::PendingWork(PendingWork&& other) noexcept : state_(std::move(other.state_)) {}

PendingWork& PendingWork::operator=(PendingWork&& other) noexcept {
  if (this != &other) {
    try {
      wait();
    } catch (...) {
    }
    state_ = std::move(other.state_);
  }
  return *this;
}

bool PendingWork::pending() const {
  if (!state_) return false;
  for (const auto& side : state_->sides) {
    if (side->forked()) return true;
  }
  return false;
}

void PendingWork::wait() {
  if (!state_) return;
  for (auto& side : state_->sides) side->join();
  state_.reset();  // what the work held goes only after the op's stream waits for it
}

void PendingWork::merge(PendingWork&& other) {
  if (!other.state_) return;
  auto& mine = state();
  for (auto& side : other.state_->sides) mine.sides.push_back(std::move(side));
  for (auto& t : other.state_->held) mine.held.push_back(std::move(t));
  other.state_.reset();
}

PendingWork::State& PendingWork::state() {
  if (!state_) state_ = std::make_unique<State>();
  return *state_;
}

}  // namespace moekit
