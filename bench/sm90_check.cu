// sm90_check — correctness and speed of the sm90 group-M grouped GEMM (src/cuda/sm90/), standalone.
//
// Drives the raw-pointer interface (grouped_gemm_sm90.h) directly, with the counts in device
// memory, so it needs neither libmoekit nor OpenBLAS on the GPU machine. Build (CPU machine,
// after the moekit_sm90 objects exist in a build tree): bench/sm90_check.sh build <build-dir>.
// Run (GPU machine): sm90_check [--quick] [--csv out.csv]
//
// 1. fuzz     random problems (G, K, N, counts with zero-row groups and a tail S < T, bf16/f16,
//             fprop/dgrad, bias or not, int32/int64 counts, both tile configs): every output
//             element against cuBLAS (fp32 output, per group) + bias, the tail rows [S, T) and
//             guard bands before/after the buffer bit-exact sentinels; sampled elements of both
//             against fp64 host dot products of the same stored inputs.
// 2. graph    setup + GEMM captured once in a CUDA graph, replayed with new device counts
//             (uniform, zero-row groups + tail, all rows in one group, all empty) and with invalid
//             counts (negative, S > T: error flag set, nothing written).
// 3. suite    PERFORMANCE.md shapes × {uniform, skewed Dirichlet(1)} × {fprop, dgrad}, bf16:
//             full-output check, then CUDA-event medians (30 runs after warm-up) of the sm90
//             kernel (setup kernel included; automatic config and the other config), dense cuBLAS
//             with the same FLOPs, and the per-expert cuBLAS loop. Rows of --csv feed
//             bench/sm90_peers.py (torch._grouped_mm on the same counts).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/sm90/group_m_instances.h"
#include "cuda/sm90/grouped_gemm_sm90.h"

namespace moekit::cuda::sm90 {  // bench/sm90_explore.cu
extern const GroupMInstance explore_coop_256x128_c1x2_kmajor, explore_coop_256x128_c1x2_nmajor;
}  // namespace moekit::cuda::sm90

namespace {

using moekit::DType;
namespace sm90 = moekit::cuda::sm90;

#define CK(call)                                                                               \
  do {                                                                                         \
    cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s failed: %s (%s) at %s:%d\n", #call, cudaGetErrorName(e_),       \
                   cudaGetErrorString(e_), __FILE__, __LINE__);                                \
      std::exit(2);                                                                            \
    }                                                                                          \
  } while (0)
#define CB(call)                                                                               \
  do {                                                                                         \
    cublasStatus_t s_ = (call);                                                                \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
      std::fprintf(stderr, "%s failed: %d at %s:%d\n", #call, int(s_), __FILE__, __LINE__);    \
      std::exit(2);                                                                            \
    }                                                                                          \
  } while (0)

cublasHandle_t g_blas;
cudaStream_t g_stream;
int g_failures = 0;

// ---------------------------------------------------------------- device helpers
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }

template <class T>
__global__ void randn(T* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + i);
    const float u1 = (static_cast<float>(h >> 40) + 1.0f) * (1.0f / 16777216.0f);
    const float u2 = static_cast<float>(h & 0xffffffu) * (1.0f / 16777216.0f);
    p[i] = T(scale * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
  }
}

__global__ void fill16(uint16_t* p, size_t n, uint16_t v) {
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x)
    p[i] = v;
}

__global__ void count_not16(const uint16_t* p, size_t n, uint16_t v, unsigned long long* count) {
  unsigned long long local = 0;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x)
    local += p[i] != v;
  if (local) atomicAdd(count, local);
}

struct Stats {  // accumulated by compare()
  double err2, ref2;
  unsigned int worst_bits;  // max err/tol as float bits (non-negative floats order like ints)
  unsigned long long nonfinite, over;
};

// got [m, n] (output dtype) vs ref [m, n] f32 + bias row (or none); tol = rel·|want| + abs.
template <class T>
__global__ void compare(const T* got, const float* ref, const T* bias, int64_t m, int64_t n,
                        float rel, float abs_tol, Stats* st) {
  double e2 = 0, r2 = 0;
  float worst = 0;
  unsigned long long nf = 0, over = 0;
  const size_t total = static_cast<size_t>(m) * n;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const float want = ref[i] + (bias ? to_f(bias[i % n]) : 0.0f);
    const float g = to_f(got[i]);
    if (!isfinite(g)) { ++nf; continue; }
    const float e = fabsf(g - want);
    const float r = e / (rel * fabsf(want) + abs_tol);
    worst = fmaxf(worst, r);
    over += r > 1.0f;
    e2 += double(e) * e;
    r2 += double(want) * want;
  }
  atomicAdd(&st->err2, e2);
  atomicAdd(&st->ref2, r2);
  atomicMax(&st->worst_bits, __float_as_uint(worst));
  if (nf) atomicAdd(&st->nonfinite, nf);
  if (over) atomicAdd(&st->over, over);
}

// ---------------------------------------------------------------- host helpers
uint16_t sentinel_bits(DType t) { return t == DType::BF16 ? 0x40E0 : 0x4700; }  // 7.0

