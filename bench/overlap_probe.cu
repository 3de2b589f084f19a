// moekit_overlap_probe: does a grouped MLP's backward gain from running its weight gradients on a
// second stream, beside the input-gradient chain? (design/PERFORMANCE.md, "What holds each
// target": the MLP step.) Each persistent GEMM ends in a partial last wave; a GEMM on another
// stream can fill those SMs, which one stream cannot.
//
// For each preset (the `moekit run` presets' shapes: qwen3 E16 T16384 H4096 F1536, dsv3 E8 T32768
// H7168 F2048; Dirichlet(1) routing, device splits, bf16, normal(0, 1) data as moekit_bench) it
// times the backward's GEMMs and the SwiGLU backward, two ways, through the public primitives:
//   serial      one stream, the GroupedMLP::backward order: fc2 dgrad, fc2 wgrad, SwiGLU backward,
//               fc1 dgrad, fc1 wgrad;
//   two streams stream A: fc2 dgrad, SwiGLU backward, fc1 dgrad; stream B (a second Context, its
//               own workspace): fc2 wgrad, then (after A's SwiGLU backward) fc1 wgrad; A waits
//               for B at the end (fork / join with events).
// Both run --steps steps back to back per timed run (events on stream A around them), after
// --warmup-ms of the same work, in --turns turns (serial, then two streams); prints the medians
// per step and their ratio, and checks that both ways wrote bit-identical dx, dW1, dW2 and dh.
// With --deferred 1 it then measures the library's GroupedMLP::backward (the same preset, from
// one forward) joined against `defer_weight_grads` (SPEC §1b): per step the latency to dx (an
// event on the op's stream right after the call returns: for the joined call everything, for the
// deferred one the input-gradient chain) and to everything (after weight_grads.wait()), medians
// over --turns × --steps single steps; checks that both wrote bit-identical dx, dW1, dW2.
// Exit status 1 on any error or a mismatch, 2 on a bad argument.
// Usage: moekit_overlap_probe [--presets qwen3,dsv3] [--steps N] [--turns N] [--warmup-ms MS]
//                             [--deferred 0|1]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench_common.cuh"
#include "moekit/moekit.h"

namespace {

using namespace moekit;

using moekit_bench::dirichlet_counts;

struct Preset {
  const char* name;
  int64_t E, T, H, F;
};
constexpr Preset kPresets[] = {{"qwen3", 16, 16384, 4096, 1536}, {"dsv3", 8, 32768, 7168, 2048}};

__global__ void uniform_f32(float* p, size_t n, uint64_t seed) {  // in [0.1, 1.1): routing probs
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x)
    p[i] = 0.1f + static_cast<float>(moekit_bench::mix64(seed + i) >> 40) * (1.0f / 16777216.0f);
}

Tensor normal(const Shape& shape, uint64_t seed, const Context& ctx) {
  Tensor t = Tensor::empty(shape, DType::BF16, ctx);
  moekit_bench::randn_bf16<<<1024, 256, 0, static_cast<cudaStream_t>(ctx.stream())>>>(
      t.data_as<__nv_bfloat16>(), static_cast<size_t>(t.numel()), seed);
  MOEKIT_BENCH_CHECK(cudaGetLastError());
  return t;
}

