// moekit_bandwidth_probe: what the GPU's memory sustains for streams of one direction — the
// ceilings a memory-bound grouped GEMM is judged against (design/PERFORMANCE.md: small_E64 reads
// its experts' weights once per call in fprop and dgrad, and writes as many bytes of dW in
// wgrad). The spec sheet's 4.8 TB/s on the H200 counts neither direction's overheads.
//
// For each size (default: small_E64's weights, 64 x 1024 x 2048 bf16 = 268 MB, and 2 GB) it
// times, each as one kernel, median of --iters after --warmup-ms of the same kernel:
//   read    every 16-byte vector loaded once (grid-stride, 4 in flight per thread), XOR-reduced
//           into one word per block so the loads cannot be dropped;
//   write   every 16-byte vector stored once (a pattern that depends on the index);
//   copy    read one buffer, write another (bytes counted: read + written);
//   memset  cudaMemsetAsync (the driver's own write kernel).
// Prints a table row per (stream, size): MB moved, median µs, TB/s (10^12 bytes per second).
// Exit status 1 on any CUDA error, 2 on a bad argument.
// Usage: moekit_bandwidth_probe [--mb N[,N...]] [--iters N] [--warmup-ms MS]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.cuh"

namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // vectors in flight per thread per step

// Every 16-byte vector of `in` loaded once, grid-stride, kUnroll loads in flight per thread
// before `use(index, vector)` sees them.
template <class Use>
__device__ void stream_in(const uint4* __restrict__ in, size_t n, Use use) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(in + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) use(i + u * stride, v[u]);
  }
  for (; i < n; i += stride) use(i, __ldcs(in + i));
}

__global__ void read_kernel(const uint4* __restrict__ in, size_t n, uint32_t* __restrict__ sink) {
  uint32_t acc = 0;
  stream_in(in, n, [&](size_t, uint4 v) { acc ^= v.x ^ v.y ^ v.z ^ v.w; });
  // One word per block: the loads feed a store the compiler cannot prove dead.
  acc = __reduce_xor_sync(0xffffffffu, acc);
  if (threadIdx.x % 32 == 0) atomicXor(sink + blockIdx.x, acc);
}

__global__ void write_kernel(uint4* __restrict__ out, size_t n, uint32_t seed) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint32_t x = static_cast<uint32_t>(i) * 2654435761u + seed;
    __stcs(out + i, make_uint4(x, x ^ 1u, x ^ 2u, x ^ 3u));
  }
}

__global__ void copy_kernel(const uint4* __restrict__ in, uint4* __restrict__ out, size_t n) {
  stream_in(in, n, [&](size_t i, uint4 v) { __stcs(out + i, v); });
}

struct Options {
  std::vector<double> mb{268.435456, 2147.483648};
  int iters = 20;
  double warmup_ms = 500;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "moekit_bandwidth_probe: %s\nusage: moekit_bandwidth_probe [--mb N[,N...]] "
               "[--iters N] [--warmup-ms MS]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + a).c_str());
    const std::string v = argv[++i];
    if (a == "--mb") {
      o.mb.clear();
      for (size_t s = 0; s <= v.size();) {
        const size_t e = std::min(v.find(',', s), v.size());
        const double mb = std::atof(v.substr(s, e - s).c_str());
        if (mb <= 0) usage(("--mb: expected positive sizes in MB, got '" + v + "'").c_str());
        o.mb.push_back(mb);
        s = e + 1;
      }
    } else if (a == "--iters") {
      o.iters = std::atoi(v.c_str());
      if (o.iters < 1) usage(("--iters: expected >= 1, got '" + v + "'").c_str());
    } else if (a == "--warmup-ms") {
      o.warmup_ms = std::atof(v.c_str());
      if (o.warmup_ms < 0) usage(("--warmup-ms: expected >= 0, got '" + v + "'").c_str());
    } else {
      usage(("unknown option " + a).c_str());
    }
  }
  return o;
}

