// moekit_bench — the PERFORMANCE.md grouped-GEMM shape suite through moekit's public API.
//
// How to run (GPU machine):
//   moekit_bench [--shapes a,b] [--routing uniform,skewed] [--passes fprop,dgrad,wgrad]
//                [--iters 20] [--warmup 5] [--seed 1234] [--json out.json] [--commit id]
//                [--backend NAME]
// --backend forces a backend of the primitive tables ("cublas", "sm90", ...; default: automatic,
// i.e. the first that accepts) and is recorded with the numbers.
// For every shape × routing × pass: random normal bf16 inputs (never zeros), the output poisoned
// with NaN, warm-up, then `iters` runs each timed with CUDA events on the context's stream; the
// median (and min) are reported. Correctness is checked in the same run: no non-finite element
// left in the output rows [0, S) and sampled elements against fp64 host dot products of the same
// stored bf16 inputs (tolerance: the tests' rule, eps(bf16)·|ref| + eps(f32)·L·Σ|term|).
// Routing: uniform (T/E rows each) or skewed (Dirichlet(1) split of T, seeded; some experts get
// few or no rows). The JSON (--json) holds the splits of every configuration so bench/peers.py
// times torch on exactly the same problems.
//
// Passes (W [E, N, K] bf16, x [T, K], dy [T, N]; FLOPs = 2·S·N·K each):
//   fprop  y  = x_g · W_gᵀ     grouped_gemm_group_m(..., BOp::Transposed, ...)
//   dgrad  dx = dy_g · W_g     grouped_gemm_group_m(..., BOp::Plain, ...)
//   wgrad  dW_g = dy_gᵀ · x_g  grouped_gemm_group_k(..., accumulate = false), bf16 out
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "moekit/moekit.h"

#ifndef MOEKIT_GIT_COMMIT
#define MOEKIT_GIT_COMMIT "unknown"
#endif

namespace {

using moekit::BOp;
using moekit::Context;
using moekit::DType;
using moekit::Splits;
using moekit::Tensor;

#define CK(call)                                                                               \
  do {                                                                                         \
    cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s failed: %s (%s) at %s:%d\n", #call, cudaGetErrorName(e_),       \
                   cudaGetErrorString(e_), __FILE__, __LINE__);                                \
      std::exit(2);                                                                            \
    }                                                                                          \
  } while (0)

struct Shape {
  const char* name;
  int64_t E, T, K, N;
  const char* model;
};
// PERFORMANCE.md "Shape suite".
const Shape kSuite[] = {
    {"dsv3_fc1_E8", 8, 32768, 7168, 4096, "DeepSeek-V3 gate+up, EP=32"},
    {"dsv3_fc2_E8", 8, 32768, 2048, 7168, "DeepSeek-V3 down"},
    {"dsv3_fc1_E32", 32, 32768, 7168, 4096, "DeepSeek-V3, EP=8"},
    {"qwen3_fc1_E16", 16, 16384, 4096, 3072, "Qwen3-235B-A22B gate+up"},
    {"qwen3_fc2_E16", 16, 16384, 1536, 4096, "Qwen3 down"},
    {"mixtral_fc1_E8", 8, 16384, 4096, 28672, "Mixtral 8x7B gate+up"},
    {"small_E64", 64, 4096, 2048, 1024, "many small experts (decode-like)"},
};

// ---------------------------------------------------------------- device helpers

__device__ __forceinline__ uint64_t mix64(uint64_t z) {  // splitmix64 finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Independent normal(0, 1) draws (Box–Muller over a counter hash), rounded to bf16.
__global__ void randn_bf16(__nv_bfloat16* p, size_t n, uint64_t seed) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + i);
    const float u1 = (static_cast<float>(h >> 40) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
    const float u2 = static_cast<float>(h & 0xffffffu) * (1.0f / 16777216.0f);
    p[i] = __float2bfloat16_rn(sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
  }
}

__global__ void count_nonfinite_bf16(const __nv_bfloat16* p, size_t n, unsigned long long* count) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  unsigned long long local = 0;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (!isfinite(__bfloat162float(p[i]))) ++local;
  }
  if (local) atomicAdd(count, local);
}

void fill_randn(const Context& ctx, const Tensor& t, uint64_t seed) {
  randn_bf16<<<1024, 256, 0, static_cast<cudaStream_t>(ctx.stream())>>>(
      t.data_as<__nv_bfloat16>(), static_cast<size_t>(t.numel()), seed);
  CK(cudaGetLastError());
}