double median(std::vector<double> v) {
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

Problem make_problem(const Preset& p, const Context& ctx) {
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

// One backward step, GroupedMLP::backward's calls (fc2's dgrad and the SwiGLU backward as one
// grouped_gemm_dswiglu; the automatic backend choice, as `moekit run`). Serial (b == nullptr):
// all on a, in backward's order. Otherwise the input-gradient chain on a, the weight gradients on
// b, forked from and joined back into a.
struct Fork {
  Context b;
  cudaEvent_t fork, dh_ready, join;
};

void step(const Problem& q, const Context& a, const Fork* f) {
  const auto sa = static_cast<cudaStream_t>(a.stream());
  if (f == nullptr) {
    grouped_gemm_group_k(a, q.dy, q.z, q.splits, q.dw2, false);
    grouped_gemm_dswiglu(a, q.dy, q.w2, q.splits, q.h, q.probs, GluLayout::Interleaved32, q.dh,
                         q.dprobs, false);
    grouped_gemm_group_m(a, q.dh, q.w1, BOp::Plain, q.splits, q.dx);
    grouped_gemm_group_k(a, q.dh, q.x, q.splits, q.dw1, false);
    return;
  }
  const auto sb = static_cast<cudaStream_t>(f->b.stream());
  MOEKIT_BENCH_CHECK(cudaEventRecord(f->fork, sa));
  MOEKIT_BENCH_CHECK(cudaStreamWaitEvent(sb, f->fork));
  grouped_gemm_group_k(f->b, q.dy, q.z, q.splits, q.dw2, false);
  grouped_gemm_dswiglu(a, q.dy, q.w2, q.splits, q.h, q.probs, GluLayout::Interleaved32, q.dh,
                       q.dprobs, false);
  MOEKIT_BENCH_CHECK(cudaEventRecord(f->dh_ready, sa));
  grouped_gemm_group_m(a, q.dh, q.w1, BOp::Plain, q.splits, q.dx);
  MOEKIT_BENCH_CHECK(cudaStreamWaitEvent(sb, f->dh_ready));
  grouped_gemm_group_k(f->b, q.dh, q.x, q.splits, q.dw1, false);
  MOEKIT_BENCH_CHECK(cudaEventRecord(f->join, sb));
  MOEKIT_BENCH_CHECK(cudaStreamWaitEvent(sa, f->join));
}

// Milliseconds per step of `steps` steps back to back (events on a's stream).
double time_steps(const Problem& q, const Context& a, const Fork* f, int steps) {
  const auto sa = static_cast<cudaStream_t>(a.stream());
  cudaEvent_t t0, t1;
  MOEKIT_BENCH_CHECK(cudaEventCreate(&t0));
  MOEKIT_BENCH_CHECK(cudaEventCreate(&t1));
  MOEKIT_BENCH_CHECK(cudaEventRecord(t0, sa));
  for (int i = 0; i < steps; ++i) step(q, a, f);
  MOEKIT_BENCH_CHECK(cudaEventRecord(t1, sa));
  MOEKIT_BENCH_CHECK(cudaEventSynchronize(t1));
  float ms = 0;
  MOEKIT_BENCH_CHECK(cudaEventElapsedTime(&ms, t0, t1));
  MOEKIT_BENCH_CHECK(cudaEventDestroy(t0));
  MOEKIT_BENCH_CHECK(cudaEventDestroy(t1));
  return ms / steps;
}

// A copy of every output of a step (device memory, compared bytewise after the other way ran).
std::vector<Tensor> snapshot(const Problem& q, const Context& ctx) {
  std::vector<Tensor> out;
  for (const Tensor* t : {&q.dx, &q.dw1, &q.dw2, &q.dh, &q.dprobs}) {
    Tensor c = Tensor::empty(t->shape(), t->dtype(), ctx);
    MOEKIT_BENCH_CHECK(cudaMemcpyAsync(c.data(), t->data(), t->nbytes(), cudaMemcpyDeviceToDevice,
                                       static_cast<cudaStream_t>(ctx.stream())));
    out.push_back(c);
  }
  return out;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  std::vector<unsigned char> x(a.nbytes()), y(b.nbytes());
  MOEKIT_BENCH_CHECK(cudaMemcpy(x.data(), a.data(), x.size(), cudaMemcpyDeviceToHost));
  MOEKIT_BENCH_CHECK(cudaMemcpy(y.data(), b.data(), y.size(), cudaMemcpyDeviceToHost));
  return x == y;
}

int run_preset(const Preset& p, int steps, int turns, double warmup_ms) {
  cudaStream_t sa, sb;
  MOEKIT_BENCH_CHECK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
  MOEKIT_BENCH_CHECK(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
  const Context a = Context::cuda(0, sa);
  Fork f{Context::cuda(0, sb), {}, {}, {}};
  MOEKIT_BENCH_CHECK(cudaEventCreateWithFlags(&f.fork, cudaEventDisableTiming));
  MOEKIT_BENCH_CHECK(cudaEventCreateWithFlags(&f.dh_ready, cudaEventDisableTiming));
  MOEKIT_BENCH_CHECK(cudaEventCreateWithFlags(&f.join, cudaEventDisableTiming));
  const Problem q = make_problem(p, a);

  // Both ways once, outputs compared bytewise (same kernels, same inputs: identical bits).
  step(q, a, nullptr);
  const std::vector<Tensor> serial_out = snapshot(q, a);
  step(q, a, &f);
  MOEKIT_BENCH_CHECK(cudaStreamSynchronize(sa));
  const char* names[] = {"dx", "dW1", "dW2", "dh", "dprobs"};
  const std::vector<Tensor> outs = {q.dx, q.dw1, q.dw2, q.dh, q.dprobs};
  int mismatches = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!same_bytes(serial_out[i], outs[i])) {
      std::printf("%s: %s differs between the serial and the two-stream step\n", p.name, names[i]);
      ++mismatches;
    }
  }

  // Sustained load first: both ways in turns for warmup_ms.
  const auto start = std::chrono::steady_clock::now();
  while (
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() <
      warmup_ms) {
    time_steps(q, a, nullptr, 2);
    time_steps(q, a, &f, 2);
  }
  std::vector<double> serial, fork;
  for (int t = 0; t < turns; ++t) {
    serial.push_back(time_steps(q, a, nullptr, steps));
    fork.push_back(time_steps(q, a, &f, steps));
  }
  const double s = median(serial), o = median(fork);
  std::printf("| %s | %lld | %lld | %lld | %lld | %.3f | %.3f | %.3f | %s |\n", p.name,
              static_cast<long long>(p.E), static_cast<long long>(p.T), static_cast<long long>(p.H),
              static_cast<long long>(p.F), s, o, s / o, mismatches ? "DIFFER" : "bit-identical");
  std::printf("<!-- %s turns, ms per step: serial", p.name);
  for (double v : serial) std::printf(" %.3f", v);
  std::printf("; two streams");
  for (double v : fork) std::printf(" %.3f", v);
  std::printf(" -->\n");
  std::fflush(stdout);
  MOEKIT_BENCH_CHECK(cudaEventDestroy(f.fork));
  MOEKIT_BENCH_CHECK(cudaEventDestroy(f.dh_ready));
  MOEKIT_BENCH_CHECK(cudaEventDestroy(f.join));
  return mismatches ? 1 : 0;
}

// ---- the library's backward, joined against deferred weight gradients
struct LatencyMs {
  std::vector<double> dx, all;
};

// One backward from `saved`: events before it, right after it returns (dx queued) and after the
// weight gradients were waited for; returns the grads (waited for).
GroupedMLP::Grads timed_backward(const GroupedMLP& mlp, const GroupedMLP::Saved& saved,
                                 const Tensor& dy, bool defer, cudaStream_t s, LatencyMs* out) {
  cudaEvent_t e[3];
  for (auto& ev : e) MOEKIT_BENCH_CHECK(cudaEventCreate(&ev));
  MOEKIT_BENCH_CHECK(cudaEventRecord(e[0], s));
  GroupedMLP::Grads g = mlp.backward(saved, dy, {.defer_weight_grads = defer});
  MOEKIT_BENCH_CHECK(cudaEventRecord(e[1], s));
  g.weight_grads.wait();
  MOEKIT_BENCH_CHECK(cudaEventRecord(e[2], s));
  MOEKIT_BENCH_CHECK(cudaEventSynchronize(e[2]));
  float dx_ms = 0, all_ms = 0;
  MOEKIT_BENCH_CHECK(cudaEventElapsedTime(&dx_ms, e[0], e[1]));
  MOEKIT_BENCH_CHECK(cudaEventElapsedTime(&all_ms, e[0], e[2]));
  for (auto& ev : e) MOEKIT_BENCH_CHECK(cudaEventDestroy(ev));
  if (out) {
    out->dx.push_back(dx_ms);
    out->all.push_back(all_ms);
  }
  return g;
}

int run_deferred(const Preset& p, int steps, int turns, double warmup_ms) {
  cudaStream_t sa;
  MOEKIT_BENCH_CHECK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
  const Context ctx = Context::cuda(0, sa);
  const Problem q = make_problem(p, ctx);
  const GroupedMLP mlp({.groups = p.E,
                        .hidden = p.H,
                        .ffn = p.F,
                        .dtype = DType::BF16,
                        .layout = GluLayout::Interleaved32},
                       ctx);
  mlp.fc1()->linear().set_weight(q.w1);
  mlp.fc2()->linear().set_weight(q.w2);
  GroupedMLP::Saved saved;
  mlp.forward(q.x, q.probs, q.splits, {}, &saved);

  int mismatches = 0;
  {
    const GroupedMLP::Grads a = timed_backward(mlp, saved, q.dy, false, sa, nullptr);
    const GroupedMLP::Grads b = timed_backward(mlp, saved, q.dy, true, sa, nullptr);
    const char* names[] = {"dx", "dW1", "dW2"};
    const Tensor as[] = {a.input, a.fc1.weight, a.fc2.weight},
                 bs[] = {b.input, b.fc1.weight, b.fc2.weight};
    for (int i = 0; i < 3; ++i) {
      if (!same_bytes(as[i], bs[i])) {
        std::printf("%s: %s differs between the joined and the deferred backward\n", p.name,
                    names[i]);
        ++mismatches;
      }
    }
  }
  const auto start = std::chrono::steady_clock::now();
  while (
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() <
      warmup_ms) {
    timed_backward(mlp, saved, q.dy, false, sa, nullptr);
    timed_backward(mlp, saved, q.dy, true, sa, nullptr);
  }
  LatencyMs joined, deferred;
  for (int t = 0; t < turns; ++t) {
    for (int i = 0; i < steps; ++i) timed_backward(mlp, saved, q.dy, false, sa, &joined);
    for (int i = 0; i < steps; ++i) timed_backward(mlp, saved, q.dy, true, sa, &deferred);
  }
  std::printf("| %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %s |\n", p.name, median(joined.dx),
              median(deferred.dx), median(joined.dx) / median(deferred.dx), median(joined.all),
              median(deferred.all), median(joined.all) / median(deferred.all),
              mismatches ? "DIFFER" : "bit-identical");
  std::fflush(stdout);
  return mismatches ? 1 : 0;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "moekit_overlap_probe: %s\nusage: moekit_overlap_probe [--presets qwen3,dsv3] "
               "[--steps N] [--turns N] [--warmup-ms MS] [--deferred 0|1]\n",
               why.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string presets = "qwen3,dsv3";
  int steps = 10, turns = 5;
  double warmup_ms = 1000;
  bool deferred = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) usage(arg + " needs a value");
    const std::string v = argv[++i];
    if (arg == "--presets")
      presets = v;
    else if (arg == "--steps")
      steps = std::atoi(v.c_str());
    else if (arg == "--turns")
      turns = std::atoi(v.c_str());
    else if (arg == "--warmup-ms")
      warmup_ms = std::atof(v.c_str());
    else if (arg == "--deferred") {
      if (v != "0" && v != "1") usage("--deferred must be 0 or 1, got " + v);
      deferred = v == "1";
    } else
      usage("unknown argument " + arg);
  }
  if (steps < 1) usage("--steps must be >= 1, got " + std::to_string(steps));
  if (turns < 1) usage("--turns must be >= 1, got " + std::to_string(turns));
  try {
    std::printf(
        "| preset | E | T | H | F | serial ms/step | two streams ms/step | serial / two streams | "
        "outputs |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|\n");
    int rc = 0;
    bool any = false;
    std::string list = ",";  // ",qwen3,dsv3,": each name looked up with its commas
    list += presets;
    list += ',';
    auto chosen = [&](const Preset& p) {
      return list.find(std::string(",") + p.name + ",") != std::string::npos;
    };
    for (const Preset& p : kPresets) {
      if (!chosen(p)) continue;
      any = true;
      rc |= run_preset(p, steps, turns, warmup_ms);
    }
    if (!any) usage("--presets names none of qwen3, dsv3: " + presets);
    if (deferred) {
      std::printf(
          "\n| preset | joined: ms to dx | deferred: ms to dx | joined / deferred | joined: ms to "
          "all | deferred: ms to all | joined / deferred | outputs |\n");
      std::printf("|---|---|---|---|---|---|---|---|\n");
      for (const Preset& p : kPresets) {
        if (chosen(p)) rc |= run_deferred(p, steps, turns, warmup_ms);
      }
    }
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit_overlap_probe: %s\n", e.what());
    return 1;
  }
}