template <class T>
void fill_randn(void* p, size_t n, uint64_t seed, float scale = 1.0f) {
  randn<T><<<1024, 256, 0, g_stream>>>(static_cast<T*>(p), n, seed, scale);
  CK(cudaGetLastError());
}
void fill_randn(DType t, void* p, size_t n, uint64_t seed, float scale = 1.0f) {
  if (t == DType::BF16) fill_randn<__nv_bfloat16>(p, n, seed, scale);
  else fill_randn<__half>(p, n, seed, scale);
}
void fill_sentinel(DType t, void* p, size_t n) {
  if (!n) return;
  fill16<<<1024, 256, 0, g_stream>>>(static_cast<uint16_t*>(p), n, sentinel_bits(t));
  CK(cudaGetLastError());
}
unsigned long long not_sentinel(DType t, const void* p, size_t n) {
  if (!n) return 0;
  unsigned long long* d;
  CK(cudaMallocAsync(&d, 8, g_stream));
  CK(cudaMemsetAsync(d, 0, 8, g_stream));
  count_not16<<<1024, 256, 0, g_stream>>>(static_cast<const uint16_t*>(p), n, sentinel_bits(t), d);
  CK(cudaGetLastError());
  unsigned long long h = 0;
  CK(cudaMemcpyAsync(&h, d, 8, cudaMemcpyDeviceToHost, g_stream));
  CK(cudaFreeAsync(d, g_stream));
  CK(cudaStreamSynchronize(g_stream));
  return h;
}

double to_double(DType t, uint16_t bits) {
  if (t == DType::BF16) {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  __half_raw r;
  r.x = bits;
  return static_cast<double>(__half2float(__half(r)));
}

std::vector<uint16_t> fetch(const void* base, size_t first, size_t count, size_t stride) {
  std::vector<uint16_t> out(count);
  const auto* src = static_cast<const uint16_t*>(base) + first;
  CK(cudaMemcpy2D(out.data(), 2, src, stride * 2, 2, count, cudaMemcpyDeviceToHost));
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

template <class F>
double time_median_ms(F&& f, int iters = 30, int warmup = 5) {
  for (int i = 0; i < warmup; ++i) f();
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(a, g_stream));
    f();
    CK(cudaEventRecord(b, g_stream));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return median(ms);
}

// Per-call event timing of several variants measured in turns (round r: `per_round` runs of
// each), so that clock and temperature drift hits every variant alike. Medians per variant.
std::vector<double> time_in_turns(const std::vector<std::function<void()>>& fns, int rounds = 3,
                                  int per_round = 10) {
  std::vector<std::vector<double>> ms(fns.size());
  for (auto& f : fns) for (int i = 0; i < 3; ++i) f();  // warm-up
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int r = 0; r < rounds; ++r) {
    for (size_t v = 0; v < fns.size(); ++v) {
      for (int i = 0; i < per_round; ++i) {
        CK(cudaEventRecord(a, g_stream));
        fns[v]();
        CK(cudaEventRecord(b, g_stream));
        CK(cudaEventSynchronize(b));
        float t = 0;
        CK(cudaEventElapsedTime(&t, a, b));
        ms[v].push_back(t);
      }
    }
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::vector<double> out;
  for (auto& v : ms) out.push_back(median(v));
  return out;
}

// Back-to-back calls between two events (host work overlaps the GPU): median of `batches`.
template <class F>
double time_pipelined_ms(F&& f, int per_batch = 20, int batches = 5) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int j = 0; j < batches; ++j) {
    CK(cudaEventRecord(a, g_stream));
    for (int i = 0; i < per_batch; ++i) f();
    CK(cudaEventRecord(b, g_stream));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t / per_batch);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return median(ms);
}

// ---------------------------------------------------------------- a problem and its buffers
struct Case {
  std::string label;
  DType dtype = DType::BF16;
  bool fprop = true;  // b_transposed
  bool bias = false;
  bool i64 = false;
  int config = -1;
  int64_t G = 1, T = 0, k = 0, n = 0;  // GEMM k (reduction) and n (output columns)
  std::vector<int64_t> counts;
};

int64_t sum(const std::vector<int64_t>& c) {
  int64_t s = 0;
  for (auto x : c) s += x;
  return s;
}

