// The router on the CPU (moekit/primitives/router.h): fp64 loops in the header's order. The
// oracle of the CUDA router (src/backends/cuda/router.cu), which follows these loops step by step.
#include "backends/cpu/cpu_router.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "moekit/core/dtype.h"
#include "moekit/core/error.h"

namespace moekit::cpu {
namespace {

std::vector<double> as_f64(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  to_f64(t.data(), t.dtype(), v.data(), v.size());
  return v;
}

std::string reject_unless_cpu(const Context& ctx) {
  return ctx.device().is_cpu() ? "" : str("the context's device is ", ctx.device().to_string());
}

std::string router_topk_rejects(const detail::RouterTopkArgs& a) {
  return reject_unless_cpu(a.ctx);
}

void router_topk_run(const detail::RouterTopkArgs& a) {
  const int64_t T = a.tokens, H = a.hidden, E = a.experts, k = a.options.topk;
  if (T == 0) return;
  const std::vector<double> xv = as_f64(a.x), gv = as_f64(a.gate);
  double* scores = static_cast<double*>(a.scores.data());  // [T, E]
  int64_t* idx = a.topk_idx.data_as<int64_t>();            // [T, k]
  float* w = a.topk_weights.data_as<float>();              // [T, k]
  std::vector<int64_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    double* s = scores + t * E;
    for (int64_t e = 0; e < E; ++e) {
      double l = 0;
      for (int64_t h = 0; h < H; ++h)
        l += xv[static_cast<size_t>(t * H + h)] * gv[static_cast<size_t>(e * H + h)];
      s[e] = l;
    }
    if (a.options.score == RouterScore::Softmax) {
      const double m = *std::max_element(s, s + E);
      double z = 0;
      for (int64_t e = 0; e < E; ++e) z += (s[e] = std::exp(s[e] - m));
      for (int64_t e = 0; e < E; ++e) s[e] /= z;
    } else {
      for (int64_t e = 0; e < E; ++e) s[e] = 1.0 / (1.0 + std::exp(-s[e]));
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int64_t p, int64_t q) { return s[p] > s[q] || (s[p] == s[q] && p < q); });
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += s[order[static_cast<size_t>(j)]];
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = order[static_cast<size_t>(j)];
      idx[t * k + j] = e;
      w[t * k + j] = static_cast<float>(a.options.normalize ? s[e] / sum : s[e]);
    }
  }
}

std::string router_topk_backward_rejects(const detail::RouterTopkBackwardArgs& a) {
  return reject_unless_cpu(a.ctx);
}

void router_topk_backward_run(const detail::RouterTopkBackwardArgs& a) {
  const int64_t T = a.tokens, H = a.hidden, E = a.experts, k = a.options.topk;
  const DType dt = a.x.dtype();
  std::vector<double> dgate(static_cast<size_t>(E * H), 0.0);
  if (T > 0) {
    const std::vector<double> xv = as_f64(a.x), gv = as_f64(a.gate);
    std::vector<double> dx = a.grad_expert_input.defined()
                                 ? as_f64(a.grad_expert_input)
                                 : std::vector<double>(static_cast<size_t>(T * H), 0.0);
    std::vector<double> ds(static_cast<size_t>(E)), dl(static_cast<size_t>(E));
    const double* scores = static_cast<const double*>(a.scores.data());
    const int64_t* idx = a.topk_idx.data_as<const int64_t>();
    const float* gw = a.grad_topk_weights.data_as<const float>();
    for (int64_t t = 0; t < T; ++t) {
      const double* sc = scores + t * E;
      std::fill(ds.begin(), ds.end(), 0.0);
      if (a.options.normalize) {
        double z = 0, gdotw = 0;
        for (int64_t j = 0; j < k; ++j) z += sc[idx[t * k + j]];
        for (int64_t j = 0; j < k; ++j) gdotw += gw[t * k + j] * sc[idx[t * k + j]] / z;
        for (int64_t j = 0; j < k; ++j)
          ds[static_cast<size_t>(idx[t * k + j])] = (gw[t * k + j] - gdotw) / z;
      } else {
        for (int64_t j = 0; j < k; ++j) ds[static_cast<size_t>(idx[t * k + j])] = gw[t * k + j];
      }
      if (a.options.score == RouterScore::Softmax) {
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
    from_f64(dx.data(), a.grad_input.data(), dt, dx.size());
  }
  from_f64(dgate.data(), a.grad_gate.data(), dt, dgate.size());
}

}  // namespace

constexpr detail::Backend<detail::RouterTopkArgs> kRouterTopk{"cpu", router_topk_rejects,
                                                              router_topk_run};
constexpr detail::Backend<detail::RouterTopkBackwardArgs> kRouterTopkBackward{
    "cpu", router_topk_backward_rejects, router_topk_backward_run};

}  // namespace moekit::cpu
