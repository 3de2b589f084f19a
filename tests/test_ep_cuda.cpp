// Expert parallelism on the GPU engines (SPEC §7; src/ep/ep_device.h, src/backends/cuda/ep/):
// every EpCuda case runs once per engine — EpCuda.<case>/cuda_ranks (CudaRanks) and, where moekit
// was built with NCCL, EpCuda.<case>/nccl_symmetric (NcclRanks) and EpCuda.<case>/nccl_communicator
// (nccl_communicator over ncclCommInitRank communicators, one host thread per rank standing in for
// one process per GPU), and EpCuda.<case>/caller_group (caller_communicator over regions and
// collectives the test brings, as torch symmetric memory does) — the last two agree in band
// (Communicator::Agreement::InBand), so their steps capture too — against CpuRanks on the same
// data, bit for bit — dispatch (recv, weights, splits,
// tokens per expert), combine, combine_backward, dispatch_backward — with fuzzed routing,
// zero-token experts, int32 indices, capacity overflow both ways, malformed topk_idx (the device
// checks set the context's error word; every output keeps its sentinel), W = 2 on two GPUs, and
// the layer step captured in a CUDA graph and replayed with new routing, bit-identical to eager;
// the MoE layer (router on the device) on CudaRanks against CpuRanks (W = 1, and W = 2 on two
// GPUs); the router primitives captured in a CUDA graph; each engine's symmetric allocation
// (this rank's base is its block, sizes checked across ranks, a block outliving its ranks).
// EpCudaInBand.*: a caller group of two ranks on ONE GPU (a stream each) — W = 2's cross-rank
// kernels without a second GPU — bit for bit as CpuRanks, and a rank refusing its arguments in
// each call: it throws, the other stores nothing and gets Context::kEpPeerRefused.
// NcclRanksArguments.* need no GPU.
//
// Every EpCuda test needs a GPU: it skips only when moekit has no CUDA backend or no device exists; on a
// machine with a GPU an engine that cannot run fails the test.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>

#include <dlfcn.h>

#include "moekit/moekit.h"
#include "support/cuda_graph.h"
#include "support/test_util.h"

namespace moekit::test {
namespace {

#define MOEKIT_EP_REQUIRE_GPUS(n)                                                            \
  do {                                                                                       \
    if (!Context::built_with_cuda()) GTEST_SKIP() << "built without the CUDA backend";        \
    if (Context::cuda_device_count() < (n)) {                                                \
      GTEST_SKIP() << "needs " << (n) << " GPU(s), cudaGetDeviceCount() = "                  \
                   << Context::cuda_device_count();                                          \
    }                                                                                        \
  } while (0)

// The GPU engines every EpCuda case runs on (the test parameter): cuda-ranks (CudaRanks) and,
// where moekit was built with NCCL, nccl-symmetric (NcclRanks) and nccl-communicator
// (nccl_communicator over communicators the test makes, as a program with one process per GPU
// does).
std::vector<std::string> gpu_engines() {
  std::vector<std::string> e = {"cuda-ranks", "caller-group"};
  if (NcclRanks::built()) {
    e.push_back("nccl-symmetric");
    e.push_back("nccl-communicator");
  }
  return e;
}

// What Communicator::engine() says for a test engine (nccl_communicator is the NCCL engine too;
// a caller group is CallerGroup::engine's default).
std::string engine_name(const std::string& engine) {
  if (engine == "caller-group") return "caller-symmetric";
  return engine == "nccl-communicator" ? "nccl-symmetric" : engine;
}

// The NCCL and CUDA runtime calls a program makes before nccl_communicator, from the libraries
// moekit loaded (dlsym: this test includes no NCCL or CUDA header). ncclUniqueId is 128 bytes
// (NCCL_UNIQUE_ID_BYTES), passed by value; ncclComm_t is a pointer; ncclResult_t 0 is ncclSuccess.
struct NcclApi {
  struct UniqueId {
    char internal[128];
  };
  int (*get_unique_id)(UniqueId*) = nullptr;
  int (*comm_init_rank)(void**, int, UniqueId, int) = nullptr;
  int (*comm_destroy)(void*) = nullptr;
  int (*set_device)(int) = nullptr;
  NcclApi() {
    get_unique_id = reinterpret_cast<decltype(get_unique_id)>(dlsym(RTLD_DEFAULT, "ncclGetUniqueId"));
    comm_init_rank = reinterpret_cast<decltype(comm_init_rank)>(dlsym(RTLD_DEFAULT, "ncclCommInitRank"));
    comm_destroy = reinterpret_cast<decltype(comm_destroy)>(dlsym(RTLD_DEFAULT, "ncclCommDestroy"));
    set_device = reinterpret_cast<decltype(set_device)>(dlsym(RTLD_DEFAULT, "cudaSetDevice"));
  }
  bool ok() const { return get_unique_id && comm_init_rank && comm_destroy && set_device; }
};

// fn(r) on one host thread per rank, joined, the first rank's error rethrown (CpuRanks' threads:
// only their rank numbers are used).
void on_rank_threads(int W, const std::function<void(int)>& fn) {
  CpuRanks(W).run([&](Communicator& host) { fn(host.rank()); });
}

// W caller_communicator ranks — a group the caller runs (one process per GPU; here a host thread
// per rank) — over regions the test allocates (a tensor on each rank's context, every rank's base
// of it exchanged), with the caller's collectives: all_gather among the host threads, and a
// stream-ordered barrier (each rank records an event on its stream, the threads meet, each stream
// waits for every other rank's event, the threads meet again; nothing at W = 1, so a step
// captures), as torch symmetric memory brings them. The host meetings are a CpuRanks group's, so a
// rank that throws aborts the others instead of hanging them. Ranks may share a GPU, each on its
// own stream (W = 2 on one GPU); ranks on distinct GPUs get peer access to each other's memory
// pools from a CudaRanks over the same contexts (what a torch program's symmetric memory has).
class CallerGroupRanks {
 public:
  static constexpr int64_t kRegionBytes = int64_t{64} << 20;  // every test's ExpertParallels fit

  explicit CallerGroupRanks(const std::vector<Context>& contexts)
      : W_(static_cast<int>(contexts.size())), host_(W_) {
    const CudaGraphApi& api = CudaGraphApi::get();
    if (!api.ok) throw std::runtime_error("libcudart entry points not found through dlopen");
    bool distinct = true;
    for (size_t a = 0; a < contexts.size(); ++a)
      for (size_t b = 0; b < a; ++b) distinct &= contexts[a].device() != contexts[b].device();
    if (W_ > 1 && distinct) CudaRanks{contexts};  // enables peer access (devices and pools)
    std::vector<void*> bases;
    for (const Context& ctx : contexts) {
      regions_.push_back(Tensor::empty({kRegionBytes}, DType::U8, ctx));
      bases.push_back(regions_.back().data());
      void* ev = nullptr;
      if (api.set_device(ctx.device().index) != 0 ||
          api.event_create(&ev, CudaGraphApi::kDisableTiming) != 0) {
        throw std::runtime_error("cudaEventCreateWithFlags failed");
      }
      events_.push_back(ev);
    }
    for (int r = 0; r < W_; ++r) {
      const Context& ctx = contexts[static_cast<size_t>(r)];
      Communicator& host = host_.communicator(r);
      auto barrier = [this, &api, &host, ctx, r] {
        if (W_ == 1) return;  // stream order
        if (api.event_record(events_[static_cast<size_t>(r)], ctx.stream()) != 0)
          throw std::runtime_error("cudaEventRecord failed");
        host.barrier();
        for (int q = 0; q < W_; ++q) {
          if (q != r && api.stream_wait_event(ctx.stream(), events_[static_cast<size_t>(q)], 0) != 0)
            throw std::runtime_error("cudaStreamWaitEvent failed");
        }
        host.barrier();  // no event is recorded again before every wait on it was queued
      };
      comms_.push_back(caller_communicator(
          CallerGroup{.rank = r,
                      .world_size = W_,
                      .context = ctx,
                      .region = regions_[static_cast<size_t>(r)],
                      .peer_bases = bases,
                      .barrier = barrier,
                      .all_gather = [&host](std::string_view b) { return host.all_gather(b); }}));
    }
  }
  ~CallerGroupRanks() {
    comms_.clear();
    for (void* ev : events_) CudaGraphApi::get().event_destroy(ev);
  }
  CallerGroupRanks(const CallerGroupRanks&) = delete;
  CallerGroupRanks& operator=(const CallerGroupRanks&) = delete;
  int world_size() const { return W_; }
  void run(const std::function<void(Communicator&)>& fn) {
    host_.run([&](Communicator& host) { fn(*comms_[static_cast<size_t>(host.rank())]); });
  }