unsigned long long nonfinite(const Context& ctx, const void* p, size_t n) {
  auto stream = static_cast<cudaStream_t>(ctx.stream());
  Tensor counter = Tensor::empty({1}, DType::I64, ctx);
  CK(cudaMemsetAsync(counter.data(), 0, 8, stream));
  if (n) {
    count_nonfinite_bf16<<<1024, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(p), n,
                                                   counter.data_as<unsigned long long>());
    CK(cudaGetLastError());
  }
  unsigned long long host = 0;
  CK(cudaMemcpyAsync(&host, counter.data(), 8, cudaMemcpyDeviceToHost, stream));
  CK(cudaStreamSynchronize(stream));
  return host;
}

__global__ void gather_strided_bf16(const __nv_bfloat16* src, int64_t stride, int64_t count,
                                    __nv_bfloat16* dst) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = src[i * stride];
  }
}

// Copies `count` bf16 elements spaced `stride` elements apart, starting at element `first` of
// `base`, to the host as doubles (a row: stride 1; a column: stride = row length, gathered on
// the device first). Synchronous (legacy default stream); callers synchronise their stream first.
std::vector<double> fetch(const void* base, int64_t first, int64_t count, int64_t stride) {
  static __nv_bfloat16* scratch = nullptr;  // column gathers (at most T elements); process lifetime
  static int64_t scratch_count = 0;
  std::vector<__nv_bfloat16> raw(static_cast<size_t>(count));
  const auto* src = static_cast<const __nv_bfloat16*>(base) + first;
  if (stride != 1) {
    if (scratch_count < count) {
      if (scratch) CK(cudaFree(scratch));
      CK(cudaMalloc(&scratch, static_cast<size_t>(count) * 2));
      scratch_count = count;
    }
    gather_strided_bf16<<<64, 256>>>(src, stride, count, scratch);
    CK(cudaGetLastError());
    src = scratch;
  }
  CK(cudaMemcpy(raw.data(), src, raw.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<double> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) out[i] = static_cast<double>(__bfloat162float(raw[i]));
  return out;
}

double fetch_one(const void* base, int64_t index) { return fetch(base, index, 1, 1)[0]; }

// ---------------------------------------------------------------- routing

std::vector<int64_t> uniform_counts(int64_t E, int64_t T) {
  std::vector<int64_t> c(static_cast<size_t>(E), T / E);
  for (int64_t g = 0; g < T % E; ++g) ++c[static_cast<size_t>(g)];
  return c;
}

// Dirichlet(1) proportions (normalised unit exponentials), rounded by largest remainder so that
// the counts sum to T exactly.
std::vector<int64_t> dirichlet_counts(int64_t E, int64_t T, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> ex(1.0);
  std::vector<double> w(static_cast<size_t>(E));
  double sum = 0;
  for (auto& x : w) sum += (x = ex(rng));
  std::vector<int64_t> c(w.size());
  std::vector<std::pair<double, size_t>> rem;
  int64_t assigned = 0;
  for (size_t g = 0; g < w.size(); ++g) {
    const double exact = w[g] / sum * static_cast<double>(T);
    c[g] = static_cast<int64_t>(std::floor(exact));
    assigned += c[g];
    rem.push_back({exact - std::floor(exact), g});
  }
  std::sort(rem.begin(), rem.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (size_t i = 0; assigned < T; ++i, ++assigned) ++c[rem[i % rem.size()].second];
  return c;
}

// ---------------------------------------------------------------- results

struct Check {
  int samples = 0;
  double worst = 0;  // max |got - ref| / tol over the samples
  unsigned long long nonfinite = 0;
  bool pass() const { return samples > 0 && worst <= 1.0 && nonfinite == 0; }
};

struct Result {
  const Shape* shape;
  std::string routing, pass;
  std::vector<int64_t> counts;
  double median_ms = 0, min_ms = 0, tflops = 0;
  Check check;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) o += c;
  }
  return o;
}

