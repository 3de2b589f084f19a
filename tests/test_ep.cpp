// Expert parallelism on CPU ranks (SPEC §7, moekit/ep/expert_parallel.h): dispatch, combine and
// both backward passes on 1, 2, 4 and 8 ranks, fuzzed routing, checked bit for bit against a
// single-rank dense reference written here (its own expert-major layout and its own recursive
// tree sum); capacity overflow both ways; malformed topk_idx; zero copy.
//
// The "experts" between dispatch and combine are an elementwise function of the row and the global
// expert id (fp32, one rounding), so every step is deterministic and the whole chain is compared
// bit for bit. The grouped MLP between them is tests/test_ep_layer.cpp's.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "moekit/moekit.h"
#include "support/test_util.h"

namespace moekit::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

enum class Routing { Uniform, Skewed, EmptyExpert, LastRankNothing, AllToRankZero };
const char* routing_name(Routing r) {
  switch (r) {
    case Routing::Uniform:
      return "uniform";
    case Routing::Skewed:
      return "skewed";
    case Routing::EmptyExpert:
      return "empty_expert";
    case Routing::LastRankNothing:
      return "last_rank_nothing";
    case Routing::AllToRankZero:
      return "all_to_rank_zero";
  }
  return "?";
}

struct Case {
  int W = 2;
  int64_t L = 4, H = 24, k = 3, Tm = 40, A = 1;
  int64_t R = 0;  // 0: room for every row
  DType dtype = DType::BF16;
  Routing routing = Routing::Uniform;
  OverflowPolicy overflow = OverflowPolicy::Error;
  uint64_t seed = 1;
  int64_t E() const { return L * W; }
};

// One rank's inputs, on the host.
struct RankInput {
  int64_t T = 0;
  Tensor x;                  // [T, H] dtype
  std::vector<int64_t> idx;  // [T, k]
  std::vector<float> w;      // [T, k]
  Tensor dy;                 // [T, H] dtype (the combine's output gradient)
};

std::vector<int64_t> route_token(const Case& c, std::mt19937_64& rng) {
  const int64_t E = c.E();
  std::vector<int64_t> allowed;
  for (int64_t g = 0; g < E; ++g) {
    if (c.routing == Routing::EmptyExpert && g == 1) continue;
    if (c.routing == Routing::LastRankNothing && c.W > 1 && g / c.L == c.W - 1) continue;
    if (c.routing == Routing::AllToRankZero && g / c.L != 0) continue;
    allowed.push_back(g);
  }
  std::vector<double> weight(allowed.size(), 1.0);
  if (c.routing == Routing::Skewed) {
    for (size_t i = 0; i < allowed.size(); ++i) weight[i] = std::exp(-static_cast<double>(i) / 2.0);
  }
  std::vector<int64_t> chosen;
  for (int64_t j = 0; j < c.k; ++j) {  // weighted draws without replacement
    std::discrete_distribution<size_t> pick(weight.begin(), weight.end());
    const size_t i = pick(rng);
    chosen.push_back(allowed[i]);
    weight[i] = 0;
  }
  return chosen;
}

std::vector<RankInput> make_inputs(const Case& c, const std::vector<int64_t>& tokens_per_rank) {
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<float> unit(0.1f, 1.0f);
  std::vector<RankInput> in(static_cast<size_t>(c.W));
  for (int r = 0; r < c.W; ++r) {
    RankInput& ri = in[static_cast<size_t>(r)];
    ri.T = tokens_per_rank[static_cast<size_t>(r)];
    ri.x = random_normal({ri.T, c.H}, c.dtype, c.seed * 100 + static_cast<uint64_t>(r));
    ri.dy = random_normal({ri.T, c.H}, c.dtype, c.seed * 100 + 50 + static_cast<uint64_t>(r));
    for (int64_t t = 0; t < ri.T; ++t) {
      for (int64_t g : route_token(c, rng)) {
        ri.idx.push_back(g);
        ri.w.push_back(unit(rng));
      }
    }
  }
  return in;
}

// The ExpertParallel of a case, each rank receiving at most `receive_capacity` rows.
ExpertParallelConfig config_of(const Case& c, int64_t receive_capacity) {
  return {.experts_per_rank = c.L,
          .hidden = c.H,
          .dtype = c.dtype,
          .topk = c.k,
          .max_tokens = c.Tm,
          .receive_capacity = receive_capacity,
          .alignment = c.A,
          .overflow = c.overflow};
}

// A rank's routing as dispatch takes it: idx [T, k] i64 and w [T, k] f32, host tensors viewing
// copies of the rank's vectors (Tensor::wrap views mutable memory). Not copyable: the views
// point into it.
struct HostRouting {
  HostRouting(const RankInput& ri, int64_t k)
      : idx_data(ri.idx),
        w_data(ri.w),
        idx(Tensor::wrap(idx_data.data(), {ri.T, k}, DType::I64, Device::cpu())),
        w(Tensor::wrap(w_data.data(), {ri.T, k}, DType::F32, Device::cpu())) {}
  HostRouting(const HostRouting&) = delete;
  HostRouting& operator=(const HostRouting&) = delete;
  std::vector<int64_t> idx_data;
  std::vector<float> w_data;
  Tensor idx, w;
};

std::vector<int64_t> default_tokens(const Case& c) {
  std::vector<int64_t> t;
  for (int r = 0; r < c.W; ++r) t.push_back(c.Tm - 3 * (r % 3));  // ranks differ; some at max
  return t;
}

// ---------------------------------------------------------------- the reference (one rank, dense)

float value_of(const Tensor& t, int64_t i) {
  float v;
  to_f32(static_cast<const char*>(t.data()) + static_cast<size_t>(i) * size_of(t.dtype()),
         t.dtype(), &v, 1);
  return v;
}

float round_to(float y, DType dt) {
  switch (dt) {
    case DType::BF16:
      return bf16_to_f32(f32_to_bf16(y));
    case DType::F16:
      return f16_to_f32(f32_to_f16(y));
    default:
      return y;
  }
}
// The test's experts: y = x·(1 + g/4) + (g + 1)/8 in fp32, one rounding to dtype, per element.
float expert_fn(float x, int64_t g, DType dt) {
  return round_to(x * (1.0f + 0.25f * static_cast<float>(g)) + 0.125f * static_cast<float>(g + 1),
                  dt);
}
// The test's input gradient of the experts: dx = dY·(0.5 + g) (fp32, one rounding).
float grad_fn(float dy, int64_t g, DType dt) {
  return round_to(dy * (0.5f + static_cast<float>(g)), dt);
}
// The test's routing-weight gradient of a row: 3·w + g (fp32).
float dw_fn(float w, int64_t g) {
  return 3.0f * w + static_cast<float>(g);
}

// One received row, as the reference lays them out.
struct RefRow {
  int src = 0;
  int64_t t = 0, g = 0, j = 0;
};
struct RefRank {
  std::vector<RefRow> rows;     // in recv order; padding rows have src = -1
  std::vector<int64_t> padded;  // [L]
  std::vector<int64_t> kept;    // [L]
  int64_t dropped = 0;
  std::map<std::tuple<int, int64_t, int64_t>, int64_t> row_of;  // (src, t, g) → row
};

RefRank reference_layout(const Case& c, const std::vector<RankInput>& in, int d, int64_t R) {
  RefRank rr;
  int64_t off = 0;
  for (int64_t e = 0; e < c.L; ++e) {
    const int64_t g = d * c.L + e;
    std::vector<RefRow> mine;
    for (int s = 0; s < c.W; ++s) {
      const RankInput& ri = in[static_cast<size_t>(s)];
      for (int64_t t = 0; t < ri.T; ++t) {
        for (int64_t j = 0; j < c.k; ++j) {
          if (ri.idx[static_cast<size_t>(t * c.k + j)] == g) mine.push_back({s, t, g, j});
        }
      }
    }
    const int64_t room = std::max<int64_t>(0, (R - off) / c.A * c.A);
    const int64_t kept = std::min<int64_t>(static_cast<int64_t>(mine.size()), room);
    rr.dropped += static_cast<int64_t>(mine.size()) - kept;
    const int64_t padded = (kept + c.A - 1) / c.A * c.A;
    for (int64_t i = 0; i < kept; ++i) {
      rr.row_of[{mine[static_cast<size_t>(i)].src, mine[static_cast<size_t>(i)].t, g}] =
          static_cast<int64_t>(rr.rows.size());
      rr.rows.push_back(mine[static_cast<size_t>(i)]);
    }
    for (int64_t i = kept; i < padded; ++i) rr.rows.push_back({-1, 0, g, 0});
    rr.kept.push_back(kept);
    rr.padded.push_back(padded);
    off += padded;
  }
  return rr;
}