 private:
  int W_;
  CpuRanks host_;
  std::vector<Tensor> regions_;
  std::vector<void*> events_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

// CudaRanks, NcclRanks, a caller group, or W nccl_communicator ranks over the test's own NCCL communicators
// (ncclGetUniqueId, then ncclCommInitRank on one host thread per rank, each on its GPU — one
// process standing in for W; the communicators are kept until the ranks are gone), by engine name.
class GpuRanks {
 public:
  GpuRanks(const std::string& engine, const std::vector<Context>& contexts) {
    if (engine == "nccl-symmetric") {
      nccl_ = std::make_unique<NcclRanks>(contexts);
    } else if (engine == "caller-group") {
      caller_ = std::make_unique<CallerGroupRanks>(contexts);
    } else if (engine == "nccl-communicator") {
      const NcclApi api;
      if (!api.ok()) throw std::runtime_error("NCCL / CUDA runtime entry points not found through dlsym");
      const int W = static_cast<int>(contexts.size());
      NcclApi::UniqueId id{};
      if (api.get_unique_id(&id) != 0) throw std::runtime_error("ncclGetUniqueId failed");
      raw_.assign(static_cast<size_t>(W), nullptr);
      ranks_.resize(static_cast<size_t>(W));
      destroy_ = api.comm_destroy;
      on_rank_threads(W, [&](int r) {
        const Context& ctx = contexts[static_cast<size_t>(r)];
        if (api.set_device(ctx.device().index) != 0) throw std::runtime_error("cudaSetDevice failed");
        if (api.comm_init_rank(&raw_[static_cast<size_t>(r)], W, id, r) != 0) {
          throw std::runtime_error("ncclCommInitRank failed");
        }
        ranks_[static_cast<size_t>(r)] = nccl_communicator(raw_[static_cast<size_t>(r)], ctx);
      });
    } else {
      cuda_ = std::make_unique<CudaRanks>(contexts);
    }
  }
  ~GpuRanks() {
    ranks_.clear();
    // One thread per rank, together: a communicator's destruction may wait for its peers'.
    if (!raw_.empty()) {
      on_rank_threads(static_cast<int>(raw_.size()), [&](int r) {
        if (raw_[static_cast<size_t>(r)]) destroy_(raw_[static_cast<size_t>(r)]);
      });
    }
  }
  GpuRanks(const GpuRanks&) = delete;
  GpuRanks& operator=(const GpuRanks&) = delete;
  int world_size() const {
    if (caller_) return caller_->world_size();
    return nccl_ ? nccl_->world_size() : cuda_ ? cuda_->world_size() : static_cast<int>(ranks_.size());
  }
  void run(const std::function<void(Communicator&)>& fn) {
    if (nccl_) return nccl_->run(fn);
    if (cuda_) return cuda_->run(fn);
    if (caller_) return caller_->run(fn);
    on_rank_threads(world_size(), [&](int r) { fn(*ranks_[static_cast<size_t>(r)]); });
  }

