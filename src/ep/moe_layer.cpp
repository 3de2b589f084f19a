// MoELayer: router → ExpertParallel dispatch → GroupedMLP (into the EP buffers) → combine
// (moekit/ep/moe_layer.h). The router is host code in fp64 (CPU ranks); everything else is the
// library's ops.
#include "moekit/ep/moe_layer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "core/checks.h"
#include "moekit/core/error.h"

namespace moekit {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::vector<double> as_f64(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  to_f64(t.data(), t.dtype(), v.data(), v.size());
  return v;
}

}  // namespace

MoELayer::MoELayer(Communicator& comm, const MoELayerConfig& config)
    : config_(config), comm_(&comm) {
  if (config.ffn < 1) throw_invalid("ffn", "a value >= 1", std::to_string(config.ffn));
  ep_ = std::make_unique<ExpertParallel>(comm, config.ep);
  const ExpertParallelConfig& c = config.ep;
  mlp_ = std::make_unique<GroupedMLP>(GroupedMLPConfig{.groups = c.experts_per_rank,
                                                       .hidden = c.hidden,
                                                       .ffn = config.ffn,
                                                       .dtype = c.dtype,
                                                       .fc1_bias = config.fc1_bias,
                                                       .fc2_bias = config.fc2_bias,
                                                       .layout = config.layout},
                                      comm.context());
  gate_ = Tensor::empty({ep_->experts(), c.hidden}, c.dtype, comm.context());  // [E, H]
}

MoELayer::~MoELayer() = default;