// Median time in µs of `launch` after `warmup_ms` of it.
template <class F>
double time_us(F launch, const Options& o) {
  cudaEvent_t a, b;
  MOEKIT_BENCH_CHECK(cudaEventCreate(&a));
  MOEKIT_BENCH_CHECK(cudaEventCreate(&b));
  float ms = 0;
  for (float spent = 0; spent < o.warmup_ms; spent += ms) {
    MOEKIT_BENCH_CHECK(cudaEventRecord(a));
    launch();
    MOEKIT_BENCH_CHECK(cudaEventRecord(b));
    MOEKIT_BENCH_CHECK(cudaEventSynchronize(b));
    MOEKIT_BENCH_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (ms <= 0) ms = 0.001f;
  }
  std::vector<double> us;
  for (int i = 0; i < o.iters; ++i) {
    MOEKIT_BENCH_CHECK(cudaEventRecord(a));
    launch();
    MOEKIT_BENCH_CHECK(cudaEventRecord(b));
    MOEKIT_BENCH_CHECK(cudaEventSynchronize(b));
    MOEKIT_BENCH_CHECK(cudaEventElapsedTime(&ms, a, b));
    us.push_back(ms * 1e3);
  }
  MOEKIT_BENCH_CHECK(cudaGetLastError());
  MOEKIT_BENCH_CHECK(cudaEventDestroy(a));
  MOEKIT_BENCH_CHECK(cudaEventDestroy(b));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  int device = 0, sms = 0;
  cudaDeviceProp prop{};
  MOEKIT_BENCH_CHECK(cudaGetDevice(&device));
  MOEKIT_BENCH_CHECK(cudaGetDeviceProperties(&prop, device));
  MOEKIT_BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  std::printf("# moekit_bandwidth_probe on %s (%d SMs, L2 %d MB)\n", prop.name, sms,
              prop.l2CacheSize >> 20);
  std::printf("| stream | MB | µs (median of %d) | TB/s |\n|---|---|---|---|\n", o.iters);
  const int blocks = sms * (2048 / kThreads);  // one full wave
  uint32_t* sink = nullptr;
  MOEKIT_BENCH_CHECK(cudaMalloc(&sink, sizeof(uint32_t) * blocks));
  MOEKIT_BENCH_CHECK(cudaMemset(sink, 0, sizeof(uint32_t) * blocks));
  for (double mb : o.mb) {
    const size_t bytes = static_cast<size_t>(mb * 1e6) / 16 * 16;
    const size_t n = bytes / 16;
    uint4 *a = nullptr, *b = nullptr;
    MOEKIT_BENCH_CHECK(cudaMalloc(&a, bytes));
    MOEKIT_BENCH_CHECK(cudaMalloc(&b, bytes));
    write_kernel<<<blocks, kThreads>>>(a, n, 7u);  // defined contents for the reads
    MOEKIT_BENCH_CHECK(cudaGetLastError());
    MOEKIT_BENCH_CHECK(cudaDeviceSynchronize());
    const auto report = [&](const char* what, double moved, double us) {
      std::printf("| %s | %.1f | %.1f | %.3f |\n", what, moved / 1e6, us, moved / us / 1e6);
    };
    report("read", double(bytes),
           time_us([&] { read_kernel<<<blocks, kThreads>>>(a, n, sink); }, o));
    report("write", double(bytes),
           time_us([&] { write_kernel<<<blocks, kThreads>>>(b, n, 3u); }, o));
    report("copy (read + write)", 2.0 * double(bytes),
           time_us([&] { copy_kernel<<<blocks, kThreads>>>(a, b, n); }, o));
    report("memset", double(bytes),
           time_us([&] { MOEKIT_BENCH_CHECK(cudaMemsetAsync(b, 0, bytes)); }, o));
    MOEKIT_BENCH_CHECK(cudaFree(a));
    MOEKIT_BENCH_CHECK(cudaFree(b));
  }
  MOEKIT_BENCH_CHECK(cudaFree(sink));
  return 0;
}
