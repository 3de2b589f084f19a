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
// With --consumer BLOCKS it then measures the deferred backward with a consumer of dx on its own
// stream (run_consumer, below: stream priority and Context::with_sm_margin). --two-streams 0 skips
// the first table (serial against two streams).
// Exit status 1 on any error or a mismatch, 2 on a bad argument.
// Usage: moekit_overlap_probe [--presets qwen3,dsv3] [--steps N] [--turns N] [--warmup-ms MS]
//                             [--deferred 0|1] [--consumer BLOCKS] [--consumer-us US] [--margins
//                             M,...]
//                             [--two-streams 0|1]
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
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_common.cuh"
#include "mlp_problem.cuh"
#include "moekit/moekit.h"

namespace {

using namespace moekit;

using moekit_bench::kPresets;
using moekit_bench::make_problem;
using moekit_bench::median;
using moekit_bench::Preset;
using moekit_bench::Problem;
using moekit_bench::same_bytes;

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

// ---- deferred weight gradients with a consumer of dx (design/PERFORMANCE.md, Next 2)
// The caller's next work on dx — an expert-parallel dispatch's backward: an all-to-all whose
// kernels use a few SMs — stood in for by a copy of dx on --consumer blocks lasting at least
// --consumer-us (0: the copy's own time), queued on its own stream right after the backward returns
// (after dx). The weight gradients' persistent GEMMs hold every SM they are given until they end,
// so the question is when the consumer gets SMs: per step the time from the backward's start to the
// consumer's end ("to consumer") and to everything ("to all"), medians over --turns × --steps, for
//   joined            the backward as one call, then the consumer;
//   deferred          defer_weight_grads, the consumer's stream of the same priority as the op's;
//   deferred, high    the consumer's stream of the device's greatest priority;
//   + margin M        the same on a context with_sm_margin(M) (M = --consumer's blocks): the
//                     GEMMs' grids leave M SMs (Context::with_sm_margin);
//   + deferred margin the margin on the deferred weight gradients only (deferred_sm_margin), for
//                     each of --margins (default: the consumer's blocks);
// and the consumer alone. Checks that every way wrote dx, dW1, dW2 bit-identical to the first
// (the GEMMs with a margin run the same tiles on fewer CTAs).
// At least `ns` long (an all-to-all over NVLink moves dx slower than a copy in HBM): each block
// copies its share, then waits on the global timer.
__global__ void consume(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n,
                        uint64_t ns) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x)
    dst[i] = src[i];
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

struct ConsumerWay {
  std::string name;
  bool defer, high;
  int margin, deferred_margin;
};

