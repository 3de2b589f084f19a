// Internal: the argument bundles of the router primitives (moekit/primitives/router.h), already
// validated, as passed to their backends.
#pragma once

#include <cstdint>

#include "moekit/core/context.h"
#include "moekit/core/tensor.h"
#include "moekit/primitives/router.h"

namespace moekit::detail {

/// router_topk: logits → scores → top-k of each token.
struct RouterTopkArgs {
  Context ctx;
  Tensor x;     // [T, H] dtype
  Tensor gate;  // [E, H] dtype
  RouterOptions options;
  Tensor topk_idx;      // [T, k] i64
  Tensor topk_weights;  // [T, k] f32
  Tensor scores;        // [T, E] fp64 bytes (an i64 tensor)
  int64_t tokens, hidden, experts;
};

/// router_topk_backward: d topk_weights → d logits → dWg, dx.
struct RouterTopkBackwardArgs {
  Context ctx;
  Tensor x;                  // [T, H] dtype
  Tensor gate;               // [E, H] dtype
  Tensor scores;             // [T, E] fp64 bytes
  Tensor topk_idx;           // [T, k] i64
  Tensor grad_topk_weights;  // [T, k] f32
  Tensor grad_expert_input;  // [T, H] dtype or undefined (0)
  RouterOptions options;
  Tensor grad_gate;    // [E, H] dtype
  Tensor grad_input;   // [T, H] dtype; may be grad_expert_input itself
  Tensor grad_logits;  // [T, E] fp64 bytes: the backend's workspace (allocated at bind on CUDA)
  int64_t tokens, hidden, experts;
};

}  // namespace moekit::detail
