// moekit/ops/grouped_linear.h — G expert Linear layers applied to rows grouped by expert.
//
// Math (SPEC §2). Parameters: weight W [G, N, K] (row g is expert g's (out, in) matrix, exactly
// like torch.nn.Linear.weight; the layout is canonical and never inferred from shapes), optional
// bias b [G, N]. Splits give m_g rows to group g, off_g = sum_{j<g} m_j, S = sum m_g <= T.
//   forward   y[off_g : off_g+m_g] = x[off_g : off_g+m_g] · W_gᵀ + b_g        x [T, K] → y [T, N]
//   backward  dx_g = dy_g · W_g                                               dx [T, K]
//             dW_g = dy_gᵀ · x_g   (or main_grad_g += dy_gᵀ · x_g, fp32)       dW [G, N, K]
//             db_g = Σ_rows dy_g   (fp32 accumulation)                         db [G, N]
// Rows [S, T) of y and dx are never written. Zero-row groups are fine: dW_g = 0 (main_grad_g
// unchanged), db_g = 0. Gradients nobody needs are not computed: no dx when the input did not
// require grad, no dW/db when the weights are frozen.
// dtypes: activations and parameters share one dtype (f32, f16, bf16); accumulation is fp32.
//
// Caller-provided buffers (SPEC §3). `ForwardOptions::output` receives y and
// `BackwardOptions::grad_input` receives dx. Requirements, checked on host metadata before any
// work, in this order: shape ([T, N] resp. [T, K], tail included), dtype (the activation dtype),
// device (the op's), contiguity (row-major dense), no overlap with any input of the same call.
// A failed check throws Error(InvalidArgument) naming the buffer, the expected and the seen value,
// and nothing is written. On success the returned tensor *is* the buffer (same data pointer and
// shape), written in place with no temporary, bit-identical to the internally allocated result,
// and rows [S, T) keep their previous contents. Internally allocated outputs leave rows [S, T)
// uninitialised.
//
//   GroupedLinear fc({.groups = E, .in = H, .out = F, .dtype = DType::BF16}, ctx);
//   GroupedLinear::Saved saved;
//   Tensor y = fc.forward(x, splits, {.output = y_buf}, &saved);      // y aliases y_buf
//   auto g = fc.backward(saved, dy, {.grad_input = dx_buf});          // g.input aliases dx_buf
//
// Quantized recipes (SPEC §6d): `config.recipe` (per layer, like a TE module inside one autocast
// recipe; Recipe::none() = the bf16/fp16/fp32 path above) runs every GEMM on quantized operands,
// TE's choice for each: forward x rowwise · W rowwise, dgrad dy rowwise · W columnwise, wgrad
// dy columnwise · x columnwise (Recipe::spec gives each role's format: HYBRID = e4m3 x and W,
// e5m2 dy). The output and the gradients keep every promise above (caller buffers written in
// place, tail untouched, checks before any work). The weight's quantized copies are made by the
// first forward after the weight changed and reused until it changes again: set_weight() or
// notify_weight_changed() (call it after writing the weight in place, e.g. an optimizer step)
// bumps weight_version(). The input is quantized once in forward and its columnwise copy saved
// for the weight gradient. bias and db stay in the activation dtype (db from the unquantized dy).
//
// Deferred weight gradients (`defer_weight_grads`): dx is queued first and the call returns;
// dW runs after it on a side stream until `g.weight_grads.wait()` (or g's destruction) makes the
// op's stream wait. On a CPU context, or without a dx to overlap, nothing is deferred.
#pragma once

#include <cstdint>

#include "moekit/core/context.h"
#include "moekit/core/pending.h"
#include "moekit/core/splits.h"
#include "moekit/core/tensor.h"
#include "moekit/ops/bound.h"
#include "moekit/primitives/quantize.h"

namespace moekit {
namespace detail {
class Plan;
}  // namespace detail

struct GroupedLinearConfig {
  int64_t groups = 0;          // G experts on this rank
  int64_t in = 0;              // K in_features
  int64_t out = 0;             // N out_features
  DType dtype = DType::BF16;   // activations and parameters
  bool bias = false;           // has bias [G, N]
  /// Quantized recipe of the layer's GEMMs (SPEC §6); none: the dtype's own GEMMs. Alignment:
  /// in, out and every group's rows multiples of recipe.dim_multiple() / group_rows_multiple().
  Recipe recipe = {};
};

struct GroupedLinearForwardOptions {
  Tensor output;                     // optional caller buffer for y: [T, N], activation dtype
  bool input_requires_grad = true;   // false: backward will not compute dx
};

struct GroupedLinearBackwardOptions {
  Tensor grad_input;  // optional caller buffer for dx: [T, K], activation dtype
  /// true: return once dx is queued; dW (and main_grad's update) may still be running on a side
  /// stream — Grads::weight_grads holds it until wait() (moekit/core/pending.h, SPEC §1b).
  bool defer_weight_grads = false;
  /// With defer_weight_grads: the deferred GEMMs leave this many SMs to the caller's work on dx
  /// (as Context::with_sm_margin, when larger than the context's margin; the input-gradient
  /// GEMMs keep the context's). 0 <= it < the device's SM count.
  int deferred_sm_margin = 0;
  /// One backward per forward (as PyTorch without retain_graph): a second backward of the same
  /// saved context is an error, since it would add into main_grad twice. true: this backward
  /// leaves the context usable for another one (PyTorch's retain_graph).
  bool retain_saved = false;
};

class GroupedLinear {
 public:
  /// Allocates weight (and bias) on ctx's device, uninitialised: fill them, or set_weight().
  GroupedLinear(const GroupedLinearConfig& config, const Context& ctx);