 private:
  std::unique_ptr<CudaRanks> cuda_;
  std::unique_ptr<NcclRanks> nccl_;
  std::unique_ptr<CallerGroupRanks> caller_;
  std::vector<void*> raw_;
  std::vector<std::unique_ptr<Communicator>> ranks_;
  int (*destroy_)(void*) = nullptr;
};

// Contexts on GPUs 0..W-1.
std::vector<Context> gpu_contexts(int W) {
  std::vector<Context> out;
  for (int d = 0; d < W; ++d) out.push_back(Context::cuda(d));
  return out;
}

class EpCuda : public ::testing::TestWithParam<std::string> {
 protected:
  const std::string& engine() const { return GetParam(); }
};

INSTANTIATE_TEST_SUITE_P(, EpCuda, ::testing::ValuesIn(gpu_engines()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

struct Cfg {
  int64_t L = 4, H = 40, k = 3, Tm = 48, R = 0, A = 1;
  DType dt = DType::BF16;
  OverflowPolicy overflow = OverflowPolicy::Error;
  bool i32 = false;
  int64_t skip_expert = -1;  // an expert no token picks (zero-token expert)
  enum Bad { kNone, kOutOfRange, kDuplicate } bad = kNone;
};

ExpertParallelConfig config_of(const Cfg& c, int W) {
  ExpertParallelConfig e;
  e.experts_per_rank = c.L;
  e.hidden = c.H;
  e.dtype = c.dt;
  e.topk = c.k;
  e.max_tokens = c.Tm;
  e.receive_capacity = c.R > 0 ? c.R : W * c.Tm * c.k + c.L * c.A;  // room for every row
  e.alignment = c.A;
  e.overflow = c.overflow;
  return e;
}

// One rank's inputs, on the host.
struct Data {
  int64_t T = 0;
  Tensor x, idx, w, dy;  // [T, H], [T, k] i64|i32, [T, k] f32, [T, H]
  Tensor y, dX, dp;      // [R, H] (expert outputs), [R, H], [R] f32
};

Data make_data(const Cfg& c, int W, int64_t T, uint64_t seed) {
  const int64_t E = c.L * W, R = config_of(c, W).receive_capacity;
  Data d;
  d.T = T;
  d.x = random_normal({T, c.H}, c.dt, seed);
  d.dy = random_normal({T, c.H}, c.dt, seed + 1);
  d.y = random_normal({R, c.H}, c.dt, seed + 2);
  d.dX = random_normal({R, c.H}, c.dt, seed + 3);
  d.dp = random_normal({R}, DType::F32, seed + 4);
  d.w = random_normal({T, c.k}, DType::F32, seed + 5);
  d.idx = Tensor::empty({T, c.k}, c.i32 ? DType::I32 : DType::I64, Context::cpu());
  std::mt19937_64 rng(seed + 6);
  std::vector<int64_t> experts;
  for (int64_t g = 0; g < E; ++g) {
    if (g != c.skip_expert) experts.push_back(g);
  }
  for (int64_t t = 0; t < T; ++t) {
    std::shuffle(experts.begin(), experts.end(), rng);
    for (int64_t j = 0; j < c.k; ++j) {
      int64_t v = experts[static_cast<size_t>(j)];
      if (t == T / 2 && j == c.k - 1 && c.bad == Cfg::kOutOfRange) v = E + 3;
      if (t == T / 2 && j == c.k - 1 && c.bad == Cfg::kDuplicate) v = experts[0];
      if (c.i32) {
        d.idx.data_as<int32_t>()[t * c.k + j] = static_cast<int32_t>(v);
      } else {
        d.idx.data_as<int64_t>()[t * c.k + j] = v;
      }
    }
  }
  return d;
}

// What one rank's chain wrote: every output a sentinel-filled caller buffer (byte images), and
// each call's error ("" when it returned).
struct Result {
  std::vector<uint8_t> recv, weights, splits, tpe, y, cb, dtok, dgw;
  uint32_t bits = 0;
  std::string error;  // the first call's error that threw
  std::string errors[4];  // dispatch, combine, combine_backward, dispatch_backward
};

// The chain dispatch → combine → combine_backward → dispatch_backward, each call made whatever the
// earlier ones did (every call is collective; a refused dispatch leaves the handle undefined, so the
// later calls refuse too). `wrong_call` (0..3) on rank `wrong_rank`: that call's output buffer is
// one of the wrong shape, which the rank refuses on the host.
Result run_chain(Communicator& comm, const Cfg& c, const Data& d, int wrong_call = -1,
                 int wrong_rank = -1) {
  const Context& ctx = comm.context();
  const ExpertParallelConfig cfg = config_of(c, comm.world_size());
  const int64_t R = cfg.receive_capacity, T = d.T;
  ExpertParallel ep(comm, cfg);
  const Tensor x = to_device(ctx, d.x), idx = to_device(ctx, d.idx), w = to_device(ctx, d.w);
  const Tensor dy = to_device(ctx, d.dy), y = to_device(ctx, d.y), dX = to_device(ctx, d.dX);
  const Tensor dp = to_device(ctx, d.dp);
  const Tensor recv = filled(ctx, {R, c.H}, c.dt, kSentinel);
  const Tensor wts = filled(ctx, {R}, DType::F32, kSentinel);
  const Tensor out = filled(ctx, {T, c.H}, c.dt, kSentinel);
  const Tensor cb = filled(ctx, {R, c.H}, c.dt, kSentinel);
  const Tensor dtok = filled(ctx, {T, c.H}, c.dt, kSentinel);
  const Tensor dgw = filled(ctx, {T, c.k}, DType::F32, kSentinel);
  const Tensor wrong = filled(ctx, {1, c.H}, c.dt, kSentinel);
  auto buffer = [&](int call, const Tensor& t) {
    return call == wrong_call && comm.rank() == wrong_rank ? wrong : t;
  };
  Result r;
  auto attempt = [&](int call, const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      r.errors[call] = e.what();
      if (r.error.empty()) r.error = e.what();
    }
  };
  ExpertParallel::Dispatched D;
  attempt(0, [&] { D = ep.dispatch(x, idx, w, {buffer(0, recv), wts}); });
  attempt(1, [&] { ep.combine(D.handle, y, buffer(1, out)); });
  attempt(2, [&] { ep.combine_backward(D.handle, dy, buffer(2, cb)); });
  attempt(3, [&] { ep.dispatch_backward(D.handle, dX, dp, {buffer(3, dtok), dgw}); });
  if (r.errors[0].empty()) {
    r.splits = bytes_of(ctx, D.splits.device_counts());
    r.tpe = bytes_of(ctx, D.tokens_per_expert);
  }
  r.recv = bytes_of(ctx, recv);
  r.weights = bytes_of(ctx, wts);
  r.y = bytes_of(ctx, out);
  r.cb = bytes_of(ctx, cb);
  r.dtok = bytes_of(ctx, dtok);
  r.dgw = bytes_of(ctx, dgw);
  r.bits = ctx.device_error_bits();
  return r;
}

std::vector<Result> run_cpu(const Cfg& c, const std::vector<Data>& data, int wrong_call = -1,
                            int wrong_rank = -1) {
  const int W = static_cast<int>(data.size());
  std::vector<Result> out(static_cast<size_t>(W));
  CpuRanks ranks(W);
  ranks.run([&](Communicator& comm) {
    out[static_cast<size_t>(comm.rank())] =
        run_chain(comm, c, data[static_cast<size_t>(comm.rank())], wrong_call, wrong_rank);
  });
  return out;
}

std::vector<Result> run_gpu(GpuRanks& ranks, const std::string& engine, const Cfg& c,
                            const std::vector<Data>& data, int wrong_call = -1, int wrong_rank = -1) {
  std::vector<Result> out(data.size());
  ranks.run([&](Communicator& comm) {
    EXPECT_EQ(comm.engine(), engine_name(engine));
    out[static_cast<size_t>(comm.rank())] =
        run_chain(comm, c, data[static_cast<size_t>(comm.rank())], wrong_call, wrong_rank);
  });
  return out;
}
std::vector<Result> run_gpu(const std::string& engine, const Cfg& c, const std::vector<Data>& data,
                            const std::vector<Context>& contexts, int wrong_call = -1,
                            int wrong_rank = -1) {
  GpuRanks ranks(engine, contexts);  // a GPU machine whose engine cannot run fails here (no skip)
  return run_gpu(ranks, engine, c, data, wrong_call, wrong_rank);
}
std::vector<Result> run_gpu(const std::string& engine, const Cfg& c, const std::vector<Data>& data) {
  return run_gpu(engine, c, data, gpu_contexts(static_cast<int>(data.size())));
}

void expect_same(const Result& gpu, const Result& cpu, DType dt, bool compare_counts) {
  EXPECT_TRUE(bit_identical(gpu.recv, cpu.recv, dt)) << "recv";
  EXPECT_TRUE(bit_identical(gpu.weights, cpu.weights, DType::F32)) << "weights";
  if (compare_counts) {
    EXPECT_TRUE(bit_identical(gpu.splits, cpu.splits, DType::I64)) << "splits";
    EXPECT_TRUE(bit_identical(gpu.tpe, cpu.tpe, DType::I64)) << "tokens_per_expert";
  }
  EXPECT_TRUE(bit_identical(gpu.y, cpu.y, dt)) << "combine";
  EXPECT_TRUE(bit_identical(gpu.cb, cpu.cb, dt)) << "combine_backward";
  EXPECT_TRUE(bit_identical(gpu.dtok, cpu.dtok, dt)) << "dispatch_backward tokens";
  EXPECT_TRUE(bit_identical(gpu.dgw, cpu.dgw, DType::F32)) << "dispatch_backward topk_weights";
}

// `ranks`: a group to reuse (a fuzz's many cases on one group: an NCCL communicator per case
// cost ~2 s each), else one made for the call on GPUs 0..W-1.
void expect_gpu_matches_cpu(const std::string& engine, const Cfg& c,
                            const std::vector<int64_t>& tokens, uint64_t seed,
                            GpuRanks* ranks = nullptr) {
  std::vector<Data> data;
  for (size_t r = 0; r < tokens.size(); ++r) {
    data.push_back(make_data(c, static_cast<int>(tokens.size()), tokens[r], seed + 100 * r));
  }
  const std::vector<Result> cpu = run_cpu(c, data),
                            gpu = ranks ? run_gpu(*ranks, engine, c, data) : run_gpu(engine, c, data);
  for (size_t r = 0; r < tokens.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(cpu[r].error, "") << "the CPU engine refused a valid case";
    EXPECT_EQ(gpu[r].error, "");
    EXPECT_EQ(gpu[r].bits, 0u) << "valid routing flagged by the device checks";
    expect_same(gpu[r], cpu[r], c.dt, true);
  }
}

TEST_P(EpCuda, WorldSizeOneIsBitIdenticalToCpuRanksOnFuzzedRouting) {
  MOEKIT_EP_REQUIRE_GPUS(1);
  GpuRanks ranks(engine(), gpu_contexts(1));  // one group, a new ExpertParallel per case
  const DType dtypes[] = {DType::BF16, DType::F16, DType::F32};
  uint64_t seed = 1;
  for (DType dt : dtypes) {
    for (int64_t A : {1, 8}) {
      for (int64_t k : {1, 3, 8}) {
        Cfg c;
        c.dt = dt;
        c.A = A;
        c.k = k;
        c.L = k == 8 ? 16 : 4;
        c.H = dt == DType::F32 ? 36 : 40;  // 16-byte rows and rows that need the 2-byte path
        c.skip_expert = seed % 2 ? 1 : -1;
        c.i32 = seed % 3 == 0;
        SCOPED_TRACE(str(name(dt), " A=", A, " k=", k, " i32=", c.i32));
        for (int64_t T : {int64_t{0}, int64_t{1}, int64_t{37}, int64_t{48}}) {
          SCOPED_TRACE("T=" + std::to_string(T));
          expect_gpu_matches_cpu(engine(), c, {T}, seed++, &ranks);
        }
      }
    }
  }
}

TEST_P(EpCuda, CapacityDropKeepsTheSameRowsAsCpuRanks) {
  MOEKIT_EP_REQUIRE_GPUS(1);
  for (int64_t A : {1, 4}) {
    Cfg c;
    c.overflow = OverflowPolicy::Drop;
    c.A = A;
    c.R = 30;  // 48 tokens · top-3 = 144 rows wanted
    SCOPED_TRACE("A=" + std::to_string(A));
    expect_gpu_matches_cpu(engine(), c, {48}, 7 + static_cast<uint64_t>(A));
  }
}

// A refused dispatch on the GPU: the device checks set the bit, every output keeps its sentinel
// (so the GPU's buffers equal the CPU engine's, which refused before writing anything), and the
// handle's combine / backward passes store nothing either.
void expect_refused(const std::string& engine, const Cfg& c, uint32_t bit, const char* argument) {
  const std::vector<Data> data = {make_data(c, 1, 40, 11)};
  const std::vector<Result> cpu = run_cpu(c, data), gpu = run_gpu(engine, c, data);
  EXPECT_THAT(cpu[0].error, ::testing::HasSubstr(argument));
  EXPECT_EQ(gpu[0].error, "") << "the GPU path must not read topk_idx on the host";
  EXPECT_EQ(gpu[0].bits, bit);
  expect_same(gpu[0], cpu[0], c.dt, false);
  // The error is raised by check_device_errors, naming the argument.
  GpuRanks ranks(engine, gpu_contexts(1));
  ranks.run([&](Communicator& comm) {
    ExpertParallel ep(comm, config_of(c, 1));
    const Context& ctx = comm.context();
    ep.dispatch(to_device(ctx, data[0].x), to_device(ctx, data[0].idx), to_device(ctx, data[0].w));
    try {
      ctx.check_device_errors();
      ADD_FAILURE() << "no error raised";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(argument));
    }
  });
}

TEST_P(EpCuda, MalformedTopkIdxSetsTheErrorBitAndWritesNothing) {
  MOEKIT_EP_REQUIRE_GPUS(1);
  for (bool i32 : {false, true}) {
    Cfg c;
    c.i32 = i32;
    c.bad = Cfg::kOutOfRange;
    expect_refused(engine(), c, Context::kEpInvalidRouting, "topk_idx");
    c.bad = Cfg::kDuplicate;
    expect_refused(engine(), c, Context::kEpInvalidRouting, "topk_idx");
  }
}

TEST_P(EpCuda, CapacityOverflowErrorSetsTheErrorBitAndWritesNothing) {
  MOEKIT_EP_REQUIRE_GPUS(1);
  Cfg c;
  c.R = 30;
  expect_refused(engine(), c, Context::kEpCapacityExceeded, "receive_capacity");
}

TEST_P(EpCuda, WorldSizeTwoOnTwoGpusIsBitIdenticalToCpuRanks) {
  MOEKIT_EP_REQUIRE_GPUS(2);
  for (DType dt : {DType::BF16, DType::F32}) {
    Cfg c;
    c.dt = dt;
    c.A = 4;
    c.skip_expert = 5;
    SCOPED_TRACE(name(dt));
    expect_gpu_matches_cpu(engine(), c, {48, 17}, 21);
    expect_gpu_matches_cpu(engine(), c, {0, 30}, 22);  // a rank with no tokens
  }
  Cfg drop;
  drop.overflow = OverflowPolicy::Drop;
  drop.R = 40;
  expect_gpu_matches_cpu(engine(), drop, {48, 48}, 23);
}

// ---------------------------------------------------------------- in-band agreement at W = 2
//
// A caller group of two ranks on ONE GPU, each on its own stream (the caller's stream-ordered
// barrier between them): the W = 2 protocol — peer loads of counts and verdicts, stores into the
// other rank's staging and returns — runs without a second GPU.
std::vector<Context> two_ranks_on_gpu0(const CudaGraphApi& api, std::vector<std::unique_ptr<OwnedStream>>& streams) {
  std::vector<Context> out;
  for (int r = 0; r < 2; ++r) {
    streams.push_back(std::make_unique<OwnedStream>(api));
    out.push_back(Context::cuda(0, streams.back()->get()));
  }
  return out;
}

TEST(EpCudaInBand, TwoRanksOnOneGpuAreBitIdenticalToCpuRanks) {
  MOEKIT_EP_REQUIRE_GPUS(1);
  const CudaGraphApi& api = CudaGraphApi::get();
  ASSERT_TRUE(api.ok) << "libcudart entry points not found through dlopen";
  std::vector<std::unique_ptr<OwnedStream>> streams;
  const std::vector<Context> contexts = two_ranks_on_gpu0(api, streams);
  uint64_t seed = 61;
  for (DType dt : {DType::BF16, DType::F32}) {
    for (const auto& [tokens, overflow] :
         {std::pair{std::vector<int64_t>{48, 17}, OverflowPolicy::Error},
          std::pair{std::vector<int64_t>{0, 30}, OverflowPolicy::Error},  // a rank with no tokens
          std::pair{std::vector<int64_t>{48, 48}, OverflowPolicy::Drop}}) {
      Cfg c;
      c.dt = dt;
      c.A = 4;
      c.skip_expert = 5;
      c.overflow = overflow;
      if (overflow == OverflowPolicy::Drop) c.R = 40;
      SCOPED_TRACE(str(name(dt), " T=", tokens[0], ",", tokens[1], overflow == OverflowPolicy::Drop ? " drop" : ""));
      std::vector<Data> data;
      for (size_t r = 0; r < 2; ++r) data.push_back(make_data(c, 2, tokens[r], seed + 100 * r));
      ++seed;
      const std::vector<Result> cpu = run_cpu(c, data), gpu = run_gpu("caller-group", c, data, contexts);
      for (size_t r = 0; r < 2; ++r) {
        SCOPED_TRACE("rank " + std::to_string(r));
        ASSERT_EQ(cpu[r].error, "");
        EXPECT_EQ(gpu[r].error, "");
        EXPECT_EQ(gpu[r].bits, 0u);
        expect_same(gpu[r], cpu[r], c.dt, true);
      }
    }
  }
}

// Rank 1 gives a wrong-shaped output buffer to one call (each call in turn): it throws that call's
// InvalidArgument naming the buffer; rank 0 returns (no host agreement) and stores nothing for
// that call — nor for the calls after a refused dispatch (its handle's plan refuses them) — and
// its context reports kEpPeerRefused; every buffer equals the CPU engine's, where both ranks threw
// at the call (host agreement); the calls after a refused combine / combine_backward run as usual.
void expect_refusals_store_nothing(const std::vector<Context>& contexts) {
  const char* buffers[] = {"'recv'", "'output'", "'output'", "'tokens'"};
  for (int call = 0; call < 4; ++call) {
    SCOPED_TRACE("refused call " + std::to_string(call));
    Cfg c;
    c.A = 4;
    const std::vector<Data> data = {make_data(c, 2, 40, 71), make_data(c, 2, 33, 72)};
    const std::vector<Result> cpu = run_cpu(c, data, call, 1),
                              gpu = run_gpu("caller-group", c, data, contexts, call, 1);
    EXPECT_THAT(gpu[1].errors[call], ::testing::HasSubstr(buffers[call]));
    EXPECT_EQ(gpu[1].errors[call], cpu[1].errors[call]);
    EXPECT_THAT(cpu[0].errors[call], ::testing::HasSubstr("rank 1 refused its arguments"));
    EXPECT_EQ(gpu[0].errors[call], "") << "in band, only the rank at fault throws";
    EXPECT_EQ(gpu[0].bits, Context::kEpPeerRefused);
    for (size_t r = 0; r < 2; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      expect_same(gpu[r], cpu[r], c.dt, false);
    }
  }
  // The group is usable afterwards: the same contexts, a clean chain.
  for (const Context& ctx : contexts) EXPECT_EQ(ctx.device_error_bits(), 0u);
  Cfg c;
  const std::vector<Data> data = {make_data(c, 2, 20, 81), make_data(c, 2, 25, 82)};
  const std::vector<Result> cpu = run_cpu(c, data), gpu = run_gpu("caller-group", c, data, contexts);
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(gpu[r].error, "");
    EXPECT_EQ(gpu[r].bits, 0u);
    expect_same(gpu[r], cpu[r], c.dt, true);
  }
}

TEST(EpCudaInBand, ARankRefusingItsArgumentsStoresNothingOnAnyRank) {
  MOEKIT_EP_REQUIRE_GPUS(1);
  const CudaGraphApi& api = CudaGraphApi::get();
  ASSERT_TRUE(api.ok) << "libcudart entry points not found through dlopen";
  std::vector<std::unique_ptr<OwnedStream>> streams;
  expect_refusals_store_nothing(two_ranks_on_gpu0(api, streams));
}

// The same across two GPUs (the caller group's peers over NVLink; issue 42's run).
TEST(EpCudaInBand, WorldSizeTwoOnTwoGpusARankRefusingItsArgumentsStoresNothingOnAnyRank) {
  MOEKIT_EP_REQUIRE_GPUS(2);
  expect_refusals_store_nothing(gpu_contexts(2));
}

// The layer step — dispatch, an expert kernel reading the device splits (grouped_bias_add: rows
// of each local expert + its bias, scaled by the routing weights), combine, combine_backward,
// dispatch_backward — captured once in a CUDA graph on one GPU, then replayed after only the
// routing (and tokens) changed in place: every output bit-identical to the same step run eagerly
// on a second ExpertParallel; a malformed routing replayed sets the error bit and writes nothing.
TEST_P(EpCuda, LayerStepCapturedInACudaGraphReplaysWithNewRoutingBitIdenticalToEager) {
  MOEKIT_EP_REQUIRE_GPUS(1);
  const CudaGraphApi& api = CudaGraphApi::get();
  ASSERT_TRUE(api.ok) << "libcudart entry points not found through dlopen";
  const OwnedStream owned(api);
  void* const stream = owned.get();
  ASSERT_NE(stream, nullptr);
  Cfg c;
  c.A = 8;
  c.k = 4;
  c.L = 8;
  const int64_t T = 48;
  const ExpertParallelConfig cfg = config_of(c, 1);
  const int64_t R = cfg.receive_capacity, H = c.H;
  GpuRanks ranks(engine(), std::vector<Context>{Context::cuda(0, stream)});
  ranks.run([&](Communicator& comm) {
    const Context& ctx = comm.context();
    ExpertParallel graphed(comm, cfg), eager(comm, cfg);
    const Data d0 = make_data(c, 1, T, 31);
    const Tensor x = to_device(ctx, d0.x), idx = to_device(ctx, d0.idx), w = to_device(ctx, d0.w);
    const Tensor dy = to_device(ctx, d0.dy), dp = to_device(ctx, d0.dp);
    const Tensor bias = to_device(ctx, random_normal({c.L, H}, c.dt, 39));
    struct Outs {
      Tensor recv, wts, y_exp, out, cb, dtok, dgw;
    };
    auto make_outs = [&] {
      return Outs{filled(ctx, {R, H}, c.dt, kSentinel),     filled(ctx, {R}, DType::F32, kSentinel),
                  filled(ctx, {R, H}, c.dt, kSentinel),     filled(ctx, {T, H}, c.dt, kSentinel),
                  filled(ctx, {R, H}, c.dt, kSentinel),     filled(ctx, {T, H}, c.dt, kSentinel),
                  filled(ctx, {T, c.k}, DType::F32, kSentinel)};
    };
    auto step = [&](ExpertParallel& ep, const Outs& o) {
      const ExpertParallel::Dispatched D = ep.dispatch(x, idx, w, {o.recv, o.wts});
      grouped_bias_add(ctx, o.recv, bias, o.wts, D.splits, o.y_exp);
      ep.combine(D.handle, o.y_exp, o.out);
      ep.combine_backward(D.handle, dy, o.cb);
      ep.dispatch_backward(D.handle, o.cb, dp, {o.dtok, o.dgw});
    };
    auto refill = [&](const Outs& o) {
      for (const Tensor* t : {&o.recv, &o.wts, &o.y_exp, &o.out, &o.cb, &o.dtok, &o.dgw}) {
        fill(ctx, *t, kSentinel);
      }
    };
    const Outs g = make_outs(), e = make_outs();
    ctx.synchronize();
    void* graph = nullptr;
    void* exec = nullptr;
    ASSERT_EQ(api.capture(stream, [&] { step(graphed, g); }, &graph), "");
    ASSERT_EQ(api.instantiate(&exec, graph, 0), 0);
    for (int round = 0; round < 4; ++round) {
      SCOPED_TRACE("replay " + std::to_string(round));
      Cfg cr = c;
      cr.i32 = false;
      cr.skip_expert = round == 1 ? 2 : -1;
      cr.bad = round == 3 ? Cfg::kDuplicate : Cfg::kNone;
      const Data d = make_data(cr, 1, T, 40 + static_cast<uint64_t>(round));
      copy(ctx, d.x, x);
      copy(ctx, d.idx, idx);
      copy(ctx, d.w, w);
      refill(g);
      ASSERT_EQ(api.launch(exec, stream), 0);
      ASSERT_EQ(api.stream_sync(stream), 0);
      const uint32_t graph_bits = ctx.device_error_bits();
      refill(e);
      step(eager, e);
      const uint32_t eager_bits = ctx.device_error_bits();
      EXPECT_EQ(graph_bits, round == 3 ? Context::kEpInvalidRouting : 0u);
      EXPECT_EQ(eager_bits, graph_bits);
      for (auto [a, b, dt, what] :
           {std::tuple{g.recv, e.recv, c.dt, "recv"}, {g.wts, e.wts, DType::F32, "weights"},
            {g.y_exp, e.y_exp, c.dt, "expert output"}, {g.out, e.out, c.dt, "combine"},
            {g.cb, e.cb, c.dt, "combine_backward"}, {g.dtok, e.dtok, c.dt, "dx"},
            {g.dgw, e.dgw, DType::F32, "d topk_weights"}}) {
        const std::vector<uint8_t> got = bytes_of(ctx, a);
        EXPECT_TRUE(bit_identical(got, bytes_of(ctx, b), dt)) << what;
        if (round == 3) {
          EXPECT_TRUE(bit_identical(got, bytes_of(ctx, filled(ctx, a.shape(), dt, kSentinel)), dt))
              << what << ": a refused step wrote something";
        }
      }
    }
    api.exec_destroy(exec);
    api.graph_destroy(graph);
    ctx.synchronize();
  });
}

// ---------------------------------------------------------------- the MoE layer on CUDA ranks
//
// MoELayer (router primitive → dispatch → GroupedMLP → combine, and back) on CudaRanks against the
// same layer, same data, on CpuRanks. Both allocators poison (unwritten memory is NaN, which no
// comparison passes). What must agree and how:
//  - the routing (saved topk_idx) exactly, and the topk weights within one f32 ulp: the router is
//    the same fp64 arithmetic on both (moekit/primitives/router.h), only exp() may differ by an
//    fp64 ulp;
//  - y, dx, dWg, dW1, dW2 within rtol·(|ref| + rms(ref)), rtol = 2·ε_dtype (bf16: 2⁻⁶): the GPU's
//    grouped GEMMs sum in another order than the CPU's, so the bf16 intermediates (h, z, dX) may
//    round one ulp apart and the final rounding another ulp — while a wrong element (a wrong
//    expert, a dropped or doubled row, a missing router term) is O(rms);
//  - an expert no token picks (its gate row makes its logit ≈ −30 for every token): never in
//    topk_idx, and its dW1 / dW2 exactly 0 on the GPU.
struct LayerCfg {
  int W = 1;
  int64_t L = 4, H = 64, F = 96, k = 2, T = 40;
  DType dt = DType::BF16;
  RouterScore score = RouterScore::Softmax;
  bool normalize = false;
  int64_t zero_expert = 1;  // global expert no token picks
  uint64_t seed = 7;
};

struct LayerHostData {
  Tensor gate, w1, w2;        // [E, H], [E, 2F, H], [E, H, F]
  std::vector<Tensor> x, dy;  // per rank [T_r, H]
};

LayerHostData make_layer_host(const LayerCfg& c) {
  const int64_t E = c.L * c.W;
  LayerHostData d{random_normal({E, c.H}, c.dt, c.seed, 0.3),
                  random_normal({E, 2 * c.F, c.H}, c.dt, c.seed + 1, 1.0 / std::sqrt(double(c.H))),
                  random_normal({E, c.H, c.F}, c.dt, c.seed + 2, 1.0 / std::sqrt(double(c.F))),
                  {},
                  {}};
  // x[:, 0] = 4 on every token and gate[z] = (-8, 0, ..., 0): logit_z = -32, far below the rest.
  std::vector<double> g(static_cast<size_t>(E * c.H));
  to_f64(d.gate.data(), c.dt, g.data(), g.size());
  for (int64_t h = 0; h < c.H; ++h) g[static_cast<size_t>(c.zero_expert * c.H + h)] = h == 0 ? -8 : 0;
  from_f64(g.data(), d.gate.data(), c.dt, g.size());
  for (int r = 0; r < c.W; ++r) {
    const int64_t T = c.T - 3 * r;  // ranks differ in T
    Tensor x = random_normal({T, c.H}, c.dt, c.seed * 10 + 100 + static_cast<uint64_t>(r));
    std::vector<double> xv(static_cast<size_t>(T * c.H));
    to_f64(x.data(), c.dt, xv.data(), xv.size());
    for (int64_t t = 0; t < T; ++t) xv[static_cast<size_t>(t * c.H)] = 4;
    from_f64(xv.data(), x.data(), c.dt, xv.size());
    d.x.push_back(x);
    d.dy.push_back(random_normal({T, c.H}, c.dt, c.seed * 10 + 200 + static_cast<uint64_t>(r)));
  }
  return d;
}

struct LayerResult {
  std::vector<double> idx, w, y, dx, dgate, dw1, dw2;
};

// The layer's forward + backward on each rank of `ranks` (CpuRanks or GpuRanks).
template <class Ranks>
std::vector<LayerResult> run_layer(Ranks& ranks, const LayerCfg& c, const LayerHostData& d) {
  std::vector<LayerResult> out(static_cast<size_t>(c.W));
  ranks.run([&](Communicator& comm) {
    const int r = comm.rank();
    const Context& ctx = comm.context();
    const int64_t Tm = c.T;
    MoELayer moe(comm, {.ep = {.experts_per_rank = c.L,
                               .hidden = c.H,
                               .dtype = c.dt,
                               .topk = c.k,
                               .max_tokens = Tm,
                               .receive_capacity = Tm * c.W * c.k},
                        .ffn = c.F,
                        .score = c.score,
                        .normalize_topk = c.normalize});
    copy(ctx, d.gate, moe.gate_weight());
    copy(ctx, d.w1.rows(r * c.L, (r + 1) * c.L), moe.experts().fc1()->linear().weight());
    copy(ctx, d.w2.rows(r * c.L, (r + 1) * c.L), moe.experts().fc2()->linear().weight());
    const Tensor x = to_device(ctx, d.x[static_cast<size_t>(r)]);
    const Tensor dy = to_device(ctx, d.dy[static_cast<size_t>(r)]);
    MoELayer::Saved saved;
    const Tensor y = moe.forward(x, &saved);
    const MoELayer::Grads g = moe.backward(saved, dy);
    ctx.check_device_errors();
    out[static_cast<size_t>(r)] = {to_doubles(ctx, saved.topk_idx), to_doubles(ctx, saved.topk_weights),
                                   to_doubles(ctx, y), to_doubles(ctx, g.input),
                                   to_doubles(ctx, g.gate), to_doubles(ctx, g.experts.fc1.weight),
                                   to_doubles(ctx, g.experts.fc2.weight)};
  });
  return out;
}

// |got − ref| ≤ rtol·(|ref| + rms(ref)) for every element (NaN never passes); the reference must
// not be all zeros (a comparison that cannot fail).
::testing::AssertionResult layer_close(const char* what, const std::vector<double>& got,
                                       const std::vector<double>& ref, double rtol) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs " << ref.size();
  double ss = 0;
  for (double v : ref) ss += v * v;
  const double rms = std::sqrt(ss / static_cast<double>(std::max<size_t>(1, ref.size())));
  if (rms == 0) return ::testing::AssertionFailure() << what << ": the reference is all zeros";
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = rtol * (std::fabs(ref[i]) + rms);
    if (!(std::fabs(got[i] - ref[i]) <= tol)) {
      return ::testing::AssertionFailure() << what << "[" << i << "]: cuda " << got[i] << ", cpu "
                                           << ref[i] << " (tolerance " << tol << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

void expect_layer_matches(const LayerCfg& c, const std::vector<LayerResult>& gpu,
                          const std::vector<LayerResult>& cpu) {
  const double rtol = 2 * epsilon(c.dt);
  for (int r = 0; r < c.W; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const LayerResult& a = gpu[static_cast<size_t>(r)];
    const LayerResult& b = cpu[static_cast<size_t>(r)];
    ASSERT_EQ(a.idx, b.idx) << "the routing differs";
    for (double e : a.idx) EXPECT_NE(e, static_cast<double>(c.zero_expert)) << "zero-token expert chosen";
    ASSERT_EQ(a.w.size(), b.w.size());
    for (size_t i = 0; i < a.w.size(); ++i)
      EXPECT_LE(std::fabs(a.w[i] - b.w[i]), std::ldexp(std::fabs(b.w[i]), -23)) << "weight " << i;
    EXPECT_TRUE(layer_close("y", a.y, b.y, rtol));
    EXPECT_TRUE(layer_close("dx", a.dx, b.dx, rtol));
    if (c.normalize && c.k == 1) {
      // One expert per token, its weight normalised: w = s/s = 1 whatever the logits, so dgate
      // is 0 in exact arithmetic and both devices return fp64 cancellation noise (measured on
      // the H200: 1e-15 vs 7e-18) — a relative comparison of noise cannot be posed. Both must be
      // noise: far below any real gate gradient (O(1e-2) in the other cases, compared above).
      for (size_t i = 0; i < a.dgate.size(); ++i) {
        EXPECT_LE(std::fabs(a.dgate[i]), 0x1p-30) << "cuda dgate[" << i << "]";
        EXPECT_LE(std::fabs(b.dgate[i]), 0x1p-30) << "cpu dgate[" << i << "]";
      }
    } else {
      EXPECT_TRUE(layer_close("dgate", a.dgate, b.dgate, rtol));
    }
    EXPECT_TRUE(layer_close("dW1", a.dw1, b.dw1, rtol));
    EXPECT_TRUE(layer_close("dW2", a.dw2, b.dw2, rtol));
    if (c.zero_expert / c.L == r) {  // this rank owns the zero-token expert: its grads are 0
      const int64_t e = c.zero_expert % c.L, n1 = 2 * c.F * c.H, n2 = c.H * c.F;
      for (int64_t i = 0; i < n1; ++i) ASSERT_EQ(a.dw1[static_cast<size_t>(e * n1 + i)], 0.0) << i;
      for (int64_t i = 0; i < n2; ++i) ASSERT_EQ(a.dw2[static_cast<size_t>(e * n2 + i)], 0.0) << i;
    }
  }
}

TEST_P(EpCuda, MoELayerWorldSizeOneMatchesCpuRanks) {
  MOEKIT_EP_REQUIRE_GPUS(1);
  for (const auto& [score, normalize, k] :
       {std::tuple{RouterScore::Softmax, false, int64_t{2}},
        std::tuple{RouterScore::Sigmoid, true, int64_t{3}},
        std::tuple{RouterScore::Softmax, true, int64_t{1}}}) {
    LayerCfg c;
    c.score = score;
    c.normalize = normalize;
    c.k = k;
    SCOPED_TRACE(str(score == RouterScore::Softmax ? "softmax" : "sigmoid",
                     normalize ? " normalized" : "", " k=", k));
    const LayerHostData d = make_layer_host(c);
    CpuRanks cpu(1, [](int) { return poisoned(Context::cpu(1)); });
    GpuRanks gpu(engine(), std::vector<Context>{poisoned(Context::cuda(0))});
    const auto want = run_layer(cpu, c, d);
    const auto got = run_layer(gpu, c, d);
    expect_layer_matches(c, got, want);
  }
}

TEST_P(EpCuda, MoELayerWorldSizeTwoOnTwoGpusMatchesCpuRanks) {
  MOEKIT_EP_REQUIRE_GPUS(2);
  LayerCfg c;
  c.W = 2;
  c.k = 3;
  c.zero_expert = 6;  // on rank 1
  const LayerHostData d = make_layer_host(c);
  CpuRanks cpu(2, [](int) { return poisoned(Context::cpu(1)); });
  GpuRanks gpu(engine(), std::vector<Context>{poisoned(Context::cuda(0)), poisoned(Context::cuda(1))});
  const auto want = run_layer(cpu, c, d);
  const auto got = run_layer(gpu, c, d);
  expect_layer_matches(c, got, want);
}

// ---------------------------------------------------------------- each engine's symmetric memory
//
// allocate(): this rank's base is its own block (peers[rank()] == local.data()), a u8 [bytes]
// tensor on the rank's device, 16-byte aligned; every rank's stores into its block are seen by
// the others through their peers[] after a barrier; sizes that differ across ranks are an
// InvalidArgument naming 'bytes' with every rank's value on every rank; a block outlives the
// ranks object that allocated it (NcclRanks: its tensor keeps the NCCL communicator and window).
TEST_P(EpCuda, AllocateGivesEachRankItsOwnBlockAsItsPeer) {
  MOEKIT_EP_REQUIRE_GPUS(1);
  GpuRanks ranks(engine(), gpu_contexts(1));
  ranks.run([&](Communicator& comm) {
    EXPECT_EQ(comm.engine(), engine_name(engine()));
    // One process per GPU (nccl_communicator, caller groups) agrees in band; one process (its
    // ranks' host threads) on the host.
    const bool one_process = engine() == "cuda-ranks" || engine() == "nccl-symmetric";
    EXPECT_EQ(comm.agreement(), one_process ? Communicator::Agreement::Host
                                            : Communicator::Agreement::InBand);
    const Context& ctx = comm.context();
    for (size_t bytes : {size_t{1}, size_t{4096}, size_t{3 * 4096 + 17}}) {
      SCOPED_TRACE("bytes=" + std::to_string(bytes));
      const SymmetricMemory m = comm.allocate(bytes);
      ASSERT_EQ(m.peers.size(), 1u);
      EXPECT_EQ(m.peers[0], m.local.data());
      EXPECT_EQ(m.local.dtype(), DType::U8);
      EXPECT_EQ(m.local.numel(), static_cast<int64_t>(bytes));
      EXPECT_EQ(m.local.device(), ctx.device());
      EXPECT_EQ(reinterpret_cast<uintptr_t>(m.local.data()) % 16, 0u);
      fill(ctx, m.local, 7);
      comm.barrier();
      for (uint8_t b : bytes_of(ctx, m.local)) ASSERT_EQ(b, 7);
    }
  });
}

TEST_P(EpCuda, WorldSizeTwoAllocateStoresReachThePeerAfterABarrier) {
  MOEKIT_EP_REQUIRE_GPUS(2);
  GpuRanks ranks(engine(), gpu_contexts(2));
  const size_t bytes = 4096 + 40;
  ranks.run([&](Communicator& comm) {
    const Context& ctx = comm.context();
    const int me = comm.rank(), other = 1 - me;
    const SymmetricMemory m = comm.allocate(bytes);
    ASSERT_EQ(m.peers.size(), 2u);
    EXPECT_EQ(m.peers[static_cast<size_t>(me)], m.local.data());
    EXPECT_NE(m.peers[static_cast<size_t>(other)], nullptr);
    fill(ctx, m.local, 10 + me);
    comm.barrier();
    // The peer's block read through this rank's address of it.
    const Tensor theirs = Tensor::wrap(m.peers[static_cast<size_t>(other)],
                                       {static_cast<int64_t>(bytes)}, DType::U8, ctx.device());
    for (uint8_t b : bytes_of(ctx, theirs)) ASSERT_EQ(b, 10 + other);
    comm.barrier();  // neither block is freed while the other rank reads it
  });
}

TEST_P(EpCuda, WorldSizeTwoAllocateRefusesDifferentSizesOnEveryRank) {
  MOEKIT_EP_REQUIRE_GPUS(2);
  GpuRanks ranks(engine(), gpu_contexts(2));
  ranks.run([&](Communicator& comm) {
    try {
      comm.allocate(static_cast<size_t>(1000 + comm.rank()));
      ADD_FAILURE() << "rank " << comm.rank() << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
      EXPECT_THAT(e.what(), ::testing::HasSubstr("'bytes'"));
      EXPECT_THAT(e.what(), ::testing::HasSubstr("rank 0: 1000, rank 1: 1001"));
    }
    const SymmetricMemory m = comm.allocate(512);  // the group is usable afterwards
    EXPECT_EQ(m.peers[static_cast<size_t>(comm.rank())], m.local.data());
  });
}

TEST_P(EpCuda, SymmetricBlockOutlivesItsRanks) {
  MOEKIT_EP_REQUIRE_GPUS(1);
  std::optional<SymmetricMemory> kept;
  {
    GpuRanks ranks(engine(), gpu_contexts(1));
    ranks.run([&](Communicator& comm) {
      kept = comm.allocate(8192);
      fill(comm.context(), kept->local, 3);
      comm.context().synchronize();
    });
  }  // the ranks, their communicators and contexts are gone; the block is not
  const Context ctx = Context::cuda(0);
  fill(ctx, kept->local, 5);
  for (uint8_t b : bytes_of(ctx, kept->local)) ASSERT_EQ(b, 5);
  kept.reset();  // the last copy: deregistered and freed now (NCCL: then the communicator)
  ctx.synchronize();
}

// No GPU needed: NcclRanks and nccl_communicator check their arguments before any NCCL or CUDA
// call (so these pass in a build without NCCL too), and built() tells the build's truth.
TEST(NcclRanksArguments, BuiltIsTheBuildsMoekitHasNccl) {
#ifdef MOEKIT_HAS_NCCL
  EXPECT_TRUE(NcclRanks::built());
#else
  EXPECT_FALSE(NcclRanks::built());
#endif
}

TEST(NcclRanksArguments, RefusedBeforeAnyDeviceIsTouched) {
  auto expect_invalid = [](const std::function<void()>& f, const char* argument, const char* what) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << e.what();
      EXPECT_THAT(e.what(), ::testing::HasSubstr(argument));
      EXPECT_THAT(e.what(), ::testing::HasSubstr(what));
    }
  };
  expect_invalid([] { NcclRanks r(std::vector<int>{}); }, "'devices'", "got 0");
  expect_invalid([] { NcclRanks r(std::vector<int>(9, 0)); }, "'devices'", "1 to 8 GPUs");
  expect_invalid([] { NcclRanks r(std::vector<int>{0, 1, 0}); }, "'devices'", "GPU 0 twice");
  expect_invalid([] { NcclRanks r(std::vector<Context>{Context::cpu(1)}); }, "'contexts'",
                 "a CUDA context for every rank");
  expect_invalid([] { nccl_communicator(nullptr, Context::cpu(1)); }, "'nccl_comm'", "null");
  int fake = 0;  // never dereferenced: the context is refused first
  expect_invalid([&] { nccl_communicator(&fake, Context::cpu(1)); }, "'ctx'", "a CUDA context");
}

// The router primitives on one GPU, captured in a CUDA graph (caller buffers; the backward's
// d-logits workspace is a stream-ordered allocation inside the capture) and replayed after x and
// d topk_weights changed in place: every output bit-identical to the same calls run eagerly.
// (TEST_F: the suite's fixture, no engine parameter — it runs once.)
TEST_F(EpCuda, RouterCapturedInACudaGraphReplaysBitIdenticalToEager) {
  MOEKIT_EP_REQUIRE_GPUS(1);
  const CudaGraphApi& api = CudaGraphApi::get();
  ASSERT_TRUE(api.ok) << "libcudart entry points not found through dlopen";
  const OwnedStream owned(api);
  void* const stream = owned.get();
  ASSERT_NE(stream, nullptr);
  const Context ctx = Context::cuda(0, stream);
  const int64_t T = 50, E = 16, H = 72;
  const DType dt = DType::BF16;
  const RouterOptions o{.topk = 4, .score = RouterScore::Softmax, .normalize = true};
  const Tensor x = to_device(ctx, random_normal({T, H}, dt, 1));
  const Tensor gate = to_device(ctx, random_normal({E, H}, dt, 2, 0.5));
  const Tensor gw = to_device(ctx, random_normal({T, o.topk}, DType::F32, 3));
  const Tensor dxe = to_device(ctx, random_normal({T, H}, dt, 4));
  struct Outs {
    Tensor idx, w, scores, dgate, dx;
  };
  auto make_outs = [&] {
    return Outs{filled(ctx, {T, o.topk}, DType::I64, kSentinel),
                filled(ctx, {T, o.topk}, DType::F32, kSentinel),
                filled(ctx, {T, E}, DType::I64, kSentinel), filled(ctx, {E, H}, dt, kSentinel),
                filled(ctx, {T, H}, dt, kSentinel)};
  };
  auto step = [&](const Outs& q) {
    router_topk(ctx, x, gate, o, q.idx, q.w, q.scores);
    router_topk_backward(ctx, x, gate, q.scores, q.idx, gw, dxe, o, q.dgate, q.dx);
  };
  const Outs g = make_outs(), e = make_outs();
  ctx.synchronize();
  void* graph = nullptr;
  void* exec = nullptr;
  ASSERT_EQ(api.capture(stream, [&] { step(g); }, &graph), "");
  ASSERT_EQ(api.instantiate(&exec, graph, 0), 0);
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("replay " + std::to_string(round));
    copy(ctx, random_normal({T, H}, dt, 10 + static_cast<uint64_t>(round)), x);
    copy(ctx, random_normal({T, o.topk}, DType::F32, 20 + static_cast<uint64_t>(round)), gw);
    for (const Tensor* t : {&g.idx, &g.w, &g.scores, &g.dgate, &g.dx}) fill(ctx, *t, kSentinel);
    ASSERT_EQ(api.launch(exec, stream), 0);
    ASSERT_EQ(api.stream_sync(stream), 0);
    step(e);
    for (auto [a, b, t, what] :
         {std::tuple{g.idx, e.idx, DType::I64, "topk_idx"}, {g.w, e.w, DType::F32, "topk_weights"},
          {g.scores, e.scores, DType::I64, "scores"}, {g.dgate, e.dgate, dt, "grad_gate"},
          {g.dx, e.dx, dt, "grad_input"}}) {
      EXPECT_TRUE(bit_identical(bytes_of(ctx, a), bytes_of(ctx, b), t)) << what;
    }
  }
  api.exec_destroy(exec);
  api.graph_destroy(graph);
  ctx.synchronize();
}

}  // namespace
}  // namespace moekit::test
