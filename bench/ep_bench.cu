// moekit_ep_bench: expert-parallel dispatch and combine on the GPUs of one node (CudaRanks, or
// NcclRanks with --engine nccl; every visible GPU one rank, one process) beside an NCCL all-to-all moving the same rows (issue 42).
//
// For each tokens-per-rank × hidden × routing: top-k routing drawn on the host (k distinct
// experts of E = W·L per token; uniform, or skewed: expert e drawn with weight 1/(e+1)), bf16
// tokens; --warmup then --iters steps of dispatch → combine (the combine's input is the
// ExpertParallel's own buffer, zero copy), each phase timed with CUDA events on every rank's
// stream, the slowest rank's median reported. Bytes per rank, labelled:
//  - real: rows this rank sends to other ranks × H × 2 (each token once per destination rank, as
//    the engine sends it) — the cross-GPU traffic; GB/s = real / the phase's time;
//  - logical: T × k × H × 2 (one row per (token, expert) slot, DeepEP's way of counting).
// The NCCL column (where built with NCCL): one grouped ncclSend / ncclRecv per peer of exactly the
// real rows (the same per-destination counts, from a packed send buffer), the all-to-all a
// dispatch replaces. "staged copy": a device copy of [R, H] — what each of the two zero-copy
// buffers saves per step against a layer that copies the MLP's output into the combine's input.
// With one GPU it runs one rank (every row to itself: real bytes 0): a smoke test of the path.
// Exit status 1 on an error, 2 on a bad argument.
// Usage: moekit_ep_bench [--tokens 128,4096,8192] [--hidden 7168,2048] [--topk 8]
//                        [--experts-per-rank 16] [--routing uniform,skewed] [--iters 20] [--warmup 5]
//                        [--engine cuda-ranks|nccl]
#include <cuda_runtime.h>
#ifdef MOEKIT_EP_BENCH_NCCL
#include <nccl.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "bench_common.cuh"
#include "mlp_problem.cuh"
#include "moekit/moekit.h"

namespace {

using namespace moekit;
using moekit_bench::median;
using moekit_bench::normal;

std::vector<int64_t> int_list(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    const long long x = std::strtoll(p, &end, 10);
    if (end == p || x <= 0) {
      std::fprintf(stderr, "moekit_ep_bench: expected a list of positive integers, got '%s'\n", s);
      std::exit(2);
    }
    v.push_back(x);
    p = *end == ',' ? end + 1 : end;
  }
  return v;
}

struct Routing {
  std::vector<int64_t> idx;     // [T, k]
  std::vector<float> weights;   // [T, k]
  std::vector<int64_t> to_rank; // [W] rows this rank sends to each rank (token once per rank)
};

Routing route(int64_t T, int64_t k, int64_t E, int64_t L, int W, bool skewed, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> w(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) w[static_cast<size_t>(e)] = skewed ? 1.0 / double(e + 1) : 1.0;
  Routing r;
  r.to_rank.assign(static_cast<size_t>(W), 0);
  std::uniform_real_distribution<float> unit(0.05f, 1.0f);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> left = w;
    std::set<int> ranks;
    for (int64_t j = 0; j < k; ++j) {
      std::discrete_distribution<int64_t> pick(left.begin(), left.end());
      const int64_t e = pick(rng);
      left[static_cast<size_t>(e)] = 0.0;  // distinct experts per token
      r.idx.push_back(e);
      r.weights.push_back(unit(rng));
      ranks.insert(static_cast<int>(e / L));
    }
    for (int d : ranks) ++r.to_rank[static_cast<size_t>(d)];
  }
  return r;
}