int run_consumer(const Preset& p, int blocks, uint64_t consumer_ns, const std::vector<int>& margins,
                 int steps, int turns, double warmup_ms) {
  cudaStream_t sa, lo, hi;
  int least = 0, greatest = 0;
  MOEKIT_BENCH_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  MOEKIT_BENCH_CHECK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
  MOEKIT_BENCH_CHECK(cudaStreamCreateWithPriority(&lo, cudaStreamNonBlocking, least));
  MOEKIT_BENCH_CHECK(cudaStreamCreateWithPriority(&hi, cudaStreamNonBlocking, greatest));
  const Context ctx = Context::cuda(0, sa);
  const Problem q = make_problem(p, ctx);
  std::vector<ConsumerWay> ways = {{"joined", false, false, 0, 0},
                                   {"deferred", true, false, 0, 0},
                                   {"deferred, high priority", true, true, 0, 0},
                                   {"deferred, margin", true, false, blocks, 0},
                                   {"deferred, high priority, margin", true, true, blocks, 0}};
  for (int m : margins)
    ways.push_back({"deferred, deferred margin " + std::to_string(m), true, false, 0, m});
  struct Way {
    std::unique_ptr<GroupedMLP> mlp;
    GroupedMLP::Saved saved;
    std::vector<double> to_consumer, to_all;
    GroupedMLP::Grads first;
  };
  std::vector<Way> runs(ways.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    const Context c = ways[i].margin > 0 ? ctx.with_sm_margin(ways[i].margin) : ctx;
    runs[i].mlp = std::make_unique<GroupedMLP>(GroupedMLPConfig{.groups = p.E,
                                                                .hidden = p.H,
                                                                .ffn = p.F,
                                                                .dtype = DType::BF16,
                                                                .layout = GluLayout::Interleaved32},
                                               c);
    runs[i].mlp->fc1()->linear().set_weight(q.w1);
    runs[i].mlp->fc2()->linear().set_weight(q.w2);
    runs[i].mlp->forward(q.x, q.probs, q.splits, {}, &runs[i].saved);
  }
  const size_t vectors = static_cast<size_t>(p.T * p.H) * 2 / sizeof(uint4);
  Tensor sink = Tensor::empty({p.T, p.H}, DType::BF16, ctx);
  cudaEvent_t e0, dx_ready, consumed, all;
  for (cudaEvent_t* e : {&e0, &dx_ready, &consumed, &all}) MOEKIT_BENCH_CHECK(cudaEventCreate(e));
  // One step of way i; its times appended when `record`; returns the grads (waited for).
  auto one = [&](size_t i, bool record) {
    const ConsumerWay& w = ways[i];
    const cudaStream_t cs = w.high ? hi : lo;
    MOEKIT_BENCH_CHECK(cudaEventRecord(e0, sa));
    GroupedMLP::Grads g = runs[i].mlp->backward(
        runs[i].saved, q.dy,
        {.defer_weight_grads = w.defer, .deferred_sm_margin = w.deferred_margin});
    MOEKIT_BENCH_CHECK(cudaEventRecord(dx_ready, sa));
    MOEKIT_BENCH_CHECK(cudaStreamWaitEvent(cs, dx_ready, 0));
    consume<<<blocks, 512, 0, cs>>>(static_cast<const uint4*>(g.input.data()),
                                    static_cast<uint4*>(sink.data()), vectors, consumer_ns);
    MOEKIT_BENCH_CHECK(cudaGetLastError());
    MOEKIT_BENCH_CHECK(cudaEventRecord(consumed, cs));
    g.weight_grads.wait();
    MOEKIT_BENCH_CHECK(cudaStreamWaitEvent(sa, consumed, 0));
    MOEKIT_BENCH_CHECK(cudaEventRecord(all, sa));
    MOEKIT_BENCH_CHECK(cudaEventSynchronize(all));
    if (record) {
      float c_ms = 0, a_ms = 0;
      MOEKIT_BENCH_CHECK(cudaEventElapsedTime(&c_ms, e0, consumed));
      MOEKIT_BENCH_CHECK(cudaEventElapsedTime(&a_ms, e0, all));
      runs[i].to_consumer.push_back(c_ms);
      runs[i].to_all.push_back(a_ms);
    }
    return g;
  };
  int mismatches = 0;
  for (size_t i = 0; i < runs.size(); ++i) runs[i].first = one(i, false);
  for (size_t i = 1; i < runs.size(); ++i) {
    const char* names[] = {"dx", "dW1", "dW2"};
    const Tensor as[] = {runs[0].first.input, runs[0].first.fc1.weight, runs[0].first.fc2.weight},
                 bs[] = {runs[i].first.input, runs[i].first.fc1.weight, runs[i].first.fc2.weight};
    for (int k = 0; k < 3; ++k) {
      if (!same_bytes(as[k], bs[k])) {
        std::printf("%s: %s differs between '%s' and '%s'\n", p.name, names[k],
                    ways[0].name.c_str(), ways[i].name.c_str());
        ++mismatches;
      }
    }
  }
  // The consumer alone, and the warm-up.
  std::vector<double> alone;
  for (int i = 0; i < 20; ++i) {
    MOEKIT_BENCH_CHECK(cudaEventRecord(e0, lo));
    consume<<<blocks, 512, 0, lo>>>(static_cast<const uint4*>(q.dy.data()),
                                    static_cast<uint4*>(sink.data()), vectors, consumer_ns);
    MOEKIT_BENCH_CHECK(cudaEventRecord(consumed, lo));
    MOEKIT_BENCH_CHECK(cudaEventSynchronize(consumed));
    float ms = 0;
    MOEKIT_BENCH_CHECK(cudaEventElapsedTime(&ms, e0, consumed));
    alone.push_back(ms);
  }
  const auto start = std::chrono::steady_clock::now();
  while (
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() <
      warmup_ms) {
    for (size_t i = 0; i < runs.size(); ++i) one(i, false);
  }
  for (int t = 0; t < turns; ++t) {
    for (size_t i = 0; i < runs.size(); ++i) {
      for (int s = 0; s < steps; ++s) one(i, true);
    }
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    std::printf("| %s | %s | %d | %.3f | %.3f | %.3f | %.3f | %s |\n", p.name, ways[i].name.c_str(),
                blocks, median(alone), median(runs[i].to_consumer), median(runs[i].to_all),
                median(runs[0].to_consumer) / median(runs[i].to_consumer),
                mismatches ? "DIFFER" : "bit-identical");
  }
  std::fflush(stdout);
  for (cudaEvent_t e : {e0, dx_ready, consumed, all}) MOEKIT_BENCH_CHECK(cudaEventDestroy(e));
  return mismatches ? 1 : 0;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "moekit_overlap_probe: %s\nusage: moekit_overlap_probe [--presets qwen3,dsv3] "
               "[--steps N] [--turns N] [--warmup-ms MS] [--deferred 0|1] [--consumer BLOCKS] "
               "[--consumer-us US] [--margins M,M...] [--two-streams 0|1]\n",
               why.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  moekit_bench::ProbeArgs args;
  args.steps = 10;
  args.turns = 5;
  args.warmup_ms = 1000;
  bool deferred = false;
  int consumer = 0;
  double consumer_us = 0;
  bool two_streams = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) usage(arg + " needs a value");
    const std::string v = argv[++i];
    std::string why;
    const int taken = args.take(arg, v, &why);
    if (taken < 0) usage(why);
    if (taken > 0) continue;
    if (arg == "--deferred") {
      if (v != "0" && v != "1") usage("--deferred must be 0 or 1, got " + v);
      deferred = v == "1";
    } else if (arg == "--two-streams") {
      if (v != "0" && v != "1") usage("--two-streams must be 0 or 1, got " + v);
      two_streams = v == "1";
    } else if (arg == "--consumer-us") {
      consumer_us = std::atof(v.c_str());
      if (!(consumer_us >= 0 && consumer_us <= 1e6))
        usage("--consumer-us must be 0..1e6, got " + v);
    } else if (arg == "--consumer") {
      consumer = std::atoi(v.c_str());
      if (consumer < 0 || consumer > 1024) usage("--consumer must be 0..1024 blocks, got " + v);
    } else {
      usage("unknown argument " + arg);
    }
  }
  if (const std::string why = args.check(); !why.empty()) usage(why);
  const int steps = args.steps, turns = args.turns;
  const double warmup_ms = args.warmup_ms;
  const std::vector<int>& margins = args.margins;
  try {
    if (two_streams) {
      std::printf(
          "| preset | E | T | H | F | serial ms/step | two streams ms/step | serial / two streams "
          "| "
          "outputs |\n");
      std::printf("|---|---|---|---|---|---|---|---|---|\n");
    }
    int rc = 0;
    bool any = false;
    for (const Preset& p : kPresets) {
      if (!args.wants(p)) continue;
      any = true;
      if (two_streams) rc |= run_preset(p, steps, turns, warmup_ms);
    }
    if (!any) usage("--presets names none of qwen3, dsv3: " + args.presets);
    if (deferred) {
      std::printf(
          "\n| preset | joined: ms to dx | deferred: ms to dx | joined / deferred | joined: ms to "
          "all | deferred: ms to all | joined / deferred | outputs |\n");
      std::printf("|---|---|---|---|---|---|---|---|\n");
      for (const Preset& p : kPresets) {
        if (args.wants(p)) rc |= run_deferred(p, steps, turns, warmup_ms);
      }
    }
    if (consumer > 0) {
      std::printf(
          "\n| preset | way | consumer blocks | consumer alone ms | ms to consumer | ms to all | "
          "joined / this, to consumer | outputs |\n");
      std::printf("|---|---|---|---|---|---|---|---|\n");
      for (const Preset& p : kPresets) {
        if (args.wants(p))
          rc |= run_consumer(p, consumer, static_cast<uint64_t>(consumer_us * 1e3),
                             margins.empty() ? std::vector<int>{consumer} : margins, steps, turns,
                             warmup_ms);
      }
    }
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit_overlap_probe: %s\n", e.what());
    return 1;
  }
}