struct Buffers {
  static constexpr int64_t kGuardRows = 3;
  void *a = nullptr, *b = nullptr, *bias = nullptr, *out_alloc = nullptr, *out = nullptr;
  void *counts = nullptr, *ws = nullptr;
  int* flag = nullptr;
  float* ref = nullptr;
  size_t ws_bytes = 0;
  Buffers(const Case& c, uint64_t seed, bool want_ref = true) {
    const size_t T = c.T, K = c.k, N = c.n, G = c.G;
    CK(cudaMalloc(&a, std::max<size_t>(T * K, 1) * 2));
    CK(cudaMalloc(&b, G * N * K * 2));
    CK(cudaMalloc(&bias, G * N * 2));
    CK(cudaMalloc(&out_alloc, (T + 2 * kGuardRows) * N * 2));
    out = static_cast<char*>(out_alloc) + kGuardRows * N * 2;
    CK(cudaMalloc(&counts, G * 8));
    CK(cudaMalloc(&flag, 4));
    CK(cudaMemset(flag, 0, 4));
    if (want_ref) CK(cudaMalloc(&ref, std::max<size_t>(T * N, 1) * 4));
    // Weights scaled by 1/sqrt(K): outputs O(1) like a real layer (any scale would do).
    fill_randn(c.dtype, a, T * K, seed * 3 + 1);
    fill_randn(c.dtype, b, G * N * K, seed * 3 + 2, 1.0f / std::sqrt(float(K)));
    fill_randn(c.dtype, bias, G * N, seed * 3 + 3);
    set_counts(c, c.counts);
  }
  void set_counts(const Case& c, const std::vector<int64_t>& cnt) {
    if (c.i64) {
      CK(cudaMemcpy(counts, cnt.data(), cnt.size() * 8, cudaMemcpyHostToDevice));
    } else {
      std::vector<int32_t> c32(cnt.begin(), cnt.end());
      CK(cudaMemcpy(counts, c32.data(), c32.size() * 4, cudaMemcpyHostToDevice));
    }
  }
  sm90::GroupMProblem problem(const Case& c) const {
    sm90::GroupMProblem p;
    p.a = a;
    p.b = b;
    p.b_transposed = c.fprop;
    p.bias = c.bias ? bias : nullptr;
    p.out = out;
    p.counts = counts;
    p.counts_i64 = c.i64;
    p.groups = c.G;
    p.rows = c.T;
    p.k = c.k;
    p.n = c.n;
    p.dtype = c.dtype;
    p.error_flag = flag;
    p.config = c.config;
    return p;
  }
  void ensure_ws(size_t bytes) {
    if (bytes <= ws_bytes) return;
    if (ws) CK(cudaFree(ws));
    CK(cudaMalloc(&ws, bytes));
    ws_bytes = bytes;
  }
  ~Buffers() {
    for (void* p : {a, b, bias, out_alloc, counts, static_cast<void*>(flag),
                    static_cast<void*>(ref), ws})
      if (p) cudaFree(p);
  }
};

cudaDataType_t cuda_t(DType t) { return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F; }