Tensor MoELayer::forward(const Tensor& x, Saved* saved) {
  const ExpertParallelConfig& c = config_.ep;
  const Context& ctx = comm_->context();
  const int64_t H = c.hidden, E = ep_->experts(), k = c.topk;
  forward_phases_ = {};
  auto t0 = Clock::now();
  // ---- router (fp64): logits, scores, top-k. x is validated here and, collectively, by dispatch.
  check_input("input", x, {-1, H}, c.dtype, ctx.device());
  const int64_t T = x.size(0);
  const std::vector<double> xv = as_f64(x), gv = as_f64(gate_);
  auto scores = std::make_shared<std::vector<double>>(static_cast<size_t>(T * E));
  Tensor idx = Tensor::empty({T, k}, DType::I64, ctx);  // [T, k]
  Tensor w = Tensor::empty({T, k}, DType::F32, ctx);    // [T, k]
  std::vector<int64_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    double* s = scores->data() + t * E;
    for (int64_t e = 0; e < E; ++e) {
      double l = 0;
      for (int64_t h = 0; h < H; ++h)
        l += xv[static_cast<size_t>(t * H + h)] * gv[static_cast<size_t>(e * H + h)];
      s[e] = l;
    }
    if (config_.score == RouterScore::Softmax) {
      const double m = *std::max_element(s, s + E);
      double z = 0;
      for (int64_t e = 0; e < E; ++e) z += (s[e] = std::exp(s[e] - m));
      for (int64_t e = 0; e < E; ++e) s[e] /= z;
    } else {
      for (int64_t e = 0; e < E; ++e) s[e] = 1.0 / (1.0 + std::exp(-s[e]));
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int64_t a, int64_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += s[order[static_cast<size_t>(j)]];
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = order[static_cast<size_t>(j)];
      idx.data_as<int64_t>()[t * k + j] = e;
      w.data_as<float>()[t * k + j] =
          static_cast<float>(config_.normalize_topk ? s[e] / sum : s[e]);
    }
  }
  forward_phases_.router_ms = ms_since(t0);
  // ---- dispatch → experts (output straight into the combine's input) → combine
  t0 = Clock::now();
  ExpertParallel::Dispatched d = ep_->dispatch(x, idx, w);
  forward_phases_.dispatch_ms = ms_since(t0);
  forward_phases_.dispatch_traffic = ep_->last_traffic();
  t0 = Clock::now();
  GroupedMLP::Saved mlp_saved;
  Tensor expert_out = mlp_->forward(d.recv, d.weights, d.splits, {.output = ep_->combine_input()},
                                    saved ? &mlp_saved : nullptr);
  forward_phases_.mlp_ms = ms_since(t0);
  t0 = Clock::now();
  Tensor y = ep_->combine(d.handle, expert_out);
  forward_phases_.combine_ms = ms_since(t0);
  forward_phases_.combine_traffic = ep_->last_traffic();
  if (saved) {
    saved->input = x;
    saved->topk_idx = idx;
    saved->topk_weights = w;
    saved->handle = d.handle;
    saved->mlp = std::move(mlp_saved);
    saved->expert_out = expert_out;
    saved->scores = std::move(scores);
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
  const int64_t H = c.hidden, E = ep_->experts(), k = c.topk, T = s.input.size(0);
  check_input("grad_output", dy, {T, H}, c.dtype, ctx.device());
  backward_phases_ = {};
  auto t0 = Clock::now();
  Tensor dY = ep_->combine_backward(s.handle, dy);  // [R, H]
  backward_phases_.combine_ms = ms_since(t0);
  backward_phases_.combine_traffic = ep_->last_traffic();
  t0 = Clock::now();
  Grads g;
  g.experts = mlp_->backward(
      s.mlp, dY,
      {.grad_input = ep_->dispatch_backward_input(), .retain_saved = options.retain_saved});
  backward_phases_.mlp_ms = ms_since(t0);
  t0 = Clock::now();
  ExpertParallel::DispatchGrads dg =
      ep_->dispatch_backward(s.handle, g.experts.input, g.experts.probs);
  backward_phases_.dispatch_ms = ms_since(t0);
  backward_phases_.dispatch_traffic = ep_->last_traffic();
  // ---- router backward (fp64): d(weights) → d(scores) → d(logits) → dWg, dx_r
  t0 = Clock::now();
  const std::vector<double> xv = as_f64(s.input), gv = as_f64(gate_), dxe = as_f64(dg.tokens);
  std::vector<double> dgate(static_cast<size_t>(E * H), 0.0), dx(dxe);
  std::vector<double> ds(static_cast<size_t>(E)), dl(static_cast<size_t>(E));
  const int64_t* idx = s.topk_idx.data_as<int64_t>();
  const float* gw = dg.topk_weights.data_as<float>();
  for (int64_t t = 0; t < T; ++t) {
    const double* sc = s.scores->data() + t * E;
    std::fill(ds.begin(), ds.end(), 0.0);
    if (config_.normalize_topk) {
      double z = 0, gdotw = 0;
      for (int64_t j = 0; j < k; ++j) z += sc[idx[t * k + j]];
      for (int64_t j = 0; j < k; ++j) gdotw += gw[t * k + j] * sc[idx[t * k + j]] / z;
      for (int64_t j = 0; j < k; ++j)
        ds[static_cast<size_t>(idx[t * k + j])] = (gw[t * k + j] - gdotw) / z;
    } else {
      for (int64_t j = 0; j < k; ++j) ds[static_cast<size_t>(idx[t * k + j])] = gw[t * k + j];
    }
    if (config_.score == RouterScore::Softmax) {
      double dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += ds[static_cast<size_t>(e)] * sc[e];
      for (int64_t e = 0; e < E; ++e)
        dl[static_cast<size_t>(e)] = sc[e] * (ds[static_cast<size_t>(e)] - dot);
    } else {
      for (int64_t e = 0; e < E; ++e)
        dl[static_cast<size_t>(e)] = ds[static_cast<size_t>(e)] * sc[e] * (1 - sc[e]);
    }
    for (int64_t e = 0; e < E; ++e) {
      const double d = dl[static_cast<size_t>(e)];
      for (int64_t h = 0; h < H; ++h) {
        dgate[static_cast<size_t>(e * H + h)] += d * xv[static_cast<size_t>(t * H + h)];
        dx[static_cast<size_t>(t * H + h)] += d * gv[static_cast<size_t>(e * H + h)];
      }
    }
  }
  g.gate = Tensor::empty({E, H}, c.dtype, ctx);
  from_f64(dgate.data(), g.gate.data(), c.dtype, dgate.size());
  g.input = dg.tokens;  // dx_e's memory, now dx = round(dx_e + dx_r)
  from_f64(dx.data(), g.input.data(), c.dtype, dx.size());
  backward_phases_.router_ms = ms_since(t0);
  if (!options.retain_saved) *s.used = true;
  return g;
}

}  // namespace moekit