struct RankTimes {
  double dispatch_ms = 0, combine_ms = 0, nccl_ms = -1, copy_ms = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> tokens{128, 4096, 8192}, hidden{7168, 2048};
  int64_t topk = 8, L = 16, iters = 20, warmup = 5;
  std::vector<std::string> routings{"uniform", "skewed"};
  std::string engine = "cuda-ranks";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    auto need = [&] {
      if (!v) {
        std::fprintf(stderr, "moekit_ep_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      ++i;
      return v;
    };
    if (a == "--tokens") tokens = int_list(need());
    else if (a == "--hidden") hidden = int_list(need());
    else if (a == "--topk") topk = int_list(need())[0];
    else if (a == "--experts-per-rank") L = int_list(need())[0];
    else if (a == "--iters") iters = int_list(need())[0];
    else if (a == "--warmup") warmup = int_list(need())[0];
    else if (a == "--engine") {
      engine = need();
      if (engine != "cuda-ranks" && engine != "nccl") {
        std::fprintf(stderr, "moekit_ep_bench: --engine takes cuda-ranks, nccl\n");
        return 2;
      }
    }
    else if (a == "--routing") {
      routings.clear();
      std::string s = need();
      for (size_t p = 0; p <= s.size();) {
        const size_t q = std::min(s.find(',', p), s.size());
        routings.push_back(s.substr(p, q - p));
        if (routings.back() != "uniform" && routings.back() != "skewed") {
          std::fprintf(stderr, "moekit_ep_bench: --routing takes uniform, skewed\n");
          return 2;
        }
        p = q + 1;
      }
    } else {
      std::fprintf(stderr, "moekit_ep_bench: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  int W = 0;
  if (cudaGetDeviceCount(&W) != cudaSuccess || W < 1) {
    std::fprintf(stderr, "moekit_ep_bench: no CUDA device\n");
    return 1;
  }
  W = std::min(W, 8);
  const int64_t E = L * W;
  if (topk > E) {
    std::fprintf(stderr, "moekit_ep_bench: --topk %lld exceeds the %lld experts\n",
                 static_cast<long long>(topk), static_cast<long long>(E));
    return 2;
  }
  std::vector<int> devices(static_cast<size_t>(W));
  std::vector<cudaStream_t> streams(static_cast<size_t>(W));
  std::vector<Context> contexts;
  for (int r = 0; r < W; ++r) {
    devices[static_cast<size_t>(r)] = r;
    MOEKIT_BENCH_CHECK(cudaSetDevice(r));
    MOEKIT_BENCH_CHECK(cudaStreamCreateWithFlags(&streams[static_cast<size_t>(r)], cudaStreamNonBlocking));
    contexts.push_back(Context::cuda(r, streams[static_cast<size_t>(r)]));
  }
#ifdef MOEKIT_EP_BENCH_NCCL
  std::vector<ncclComm_t> comms(static_cast<size_t>(W));
  if (ncclCommInitAll(comms.data(), W, devices.data()) != ncclSuccess) {
    std::fprintf(stderr, "moekit_ep_bench: ncclCommInitAll failed\n");
    return 1;
  }
  const bool nccl = true;
#else
  const bool nccl = false;
#endif
  // The engine: CudaRanks (peer access, event barriers) or NcclRanks (NCCL windows, LSA barrier).
  std::unique_ptr<CudaRanks> cuda_ranks;
  std::unique_ptr<NcclRanks> nccl_ranks;
  try {
    if (engine == "nccl") {
      nccl_ranks = std::make_unique<NcclRanks>(contexts);
    } else {
      cuda_ranks = std::make_unique<CudaRanks>(contexts);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "moekit_ep_bench: --engine %s: %s\n", engine.c_str(), e.what());
    return 1;
  }
  auto run_ranks = [&](const std::function<void(Communicator&)>& fn) {
    if (nccl_ranks) {
      nccl_ranks->run(fn);
    } else {
      cuda_ranks->run(fn);
    }
  };
  cudaDeviceProp prop{};
  MOEKIT_BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("moekit_ep_bench  %s engine, %d x %s  top-%lld of %lld experts (%lld per rank), bf16, median of %lld "
              "steps after %lld; ms: the slowest rank's median; GB/s per rank: real = rows to other "
              "ranks (each token once per rank), logical = T*k rows (DeepEP's count)%s\n\n",
              engine == "nccl" ? "nccl-symmetric" : "cuda-ranks", W, prop.name, static_cast<long long>(topk), static_cast<long long>(E),
              static_cast<long long>(L), static_cast<long long>(iters),
              static_cast<long long>(warmup), nccl ? "" : "; NCCL: not built");
  std::printf("| tokens/rank | H | routing | dispatch ms | real GB/s | logical GB/s | combine ms | "
              "real GB/s | NCCL a2a ms | NCCL real GB/s | staged copy ms |\n|---|---|---|---|---|---|"
              "---|---|---|---|---|\n");
  int status = 0;
  for (const std::string& routing : routings) {
    for (const int64_t H : hidden) {
      for (const int64_t T : tokens) {
        std::vector<Routing> rt;
        for (int r = 0; r < W; ++r) rt.push_back(route(T, topk, E, L, W, routing == "skewed", 17 + r));
        // Rows each rank receives (every expert slot of every token), the receive capacity.
        std::vector<int64_t> received(static_cast<size_t>(W), 0);
        for (const Routing& x : rt)
          for (int64_t e : x.idx) ++received[static_cast<size_t>(e / L)];
        const int64_t R = *std::max_element(received.begin(), received.end());
        const ExpertParallelConfig cfg{.experts_per_rank = L, .hidden = H, .dtype = DType::BF16,
                                       .topk = topk, .max_tokens = T, .receive_capacity = R};
        std::vector<RankTimes> times(static_cast<size_t>(W));
        try {
          run_ranks([&](Communicator& comm) {
            const int r = comm.rank();
            const Context& ctx = comm.context();
            cudaStream_t s = streams[static_cast<size_t>(r)];
            ExpertParallel ep(comm, cfg);
            const Routing& x = rt[static_cast<size_t>(r)];
            const Tensor tok = normal({T, H}, 100 + static_cast<uint64_t>(r), ctx);
            const Tensor idx = Tensor::empty({T, topk}, DType::I64, ctx);
            const Tensor wts = Tensor::empty({T, topk}, DType::F32, ctx);
            MOEKIT_BENCH_CHECK(cudaMemcpyAsync(idx.data(), x.idx.data(), x.idx.size() * 8,
                                               cudaMemcpyHostToDevice, s));
            MOEKIT_BENCH_CHECK(cudaMemcpyAsync(wts.data(), x.weights.data(), x.weights.size() * 4,
                                               cudaMemcpyHostToDevice, s));
            fill(ctx, ep.combine_input(), 0.5);
            cudaEvent_t e0, e1, e2;
            for (cudaEvent_t* e : {&e0, &e1, &e2}) MOEKIT_BENCH_CHECK(cudaEventCreate(e));
            std::vector<double> d_ms, c_ms, n_ms, copy_ms;
            for (int64_t it = 0; it < warmup + iters; ++it) {
              comm.barrier();
              MOEKIT_BENCH_CHECK(cudaEventRecord(e0, s));
              const auto d = ep.dispatch(tok, idx, wts);
              MOEKIT_BENCH_CHECK(cudaEventRecord(e1, s));
              (void)ep.combine(d.handle, ep.combine_input());
              MOEKIT_BENCH_CHECK(cudaEventRecord(e2, s));
              MOEKIT_BENCH_CHECK(cudaEventSynchronize(e2));
              float a = 0, b = 0;
              MOEKIT_BENCH_CHECK(cudaEventElapsedTime(&a, e0, e1));
              MOEKIT_BENCH_CHECK(cudaEventElapsedTime(&b, e1, e2));
              if (it >= warmup) {
                d_ms.push_back(a);
                c_ms.push_back(b);
              }
            }
            ctx.check_device_errors();
            // The staged copy a zero-copy buffer saves: [R, H] bf16, device to device.
            const Tensor staged = Tensor::empty({R, H}, DType::BF16, ctx);
            for (int64_t it = 0; it < warmup + iters; ++it) {
              MOEKIT_BENCH_CHECK(cudaEventRecord(e0, s));
              MOEKIT_BENCH_CHECK(cudaMemcpyAsync(staged.data(), ep.combine_input().data(),
                                                 static_cast<size_t>(R * H * 2),
                                                 cudaMemcpyDeviceToDevice, s));
              MOEKIT_BENCH_CHECK(cudaEventRecord(e1, s));
              MOEKIT_BENCH_CHECK(cudaEventSynchronize(e1));
              float a = 0;
              MOEKIT_BENCH_CHECK(cudaEventElapsedTime(&a, e0, e1));
              if (it >= warmup) copy_ms.push_back(a);
            }
#ifdef MOEKIT_EP_BENCH_NCCL
            // The same rows as one all-to-all: x.to_rank[j] rows to rank j, as many from each.
            const std::vector<std::string> sent = comm.all_gather(std::string(
                reinterpret_cast<const char*>(x.to_rank.data()), x.to_rank.size() * 8));
            int64_t out_rows = 0, in_rows = 0;
            std::vector<int64_t> from(static_cast<size_t>(W));
            for (int j = 0; j < W; ++j) {
              std::memcpy(&from[static_cast<size_t>(j)], sent[static_cast<size_t>(j)].data() + 8 * r, 8);
              out_rows += x.to_rank[static_cast<size_t>(j)];
              in_rows += from[static_cast<size_t>(j)];
            }
            const Tensor sbuf = normal({std::max<int64_t>(out_rows, 1), H}, 7, ctx);
            const Tensor rbuf = Tensor::empty({std::max<int64_t>(in_rows, 1), H}, DType::BF16, ctx);
            ncclComm_t nc = comms[static_cast<size_t>(r)];
            for (int64_t it = 0; it < warmup + iters; ++it) {
              comm.barrier();
              MOEKIT_BENCH_CHECK(cudaEventRecord(e0, s));
              ncclGroupStart();
              int64_t so = 0, ro = 0;
              for (int j = 0; j < W; ++j) {
                const int64_t n_out = x.to_rank[static_cast<size_t>(j)], n_in = from[static_cast<size_t>(j)];
                ncclSend(static_cast<const char*>(sbuf.data()) + so * H * 2, static_cast<size_t>(n_out * H),
                         ncclBfloat16, j, nc, s);
                ncclRecv(static_cast<char*>(rbuf.data()) + ro * H * 2, static_cast<size_t>(n_in * H),
                         ncclBfloat16, j, nc, s);
                so += n_out;
                ro += n_in;
              }
              if (ncclGroupEnd() != ncclSuccess) throw_error(ErrorKind::Communication, "NCCL all-to-all failed");
              MOEKIT_BENCH_CHECK(cudaEventRecord(e1, s));
              MOEKIT_BENCH_CHECK(cudaEventSynchronize(e1));
              float a = 0;
              MOEKIT_BENCH_CHECK(cudaEventElapsedTime(&a, e0, e1));
              if (it >= warmup) n_ms.push_back(a);
            }
#endif
            for (cudaEvent_t e : {e0, e1, e2}) MOEKIT_BENCH_CHECK(cudaEventDestroy(e));
            RankTimes& t = times[static_cast<size_t>(r)];
            t.dispatch_ms = median(d_ms);
            t.combine_ms = median(c_ms);
            t.copy_ms = median(copy_ms);
            if (!n_ms.empty()) t.nccl_ms = median(n_ms);
          });
        } catch (const std::exception& e) {
          std::fprintf(stderr, "moekit_ep_bench: T=%lld H=%lld %s: %s\n", static_cast<long long>(T),
                       static_cast<long long>(H), routing.c_str(), e.what());
          status = 1;
          continue;
        }
        // The slowest rank's times; bytes of the rank that sends the most to others.
        RankTimes slow;
        int64_t real_rows = 0;
        for (int r = 0; r < W; ++r) {
          const RankTimes& t = times[static_cast<size_t>(r)];
          slow.dispatch_ms = std::max(slow.dispatch_ms, t.dispatch_ms);
          slow.combine_ms = std::max(slow.combine_ms, t.combine_ms);
          slow.copy_ms = std::max(slow.copy_ms, t.copy_ms);
          slow.nccl_ms = std::max(slow.nccl_ms, t.nccl_ms);
          int64_t rows = 0;
          for (int j = 0; j < W; ++j)
            if (j != r) rows += rt[static_cast<size_t>(r)].to_rank[static_cast<size_t>(j)];
          real_rows = std::max(real_rows, rows);
        }
        const double real = double(real_rows) * double(H) * 2, logical = double(T * topk * H) * 2;
        auto gbs = [](double bytes, double ms) { return ms > 0 ? bytes / (ms * 1e6) : 0.0; };
        char nccl_ms[32] = "-", nccl_gbs[32] = "-";
        if (slow.nccl_ms >= 0) {
          std::snprintf(nccl_ms, sizeof nccl_ms, "%.3f", slow.nccl_ms);
          std::snprintf(nccl_gbs, sizeof nccl_gbs, "%.0f", gbs(real, slow.nccl_ms));
        }
        std::printf("| %lld | %lld | %s | %.3f | %.0f | %.0f | %.3f | %.0f | %s | %s | %.3f |\n",
                    static_cast<long long>(T), static_cast<long long>(H), routing.c_str(),
                    slow.dispatch_ms, gbs(real, slow.dispatch_ms), gbs(logical, slow.dispatch_ms),
                    slow.combine_ms, gbs(real, slow.combine_ms), nccl_ms, nccl_gbs, slow.copy_ms);
        std::fflush(stdout);
      }
    }
  }
#ifdef MOEKIT_EP_BENCH_NCCL
  for (ncclComm_t c : comms) ncclCommDestroy(c);
#endif
  return status;
}
