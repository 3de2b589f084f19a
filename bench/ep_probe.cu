// moekit_ep_probe: deferred weight gradients with a real consumer of dx — the NCCL all-to-all an
// expert-parallel dispatch's backward runs on it (design/PERFORMANCE.md, Next 2; the one-GPU
// stand-in, a copy of dx on a few blocks, is moekit_overlap_probe --consumer).
//
// Every GPU of the machine is one rank (one process, one host thread, ncclCommInitAll). Each rank
// runs the grouped MLP's backward of a preset (the `moekit run` shapes, mlp_problem.cuh; every rank
// the same data), then an all-to-all of dx on its own communication stream: chunk j of dx's rows
// (T / ranks rows) to rank j, chunk j of a receive buffer from rank j (ncclSend / ncclRecv in one
// group). Per step and rank: ms from the backward's start to the all-to-all's end on that rank
// ("to all-to-all") and to everything ("to all": the op's stream waited for the all-to-all and
// the weight gradients); the step's time is the slowest rank's; medians over --turns × --steps.
// Ways: the backward joined; deferred (defer_weight_grads) with deferred_sm_margin 0 and each of
// --margins. Checks: every way wrote dx, dW1, dW2 bit-identical to the joined one on every rank,
// and rank r received from rank j what rank j's dx holds in chunk r.
// With one GPU it runs one rank, whose all-to-all is a send to itself: a smoke test of the path.
// Exit status 1 on any error or a mismatch, 2 on a bad argument.
// Usage: moekit_ep_probe [--presets qwen3,dsv3] [--margins M,M...] [--steps N] [--turns N]
//                        [--warmup-ms MS]
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
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