std::string shell_line(const char* cmd) {
  std::string out;
  if (FILE* f = popen(cmd, "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, f)) out += buf;
    pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// ---------------------------------------------------------------- the runner

struct Options {
  std::vector<std::string> shapes, routings{"uniform", "skewed"}, passes{"fprop", "dgrad", "wgrad"};
  int iters = 20, warmup = 5, samples = 96;
  uint64_t seed = 1234;
  std::string json, commit, backend;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

bool wanted(const std::vector<std::string>& list, const std::string& x) {
  return list.empty() || std::find(list.begin(), list.end(), x) != list.end();
}

// Sampled fp64 check of one pass. Tolerance per element: eps(bf16)·|ref| + eps(f32)·L·Σ|term|.
Check check_pass(const Context& ctx, const std::string& pass, const Shape& s,
                 const std::vector<int64_t>& counts, const Tensor& x, const Tensor& w,
                 const Tensor& dy, const Tensor& out, int samples, uint64_t seed) {
  Check c;
  const int64_t K = s.K, N = s.N;
  const std::vector<int64_t> off = moekit::offsets_of(counts);
  const int64_t S = off.back();
  c.nonfinite = nonfinite(ctx, out.data(), static_cast<size_t>(pass == "wgrad" ? s.E * N * K : S * (pass == "fprop" ? N : K)));
  std::vector<int64_t> groups;
  for (int64_t g = 0; g < s.E; ++g) {
    if (counts[static_cast<size_t>(g)] > 0) groups.push_back(g);
  }
  std::mt19937_64 rng(seed);
  const double eps_out = 1.0 / 128, eps_acc = 1.0 / 8388608;
  for (int i = 0; i < samples; ++i) {
    const int64_t g = groups[static_cast<size_t>(i) % groups.size()];
    const int64_t m = counts[static_cast<size_t>(g)];
    // The first and last row of each group come first, then random rows.
    const size_t round = static_cast<size_t>(i) / groups.size();
    const int64_t r = off[static_cast<size_t>(g)] +
                      (round == 0 ? 0 : round == 1 ? m - 1 : static_cast<int64_t>(rng() % static_cast<uint64_t>(m)));
    std::vector<double> u, v;
    double got;
    if (pass == "fprop") {  // y[r, n] = Σ_k x[r, k] · W[g, n, k]
      const int64_t n = static_cast<int64_t>(rng() % static_cast<uint64_t>(N));
      u = fetch(x.data(), r * K, K, 1);
      v = fetch(w.data(), (g * N + n) * K, K, 1);
      got = fetch_one(out.data(), r * N + n);
    } else if (pass == "dgrad") {  // dx[r, k] = Σ_n dy[r, n] · W[g, n, k]
      const int64_t k = static_cast<int64_t>(rng() % static_cast<uint64_t>(K));
      u = fetch(dy.data(), r * N, N, 1);
      v = fetch(w.data(), g * N * K + k, N, K);
      got = fetch_one(out.data(), r * K + k);
    } else {  // dW[g, n, k] = Σ_{r in g} dy[r, n] · x[r, k]
      const int64_t n = static_cast<int64_t>(rng() % static_cast<uint64_t>(N));
      const int64_t k = static_cast<int64_t>(rng() % static_cast<uint64_t>(K));
      u = fetch(dy.data(), off[static_cast<size_t>(g)] * N + n, m, N);
      v = fetch(x.data(), off[static_cast<size_t>(g)] * K + k, m, K);
      got = fetch_one(out.data(), (g * N + n) * K + k);
    }
    double ref = 0, mag = 0;
    for (size_t j = 0; j < u.size(); ++j) {
      ref += u[j] * v[j];
      mag += std::abs(u[j] * v[j]);
    }
    const double tol = eps_out * std::abs(ref) + eps_acc * static_cast<double>(u.size()) * mag;
    const double err = std::abs(got - ref);
    c.worst = std::max(c.worst, std::isfinite(got) ? err / tol : INFINITY);
    ++c.samples;
  }
  return c;
}

int run(const Options& o) {
  if (Context::cuda_device_count() == 0) {
    std::fprintf(stderr, "moekit_bench: no CUDA device\n");
    return 2;
  }
  const Context ctx = o.backend.empty() ? Context::cuda(0) : Context::cuda(0).with_backend(o.backend);
  const std::string backend = o.backend.empty() ? "auto" : o.backend;
  auto stream = static_cast<cudaStream_t>(ctx.stream());
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const std::string smi_query =
      "nvidia-smi --query-gpu=clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu,"
      "driver_version --format=csv,noheader 2>/dev/null | head -1";
  const std::string clocks_before = shell_line(smi_query.c_str());

  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::string commit = o.commit;
  if (commit.empty() && std::getenv("MOEKIT_COMMIT")) commit = std::getenv("MOEKIT_COMMIT");
  if (commit.empty()) commit = MOEKIT_GIT_COMMIT;

  std::printf("moekit_bench  %s  commit %s  backend %s  GPU %s (%d SMs)  clocks [sm, mem, max sm, "
              "power, temp, driver]: %s\n",
              date, commit.c_str(), backend.c_str(), prop.name, prop.multiProcessorCount,
              clocks_before.c_str());
  std::printf("warm-up %d, median of %d runs (CUDA events), bf16 in/out, fp32 accumulation\n\n",
              o.warmup, o.iters);
  std::printf("%-15s %-8s %-6s %4s %6s %6s %6s %9s %9s %8s  %s\n", "shape", "routing", "pass",
              "E", "T", "K", "N", "ms", "TFLOP/s", "min/max", "check (worst err/tol)");

  std::vector<Result> results;
  cudaEvent_t start, stop;
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));
  bool all_pass = true;
  uint64_t data_seed = o.seed;
  for (size_t si = 0; si < std::size(kSuite); ++si) {
    const Shape& s = kSuite[si];
    if (!wanted(o.shapes, s.name)) continue;
    Tensor x = Tensor::empty({s.T, s.K}, DType::BF16, ctx);
    Tensor w = Tensor::empty({s.E, s.N, s.K}, DType::BF16, ctx);
    Tensor dy = Tensor::empty({s.T, s.N}, DType::BF16, ctx);
    Tensor y = Tensor::empty({s.T, s.N}, DType::BF16, ctx);
    Tensor dx = Tensor::empty({s.T, s.K}, DType::BF16, ctx);
    Tensor dw = Tensor::empty({s.E, s.N, s.K}, DType::BF16, ctx);
    fill_randn(ctx, x, ++data_seed);
    fill_randn(ctx, w, ++data_seed);
    fill_randn(ctx, dy, ++data_seed);
    for (const std::string routing : {"uniform", "skewed"}) {
      if (!wanted(o.routings, routing)) continue;
      const std::vector<int64_t> counts =
          routing == "uniform" ? uniform_counts(s.E, s.T)
                               : dirichlet_counts(s.E, s.T, o.seed * 1000003 + si);
      const Splits splits = Splits::host(counts);
      int64_t S = 0;
      for (int64_t c : counts) S += c;
      for (const std::string pass : {"fprop", "dgrad", "wgrad"}) {
        if (!wanted(o.passes, pass)) continue;
        const Tensor& out = pass == "fprop" ? y : pass == "dgrad" ? dx : dw;
        auto step = [&] {
          if (pass == "fprop") {
            moekit::grouped_gemm_group_m(ctx, x, w, BOp::Transposed, splits, y);
          } else if (pass == "dgrad") {
            moekit::grouped_gemm_group_m(ctx, dy, w, BOp::Plain, splits, dx);
          } else {
            moekit::grouped_gemm_group_k(ctx, dy, x, splits, dw, false);
          }
        };
        CK(cudaMemsetAsync(out.data(), 0xff, out.nbytes(), stream));  // NaN poison
        for (int i = 0; i < o.warmup; ++i) step();
        std::vector<double> ms;
        for (int i = 0; i < o.iters; ++i) {
          CK(cudaEventRecord(start, stream));
          step();
          CK(cudaEventRecord(stop, stream));
          CK(cudaEventSynchronize(stop));
          float t = 0;
          CK(cudaEventElapsedTime(&t, start, stop));
          ms.push_back(t);
        }
        Result r{&s, routing, pass, counts};
        r.median_ms = median(ms);
        r.min_ms = *std::min_element(ms.begin(), ms.end());
        const double flops = 2.0 * static_cast<double>(S) * static_cast<double>(s.N) * static_cast<double>(s.K);
        r.tflops = flops / (r.median_ms * 1e-3) / 1e12;
        CK(cudaStreamSynchronize(stream));
        r.check = check_pass(ctx, pass, s, counts, x, w, dy, out, o.samples, o.seed + si * 7 + pass.size());
        all_pass = all_pass && r.check.pass();
        const double spread = *std::max_element(ms.begin(), ms.end()) / r.min_ms;
        std::printf("%-15s %-8s %-6s %4lld %6lld %6lld %6lld %9.3f %9.1f %8.3f  %s (%.3f, %d samples%s)\n",
                    s.name, routing.c_str(), pass.c_str(), static_cast<long long>(s.E),
                    static_cast<long long>(s.T), static_cast<long long>(s.K),
                    static_cast<long long>(s.N), r.median_ms, r.tflops, spread,
                    r.check.pass() ? "PASS" : "FAIL", r.check.worst, r.check.samples,
                    r.check.nonfinite ? ", NON-FINITE OUTPUT" : "");
        std::fflush(stdout);
        results.push_back(std::move(r));
      }
    }
  }
  const std::string clocks_after = shell_line(smi_query.c_str());
  std::printf("\nclocks after: %s\n%s\n", clocks_after.c_str(),
              all_pass ? "all correctness checks PASS" : "SOME CORRECTNESS CHECKS FAILED");

  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << "{\n  \"tool\": \"moekit_bench\",\n  \"date\": \"" << date << "\",\n  \"commit\": \""
      << json_escape(commit) << "\",\n  \"backend\": \"" << json_escape(backend)
      << "\",\n  \"gpu\": \"" << json_escape(prop.name)
      << "\",\n  \"sm_count\": " << prop.multiProcessorCount << ",\n  \"clocks_before\": \""
      << json_escape(clocks_before) << "\",\n  \"clocks_after\": \"" << json_escape(clocks_after)
      << "\",\n  \"dtype\": \"bf16\",\n  \"iters\": " << o.iters << ",\n  \"warmup\": " << o.warmup
      << ",\n  \"seed\": " << o.seed << ",\n  \"results\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      f << "    {\"shape\": \"" << r.shape->name << "\", \"E\": " << r.shape->E << ", \"T\": "
        << r.shape->T << ", \"K\": " << r.shape->K << ", \"N\": " << r.shape->N
        << ", \"routing\": \"" << r.routing << "\", \"pass\": \"" << r.pass
        << "\", \"median_ms\": " << r.median_ms << ", \"min_ms\": " << r.min_ms
        << ", \"tflops\": " << r.tflops << ", \"check\": {\"pass\": "
        << (r.check.pass() ? "true" : "false") << ", \"samples\": " << r.check.samples
        << ", \"worst_err_over_tol\": " << r.check.worst << ", \"nonfinite\": " << r.check.nonfinite
        << "}, \"counts\": [";
      for (size_t g = 0; g < r.counts.size(); ++g) f << (g ? ", " : "") << r.counts[g];
      f << "]}" << (i + 1 < results.size() ? "," : "") << "\n";
    }
    f << "  ]\n}\n";
    std::printf("wrote %s\n", o.json.c_str());
  }
  CK(cudaEventDestroy(start));
  CK(cudaEventDestroy(stop));
  return all_pass ? 0 : 1;
}

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "%s\nusage: moekit_bench [--shapes a,b] [--routing uniform,skewed] "
               "[--passes fprop,dgrad,wgrad] [--iters N] [--warmup N] [--samples N] [--seed S] "
               "[--json FILE] [--commit ID] [--backend NAME]\nshapes:",
               msg);
  for (const Shape& s : kSuite) std::fprintf(stderr, " %s", s.name);
  std::fprintf(stderr, "\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "--shapes") o.shapes = split_list(value());
    else if (a == "--routing") o.routings = split_list(value());
    else if (a == "--passes") o.passes = split_list(value());
    else if (a == "--iters") o.iters = std::max(1, std::atoi(value().c_str()));
    else if (a == "--warmup") o.warmup = std::max(0, std::atoi(value().c_str()));
    else if (a == "--samples") o.samples = std::max(1, std::atoi(value().c_str()));
    else if (a == "--seed") o.seed = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--json") o.json = value();
    else if (a == "--commit") o.commit = value();
    else if (a == "--backend") o.backend = value();
    else if (a == "-h" || a == "--help") usage("moekit_bench: the PERFORMANCE.md grouped-GEMM suite");
    else usage(("unknown argument " + a).c_str());
  }
  for (const std::string& s : o.shapes) {
    if (std::none_of(std::begin(kSuite), std::end(kSuite), [&](const Shape& k) { return s == k.name; })) {
      usage(("unknown shape " + s).c_str());
    }
  }
  try {
    return run(o);
  } catch (const moekit::Error& e) {
    std::fprintf(stderr, "moekit_bench: %s\n", e.what());
    return 2;
  }
}
