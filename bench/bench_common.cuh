// Shared by the bench programs (one definition each): a CUDA status check that ends the program,
// the skewed routing's counts, and random normal bf16 data.
#pragma once

#include <cuda.h>  // CUtensorMap (the encoder is reached through the runtime: no libcuda link)
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

namespace moekit_bench {

// A CUDA call that must succeed; otherwise the call, its status and place go to stderr and the
// program exits with status 1.
#define MOEKIT_BENCH_CHECK(call)                                                                  \
  do {                                                                                            \
    cudaError_t e_ = (call);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

// The driver's tensor-map encoder (cuTensorMapEncodeTiled), through the runtime; exits when the
// driver has none.
using TensorMapEncode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                     const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                     CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
inline TensorMapEncode tensor_map_encoder() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  MOEKIT_BENCH_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
  if (fn == nullptr || found != cudaDriverEntryPointSuccess) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled not found in this driver\n");
    std::exit(1);
  }
  return reinterpret_cast<TensorMapEncode>(fn);
}

// Dirichlet(1) proportions of T rows over E groups (normalised unit exponentials), rounded by
// largest remainder so that the counts sum to T exactly: the suite's skewed routing.
inline std::vector<int64_t> dirichlet_counts(int64_t E, int64_t T, uint64_t seed) {
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

}  // namespace moekit_bench
