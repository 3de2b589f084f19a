// MoELayer: router → ExpertParallel dispatch → GroupedMLP (into the EP buffers) → combine
// (moekit/ep/moe_layer.h), written once for every device: the router is the router primitive
// (moekit/primitives/router.h), the rest ExpertParallel and GroupedMLP.
#include "moekit/ep/moe_layer.h"

#include <chrono>

#include "core/checks.h"
#include "moekit/core/error.h"

namespace moekit {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

MoELayer::MoELayer(Communicator& comm, const MoELayerConfig& config)
    : config_(config), comm_(&comm) {
  if (config.ffn < 1) throw_invalid("ffn", "a value >= 1", std::to_string(config.ffn));
  if (config.recipe.enabled() && config.ep.alignment % config.recipe.group_rows_multiple() != 0) {
    throw_invalid("ep.alignment",
                  str("a multiple of ", config.recipe.group_rows_multiple(), " (recipe ",
                      config.recipe.name(), ": every expert's rows padded to its multiple)"),
                  std::to_string(config.ep.alignment));
  }
  ep_ = std::make_unique<ExpertParallel>(comm, config.ep);
  const ExpertParallelConfig& c = config.ep;
  mlp_ = std::make_unique<GroupedMLP>(GroupedMLPConfig{.groups = c.experts_per_rank,
                                                       .hidden = c.hidden,
                                                       .ffn = config.ffn,
                                                       .dtype = c.dtype,
                                                       .fc1_bias = config.fc1_bias,
                                                       .fc2_bias = config.fc2_bias,
                                                       .layout = config.layout,
                                                       .recipe = config.recipe},
                                      comm.context());
  gate_ = Tensor::empty({ep_->experts(), c.hidden}, c.dtype, comm.context());  // [E, H]
}

MoELayer::~MoELayer() = default;

RouterOptions MoELayer::router_options() const {
  return {.topk = config_.ep.topk, .score = config_.score, .normalize = config_.normalize_topk};
}

void MoELayer::end_phase() const {
  if (config_.time_phases) comm_->context().synchronize();
}

Tensor MoELayer::forward(const Tensor& x, Saved* saved) {
  const ExpertParallelConfig& c = config_.ep;
  const Context& ctx = comm_->context();
  const int64_t H = c.hidden, E = ep_->experts(), k = c.topk;
  forward_phases_ = {};
  auto t0 = Clock::now();
  // ---- router (moekit/primitives/router.h; fp64 on every device). x is validated here and,
  // collectively, by dispatch.
  check_input("input", x, {-1, H}, c.dtype, ctx.device());
  const int64_t T = x.size(0);
  Tensor idx = Tensor::empty({T, k}, DType::I64, ctx);     // [T, k]
  Tensor w = Tensor::empty({T, k}, DType::F32, ctx);       // [T, k]
  Tensor scores = Tensor::empty({T, E}, DType::I64, ctx);  // [T, E] fp64 bytes
  router_topk(ctx, x, gate_, router_options(), idx, w, scores);
  end_phase();
  forward_phases_.router_ms = ms_since(t0);
  // ---- dispatch → experts (output straight into the combine's input) → combine
  t0 = Clock::now();
  ExpertParallel::Dispatched d = ep_->dispatch(x, idx, w);
  end_phase();
  forward_phases_.dispatch_ms = ms_since(t0);
  forward_phases_.dispatch_traffic = ep_->last_traffic();
  t0 = Clock::now();
  GroupedMLP::Saved mlp_saved;
  Tensor expert_out = mlp_->forward(d.recv, d.weights, d.splits, {.output = ep_->combine_input()},
                                    saved ? &mlp_saved : nullptr);
  end_phase();
  forward_phases_.mlp_ms = ms_since(t0);
  t0 = Clock::now();
  Tensor y = ep_->combine(d.handle, expert_out);
  end_phase();
  forward_phases_.combine_ms = ms_since(t0);
  forward_phases_.combine_traffic = ep_->last_traffic();
  if (saved) {
    saved->input = x;
    saved->topk_idx = idx;
    saved->topk_weights = w;
    saved->handle = d.handle;
    saved->mlp = std::move(mlp_saved);
    saved->expert_out = expert_out;
    saved->scores = scores;
    saved->valid = true;
    saved->used = std::make_shared<bool>(false);
  }
  return y;
}

MoELayer::Grads MoELayer::backward(Saved& s, const Tensor& dy, const BackwardOptions& options) {
  if (!s.valid)
    throw_invalid("saved", "the context filled by forward(x, &saved)", "an empty context");
  check_backward_once(s.used);
  const ExpertParallelConfig& c = config_.ep;
  const Context& ctx = comm_->context();
  const int64_t H = c.hidden, E = ep_->experts(), T = s.input.size(0);
  check_input("grad_output", dy, {T, H}, c.dtype, ctx.device());
  backward_phases_ = {};
  auto t0 = Clock::now();
  Tensor dY = ep_->combine_backward(s.handle, dy);  // [R, H]
  end_phase();
  backward_phases_.combine_ms = ms_since(t0);
  backward_phases_.combine_traffic = ep_->last_traffic();
  t0 = Clock::now();
  Grads g;
  g.experts = mlp_->backward(
      s.mlp, dY,
      {.grad_input = ep_->dispatch_backward_input(), .retain_saved = options.retain_saved});
  end_phase();
  backward_phases_.mlp_ms = ms_since(t0);
  t0 = Clock::now();
  ExpertParallel::DispatchGrads dg =
      ep_->dispatch_backward(s.handle, g.experts.input, g.experts.probs);
  end_phase();
  backward_phases_.dispatch_ms = ms_since(t0);
  backward_phases_.dispatch_traffic = ep_->last_traffic();
  // ---- router backward (fp64): d(weights) → d(scores) → d(logits) → dWg, dx_r; dx = round(dx_e +
  // dx_r) once, in dx_e's memory
  t0 = Clock::now();
  g.gate = Tensor::empty({E, H}, c.dtype, ctx);  // [E, H]
  router_topk_backward(ctx, s.input, gate_, s.scores, s.topk_idx, dg.topk_weights, dg.tokens,
                       router_options(), g.gate, dg.tokens);
  g.input = dg.tokens;
  end_phase();
  backward_phases_.router_ms = ms_since(t0);
  if (!options.retain_saved) *s.used = true;
  return g;
}

}  // namespace moekit