  const GroupedLinearConfig& config() const { return config_; }
  const Context& context() const { return ctx_; }

  const Tensor& weight() const { return weight_; }  // [G, N, K]
  Tensor weight(int64_t g) const;                   // expert g's [N, K] view of the packed weight
  const Tensor& bias() const { return bias_; }      // [G, N] or undefined
  /// Uses caller storage for the parameters (validated: shape, dtype, device, contiguity).
  void set_weight(const Tensor& weight);
  void set_bias(const Tensor& bias);
  /// Megatron-style fp32 gradient buffer [G, N, K]: backward then does main_grad += dW instead of
  /// returning a new tensor (Grads::weight is then this buffer). An undefined tensor turns it off.
  void set_main_grad(const Tensor& main_grad);
  const Tensor& main_grad() const { return main_grad_; }
  /// Frozen weights (false): backward computes neither dW nor db.
  void set_weight_requires_grad(bool requires_grad) { weight_requires_grad_ = requires_grad; }
  bool weight_requires_grad() const { return weight_requires_grad_; }
  /// Quantized recipes: the weight changed (written in place, e.g. by an optimizer step); the next
  /// forward quantizes it again. set_weight() does this itself.
  void notify_weight_changed();
  /// Bumped by every change of the weight (set_weight, notify_weight_changed).
  uint64_t weight_version() const;
  /// How many times a forward quantized the weight (tests: the cache is used).
  int64_t weight_quantizations() const;

  using ForwardOptions = GroupedLinearForwardOptions;
  /// What backward needs, filled by forward.
  struct Saved {
    Tensor input;   // x [T, K]
    Splits splits;
    bool input_requires_grad = false;
    bool valid = false;
    QuantizedTensor quantized_input;   // recipes: x's columnwise copy (for dW)
    QuantizedTensor quantized_weight;  // recipes: W's copies forward used (columnwise for dx)
    BackwardOnce used;  // set by the backward: one backward per forward
  };
  /// y = grouped x · Wᵀ + b. Pass `saved` to train (nullptr: inference, nothing kept).
  Tensor forward(const Tensor& x, const Splits& splits, const ForwardOptions& options = {},
                 Saved* saved = nullptr) const;

  using BackwardOptions = GroupedLinearBackwardOptions;
  struct Grads {
    Tensor input;   // dx [T, K] (undefined when the input did not require grad)
    Tensor weight;  // dW [G, N, K] param dtype, or main_grad (undefined when frozen)
    Tensor bias;    // db [G, N] param dtype (undefined without bias or when frozen)
    PendingWork weight_grads;  // with defer_weight_grads: wait() before reading weight
  };
  /// From dy [T, N]. One backward per forward unless options.retain_saved: a second backward of
  /// the same saved context is an InvalidArgument error (it would add dW into main_grad twice).
  Grads backward(const Saved& saved, const Tensor& grad_output,
                 const BackwardOptions& options = {}) const;

  /// forward / backward bound, not run (moekit/ops/bound.h): every check done, every backend
  /// chosen, the outputs allocated (or the caller's buffers); run() queues the work. For callers
  /// that bind several calls before running any (Sequential, GroupedLinearOp).
  BoundForward bind_forward(const Tensor& x, const Splits& splits, const ForwardOptions& options,
                            Saved* saved) const;
  BoundBackward bind_backward(const Saved& saved, const Tensor& grad_output,
                              const BackwardOptions& options) const;

 private:
  friend class GroupedMLP;  // a quantized grouped MLP feeds its layers' GEMMs itself
  /// Recipes: the recipe's alignment rules for these splits (host-readable counts), before any work.
  void check_recipe_rows(const Splits& splits) const;
  /// Recipes: the weight's copies `usage` names — the cached ones when they are current, else
  /// new ones quantized by a step appended to `plan` (which then caches them).
  QuantizedTensor bind_quantized_weight(detail::Plan& plan, QuantUsage usage) const;

  GroupedLinearConfig config_;
  Context ctx_;
  Tensor weight_, bias_, main_grad_;
  bool weight_requires_grad_ = true;
  struct WeightCache;  // the quantized weight of the current version (recipes)
  std::shared_ptr<WeightCache> cache_;
};

}  // namespace moekit