// Pairwise tree sum over leaves keyed in [lo, hi) (hi - lo a power of two), absent leaves skipped:
// written recursively, independently of the library's level-by-level loop.
bool tree(const std::map<int64_t, std::vector<float>>& leaves, int64_t lo, int64_t hi,
          std::vector<float>& out) {
  auto first = leaves.lower_bound(lo);
  if (first == leaves.end() || first->first >= hi) return false;
  if (hi - lo == 1) {
    out = first->second;
    return true;
  }
  const int64_t mid = lo + (hi - lo) / 2;
  std::vector<float> a, b;
  const bool has_a = tree(leaves, lo, mid, a), has_b = tree(leaves, mid, hi, b);
  if (has_a && has_b) {
    out = a;
    for (size_t i = 0; i < out.size(); ++i) out[i] = a[i] + b[i];
  } else {
    out = has_a ? a : b;
  }
  return true;
}
int64_t pow2_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

// The combine of one source token: tree over local experts on each rank, then over ranks; rows
// dropped at their destination are absent. leaf(g) gives the fp32 row of expert g.
template <class Leaf>
std::vector<float> reference_sum(const Case& c, const std::vector<RefRank>& ref, int s, int64_t t,
                                 const std::vector<int64_t>& experts, const Leaf& leaf) {
  std::map<int64_t, std::vector<float>> per_rank;
  for (int d = 0; d < c.W; ++d) {
    std::map<int64_t, std::vector<float>> local;
    for (int64_t g : experts) {
      if (g / c.L != d || !ref[static_cast<size_t>(d)].row_of.count({s, t, g})) continue;
      local[g % c.L] = leaf(g);
    }
    std::vector<float> p;
    if (tree(local, 0, pow2_at_least(c.L), p)) per_rank[d] = p;
  }
  std::vector<float> out;
  if (!tree(per_rank, 0, pow2_at_least(c.W), out)) out.assign(static_cast<size_t>(c.H), 0.0f);
  return out;
}

std::vector<uint8_t> rounded(const std::vector<float>& v, DType dt) {
  std::vector<uint8_t> b(v.size() * size_of(dt));
  from_f32(v.data(), b.data(), dt, v.size());
  return b;
}

// ---------------------------------------------------------------- one run on CPU ranks

struct RankResult {
  std::vector<uint8_t> recv, weights, splits, tokens_per_expert;  // recv rows [0, S)
  int64_t rows = 0, dropped = 0;
  std::vector<uint8_t> out, grad_recv, grad_tokens, grad_topk;  // grad_recv rows [0, S)
  EpTraffic dispatch_traffic, combine_traffic;
  bool zero_copy = false;
};

// Every rank's context allocates poisoned memory (0xFF bytes: NaN), so a row the library should
// have written and did not fails the bitwise comparison, and rows it must not write stay 0xFF.
// The group a test runs on: CpuRanks, or threads that each bring their rank's region and the
// collectives to caller_communicator (what a one-process-per-GPU caller does).
// Processes: as Caller, but each rank a process of its own (below).
enum class Engine { CpuRanks, Caller, Processes };