#define EP_NCCL_CHECK(call)                                                                       \
  do {                                                                                            \
    ncclResult_t r_ = (call);                                                                     \
    if (r_ != ncclSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(r_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

struct Way {
  std::string name;
  bool defer;
  int margin;  // deferred_sm_margin
};

// One rank: its streams, context, problem, MLP (from one forward), receive buffer and events.
struct Rank {
  int device = 0;
  cudaStream_t op = nullptr, comm = nullptr;
  std::unique_ptr<Context> ctx;
  std::unique_ptr<Problem> q;
  std::unique_ptr<GroupedMLP> mlp;
  GroupedMLP::Saved saved;
  Tensor recv;
  cudaEvent_t start = nullptr, dx_ready = nullptr, exchanged = nullptr, all = nullptr;
  GroupedMLP::Grads grads;  // of the step in flight
};

int run_preset(const Preset& p, const std::vector<ncclComm_t>& comms, const std::vector<Way>& ways,
               int steps, int turns, double warmup_ms) {
  const int n = static_cast<int>(comms.size());
  if (p.T % n != 0) {
    std::printf("%s: T = %lld rows do not split into %d ranks' chunks\n", p.name,
                static_cast<long long>(p.T), n);
    return 1;
  }
  const int64_t chunk_rows = p.T / n;
  const size_t chunk = static_cast<size_t>(chunk_rows * p.H);  // bf16 elements per peer
  std::vector<Rank> ranks(n);
  for (int r = 0; r < n; ++r) {
    Rank& k = ranks[r];
    k.device = r;
    MOEKIT_BENCH_CHECK(cudaSetDevice(r));
    MOEKIT_BENCH_CHECK(cudaStreamCreateWithFlags(&k.op, cudaStreamNonBlocking));
    MOEKIT_BENCH_CHECK(cudaStreamCreateWithFlags(&k.comm, cudaStreamNonBlocking));
    k.ctx = std::make_unique<Context>(Context::cuda(r, k.op));
    k.q = std::make_unique<Problem>(make_problem(p, *k.ctx));
    k.mlp = std::make_unique<GroupedMLP>(GroupedMLPConfig{.groups = p.E,
                                                          .hidden = p.H,
                                                          .ffn = p.F,
                                                          .dtype = DType::BF16,
                                                          .layout = GluLayout::Interleaved32},
                                         *k.ctx);
    k.mlp->fc1()->linear().set_weight(k.q->w1);
    k.mlp->fc2()->linear().set_weight(k.q->w2);
    k.mlp->forward(k.q->x, k.q->probs, k.q->splits, {}, &k.saved);
    k.recv = Tensor::empty({p.T, p.H}, DType::BF16, *k.ctx);
    for (cudaEvent_t* e : {&k.start, &k.dx_ready, &k.exchanged, &k.all}) {
      MOEKIT_BENCH_CHECK(cudaEventCreate(e));
    }
  }
  // One step of `w` on every rank; the slowest rank's times appended when `record`.
  auto step = [&](const Way& w, std::vector<double>* to_a2a, std::vector<double>* to_all) {
    for (Rank& k : ranks) {
      MOEKIT_BENCH_CHECK(cudaSetDevice(k.device));
      MOEKIT_BENCH_CHECK(cudaEventRecord(k.start, k.op));
      k.grads = k.mlp->backward(k.saved, k.q->dy,
                                {.defer_weight_grads = w.defer, .deferred_sm_margin = w.margin});
      MOEKIT_BENCH_CHECK(cudaEventRecord(k.dx_ready, k.op));
      MOEKIT_BENCH_CHECK(cudaStreamWaitEvent(k.comm, k.dx_ready, 0));
    }
    EP_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < n; ++r) {
      Rank& k = ranks[r];
      const auto* dx = static_cast<const __nv_bfloat16*>(k.grads.input.data());
      auto* recv = static_cast<__nv_bfloat16*>(k.recv.data());
      for (int j = 0; j < n; ++j) {
        EP_NCCL_CHECK(ncclSend(dx + j * chunk, chunk, ncclBfloat16, j, comms[r], k.comm));
        EP_NCCL_CHECK(ncclRecv(recv + j * chunk, chunk, ncclBfloat16, j, comms[r], k.comm));
      }
    }
    EP_NCCL_CHECK(ncclGroupEnd());
    for (Rank& k : ranks) {
      MOEKIT_BENCH_CHECK(cudaSetDevice(k.device));
      MOEKIT_BENCH_CHECK(cudaEventRecord(k.exchanged, k.comm));
      k.grads.weight_grads.wait();
      MOEKIT_BENCH_CHECK(cudaStreamWaitEvent(k.op, k.exchanged, 0));
      MOEKIT_BENCH_CHECK(cudaEventRecord(k.all, k.op));
    }
    double a2a = 0, all = 0;
    for (Rank& k : ranks) {
      MOEKIT_BENCH_CHECK(cudaEventSynchronize(k.all));
      float a = 0, b = 0;
      MOEKIT_BENCH_CHECK(cudaEventElapsedTime(&a, k.start, k.exchanged));
      MOEKIT_BENCH_CHECK(cudaEventElapsedTime(&b, k.start, k.all));
      a2a = std::max(a2a, double(a));
      all = std::max(all, double(b));
    }
    if (to_a2a) to_a2a->push_back(a2a);
    if (to_all) to_all->push_back(all);
  };

  // Checks: each way's outputs against the joined way's, and what the all-to-all delivered.
  int mismatches = 0;
  std::vector<std::vector<Tensor>> first(n);  // the joined way's dx, dW1, dW2 per rank (copies)
  for (size_t i = 0; i < ways.size(); ++i) {
    step(ways[i], nullptr, nullptr);
    for (int r = 0; r < n; ++r) {
      Rank& k = ranks[r];
      MOEKIT_BENCH_CHECK(cudaSetDevice(k.device));
      const Tensor outs[] = {k.grads.input, k.grads.fc1.weight, k.grads.fc2.weight};
      const char* names[] = {"dx", "dW1", "dW2"};
      for (int o = 0; o < 3; ++o) {
        if (i == 0) {
          Tensor c = Tensor::empty(outs[o].shape(), outs[o].dtype(), *k.ctx);
          MOEKIT_BENCH_CHECK(cudaMemcpy(c.data(), outs[o].data(), c.nbytes(), cudaMemcpyDefault));
          first[r].push_back(c);
        } else if (!same_bytes(outs[o], first[r][o])) {
          std::printf("%s rank %d: %s of '%s' differs from the joined backward's\n", p.name, r,
                      names[o], ways[i].name.c_str());
          ++mismatches;
        }
      }
      for (int j = 0; j < n; ++j) {  // chunk j of rank r's receive buffer = chunk r of rank j's dx
        const Tensor got = k.recv.rows(j * chunk_rows, (j + 1) * chunk_rows);
        const Tensor sent = ranks[j].grads.input.rows(r * chunk_rows, (r + 1) * chunk_rows);
        if (!same_bytes(got, sent)) {
          std::printf("%s: '%s': rank %d's chunk from rank %d is not what rank %d sent\n", p.name,
                      ways[i].name.c_str(), r, j, j);
          ++mismatches;
        }
      }
    }
  }
  const auto begin = std::chrono::steady_clock::now();
  while (
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count() <
      warmup_ms) {
    for (const Way& w : ways) step(w, nullptr, nullptr);
  }
  std::vector<std::vector<double>> a2a(ways.size()), all(ways.size());
  for (int t = 0; t < turns; ++t) {
    for (size_t i = 0; i < ways.size(); ++i) {
      for (int s = 0; s < steps; ++s) step(ways[i], &a2a[i], &all[i]);
    }
  }
  for (size_t i = 0; i < ways.size(); ++i) {
    std::printf("| %s | %d | %s | %.3f | %.3f | %.3f | %s |\n", p.name, n, ways[i].name.c_str(),
                median(a2a[i]), median(all[i]), median(a2a[0]) / median(a2a[i]),
                mismatches ? "DIFFER" : "bit-identical");
  }
  std::fflush(stdout);
  for (Rank& k : ranks) {
    MOEKIT_BENCH_CHECK(cudaSetDevice(k.device));
    MOEKIT_BENCH_CHECK(cudaDeviceSynchronize());
    for (cudaEvent_t e : {k.start, k.dx_ready, k.exchanged, k.all})
      MOEKIT_BENCH_CHECK(cudaEventDestroy(e));
  }
  return mismatches ? 1 : 0;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(
      stderr,
      "moekit_ep_probe: %s\nusage: moekit_ep_probe [--presets qwen3,dsv3] [--margins M,M...] "
      "[--steps N] [--turns N] [--warmup-ms MS]\n",
      why.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  moekit_bench::ProbeArgs args;
  args.steps = 5;
  args.turns = 3;
  args.warmup_ms = 300;
  args.margins = {8, 16};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) usage(arg + " needs a value");
    std::string why;
    const int taken = args.take(arg, argv[++i], &why);
    if (taken < 0) usage(why);
    if (taken == 0) usage("unknown argument " + arg);
  }
  if (const std::string why = args.check(); !why.empty()) usage(why);
  try {
    int n = 0;
    MOEKIT_BENCH_CHECK(cudaGetDeviceCount(&n));
    std::vector<int> devices(n);
    for (int r = 0; r < n; ++r) devices[r] = r;
    std::vector<ncclComm_t> comms(n);
    EP_NCCL_CHECK(ncclCommInitAll(comms.data(), n, devices.data()));
    std::vector<Way> ways{{"joined", false, 0}, {"deferred", true, 0}};
    for (int m : args.margins)
      ways.push_back({"deferred, deferred_sm_margin " + std::to_string(m), true, m});
    std::printf(
        "| preset | ranks | way | ms to all-to-all | ms to all | joined / this, to all-to-all | "
        "outputs |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    int rc = 0;
    bool any = false;
    for (const Preset& p : kPresets) {
      if (!args.wants(p)) continue;
      any = true;
      rc |= run_preset(p, comms, ways, args.steps, args.turns, args.warmup_ms);
    }
    for (ncclComm_t c : comms) ncclCommDestroy(c);
    if (!any) usage("--presets names none of qwen3, dsv3: " + args.presets);
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit_ep_probe: %s\n", e.what());
    return 1;
  }
}
