// bench/mlp_problem.cuh — the grouped MLP's backward problems of the probes (moekit_overlap_probe,
// moekit_ep_probe): the `moekit run` presets' shapes, Dirichlet(1) routing as device splits, bf16
// normal(0, 1) data as moekit_bench, routing probabilities in [0.1, 1.1).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_common.cuh"
#include "moekit/moekit.h"

namespace moekit_bench {

using moekit::Context;
using moekit::DType;
using moekit::Shape;
using moekit::Splits;
using moekit::Tensor;

struct Preset {
  const char* name;
  int64_t E, T, H, F;
};
inline constexpr Preset kPresets[] = {{"qwen3", 16, 16384, 4096, 1536},
                                      {"dsv3", 8, 32768, 7168, 2048}};

static __global__ void uniform_f32(float* p, size_t n,
                                   uint64_t seed) {  // in [0.1, 1.1): routing probs
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x)
    p[i] = 0.1f + static_cast<float>(mix64(seed + i) >> 40) * (1.0f / 16777216.0f);
}

inline Tensor normal(const Shape& shape, uint64_t seed, const Context& ctx) {
  Tensor t = Tensor::empty(shape, DType::BF16, ctx);
  randn_bf16<<<1024, 256, 0, static_cast<cudaStream_t>(ctx.stream())>>>(
      t.data_as<__nv_bfloat16>(), static_cast<size_t>(t.numel()), seed);
  MOEKIT_BENCH_CHECK(cudaGetLastError());
  return t;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The backward's operands and outputs of one preset; every output written by both ways.
struct Problem {
  Preset p;
  Splits splits;
  Tensor x, w1, w2, h, z, probs, dy;  // inputs (saved activations and weights)
  Tensor dh, dx, dw1, dw2, dprobs;    // outputs
};

inline Problem make_problem(const Preset& p, const Context& ctx) {
  Problem q{p};
  const auto counts = dirichlet_counts(p.E, p.T, 7);
  std::vector<int64_t> host(counts);
  Tensor dev_counts = Tensor::empty({p.E}, DType::I64, ctx);
  MOEKIT_BENCH_CHECK(cudaMemcpyAsync(dev_counts.data(), host.data(), host.size() * sizeof(int64_t),
                                     cudaMemcpyHostToDevice,
                                     static_cast<cudaStream_t>(ctx.stream())));
  q.splits = Splits::device(dev_counts);
  q.x = normal({p.T, p.H}, 1, ctx);
  q.w1 = normal({p.E, 2 * p.F, p.H}, 2, ctx);
  q.w2 = normal({p.E, p.H, p.F}, 3, ctx);
  q.h = normal({p.T, 2 * p.F}, 4, ctx);
  q.z = normal({p.T, p.F}, 5, ctx);
  q.dy = normal({p.T, p.H}, 6, ctx);
  q.probs = Tensor::empty({p.T}, DType::F32, ctx);
  uniform_f32<<<256, 256, 0, static_cast<cudaStream_t>(ctx.stream())>>>(
      q.probs.data_as<float>(), static_cast<size_t>(p.T), 8);
  MOEKIT_BENCH_CHECK(cudaGetLastError());
  q.dh = Tensor::empty({p.T, 2 * p.F}, DType::BF16, ctx);
  q.dx = Tensor::empty({p.T, p.H}, DType::BF16, ctx);
  q.dw1 = Tensor::empty({p.E, 2 * p.F, p.H}, DType::BF16, ctx);
  q.dw2 = Tensor::empty({p.E, p.H, p.F}, DType::BF16, ctx);
  q.dprobs = Tensor::empty({p.T}, DType::F32, ctx);
  return q;
}

// Whether two device tensors hold the same bytes (synchronous).
inline bool same_bytes(const Tensor& a, const Tensor& b) {
  std::vector<unsigned char> x(a.nbytes()), y(b.nbytes());
  MOEKIT_BENCH_CHECK(cudaMemcpy(x.data(), a.data(), x.size(), cudaMemcpyDeviceToHost));
  MOEKIT_BENCH_CHECK(cudaMemcpy(y.data(), b.data(), y.size(), cudaMemcpyDeviceToHost));
  return x == y;
}

// A probe's --margins list ("8,16,32": SM counts 1..131); empty when any entry is not one.
inline std::vector<int> parse_sm_margins(const std::string& list) {
  std::vector<int> out;
  for (size_t at = 0; at <= list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const int m = std::atoi(list.substr(at, comma - at).c_str());
    if (m < 1 || m > 131) return {};
    out.push_back(m);
    at = comma + 1;
  }
  return out;
}

// The options both probes take — --presets, --steps, --turns, --warmup-ms, --margins — with the
// defaults each gives. take() returns 1 when `arg` is one of them (its value `v` stored), 0 when
// not, -1 when its value is bad (*why says so); check() says what is wrong once all are taken.
struct ProbeArgs {
  std::string presets = "qwen3,dsv3";
  int steps = 1, turns = 1;
  double warmup_ms = 0;
  std::vector<int> margins;

  int take(const std::string& arg, const std::string& v, std::string* why) {
    if (arg == "--presets") {
      presets = v;
    } else if (arg == "--steps") {
      steps = std::atoi(v.c_str());
    } else if (arg == "--turns") {
      turns = std::atoi(v.c_str());
    } else if (arg == "--warmup-ms") {
      warmup_ms = std::atof(v.c_str());
    } else if (arg == "--margins") {
      margins = parse_sm_margins(v);
      if (margins.empty()) {
        *why = "--margins takes SM counts 1..131, got " + v;
        return -1;
      }
    } else {
      return 0;
    }
    return 1;
  }
  std::string check() const {
    if (steps < 1) return "--steps must be >= 1, got " + std::to_string(steps);
    if (turns < 1) return "--turns must be >= 1, got " + std::to_string(turns);
    return "";
  }
  // Whether --presets names `p` (a comma-separated list).
  bool wants(const Preset& p) const {
    return ("," + presets + ",").find(std::string(",") + p.name + ",") != std::string::npos;
  }
};

}  // namespace moekit_bench