// W threads, each a caller_communicator over its own poisoned host region of `region_bytes`
// (bases exchanged beforehand), a std::barrier and a slot vector for the collectives.
void run_on_caller_group(int W, size_t region_bytes,
                         const std::function<void(Communicator&)>& body) {
  std::vector<Context> ctxs;
  std::vector<Tensor> regions;
  std::vector<void*> bases;
  for (int r = 0; r < W; ++r) {
    ctxs.push_back(poisoned(Context::cpu(1)));
    regions.push_back(Tensor::empty({static_cast<int64_t>(region_bytes)}, DType::U8, ctxs.back()));
    bases.push_back(regions.back().data());
  }
  std::barrier sync(W);
  std::mutex mutex;
  std::vector<std::string> slots(static_cast<size_t>(W));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(W));
  std::vector<std::thread> threads;
  for (int r = 0; r < W; ++r) {
    threads.emplace_back([&, r] {
      try {
        CallerGroup g{.rank = r,
                      .world_size = W,
                      .context = ctxs[static_cast<size_t>(r)],
                      .region = regions[static_cast<size_t>(r)],
                      .peer_bases = bases,
                      .barrier = [&] { sync.arrive_and_wait(); },
                      .all_gather = [&, r](std::string_view bytes) {
                        sync.arrive_and_wait();  // the previous gather's readers are done
                        {
                          std::lock_guard lock(mutex);
                          slots[static_cast<size_t>(r)] = std::string(bytes);
                        }
                        sync.arrive_and_wait();
                        std::lock_guard lock(mutex);
                        return slots;
                      }};
        const std::unique_ptr<Communicator> comm = caller_communicator(std::move(g));
        body(*comm);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// ---- ranks as processes: what a one-process-per-GPU job does, on the CPU.
// W processes (fork), each a caller_communicator over its own mapping of one shared memory file
// (memfd): rank r's region is the file's bytes [r·B, (r+1)·B), and each process maps the whole
// file itself, so the peer bases it passes are ITS addresses of the other ranks' blocks (not
// theirs — as torch symmetric memory's buffer_ptrs are each process's own mapping). The
// collectives run over a second shared mapping: a generation-counting barrier of atomics and an
// all_gather slot per rank. A child reports its gtest failures and exceptions in its exit status
// and its results through the shared mapping; the parent waits for all (60 s at most, then kills
// them: a rank stuck in a collective fails the test, it does not hang it).
struct SharedControl {
  static constexpr int kMaxRanks = 8;
  static constexpr size_t kSlotBytes = 4096;
  std::atomic<int> arrived{0};
  std::atomic<int> generation{0};
  int64_t slot_len[kMaxRanks];
  char slot[kMaxRanks][kSlotBytes];
  char error[kMaxRanks][512];
};
static_assert(std::atomic<int>::is_always_lock_free, "process-shared atomics");

void shared_barrier(SharedControl& s, int W) {
  const int gen = s.generation.load(std::memory_order_acquire);
  if (s.arrived.fetch_add(1, std::memory_order_acq_rel) == W - 1) {
    s.arrived.store(0, std::memory_order_relaxed);
    s.generation.fetch_add(1, std::memory_order_acq_rel);
  } else {
    while (s.generation.load(std::memory_order_acquire) == gen) sched_yield();
  }
}

// A RankResult's fields as bytes (one process hands them to another).
void put(std::string& o, const std::vector<uint8_t>& v) {
  const uint64_t n = v.size();
  o.append(reinterpret_cast<const char*>(&n), 8);
  o.append(reinterpret_cast<const char*>(v.data()), v.size());
}
void put(std::string& o, int64_t v) { o.append(reinterpret_cast<const char*>(&v), 8); }
std::string serialise(const RankResult& r) {
  std::string o;
  for (const auto* v : {&r.recv, &r.weights, &r.splits, &r.tokens_per_expert, &r.out, &r.grad_recv,
                        &r.grad_tokens, &r.grad_topk}) {
    put(o, *v);
  }
  for (const EpTraffic* t : {&r.dispatch_traffic, &r.combine_traffic}) {
    put(o, t->remote_bytes);
    put(o, t->local_bytes);
    put(o, t->per_slot_bytes);
  }
  put(o, r.rows);
  put(o, r.dropped);
  return o;
}
RankResult deserialise(const char* p) {
  RankResult r;
  const auto take = [&p](std::vector<uint8_t>& v) {
    uint64_t n;
    std::memcpy(&n, p, 8);
    v.assign(reinterpret_cast<const uint8_t*>(p + 8), reinterpret_cast<const uint8_t*>(p + 8 + n));
    p += 8 + n;
  };
  const auto take64 = [&p](int64_t& v) {
    std::memcpy(&v, p, 8);
    p += 8;
  };
  for (auto* v : {&r.recv, &r.weights, &r.splits, &r.tokens_per_expert, &r.out, &r.grad_recv,
                  &r.grad_tokens, &r.grad_topk}) {
    take(*v);
  }
  for (EpTraffic* t : {&r.dispatch_traffic, &r.combine_traffic}) {
    take64(t->remote_bytes);
    take64(t->local_bytes);
    take64(t->per_slot_bytes);
  }
  take64(r.rows);
  take64(r.dropped);
  return r;
}

// Runs body(comm) on W forked ranks; each child then serialises result(rank) into its result
// block of `result_bytes`; returns every rank's block. Fails the test (and returns empty) if a
// child failed, threw or did not finish.
std::vector<std::string> run_on_processes(int W, size_t region_bytes, size_t result_bytes,
                                          const std::function<void(Communicator&)>& body,
                                          const std::function<std::string(int)>& result) {
  if (W > SharedControl::kMaxRanks) {
    ADD_FAILURE() << "at most " << SharedControl::kMaxRanks << " process ranks";
    return {};
  }
  region_bytes = (region_bytes + 4095) / 4096 * 4096;
  const int fd = memfd_create("moekit-ep-test", 0);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(region_bytes * W)) != 0) {
    ADD_FAILURE() << "memfd: " << std::strerror(errno);
    return {};
  }
  {  // poisoned (0xFF) as the other engines' regions
    void* all = mmap(nullptr, region_bytes * W, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    std::memset(all, 0xFF, region_bytes * W);
    munmap(all, region_bytes * W);
  }
  const size_t control_bytes = sizeof(SharedControl) + result_bytes * W;
  void* control_mem = mmap(nullptr, control_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  auto* control = new (control_mem) SharedControl{};
  char* results = static_cast<char*>(control_mem) + sizeof(SharedControl);
  std::vector<pid_t> pids;
  for (int r = 0; r < W; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {  // rank r: its own mapping of the file, at an address of its own choosing
      int status = 0;
      try {
        auto* mine = static_cast<char*>(
            mmap(nullptr, region_bytes * W, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
        if (mine == MAP_FAILED) throw std::runtime_error("mmap failed");
        std::vector<void*> bases;
        for (int q = 0; q < W; ++q) bases.push_back(mine + region_bytes * static_cast<size_t>(q));
        const Context ctx = poisoned(Context::cpu(1));
        CallerGroup g{.rank = r,
                      .world_size = W,
                      .context = ctx,
                      .region = Tensor::wrap(bases[static_cast<size_t>(r)],
                                             {static_cast<int64_t>(region_bytes)}, DType::U8, Device::cpu()),
                      .peer_bases = bases,
                      .barrier = [control, W] { shared_barrier(*control, W); },
                      .all_gather = [control, W, r](std::string_view bytes) {
                        if (bytes.size() > SharedControl::kSlotBytes) {
                          throw std::runtime_error("all_gather: more bytes than a slot holds");
                        }
                        shared_barrier(*control, W);  // the previous gather's readers are done
                        std::memcpy(control->slot[r], bytes.data(), bytes.size());
                        control->slot_len[r] = static_cast<int64_t>(bytes.size());
                        shared_barrier(*control, W);
                        std::vector<std::string> all;
                        for (int q = 0; q < W; ++q) all.emplace_back(control->slot[q], static_cast<size_t>(control->slot_len[q]));
                        return all;
                      }};
        {
          const std::unique_ptr<Communicator> comm = caller_communicator(std::move(g));
          body(*comm);
        }
        const std::string out = result(r);
        if (out.size() > result_bytes) throw std::runtime_error("result larger than its block");
        std::memcpy(results + result_bytes * static_cast<size_t>(r), out.data(), out.size());
        status = ::testing::Test::HasFailure() ? 1 : 0;
      } catch (const std::exception& e) {
        std::snprintf(control->error[r], sizeof control->error[r], "%s", e.what());
        status = 2;
      }
      std::fflush(stdout);
      _exit(status);
    }
    pids.push_back(pid);
  }
  std::vector<std::string> out;
  bool ok = true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int r = 0; r < W; ++r) {
    int status = 0;
    pid_t done = 0;
    while ((done = waitpid(pids[static_cast<size_t>(r)], &status, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (done == 0) {
      for (pid_t p : pids) kill(p, SIGKILL);
      for (pid_t p : pids) waitpid(p, nullptr, 0);
      ADD_FAILURE() << "rank " << r << " did not finish in 60 s";
      ok = false;
      break;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ADD_FAILURE() << "rank " << r << (WIFEXITED(status) ? str(" exited ", WEXITSTATUS(status)) : std::string(" was killed"))
                    << (control->error[r][0] ? str(": ", control->error[r]) : std::string(" (its test failures above)"));
      ok = false;
    }
  }
  if (ok) {
    for (int r = 0; r < W; ++r) out.emplace_back(results + result_bytes * static_cast<size_t>(r), result_bytes);
  }
  control->~SharedControl();
  munmap(control_mem, control_bytes);
  close(fd);
  return out;
}

std::vector<RankResult> run_ep(const Case& c, const std::vector<RankInput>& in,
                               Engine engine = Engine::CpuRanks) {
  std::vector<RankResult> res(static_cast<size_t>(c.W));
  const int64_t R = c.R;
  const auto body = [&](Communicator& comm) {
    const int r = comm.rank();
    const Context& ctx = comm.context();
    const RankInput& ri = in[static_cast<size_t>(r)];
    ExpertParallel ep(comm, config_of(c, R));
    const HostRouting routing(ri, c.k);
    auto d = ep.dispatch(to_device(ctx, ri.x), routing.idx, routing.w);
    RankResult& out = res[static_cast<size_t>(r)];
    out.dispatch_traffic = ep.last_traffic();
    out.rows = d.rows;
    out.dropped = d.dropped;
    auto recv = bytes_of(ctx, d.recv);
    EXPECT_TRUE(std::all_of(recv.begin() + d.rows * c.H * static_cast<int64_t>(size_of(c.dtype)),
                            recv.end(), [](uint8_t b) { return b == 0xFF; }))
        << "rank " << r << ": recv rows [S, R) were written";
    out.recv.assign(recv.begin(),
                    recv.begin() + d.rows * c.H * static_cast<int64_t>(size_of(c.dtype)));
    auto wb = bytes_of(ctx, d.weights);
    out.weights.assign(wb.begin(), wb.begin() + d.rows * 4);
    out.splits = bytes_of(ctx, d.splits.device_counts());
    out.tokens_per_expert = bytes_of(ctx, d.tokens_per_expert);
    // The experts write straight into the combine's input (zero copy).
    const Tensor& y = ep.combine_input();
    const std::vector<int64_t> padded = [&] {
      std::vector<int64_t> p(static_cast<size_t>(c.L));
      std::memcpy(p.data(), d.splits.device_counts().data(), p.size() * 8);
      return p;
    }();
    int64_t row = 0;
    for (int64_t e = 0; e < c.L; ++e) {
      for (int64_t i = 0; i < padded[static_cast<size_t>(e)]; ++i, ++row) {
        for (int64_t h = 0; h < c.H; ++h) {
          const float v = expert_fn(value_of(d.recv, row * c.H + h), r * c.L + e, c.dtype);
          from_f32(
              &v,
              static_cast<char*>(y.data()) + static_cast<size_t>(row * c.H + h) * size_of(c.dtype),
              c.dtype, 1);
        }
      }
    }
    Tensor o = ep.combine(d.handle, y);
    out.combine_traffic = ep.last_traffic();
    out.out = bytes_of(ctx, o);
    // Backward: dY = combine_backward(dy); the experts' input gradient into dispatch_backward's
    // input, their weight gradient per row; then dispatch_backward.
    Tensor dY = ep.combine_backward(d.handle, to_device(ctx, ri.dy));
    auto gr = bytes_of(ctx, dY);
    EXPECT_TRUE(std::all_of(gr.begin() + d.rows * c.H * static_cast<int64_t>(size_of(c.dtype)),
                            gr.end(), [](uint8_t b) { return b == 0xFF; }))
        << "rank " << r << ": combine_backward rows [S, R) were written";
    out.grad_recv.assign(gr.begin(),
                         gr.begin() + d.rows * c.H * static_cast<int64_t>(size_of(c.dtype)));
    const Tensor& dX = ep.dispatch_backward_input();
    Tensor dw = Tensor::empty({R}, DType::F32, ctx);
    row = 0;
    for (int64_t e = 0; e < c.L; ++e) {
      for (int64_t i = 0; i < padded[static_cast<size_t>(e)]; ++i, ++row) {
        for (int64_t h = 0; h < c.H; ++h) {
          const float v = grad_fn(value_of(dY, row * c.H + h), r * c.L + e, c.dtype);
          from_f32(
              &v,
              static_cast<char*>(dX.data()) + static_cast<size_t>(row * c.H + h) * size_of(c.dtype),
              c.dtype, 1);
        }
        dw.data_as<float>()[row] = dw_fn(d.weights.data_as<float>()[row], r * c.L + e);
      }
    }
    auto g = ep.dispatch_backward(d.handle, dX, dw);
    out.grad_tokens = bytes_of(ctx, g.tokens);
    out.grad_topk = bytes_of(ctx, g.topk_weights);
  };
  if (engine == Engine::CpuRanks) {
    CpuRanks ranks(c.W, [](int) { return poisoned(Context::cpu(1)); });
    ranks.run(body);
  } else if (engine == Engine::Processes) {
    // Each child's results come back through shared memory: a bound on their bytes.
    const size_t es = size_of(c.dtype);
    const size_t bound = 4096 + 8 * static_cast<size_t>(R * c.H) * es + 16 * static_cast<size_t>(c.Tm * c.k + R) +
                         2 * static_cast<size_t>(c.Tm * c.H) * es + 64 * static_cast<size_t>(c.L + 1);
    const auto blocks = run_on_processes(
        c.W, ExpertParallel::symmetric_bytes(config_of(c, R), c.W, Device::cpu()), bound, body,
        [&](int r) { return serialise(res[static_cast<size_t>(r)]); });
    if (blocks.empty()) return {};
    for (int r = 0; r < c.W; ++r) res[static_cast<size_t>(r)] = deserialise(blocks[static_cast<size_t>(r)].data());
  } else {
    run_on_caller_group(c.W, ExpertParallel::symmetric_bytes(config_of(c, R), c.W, Device::cpu()),
                        body);
  }
  return res;
}

// Every result of every rank against the reference, bit for bit.
void check_against_reference(const Case& c, const std::vector<RankInput>& in,
                             const std::vector<RankResult>& res) {
  const size_t es = size_of(c.dtype);
  std::vector<RefRank> ref;
  for (int d = 0; d < c.W; ++d) ref.push_back(reference_layout(c, in, d, c.R));
  for (int d = 0; d < c.W; ++d) {
    SCOPED_TRACE(str("destination rank ", d));
    const RefRank& rr = ref[static_cast<size_t>(d)];
    const RankResult& got = res[static_cast<size_t>(d)];
    ASSERT_EQ(got.rows, static_cast<int64_t>(rr.rows.size()));
    EXPECT_EQ(got.dropped, rr.dropped);
    std::vector<int64_t> splits(static_cast<size_t>(c.L)), tpe(static_cast<size_t>(c.L));
    std::memcpy(splits.data(), got.splits.data(), got.splits.size());
    std::memcpy(tpe.data(), got.tokens_per_expert.data(), got.tokens_per_expert.size());
    EXPECT_EQ(splits, rr.padded);
    EXPECT_EQ(tpe, rr.kept);
    std::vector<uint8_t> want_recv, want_w, want_grad_recv;
    for (const RefRow& row : rr.rows) {
      if (row.src < 0) {
        want_recv.insert(want_recv.end(), static_cast<size_t>(c.H) * es, 0);
        want_grad_recv.insert(want_grad_recv.end(), static_cast<size_t>(c.H) * es, 0);
        const float zero = 0.0f;
        const auto* zb = reinterpret_cast<const uint8_t*>(&zero);
        want_w.insert(want_w.end(), zb, zb + 4);
        continue;
      }
      const RankInput& ri = in[static_cast<size_t>(row.src)];
      const auto* x =
          static_cast<const uint8_t*>(ri.x.data()) + static_cast<size_t>(row.t * c.H) * es;
      want_recv.insert(want_recv.end(), x, x + static_cast<size_t>(c.H) * es);
      const auto* dy =
          static_cast<const uint8_t*>(ri.dy.data()) + static_cast<size_t>(row.t * c.H) * es;
      want_grad_recv.insert(want_grad_recv.end(), dy, dy + static_cast<size_t>(c.H) * es);
      const auto* wb =
          reinterpret_cast<const uint8_t*>(&ri.w[static_cast<size_t>(row.t * c.k + row.j)]);
      want_w.insert(want_w.end(), wb, wb + 4);
    }
    EXPECT_TRUE(bit_identical(got.recv, want_recv, c.dtype)) << "recv";
    EXPECT_TRUE(bit_identical(got.weights, want_w, DType::F32)) << "weights";
    EXPECT_TRUE(bit_identical(got.grad_recv, want_grad_recv, c.dtype)) << "combine_backward";
  }
  for (int s = 0; s < c.W; ++s) {
    SCOPED_TRACE(str("source rank ", s));
    const RankInput& ri = in[static_cast<size_t>(s)];
    std::vector<uint8_t> want_out, want_gx, want_gw;
    for (int64_t t = 0; t < ri.T; ++t) {
      std::vector<int64_t> experts(ri.idx.begin() + t * c.k, ri.idx.begin() + (t + 1) * c.k);
      auto y = reference_sum(c, ref, s, t, experts, [&](int64_t g) {
        std::vector<float> v(static_cast<size_t>(c.H));
        for (int64_t h = 0; h < c.H; ++h)
          v[static_cast<size_t>(h)] = expert_fn(value_of(ri.x, t * c.H + h), g, c.dtype);
        return v;
      });
      auto b = rounded(y, c.dtype);
      want_out.insert(want_out.end(), b.begin(), b.end());
      auto gx = reference_sum(c, ref, s, t, experts, [&](int64_t g) {
        std::vector<float> v(static_cast<size_t>(c.H));
        for (int64_t h = 0; h < c.H; ++h)
          v[static_cast<size_t>(h)] = grad_fn(value_of(ri.dy, t * c.H + h), g, c.dtype);
        return v;
      });
      b = rounded(gx, c.dtype);
      want_gx.insert(want_gx.end(), b.begin(), b.end());
      for (int64_t j = 0; j < c.k; ++j) {
        const int64_t g = experts[static_cast<size_t>(j)];
        const bool kept = ref[static_cast<size_t>(g / c.L)].row_of.count({s, t, g}) > 0;
        const float v = kept ? dw_fn(ri.w[static_cast<size_t>(t * c.k + j)], g) : 0.0f;
        const auto* vb = reinterpret_cast<const uint8_t*>(&v);
        want_gw.insert(want_gw.end(), vb, vb + 4);
      }
    }
    const RankResult& got = res[static_cast<size_t>(s)];
    EXPECT_TRUE(bit_identical(got.out, want_out, c.dtype)) << "combine";
    EXPECT_TRUE(bit_identical(got.grad_tokens, want_gx, c.dtype)) << "dispatch_backward tokens";
    EXPECT_TRUE(bit_identical(got.grad_topk, want_gw, DType::F32))
        << "dispatch_backward topk_weights";
  }
}

int64_t rows_needed(const Case& c, const std::vector<RankInput>& in, int d) {
  Case big = c;
  return static_cast<int64_t>(reference_layout(big, in, d, INT64_MAX / 2).rows.size());
}
int64_t max_rows_needed(const Case& c, const std::vector<RankInput>& in) {
  int64_t m = 0;
  for (int d = 0; d < c.W; ++d) m = std::max(m, rows_needed(c, in, d));
  return m;
}

// ---------------------------------------------------------------- fuzzed routing, 1/2/4/8 ranks

struct FuzzParam {
  int W;
  Routing routing;
};
class EpFuzz : public ::testing::TestWithParam<FuzzParam> {};

TEST_P(EpFuzz, DispatchCombineAndBackwardMatchTheDenseReferenceBitForBit) {
  const FuzzParam p = GetParam();
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    SCOPED_TRACE(str("seed ", seed));
    Case c;
    c.W = p.W;
    c.routing = p.routing;
    c.seed = seed;
    c.L = (seed == 3 ? 3 : 2) * (p.W == 1 ? 4 : 1);  // a non-power-of-two L too (two-level tree)
    c.k = std::min<int64_t>(3, p.routing == Routing::AllToRankZero ? c.L : c.L * c.W - 1);
    if (p.routing == Routing::LastRankNothing && c.W > 1) c.k = std::min(c.k, c.L * (c.W - 1));
    c.A = seed == 2 ? 4 : 1;  // alignment padding
    c.dtype = seed == 3 ? DType::F32 : DType::BF16;
    auto in = make_inputs(c, default_tokens(c));
    c.R = max_rows_needed(c, in) + 5;  // a tail that is never written
    auto res = run_ep(c, in);
    check_against_reference(c, in, res);
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Ranks, EpFuzz,
    ::testing::Values(FuzzParam{1, Routing::Uniform}, FuzzParam{1, Routing::Skewed},
                      FuzzParam{2, Routing::Uniform}, FuzzParam{2, Routing::Skewed},
                      FuzzParam{2, Routing::EmptyExpert}, FuzzParam{2, Routing::LastRankNothing},
                      FuzzParam{2, Routing::AllToRankZero}, FuzzParam{4, Routing::Uniform},
                      FuzzParam{4, Routing::Skewed}, FuzzParam{4, Routing::EmptyExpert},
                      FuzzParam{4, Routing::LastRankNothing}, FuzzParam{4, Routing::AllToRankZero},
                      FuzzParam{8, Routing::Uniform}, FuzzParam{8, Routing::Skewed},
                      FuzzParam{8, Routing::LastRankNothing}, FuzzParam{8, Routing::AllToRankZero}),
    [](const auto& info) { return str("W", info.param.W, "_", routing_name(info.param.routing)); });

// A caller group's ranks (`engine`: threads or processes) against the reference and CpuRanks, bit
// for bit, on each (world size, routing).
void expect_caller_group_matches_cpu_ranks(Engine engine,
                                           std::initializer_list<std::pair<int, Routing>> cases) {
  for (const auto& [W, routing] : cases) {
    SCOPED_TRACE(str("W=", W, " ", routing_name(routing)));
    Case c;
    c.W = W;
    c.routing = routing;
    c.L = W == 1 ? 4 : 2;
    c.k = std::min<int64_t>(3, c.L * c.W - 1);
    auto in = make_inputs(c, default_tokens(c));
    c.R = max_rows_needed(c, in) + 5;
    const auto res = run_ep(c, in, engine);
    ASSERT_EQ(res.size(), static_cast<size_t>(W));
    check_against_reference(c, in, res);
    const auto cpu = run_ep(c, in);
    for (int r = 0; r < W; ++r) {
      const RankResult &got = res[static_cast<size_t>(r)], &want = cpu[static_cast<size_t>(r)];
      EXPECT_EQ(got.out, want.out) << "rank " << r;
      EXPECT_EQ(got.grad_tokens, want.grad_tokens) << "rank " << r;
      EXPECT_EQ(got.dispatch_traffic.remote_bytes, want.dispatch_traffic.remote_bytes) << "rank " << r;
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// A caller's group (caller_communicator over regions the caller allocated, its own barrier and
// all_gather; exactly ExpertParallel::symmetric_bytes each; ranks as threads) runs the same
// protocol: every result of every rank bit for bit the dense reference's, as on CpuRanks.
TEST(EpCallerGroup, CallerRegionsRunTheProtocolBitForBitAsCpuRanks) {
  expect_caller_group_matches_cpu_ranks(Engine::Caller, {{1, Routing::Uniform}, {2, Routing::Skewed},
                                                         {4, Routing::EmptyExpert}, {8, Routing::Uniform}});
}

// One process per rank (fork; each maps the shared region at addresses of its own and passes them
// as the peer bases; host collectives over shared memory): the one-process-per-GPU protocol of
// caller_communicator with address spaces that differ.
TEST(EpCallerGroup, RanksAsProcessesRunTheProtocolBitForBitAsCpuRanks) {
  expect_caller_group_matches_cpu_ranks(Engine::Processes, {{2, Routing::Uniform}, {2, Routing::Skewed},
                                                            {4, Routing::EmptyExpert}});
}

// The group's checks name the field; a region one block's alignment short of symmetric_bytes fails the
// allocation that does not fit, on every rank alike (no rank hangs), naming 'bytes'.
TEST(EpCallerGroup, BadGroupsAndASmallRegionAreRefusedNamingTheField) {
  const Context ctx = Context::cpu(1);
  const Tensor region = Tensor::empty({4096}, DType::U8, ctx);
  auto group = [&] {
    return CallerGroup{.rank = 0,
                       .world_size = 1,
                       .context = ctx,
                       .region = region,
                       .peer_bases = {region.data()},
                       .barrier = [] {},
                       .all_gather = [](std::string_view b) {
                         return std::vector<std::string>{std::string(b)};
                       }};
  };
  auto refused = [&](CallerGroup g, const char* field) {
    auto e = caught([&] { (void)caller_communicator(std::move(g)); });
    ASSERT_TRUE(e) << field;
    EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
    EXPECT_THAT(e->what(), HasSubstr(str("'", field, "'")));
  };
  const std::unique_ptr<Communicator> ok = caller_communicator(group());
  ASSERT_NE(ok, nullptr);
  // On the CPU the calls agree on the host (the CPU engine's loops read host metadata); a GPU
  // group agrees in band (tests/test_ep_cuda.cpp).
  EXPECT_EQ(ok->agreement(), Communicator::Agreement::Host);
  EXPECT_EQ(CpuRanks(1).communicator(0).agreement(), Communicator::Agreement::Host);
  CallerGroup g = group();
  g.rank = 1;
  refused(g, "rank");
  g = group();
  g.peer_bases = {region.data(), region.data()};
  refused(g, "peer_bases");
  g = group();
  g.world_size = 2;
  g.peer_bases = {region.data(), static_cast<char*>(region.data()) + 8};  // misaligned peer
  refused(g, "peer_bases");
  g = group();
  g.region = Tensor::empty({4096}, DType::F32, ctx);
  refused(g, "region");
  g = group();
  g.barrier = nullptr;
  refused(g, "barrier");

  Case c;
  c.W = 2;
  auto in = make_inputs(c, default_tokens(c));
  c.R = max_rows_needed(c, in) + 5;
  const size_t need = ExpertParallel::symmetric_bytes(config_of(c, c.R), c.W, Device::cpu());
  std::vector<std::string> errors(2);
  EXPECT_THROW(run_on_caller_group(2, need - kSymmetricAlignment,
                                   [&](Communicator& comm) {
                                     try {
                                       ExpertParallel ep(comm, config_of(c, c.R));
                                     } catch (const Error& e) {
                                       errors[static_cast<size_t>(comm.rank())] = e.what();
                                       throw;
                                     }
                                   }),
               Error);
  for (const std::string& e : errors) {
    EXPECT_THAT(e, AllOf(HasSubstr("'bytes'"), HasSubstr("left of the caller's"))) << e;
  }
}

// The same 8 experts and the same tokens over 1, 2, 4 and 8 ranks (L = 8, 4, 2, 1: powers of
// two): every rank's combine and dispatch_backward output is bit-identical to one rank's.
TEST(EpWorldSizes, CombineIsBitIdenticalOnEveryWorldSizeWhenExpertsPerRankIsAPowerOfTwo) {
  const int64_t E = 8, T_total = 48;
  std::vector<std::vector<uint8_t>> outs, gxs;
  for (int W : {1, 2, 4, 8}) {
    Case c;
    c.W = W;
    c.L = E / W;
    c.k = 4;
    c.Tm = T_total;
    c.seed = 7;
    // One global token set: rank r gets tokens [r·T/W, (r+1)·T/W). Routing from one generator.
    Case one = c;
    one.W = 1;
    one.L = E;
    auto global = make_inputs(one, {T_total});
    std::vector<RankInput> in(static_cast<size_t>(W));
    const int64_t per = T_total / W;
    const size_t es = size_of(c.dtype);
    for (int r = 0; r < W; ++r) {
      RankInput& ri = in[static_cast<size_t>(r)];
      ri.T = per;
      ri.x = Tensor::empty({per, c.H}, c.dtype, host());
      ri.dy = Tensor::empty({per, c.H}, c.dtype, host());
      std::memcpy(ri.x.data(), static_cast<char*>(global[0].x.data()) + r * per * c.H * es,
                  ri.x.nbytes());
      std::memcpy(ri.dy.data(), static_cast<char*>(global[0].dy.data()) + r * per * c.H * es,
                  ri.dy.nbytes());
      ri.idx.assign(global[0].idx.begin() + r * per * c.k,
                    global[0].idx.begin() + (r + 1) * per * c.k);
      ri.w.assign(global[0].w.begin() + r * per * c.k, global[0].w.begin() + (r + 1) * per * c.k);
    }
    c.R = max_rows_needed(c, in);
    auto res = run_ep(c, in);
    check_against_reference(c, in, res);
    std::vector<uint8_t> out, gx;
    for (const auto& rr : res) {
      out.insert(out.end(), rr.out.begin(), rr.out.end());
      gx.insert(gx.end(), rr.grad_tokens.begin(), rr.grad_tokens.end());
    }
    outs.push_back(out);
    gxs.push_back(gx);
  }
  for (size_t i = 1; i < outs.size(); ++i) {
    EXPECT_TRUE(bit_identical(outs[i], outs[0], DType::BF16)) << "combine, world size index " << i;
    EXPECT_TRUE(bit_identical(gxs[i], gxs[0], DType::BF16)) << "dispatch_backward, index " << i;
  }
}

// Bytes: a token crosses to each other rank once, however many of its experts are there.
TEST(EpTraffic, DispatchSendsEachTokenOncePerDestinationRank) {
  Case c;
  c.W = 2;
  c.L = 8;
  c.k = 8;
  c.H = 64;
  c.Tm = 32;
  auto in = make_inputs(c, {32, 32});
  c.R = max_rows_needed(c, in);
  auto res = run_ep(c, in);
  check_against_reference(c, in, res);
  const int64_t row = c.H * 2;
  for (int s = 0; s < 2; ++s) {
    const RankInput& ri = in[static_cast<size_t>(s)];
    int64_t to_other = 0, slots_other = 0;
    for (int64_t t = 0; t < ri.T; ++t) {
      bool any = false;
      for (int64_t j = 0; j < c.k; ++j) {
        const bool other = ri.idx[static_cast<size_t>(t * c.k + j)] / c.L != s;
        slots_other += other;
        any = any || other;
      }
      to_other += any;
    }
    const EpTraffic& tr = res[static_cast<size_t>(s)].dispatch_traffic;
    // Remote: the rows, each row's k entries of metadata (12 bytes each), the counts block.
    EXPECT_EQ(tr.remote_bytes, to_other * (row + c.k * 12) + (c.L + 1) * 8);
    EXPECT_EQ(tr.per_slot_bytes, slots_other * row);
    EXPECT_LT(to_other * row * 3, tr.per_slot_bytes) << "top-8 over 2 ranks: ~4x fewer row bytes";
  }
}

// ---------------------------------------------------------------- zero copy

// combine and dispatch_backward read the EP-owned buffers in place: the only allocations are their
// outputs ([T, H]; and [T, k] f32), nothing of the input's [R, H] size; the buffers are the
// engine's symmetric memory, allocated once by the constructor.
TEST(EpZeroCopy, CombineAndDispatchBackwardReadTheirInputBuffersInPlace) {
  Case c;
  c.W = 2;
  auto in = make_inputs(c, default_tokens(c));
  c.R = max_rows_needed(c, in) + 7;
  CpuRanks ranks(c.W);
  ranks.run([&](Communicator& comm) {
    const RankInput& ri = in[static_cast<size_t>(comm.rank())];
    const Context& ctx = comm.context();
    ctx.allocator().reset_stats();
    ExpertParallel ep(comm, config_of(c, c.R));
    const int64_t es = 2, buffer_bytes = c.R * c.H * es;
    // Both buffers are part of what the constructor allocated (the engine's memory), not later.
    EXPECT_GE(ctx.allocator().stats().bytes, 2 * buffer_bytes);
    EXPECT_EQ(ep.combine_input().shape(), (Shape{c.R, c.H}));
    EXPECT_EQ(ep.dispatch_backward_input().shape(), (Shape{c.R, c.H}));
    EXPECT_FALSE(overlaps(ep.combine_input(), ep.dispatch_backward_input()));
    const HostRouting routing(ri, c.k);
    auto d = ep.dispatch(to_device(ctx, ri.x), routing.idx, routing.w);
    copy(ctx, d.recv, ep.combine_input());  // the "experts": identity, written into the buffer
    ctx.allocator().reset_stats();
    Tensor o = ep.combine(d.handle, ep.combine_input());
    Allocator::Stats st = ctx.allocator().stats();
    EXPECT_EQ(st.count, 1);
    EXPECT_EQ(st.bytes, ri.T * c.H * es);
    EXPECT_LT(st.largest, buffer_bytes);
    // Identity experts: out[t] = the k = 3 copies of x[t] summed in fp32 (3x, exact for a bf16
    // x in any order), rounded once: what combine read is what the buffer held.
    ASSERT_EQ(c.k, 3);
    for (int64_t i = 0; i < ri.T * c.H; ++i) {
      ASSERT_EQ(value_of(o, i), round_to(3.0f * value_of(ri.x, i), c.dtype)) << "element " << i;
    }
    copy(ctx, d.recv, ep.dispatch_backward_input());
    Tensor dw = Tensor::empty({c.R}, DType::F32, ctx);
    fill(ctx, dw, 0.5);
    ctx.allocator().reset_stats();
    auto g = ep.dispatch_backward(d.handle, ep.dispatch_backward_input(), dw);
    st = ctx.allocator().stats();
    EXPECT_EQ(st.count, 2);
    EXPECT_EQ(st.bytes, ri.T * c.H * es + ri.T * c.k * 4);
    EXPECT_EQ(bytes_of(ctx, g.tokens), bytes_of(ctx, o)) << "the same sum of the same rows";
  });
}

// Combine: one entry per (token, other rank holding ≥ 1 of its rows) — the row itself in the dtype
// when that rank holds one, else an fp32 sum — plus a 4-byte flag per slot.
TEST(EpTraffic, CombineReturnsOneEntryPerTokenAndRank) {
  Case c;
  c.W = 4;
  c.L = 2;
  c.k = 4;
  c.H = 32;
  auto in = make_inputs(c, default_tokens(c));
  c.R = max_rows_needed(c, in);
  auto res = run_ep(c, in);
  check_against_reference(c, in, res);
  // Bytes a destination d stores into other ranks' memory.
  for (int d = 0; d < c.W; ++d) {
    int64_t want = 0, want_rows = 0, per_slot = 0;
    for (int s = 0; s < c.W; ++s) {
      const RankInput& ri = in[static_cast<size_t>(s)];
      for (int64_t t = 0; t < ri.T; ++t) {
        int64_t here = 0;
        for (int64_t j = 0; j < c.k; ++j)
          here += ri.idx[static_cast<size_t>(t * c.k + j)] / c.L == d;
        if (s == d || here == 0) continue;
        want += 4 + (here == 1 ? c.H * 2 : c.H * 4);
        want_rows += here == 1 ? c.H * 2 : c.H * 4;
        per_slot += here * c.H * 2;
      }
    }
    EXPECT_EQ(res[static_cast<size_t>(d)].combine_traffic.remote_bytes, want) << "rank " << d;
    EXPECT_LE(want_rows, per_slot) << "never more row bytes than a per-slot bf16 all-to-all";
  }
}

// A rank with no tokens at all, int32 indices, and the same call repeated: bit-identical results
// every time (the threads' timing never shows).
TEST(EpEdges, EmptyRankInt32IndicesAndRepeatability) {
  Case c;
  c.W = 4;
  auto in = make_inputs(c, {c.Tm, 0, 17, c.Tm});
  c.R = max_rows_needed(c, in) + 1;
  auto first = run_ep(c, in);
  check_against_reference(c, in, first);
  for (int rep = 0; rep < 5; ++rep) {
    auto again = run_ep(c, in);
    for (int r = 0; r < c.W; ++r) {
      EXPECT_EQ(again[static_cast<size_t>(r)].out, first[static_cast<size_t>(r)].out)
          << "rep " << rep;
      EXPECT_EQ(again[static_cast<size_t>(r)].grad_tokens,
                first[static_cast<size_t>(r)].grad_tokens);
      EXPECT_EQ(again[static_cast<size_t>(r)].recv, first[static_cast<size_t>(r)].recv);
    }
  }
  // int32 topk_idx routes exactly like int64.
  CpuRanks ranks(c.W);
  std::vector<std::vector<uint8_t>> recv32(static_cast<size_t>(c.W));
  ranks.run([&](Communicator& comm) {
    const RankInput& ri = in[static_cast<size_t>(comm.rank())];
    ExpertParallel ep(comm, config_of(c, c.R));
    std::vector<int32_t> idx(ri.idx.begin(), ri.idx.end());
    std::vector<float> w = ri.w;
    auto d = ep.dispatch(to_device(comm.context(), ri.x),
                         Tensor::wrap(idx.data(), {ri.T, c.k}, DType::I32, Device::cpu()),
                         Tensor::wrap(w.data(), {ri.T, c.k}, DType::F32, Device::cpu()));
    auto b = bytes_of(comm.context(), d.recv);
    recv32[static_cast<size_t>(comm.rank())].assign(b.begin(), b.begin() + d.rows * c.H * 2);
  });
  for (int r = 0; r < c.W; ++r)
    EXPECT_EQ(recv32[static_cast<size_t>(r)], first[static_cast<size_t>(r)].recv);
}

// ---------------------------------------------------------------- caller buffers

// Every EP output may be a caller buffer: written in place (returned aliased), bit-identical to the
// internally allocated result, rows [S, R) of recv, weights and combine_backward's output keep the
// sentinel; a wrong buffer on one rank is refused on every rank and nothing is written.
TEST(EpCallerBuffers, EveryOutputIsWrittenInPlaceAndAWrongOneWritesNothing) {
  Case c;
  c.W = 2;
  c.A = 4;
  auto in = make_inputs(c, default_tokens(c));
  c.R = max_rows_needed(c, in) + 9;
  CpuRanks ranks(c.W);
  std::vector<std::string> msgs(static_cast<size_t>(c.W));
  ranks.run([&](Communicator& comm) {
    const int r = comm.rank();
    const Context& ctx = comm.context();
    const RankInput& ri = in[static_cast<size_t>(r)];
    ExpertParallel ep(comm, config_of(c, c.R));
    const HostRouting routing(ri, c.k);
    const Tensor x = to_device(ctx, ri.x), dy = to_device(ctx, ri.dy);
    const Tensor &idx_t = routing.idx, &w_t = routing.w;
    const auto internal = ep.dispatch(x, idx_t, w_t);
    const Tensor recv = filled(ctx, {c.R, c.H}, c.dtype, kSentinel);
    const Tensor weights = filled(ctx, {c.R}, DType::F32, kSentinel);
    const auto d = ep.dispatch(x, idx_t, w_t, {.recv = recv, .weights = weights});
    EXPECT_EQ(d.recv.data(), recv.data());
    EXPECT_EQ(d.weights.data(), weights.data());
    const size_t es = size_of(c.dtype);
    const auto rb = bytes_of(ctx, recv), wb = bytes_of(ctx, weights);
    const auto ib = bytes_of(ctx, internal.recv), iw = bytes_of(ctx, internal.weights);
    const auto S = static_cast<size_t>(d.rows);
    EXPECT_TRUE(bit_identical({rb.begin(), rb.begin() + S * c.H * es},
                              {ib.begin(), ib.begin() + S * c.H * es}, c.dtype));
    EXPECT_TRUE(bit_identical({wb.begin(), wb.begin() + S * 4}, {iw.begin(), iw.begin() + S * 4},
                              DType::F32));
    EXPECT_TRUE(rows_hold_sentinel(rb, d.rows, c.R, c.H, c.dtype));
    EXPECT_TRUE(rows_hold_sentinel(wb, d.rows, c.R, 1, DType::F32));
    copy(ctx, d.recv, ep.combine_input());
    const Tensor out = filled(ctx, {ri.T, c.H}, c.dtype, kSentinel);
    EXPECT_EQ(ep.combine(d.handle, ep.combine_input(), out).data(), out.data());
    EXPECT_EQ(bytes_of(ctx, out), bytes_of(ctx, ep.combine(d.handle, ep.combine_input())));
    const Tensor dY = filled(ctx, {c.R, c.H}, c.dtype, kSentinel);
    EXPECT_EQ(ep.combine_backward(d.handle, dy, dY).data(), dY.data());
    const auto db = bytes_of(ctx, dY), dbi = bytes_of(ctx, ep.combine_backward(d.handle, dy));
    EXPECT_TRUE(bit_identical({db.begin(), db.begin() + S * c.H * es},
                              {dbi.begin(), dbi.begin() + S * c.H * es}, c.dtype));
    EXPECT_TRUE(rows_hold_sentinel(db, d.rows, c.R, c.H, c.dtype));
    copy(ctx, dY, ep.dispatch_backward_input());
    const Tensor gx = filled(ctx, {ri.T, c.H}, c.dtype, kSentinel);
    const Tensor gw = filled(ctx, {ri.T, c.k}, DType::F32, kSentinel);
    const auto g = ep.dispatch_backward(d.handle, ep.dispatch_backward_input(), d.weights,
                                        {.tokens = gx, .topk_weights = gw});
    EXPECT_EQ(g.tokens.data(), gx.data());
    EXPECT_EQ(g.topk_weights.data(), gw.data());
    const auto gi = ep.dispatch_backward(d.handle, ep.dispatch_backward_input(), d.weights);
    EXPECT_EQ(bytes_of(ctx, gx), bytes_of(ctx, gi.tokens));
    EXPECT_EQ(bytes_of(ctx, gw), bytes_of(ctx, gi.topk_weights));
    // A wrong buffer on rank 1: refused on both ranks, nothing written into either's buffer.
    const Tensor bad = filled(ctx, {r == 1 ? ri.T + 1 : ri.T, c.H}, c.dtype, kSentinel);
    const auto before = bytes_of(ctx, bad);
    auto e = caught([&] { ep.combine(d.handle, ep.combine_input(), bad); });
    msgs[static_cast<size_t>(r)] = e ? e->what() : "no error";
    EXPECT_EQ(bytes_of(ctx, bad), before) << "rank " << r;
    // Overlap with the call's input is refused too.
    auto o =
        caught([&] { ep.combine(d.handle, ep.combine_input(), ep.combine_input().rows(0, ri.T)); });
    EXPECT_TRUE(o && std::string(o->what()).find("overlaps no input") != std::string::npos)
        << (o ? o->what() : "no error");
  });
  EXPECT_THAT(msgs[1], HasSubstr(str("invalid argument 'output': expected shape [", in[1].T, ", ",
                                     c.H, "], got [", in[1].T + 1, ", ", c.H, "]")));
  EXPECT_THAT(msgs[0], HasSubstr("combine: rank 1 refused its arguments, nothing was sent"));
}

// ---------------------------------------------------------------- capacity

TEST(EpCapacity, OverflowIsAnErrorOnEveryRankNamingRankNeededAndCapacity) {
  Case c;
  c.W = 4;
  c.routing = Routing::AllToRankZero;
  c.k = 2;
  auto in = make_inputs(c, default_tokens(c));
  const int64_t needed = rows_needed(c, in, 0);
  CpuRanks ranks(c.W);
  std::vector<std::string> messages(static_cast<size_t>(c.W));
  std::vector<int64_t> allocations(static_cast<size_t>(c.W), -1);
  ranks.run([&](Communicator& comm) {
    const RankInput& ri = in[static_cast<size_t>(comm.rank())];
    ExpertParallel ep(comm, config_of(c, needed - 1));
    const HostRouting routing(ri, c.k);
    Tensor x = to_device(comm.context(), ri.x);
    comm.context().allocator().reset_stats();
    auto e = caught([&] { ep.dispatch(x, routing.idx, routing.w); });
    allocations[static_cast<size_t>(comm.rank())] = comm.context().allocator().stats().count;
    if (e) {
      EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
      messages[static_cast<size_t>(comm.rank())] = e->what();
    }
  });
  for (int r = 0; r < c.W; ++r) {
    EXPECT_THAT(
        messages[static_cast<size_t>(r)],
        HasSubstr(str("receive capacity exceeded on rank 0: needs ", needed,
                      " rows (each expert's rows padded to a multiple of 1), receive_capacity is ",
                      needed - 1)));
    EXPECT_EQ(allocations[static_cast<size_t>(r)], 0) << "rank " << r << " allocated an output";
  }
}

TEST(EpCapacity, DropPolicyKeepsExpertMajorPrefixAndCountsTheRest) {
  for (int64_t A : {1, 4}) {
    Case c;
    c.W = 2;
    c.A = A;
    c.routing = Routing::Skewed;
    c.overflow = OverflowPolicy::Drop;
    auto in = make_inputs(c, default_tokens(c));
    c.R = max_rows_needed(c, in) / 2 + 1;
    auto res = run_ep(c, in);
    check_against_reference(c, in, res);
    int64_t dropped = 0;
    for (const auto& r : res) dropped += r.dropped;
    EXPECT_GT(dropped, 0) << "the case must drop something";
  }
}

// ---------------------------------------------------------------- malformed arguments

// Runs one dispatch on every rank with rank `bad`'s topk_idx replaced; returns each rank's error.
std::vector<std::string> dispatch_errors(const Case& c, std::vector<RankInput> in, int bad,
                                         const std::function<void(std::vector<int64_t>&)>& spoil,
                                         std::vector<int64_t>* allocations,
                                         std::vector<bool>* combine_input_intact) {
  spoil(in[static_cast<size_t>(bad)].idx);
  CpuRanks ranks(c.W);
  std::vector<std::string> msgs(static_cast<size_t>(c.W));
  allocations->assign(static_cast<size_t>(c.W), -1);
  combine_input_intact->assign(static_cast<size_t>(c.W), false);
  std::mutex m;
  ranks.run([&](Communicator& comm) {
    const RankInput& ri = in[static_cast<size_t>(comm.rank())];
    ExpertParallel ep(comm, config_of(c, 1000));
    fill(comm.context(), ep.combine_input(), kSentinel);
    const auto before = bytes_of(comm.context(), ep.combine_input());
    const HostRouting routing(ri, c.k);
    Tensor x = to_device(comm.context(), ri.x);
    comm.context().allocator().reset_stats();
    auto e = caught([&] { ep.dispatch(x, routing.idx, routing.w); });
    std::lock_guard lock(m);
    (*allocations)[static_cast<size_t>(comm.rank())] = comm.context().allocator().stats().count;
    (*combine_input_intact)[static_cast<size_t>(comm.rank())] =
        bytes_of(comm.context(), ep.combine_input()) == before;
    if (e) msgs[static_cast<size_t>(comm.rank())] = e->what();
  });
  return msgs;
}

TEST(EpMalformed, OutOfRangeExpertIsRefusedOnEveryRankBeforeAnythingIsSent) {
  Case c;
  c.W = 4;
  auto in = make_inputs(c, default_tokens(c));
  for (int64_t bad_value : {c.E(), int64_t{-1}, int64_t{1} << 40}) {
    std::vector<int64_t> allocs;
    std::vector<bool> intact;
    auto msgs = dispatch_errors(
        c, in, 2, [&](std::vector<int64_t>& idx) { idx[5 * c.k + 1] = bad_value; }, &allocs,
        &intact);
    EXPECT_THAT(msgs[2],
                HasSubstr(str("invalid argument 'topk_idx[5, 1]': expected an expert in [0, ",
                              c.E(), "), got ", bad_value)));
    for (int r : {0, 1, 3}) {
      EXPECT_THAT(msgs[static_cast<size_t>(r)],
                  HasSubstr("dispatch: rank 2 refused its arguments, nothing was sent"));
      EXPECT_THAT(msgs[static_cast<size_t>(r)], HasSubstr("topk_idx[5, 1]"));
    }
    for (int r = 0; r < c.W; ++r) {
      EXPECT_EQ(allocs[static_cast<size_t>(r)], 0) << "rank " << r;
      EXPECT_TRUE(intact[static_cast<size_t>(r)]) << "rank " << r;
    }
  }
}

TEST(EpMalformed, DuplicateExpertOfOneTokenIsRefused) {
  Case c;
  c.W = 2;
  auto in = make_inputs(c, default_tokens(c));
  std::vector<int64_t> allocs;
  std::vector<bool> intact;
  auto msgs = dispatch_errors(
      c, in, 1, [&](std::vector<int64_t>& idx) { idx[7 * c.k + 2] = idx[7 * c.k]; }, &allocs,
      &intact);
  EXPECT_THAT(
      msgs[1],
      HasSubstr(
          str("invalid argument 'topk_idx[7]': expected k distinct experts per token, got expert ",
              in[1].idx[7 * c.k], " in columns 0 and 2")));
  EXPECT_THAT(msgs[0], HasSubstr("rank 1 refused its arguments"));
  EXPECT_EQ(allocs, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(intact, (std::vector<bool>{true, true}));
}

TEST(EpMalformed, ShapeAndDtypeMismatchesNameTheArgument) {
  CpuRanks ranks(1);
  ranks.run([&](Communicator& comm) {
    const Context& ctx = comm.context();
    ExpertParallel ep(comm, {.experts_per_rank = 4,
                             .hidden = 8,
                             .dtype = DType::BF16,
                             .topk = 2,
                             .max_tokens = 16,
                             .receive_capacity = 64});
    Tensor x = random_normal({6, 8}, DType::BF16, 1);
    std::vector<int64_t> idx(12);
    for (int t = 0; t < 6; ++t) {
      idx[static_cast<size_t>(2 * t)] = t % 4;
      idx[static_cast<size_t>(2 * t + 1)] = (t + 1) % 4;
    }
    std::vector<float> w(12, 0.5f);
    Tensor idx_t = Tensor::wrap(idx.data(), {6, 2}, DType::I64, Device::cpu());
    Tensor w_t = Tensor::wrap(w.data(), {6, 2}, DType::F32, Device::cpu());
    auto msg = [](auto f) {
      auto e = caught(f);
      return e ? std::string(e->what()) : std::string("no error");
    };
    EXPECT_THAT(msg([&] {
                  ep.dispatch(random_normal({6, 9}, DType::BF16, 1), idx_t, w_t);
                }),
                HasSubstr("invalid argument 'tokens': expected shape [*, 8], got [6, 9]"));
    EXPECT_THAT(msg([&] {
                  ep.dispatch(random_normal({6, 8}, DType::F32, 1), idx_t, w_t);
                }),
                HasSubstr("invalid argument 'tokens': expected dtype bf16, got f32"));
    EXPECT_THAT(
        msg([&] {
          ep.dispatch(random_normal({17, 8}, DType::BF16, 1), idx_t, w_t);
        }),
        HasSubstr("invalid argument 'tokens': expected at most max_tokens = 16 rows, got [17, 8]"));
    EXPECT_THAT(msg([&] {
                  ep.dispatch(x, Tensor::wrap(idx.data(), {6, 1}, DType::I64, Device::cpu()), w_t);
                }),
                HasSubstr("invalid argument 'topk_idx': expected shape [6, 2], got [6, 1]"));
    EXPECT_THAT(msg([&] {
                  ep.dispatch(x, idx_t, Tensor::wrap(w.data(), {6, 2}, DType::BF16, Device::cpu()));
                }),
                HasSubstr("invalid argument 'topk_weights': expected dtype f32, got bf16"));
    auto d = ep.dispatch(x, idx_t, w_t);
    EXPECT_THAT(msg([&] {
                  ep.combine(d.handle, random_normal({63, 8}, DType::BF16, 1));
                }),
                HasSubstr("invalid argument 'expert_out': expected shape [64, 8], got [63, 8]"));
    EXPECT_THAT(msg([&] { ep.combine({}, ep.combine_input()); }),
                HasSubstr("invalid argument 'handle': expected the handle of a dispatch"));
    EXPECT_THAT(msg([&] {
                  ep.combine_backward(d.handle, random_normal({5, 8}, DType::BF16, 1));
                }),
                HasSubstr("invalid argument 'grad_output': expected shape [6, 8], got [5, 8]"));
    EXPECT_THAT(msg([&] {
                  ep.dispatch_backward(d.handle, ep.dispatch_backward_input(),
                                       Tensor::empty({64}, DType::BF16, ctx));
                }),
                HasSubstr("invalid argument 'grad_weights': expected dtype f32, got bf16"));
    ExpertParallel other(comm, ep.config());
    EXPECT_THAT(msg([&] { other.combine(d.handle, other.combine_input()); }),
                HasSubstr("expected a handle of this ExpertParallel's dispatch"));
  });
}

TEST(EpConfig, InconsistentConfigIsRefusedOnEveryRank) {
  CpuRanks ranks(2);
  std::vector<std::string> msgs(2);
  ranks.run([&](Communicator& comm) {
    auto e = caught([&] {
      ExpertParallel ep(comm, {.experts_per_rank = 2,
                               .hidden = 8,
                               .topk = comm.rank() == 1 ? 5 : 2,
                               .max_tokens = 4,
                               .receive_capacity = 8});
    });
    msgs[static_cast<size_t>(comm.rank())] = e ? e->what() : "no error";
  });
  EXPECT_THAT(msgs[1], HasSubstr("invalid argument 'topk': expected at most E = 4 experts, got 5"));
  EXPECT_THAT(msgs[0], HasSubstr("rank 1 refused its config"));
}

// A rank that throws outside the library aborts the group: the others fail, they do not hang.
TEST(EpRanks, AFailingRankAbortsTheGroupInsteadOfHangingIt) {
  CpuRanks ranks(3);
  std::vector<std::string> msgs(3);
  auto e = caught([&] {
    ranks.run([&](Communicator& comm) {
      if (comm.rank() == 1) throw_error(ErrorKind::Runtime, "rank 1 gave up");
      auto err = caught([&] { comm.barrier(); });
      msgs[static_cast<size_t>(comm.rank())] = err ? err->what() : "no error";
    });
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("rank 1 gave up"));
  EXPECT_THAT(msgs[0], HasSubstr("the CPU ranks group was aborted: rank 1 failed"));
  EXPECT_THAT(msgs[2], HasSubstr("the CPU ranks group was aborted: rank 1 failed"));
}

}  // namespace
}  // namespace moekit::test