// Per-group cuBLAS: out rows of g = a_g · op(b_g), into `dst` of type `dst_t` (ld n).
void cublas_groups(const Case& c, const std::vector<int64_t>& cnt, const void* a, const void* b,
                   void* dst, cudaDataType_t dst_t) {
  const float one = 1.0f, zero = 0.0f;
  const size_t dst_es = dst_t == CUDA_R_32F ? 4 : 2;
  int64_t off = 0;
  for (int64_t g = 0; g < c.G; ++g) {
    const int64_t m = cnt[size_t(g)];
    if (m > 0) {
      const void* bg = static_cast<const char*>(b) + size_t(g) * c.n * c.k * 2;
      const void* ag = static_cast<const char*>(a) + size_t(off) * c.k * 2;
      void* dg = static_cast<char*>(dst) + size_t(off) * c.n * dst_es;
      // Row-major out_g [m, n] = column-major out_gᵀ [n, m].
      if (c.fprop) {  // b_g [n, k] row-major = column-major [k, n]: op T
        CB(cublasGemmEx(g_blas, CUBLAS_OP_T, CUBLAS_OP_N, int(c.n), int(m), int(c.k), &one, bg,
                        cuda_t(c.dtype), int(c.k), ag, cuda_t(c.dtype), int(c.k), &zero, dg,
                        dst_t, int(c.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      } else {  // b_g [k, n] row-major = column-major [n, k]: op N
        CB(cublasGemmEx(g_blas, CUBLAS_OP_N, CUBLAS_OP_N, int(c.n), int(m), int(c.k), &one, bg,
                        cuda_t(c.dtype), int(c.n), ag, cuda_t(c.dtype), int(c.k), &zero, dg,
                        dst_t, int(c.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }
    }
    off += m;
  }
}

struct Verdict {
  bool ok = true;
  double rel_frob = 0, worst = 0, fp64_worst = 0, ref_fp64_worst = 0;
  unsigned long long nonfinite = 0, over = 0, tail_bad = 0, guard_bad = 0;
  std::string why;
};

// Full check of buf.out for counts `cnt` (the kernel has run): every valid element against
// cuBLAS-fp32 + bias, the tail and guards bit-exact sentinels, sampled elements vs fp64.
Verdict verify(const Case& c, Buffers& buf, const std::vector<int64_t>& cnt, uint64_t seed,
               bool fp64_samples = true) {
  Verdict v;
  const int64_t S = sum(cnt);
  cublas_groups(c, cnt, buf.a, buf.b, buf.ref, CUDA_R_32F);
  Stats* st;
  CK(cudaMallocAsync(&st, sizeof(Stats), g_stream));
  CK(cudaMemsetAsync(st, 0, sizeof(Stats), g_stream));
  const float rel = c.dtype == DType::BF16 ? 1.0f / 128 : 1.0f / 1024;  // 2 ulp-ish of output
  const float abs_tol = 1e-3f;
  int64_t off = 0;
  for (int64_t g = 0; g < c.G; ++g) {
    const int64_t m = cnt[size_t(g)];
    if (m > 0) {
      const size_t o = size_t(off) * c.n;
      const void* bias_g = c.bias ? static_cast<const char*>(buf.bias) + size_t(g) * c.n * 2 : nullptr;
      if (c.dtype == DType::BF16)
        compare<__nv_bfloat16><<<264, 256, 0, g_stream>>>(
            static_cast<const __nv_bfloat16*>(buf.out) + o, buf.ref + o,
            static_cast<const __nv_bfloat16*>(bias_g), m, c.n, rel, abs_tol, st);
      else
        compare<__half><<<264, 256, 0, g_stream>>>(static_cast<const __half*>(buf.out) + o,
                                                   buf.ref + o, static_cast<const __half*>(bias_g),
                                                   m, c.n, rel, abs_tol, st);
      CK(cudaGetLastError());
    }
    off += m;
  }
  Stats h{};
  CK(cudaMemcpyAsync(&h, st, sizeof(Stats), cudaMemcpyDeviceToHost, g_stream));
  CK(cudaFreeAsync(st, g_stream));
  CK(cudaStreamSynchronize(g_stream));
  float worst;
  std::memcpy(&worst, &h.worst_bits, 4);
  v.worst = worst;
  v.rel_frob = h.ref2 > 0 ? std::sqrt(h.err2 / h.ref2) : 0;
  v.nonfinite = h.nonfinite;
  v.over = h.over;
  v.tail_bad = not_sentinel(c.dtype, static_cast<char*>(buf.out) + size_t(S) * c.n * 2,
                            size_t(c.T - S) * c.n);
  v.guard_bad = not_sentinel(c.dtype, buf.out_alloc, Buffers::kGuardRows * c.n) +
                not_sentinel(c.dtype, static_cast<char*>(buf.out) + size_t(c.T) * c.n * 2,
                             Buffers::kGuardRows * c.n);
  // fp64 anchor: first/last row of every non-empty group (at most 64 groups) + random rows,
  // 8 random columns each; both the kernel's output and the cuBLAS reference must match it.
  std::mt19937_64 rng(seed);
  std::vector<std::pair<int64_t, int64_t>> rows;  // (row, group)
  off = 0;
  for (int64_t g = 0; g < c.G; ++g) {
    const int64_t m = cnt[size_t(g)];
    if (m > 0 && rows.size() < 48 && (g < 16 || rng() % 4 == 0)) {
      rows.push_back({off, g});
      rows.push_back({off + m - 1, g});
      rows.push_back({off + int64_t(rng() % uint64_t(m)), g});
    }
    off += m;
  }
  if (!fp64_samples) rows.clear();
  for (auto [r, g] : rows) {
    const auto arow = fetch(buf.a, size_t(r) * c.k, size_t(c.k), 1);
    for (int j = 0; j < 8; ++j) {
      const int64_t col = int64_t(rng() % uint64_t(c.n));
      const size_t bbase = size_t(g) * c.n * c.k;
      const auto bcol = c.fprop ? fetch(buf.b, bbase + size_t(col) * c.k, size_t(c.k), 1)
                                : fetch(buf.b, bbase + size_t(col), size_t(c.k), size_t(c.n));
      double ref = 0, mag = 0;
      for (int64_t kk = 0; kk < c.k; ++kk) {
        const double t = to_double(c.dtype, arow[size_t(kk)]) * to_double(c.dtype, bcol[size_t(kk)]);
        ref += t;
        mag += std::fabs(t);
      }
      if (c.bias) ref += to_double(c.dtype, fetch(buf.bias, size_t(g) * c.n + col, 1, 1)[0]);
      const double got = to_double(c.dtype, fetch(buf.out, size_t(r) * c.n + col, 1, 1)[0]);
      float cub;
      CK(cudaMemcpy(&cub, buf.ref + size_t(r) * c.n + col, 4, cudaMemcpyDeviceToHost));
      const double want_cub = cub + (c.bias ? to_double(c.dtype, fetch(buf.bias, size_t(g) * c.n + col, 1, 1)[0]) : 0.0);
      // The tests' rule (tests/support/reference.h): fp32 accumulation of L = K (+1 with bias)
      // terms errs by at most eps(f32)·L·Σ|term|; the output rounding by eps(out)·|ref|.
      const double acc_tol = (1.0 / (1 << 23)) * double(c.k + (c.bias ? 1 : 0)) * mag;
      v.fp64_worst = std::max(v.fp64_worst, std::fabs(got - ref) / (rel * std::fabs(ref) + acc_tol + abs_tol));
      v.ref_fp64_worst = std::max(v.ref_fp64_worst, std::fabs(want_cub - ref) / (acc_tol + 1e-30));
    }
  }
  std::string why;
  if (v.nonfinite) why += " nonfinite=" + std::to_string(v.nonfinite);
  if (v.over) why += " over_tol=" + std::to_string(v.over);
  if (v.tail_bad) why += " tail_written=" + std::to_string(v.tail_bad);
  if (v.guard_bad) why += " guard_written=" + std::to_string(v.guard_bad);
  if (v.fp64_worst > 1.0) why += " fp64_worst=" + std::to_string(v.fp64_worst);
  if (v.ref_fp64_worst > 1.0) why += " cublas_ref_vs_fp64=" + std::to_string(v.ref_fp64_worst);
  if (S > 0 && v.rel_frob > (c.dtype == DType::BF16 ? 8e-3 : 1e-3)) why += " rel_frob";
  v.ok = why.empty();
  v.why = why;
  return v;
}

void run_sm90(const Case& c, Buffers& buf) {
  const sm90::GroupMProblem p = buf.problem(c);
  buf.ensure_ws(sm90::workspace_bytes(p));
  sm90::run(p, buf.ws, g_stream);
}

std::string counts_str(const std::vector<int64_t>& c) {
  std::string s;
  for (size_t i = 0; i < c.size(); ++i) {
    if (i == 12) return s + " ...";
    s += (i ? "," : "") + std::to_string(c[i]);
  }
  return s;
}

bool report(const std::string& what, const Verdict& v) {
  std::printf("  %-4s %-70s rel_frob=%.2e worst=%.2f fp64=%.2f%s\n", v.ok ? "ok" : "FAIL",
              what.c_str(), v.rel_frob, v.worst, v.fp64_worst, v.why.c_str());
  if (!v.ok) ++g_failures;
  return v.ok;
}

// ---------------------------------------------------------------- 1. fuzz
std::vector<int64_t> random_counts(std::mt19937_64& rng, int64_t G, int64_t S) {
  std::vector<double> w(static_cast<size_t>(G));
  std::exponential_distribution<double> ex(1.0);
  double tot = 0;
  for (auto& x : w) tot += (x = (rng() % 4 == 0) ? 0.0 : ex(rng));  // ~1/4 of groups empty
  std::vector<int64_t> c(size_t(G), 0);
  if (tot == 0) { c[size_t(G - 1)] = S; return c; }
  int64_t assigned = 0;
  for (size_t g = 0; g < c.size(); ++g) assigned += (c[g] = int64_t(std::floor(w[g] / tot * S)));
  for (size_t g = 0; assigned < S; g = (g + 1) % c.size())
    if (w[g] > 0) { ++c[g]; ++assigned; }
  return c;
}

void fuzz(int cases) {
  std::printf("== fuzz: %d random problems (full-output check vs cuBLAS fp32, fp64 samples)\n", cases);
  std::mt19937_64 rng(20251129);
  const int64_t ks[] = {8, 16, 64, 136, 512, 1000, 2048};
  const int64_t ns[] = {8, 24, 128, 200, 264, 1000, 2048};
  for (int i = 0; i < cases; ++i) {
    Case c;
    c.dtype = rng() % 3 == 0 ? DType::F16 : DType::BF16;
    c.fprop = rng() % 2;
    c.bias = rng() % 2;
    c.i64 = rng() % 2;
    c.config = int(rng() % 2);
    c.G = std::vector<int64_t>{1, 2, 3, 8, 17, 64}[rng() % 6];
    c.k = ks[rng() % 7];
    c.n = ns[rng() % 7];
    const int64_t S = int64_t(rng() % 3000);
    c.T = S + int64_t(rng() % 3 == 0 ? 0 : rng() % 300);  // a tail S < T most of the time
    c.counts = random_counts(rng, c.G, S);
    Buffers buf(c, uint64_t(i) + 1);
    fill_sentinel(c.dtype, buf.out_alloc, size_t(c.T + 2 * Buffers::kGuardRows) * c.n);
    run_sm90(c, buf);
    CK(cudaStreamSynchronize(g_stream));
    const sm90::GroupMProblem p = buf.problem(c);
    char what[256];
    std::snprintf(what, sizeof what, "%s %s%s%s G=%lld T=%lld S=%lld K=%lld N=%lld cfg=%d",
                  c.dtype == DType::BF16 ? "bf16" : "f16", c.fprop ? "fprop" : "dgrad",
                  c.bias ? "+bias" : "", c.i64 ? " i64" : " i32", (long long)c.G, (long long)c.T,
                  (long long)S, (long long)c.k, (long long)c.n, c.config);
    (void)p;
    report(what, verify(c, buf, c.counts, uint64_t(i) + 99));
  }
}

// ---------------------------------------------------------------- 2. graph
void graph() {
  std::printf("== graph: capture once, replay with new device counts\n");
  Case c;
  c.G = 8; c.T = 4096; c.k = 512; c.n = 256; c.bias = true; c.fprop = true;
  c.counts = std::vector<int64_t>(8, 512);
  Buffers buf(c, 777);
  const sm90::GroupMProblem p = buf.problem(c);  // automatic config: kLarge (512 rows/group)
  {  // Size the workspace through the other config, so that kLarge is first touched in capture.
    Case other = c;
    other.config = sm90::kSmallM;
    buf.ensure_ws(2 * sm90::workspace_bytes(buf.problem(other)) + (1 << 20));
  }
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  // This is the process's first sm90 call when graph() runs first: one-time initialisation
  // (kernel attributes, occupancy query) happens inside the capture, as it may for a user.
  CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal));
  try {
    sm90::run(p, buf.ws, g_stream);
  } catch (const std::exception& e) {
    std::printf("  FAIL run() during capture threw: %s\n", e.what());
    ++g_failures;
  }
  const cudaError_t end = cudaStreamEndCapture(g_stream, &graph);
  if (end != cudaSuccess) {
    std::printf("  FAIL capture invalidated: %s\n", cudaGetErrorString(end));
    ++g_failures;
    (void)cudaGetLastError();
    return;
  }
  CK(cudaGraphInstantiate(&exec, graph, 0));
  size_t nodes = 0;
  CK(cudaGraphGetNodes(graph, nullptr, &nodes));
  std::printf("  captured %zu kernel nodes (setup + grouped GEMM)\n", nodes);
  const std::vector<std::vector<int64_t>> scenarios = {
      {512, 512, 512, 512, 512, 512, 512, 512},  // uniform, S = T
      {0, 700, 0, 1, 1000, 0, 333, 77},           // zero-row groups, tail [2111, 4096)
      {0, 0, 0, 0, 0, 0, 0, 4000},                // everything in the last group
      {0, 0, 0, 0, 0, 0, 0, 0},                   // nothing at all
      {3, 1, 4, 1, 5, 9, 2, 6},                   // tiny groups
  };
  for (const auto& cnt : scenarios) {
    buf.set_counts(c, cnt);
    fill_sentinel(c.dtype, buf.out_alloc, size_t(c.T + 2 * Buffers::kGuardRows) * c.n);
    CK(cudaGraphLaunch(exec, g_stream));
    CK(cudaStreamSynchronize(g_stream));
    report("replay counts " + counts_str(cnt), verify(c, buf, cnt, 5));
  }
  // Invalid counts: the error flag says why, nothing is written.
  const std::vector<std::pair<std::vector<int64_t>, int>> invalid = {
      {{512, -1, 512, 512, 512, 512, 512, 512}, sm90::kCountNegative},
      {{4096, 1, 0, 0, 0, 0, 0, 0}, sm90::kCountsExceedRows},
      {{4097, 0, 0, 0, 0, 0, 0, 0}, sm90::kCountsExceedRows}};
  for (const auto& [cnt, code] : invalid) {
    buf.set_counts(c, cnt);
    CK(cudaMemset(buf.flag, 0, 4));
    fill_sentinel(c.dtype, buf.out_alloc, size_t(c.T + 2 * Buffers::kGuardRows) * c.n);
    CK(cudaGraphLaunch(exec, g_stream));
    CK(cudaStreamSynchronize(g_stream));
    int flag = 0;
    CK(cudaMemcpy(&flag, buf.flag, 4, cudaMemcpyDeviceToHost));
    const unsigned long long written =
        not_sentinel(c.dtype, buf.out_alloc, size_t(c.T + 2 * Buffers::kGuardRows) * c.n);
    const bool ok = flag == code && written == 0;
    std::printf("  %-4s invalid counts %-40s error_flag=%d (want %d) elements written=%llu\n",
                ok ? "ok" : "FAIL", counts_str(cnt).c_str(), flag, code, written);
    if (!ok) ++g_failures;
  }
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
}

// ---------------------------------------------------------------- 3. suite
struct SuiteShape { const char* name; int64_t E, T, K, N; };
const SuiteShape kSuite[] = {
    {"dsv3_fc1_E8", 8, 32768, 7168, 4096},   {"dsv3_fc2_E8", 8, 32768, 2048, 7168},
    {"dsv3_fc1_E32", 32, 32768, 7168, 4096}, {"qwen3_fc1_E16", 16, 16384, 4096, 3072},
    {"qwen3_fc2_E16", 16, 16384, 1536, 4096}, {"mixtral_fc1_E8", 8, 16384, 4096, 28672},
    {"small_E64", 64, 4096, 2048, 1024},
};

std::vector<int64_t> dirichlet_counts(int64_t E, int64_t T, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> ex(1.0);
  std::vector<double> w(static_cast<size_t>(E));
  double tot = 0;
  for (auto& x : w) tot += (x = ex(rng));
  std::vector<int64_t> c(w.size());
  int64_t assigned = 0;
  std::vector<std::pair<double, size_t>> rem;
  for (size_t g = 0; g < w.size(); ++g) {
    const double exact = w[g] / tot * double(T);
    assigned += (c[g] = int64_t(std::floor(exact)));
    rem.push_back({exact - std::floor(exact), g});
  }
  std::sort(rem.begin(), rem.end(), [](auto& x, auto& y) { return x.first > y.first; });
  for (size_t i = 0; assigned < T; ++i, ++assigned) ++c[rem[i % rem.size()].second];
  return c;
}

void suite(FILE* csv, bool quick) {
  std::printf("== suite: bf16, CUDA-event medians of 30 runs; TFLOP/s = 2*S*K*N / time\n");
  std::printf("%-15s %-7s %-5s %-6s %9s %8s %8s %7s | %8s %8s | %8s %8s | %6s %6s\n", "shape", "split",
              "pass", "cfg", "sm90 ms", "TFLOP/s", "pipelined", "host us", "alt cfg", "TFLOP/s", "dense", "loop",
              "/dense", "/loop");
  if (csv) std::fprintf(csv, "shape,split,pass,T,k,n,counts,cfg,sm90_ms,pipelined_ms,host_us,alt_cfg,alt_ms,dense_ms,loop_ms,check\n");
  for (const auto& s : kSuite) {
    for (const char* split : {"uniform", "skewed"}) {
      for (const bool fprop : {true, false}) {
        if (quick && (!fprop || std::strcmp(split, "skewed") == 0)) continue;
        Case c;
        c.label = s.name;
        c.fprop = fprop;
        c.G = s.E;
        c.T = s.T;
        c.k = fprop ? s.K : s.N;  // dgrad: dx [T, K] = dy [T, N] · W_g
        c.n = fprop ? s.N : s.K;
        c.counts = std::strcmp(split, "uniform") == 0
                       ? std::vector<int64_t>(size_t(s.E), s.T / s.E)
                       : dirichlet_counts(s.E, s.T, 1234 + uint64_t(s.E) * 7 + uint64_t(s.K));
        const int64_t S = sum(c.counts);
        Buffers buf(c, 4242);
        fill_sentinel(c.dtype, buf.out_alloc, size_t(c.T + 2 * Buffers::kGuardRows) * c.n);
        run_sm90(c, buf);
        CK(cudaStreamSynchronize(g_stream));
        const Verdict v = verify(c, buf, c.counts, 11);
        const sm90::GroupMProblem p = buf.problem(c);
        const std::string cfg_name = sm90::config_name(p);
        const int auto_cfg = cfg_name.find(" 64x128x64") != std::string::npos ? sm90::kSmallM : sm90::kLarge;
        Case alt = c;
        alt.config = 1 - auto_cfg;
        Case dense = c;  // dense cuBLAS, same FLOPs: [S, k] · op(W_0) as one GEMM
        dense.G = 1;
        const std::vector<int64_t> one{S};
        const std::vector<double> t = time_in_turns({
            [&] { run_sm90(c, buf); },
            [&] { run_sm90(alt, buf); },
            [&] { cublas_groups(dense, one, buf.a, buf.b, buf.out, cuda_t(c.dtype)); },
            [&] { cublas_groups(c, c.counts, buf.a, buf.b, buf.out, cuda_t(c.dtype)); }});
        const double t_sm90 = t[0], t_alt = t[1], t_dense = t[2], t_loop = t[3];
        const double t_pipe = time_pipelined_ms([&] { run_sm90(c, buf); });
        const auto h0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 20; ++i) run_sm90(c, buf);
        const double host_us =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count() / 20;
        CK(cudaStreamSynchronize(g_stream));
        const double flop = 2.0 * double(S) * double(c.k) * double(c.n);
        auto tf = [&](double ms) { return flop / (ms * 1e-3) / 1e12; };
        std::printf("%-15s %-7s %-5s %-6s %9.3f %8.1f %8.1f %7.1f | %8s %8.1f | %8.1f %8.1f | %6.3f %6.3f %s\n",
                    s.name, split, fprop ? "fprop" : "dgrad", auto_cfg == sm90::kLarge ? "large" : "small",
                    t_sm90, tf(t_sm90), tf(t_pipe), host_us, auto_cfg == sm90::kLarge ? "small" : "large", tf(t_alt),
                    tf(t_dense), tf(t_loop), t_dense / t_sm90, t_loop / t_sm90,
                    v.ok ? "ok" : ("FAIL" + v.why).c_str());
        if (!v.ok) ++g_failures;
        if (csv) {
          std::string cs;
          for (size_t i = 0; i < c.counts.size(); ++i) cs += (i ? ";" : "") + std::to_string(c.counts[i]);
          std::fprintf(csv, "%s,%s,%s,%lld,%lld,%lld,%s,%d,%.5f,%.5f,%.1f,%d,%.5f,%.5f,%.5f,%s\n", s.name, split,
                       fprop ? "fprop" : "dgrad", (long long)c.T, (long long)c.k, (long long)c.n,
                       cs.c_str(), auto_cfg, t_sm90, t_pipe, host_us, 1 - auto_cfg, t_alt, t_dense, t_loop,
                       v.ok ? "ok" : "FAIL");
          std::fflush(csv);
        }
        std::fflush(stdout);
      }
    }
  }
}

// ---------------------------------------------------------------- 4. explore
// The library's kLarge (ping-pong 128x128x64, cluster 1x2) at several tile orders against the
// previous kLarge (cooperative 256x128x64, cluster 1x2; bench/sm90_explore.cu), bf16 fprop and
// dgrad, measured in turns; every variant's output is checked (full compare against cuBLAS)
// before it is timed. "auto" is what sm90::run picks (the config; swizzle 1): on the large
// problems the same kernel as "pp c1x2 swz1", so the two columns show the run's noise.
void explore() {
  std::printf("== explore: bf16, TFLOP/s (per-call event medians, variants measured in turns)\n");
  struct Variant {
    const char* name;
    int config, raster, swizzle;
    const sm90::GroupMInstance* kmajor;  // nullptr: through sm90::run with `config`
    const sm90::GroupMInstance* nmajor;
  };
  const Variant variants[] = {
      {"auto", -1, 0, 1, nullptr, nullptr},
      {"pp c1x2 swz1", sm90::kLarge, 0, 1, nullptr, nullptr},
      {"pp c1x2 swz2", sm90::kLarge, 0, 2, nullptr, nullptr},
      {"pp c1x2 swz4", sm90::kLarge, 0, 4, nullptr, nullptr},
      {"coop256 swz1", -1, 0, 1, &sm90::explore_coop_256x128_c1x2_kmajor,
       &sm90::explore_coop_256x128_c1x2_nmajor},
      {"coop256 swz4", -1, 0, 4, &sm90::explore_coop_256x128_c1x2_kmajor,
       &sm90::explore_coop_256x128_c1x2_nmajor},
  };
  struct Problem { const char* name; const char* split; };
  const Problem problems[] = {{"dsv3_fc1_E8", "uniform"},   {"dsv3_fc2_E8", "skewed"},
                              {"dsv3_fc1_E32", "skewed"},   {"qwen3_fc1_E16", "skewed"},
                              {"qwen3_fc2_E16", "uniform"}, {"mixtral_fc1_E8", "skewed"}};
  std::printf("%-15s %-7s %-5s", "shape", "split", "pass");
  for (const auto& v : variants) std::printf(" %13s", v.name);
  std::printf("   auto config\n");
  for (const bool fprop : {true, false}) {
    for (const auto& pr : problems) {
      const SuiteShape* s = nullptr;
      for (const auto& x : kSuite) if (!std::strcmp(x.name, pr.name)) s = &x;
      Case c;
      c.fprop = fprop;
      c.G = s->E; c.T = s->T;
      c.k = fprop ? s->K : s->N;  // dgrad: dx [T, K] = dy [T, N] · W_g
      c.n = fprop ? s->N : s->K;
      c.counts = std::strcmp(pr.split, "uniform") == 0
                     ? std::vector<int64_t>(size_t(s->E), s->T / s->E)
                     : dirichlet_counts(s->E, s->T, 1234 + uint64_t(s->E) * 7 + uint64_t(s->K));
      Buffers buf(c, 4242);
      std::vector<std::function<void()>> fns;
      std::string verdicts;
      for (const auto& v : variants) {
        Case cv = c;
        cv.config = v.config;
        sm90::GroupMProblem p = buf.problem(cv);
        p.raster = v.raster;
        p.swizzle = v.swizzle;
        const sm90::GroupMInstance* inst = fprop ? v.kmajor : v.nmajor;
        const size_t ws = inst ? inst->workspace_bytes(p) : sm90::workspace_bytes(p);
        buf.ensure_ws(ws);
        auto call = [&buf, p, inst] {
          if (inst) inst->run(p, buf.ws, g_stream);
          else sm90::run(p, buf.ws, g_stream);
        };
        fill_sentinel(c.dtype, buf.out_alloc, size_t(c.T + 2 * Buffers::kGuardRows) * c.n);
        call();
        const Verdict ver = verify(c, buf, c.counts, 3, /*fp64_samples=*/false);
        if (!ver.ok) { ++g_failures; verdicts += std::string(" FAIL[") + v.name + ":" + ver.why + "]"; }
        fns.push_back(call);
      }
      const std::vector<double> t = time_in_turns(fns, 3, 8);
      const double flop = 2.0 * double(sum(c.counts)) * double(c.k) * double(c.n);
      std::printf("%-15s %-7s %-5s", pr.name, pr.split, fprop ? "fprop" : "dgrad");
      for (double ms : t) std::printf(" %13.1f", flop / (ms * 1e-3) / 1e12);
      std::printf("   %s%s\n", sm90::config_name(buf.problem(c)).c_str(),
                  verdicts.empty() ? " ok" : verdicts.c_str());
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  const char* csv_path = nullptr;
  int fuzz_cases = 48;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--csv") && i + 1 < argc) csv_path = argv[++i];
    else if (!std::strcmp(argv[i], "--fuzz") && i + 1 < argc) fuzz_cases = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
  }
  int dev = 0;
  CK(cudaSetDevice(dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  std::printf("device: %s, %d SMs, cc %d.%d\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor);
  CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  CB(cublasCreate(&g_blas));
  CB(cublasSetStream(g_blas, g_stream));
  sm90::GroupMProblem probe;
  probe.counts = &probe;
  probe.k = probe.n = 8;
  probe.groups = 1;
  const std::string why = sm90::rejects(probe, dev);
  if (!why.empty()) {
    std::printf("sm90 kernels cannot run here: %s\n", why.c_str());
    return 0;
  }
  FILE* csv = csv_path ? std::fopen(csv_path, "w") : nullptr;
  if (only.empty() || only == "graph") graph();  // first: capture the very first sm90 call
  if (only.empty() || only == "fuzz") fuzz(fuzz_cases);
  if (only.empty() || only == "suite") suite(csv, quick);
  if (only.empty() || only == "explore") explore();
  if (csv) std::fclose(csv);
  std::printf("== %s: %d failure(s)\n", g_failures ? "FAILED" : "PASSED", g_failures);
  return g_failures ? 1 : 0;
}
