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
  if (auto impl = cuda_side_context(ctx)) side_.emplace(Context(std::move(impl)));
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

}  // namespace moekit::detail
