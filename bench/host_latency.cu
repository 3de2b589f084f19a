// moekit_host_latency — what the host's enqueue of one moekit call is made of, on this machine.
// A call timed alone (every time in the suite: events around it) pays its host work before its
// first kernel reaches the GPU; back to back the host runs ahead and hides it. This times, per
// operation, the CUDA runtime calls a moekit sm90 call makes (each alone, in a loop), then the
// moekit calls themselves (small_E64: 64 experts, 4096 rows, N 2048, K 1024; device splits), so
// their difference is moekit's own host work.
//
//   moekit_host_latency [--backend sm90|cublas] [--iters 200] [--reps 7]
//
// Each line: the median over reps of (host time of `iters` operations / iters), in µs; the
// stream is synchronised between reps so the launch queue never fills (a full queue blocks the
// host and would be timed as enqueue).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "moekit/moekit.h"

using moekit::BOp;
using moekit::Context;
using moekit::DType;
using moekit::Splits;
using moekit::Tensor;

namespace {

#define CK(x)                                                                             \
  do {                                                                                    \
    const cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

struct Small { int64_t a[4]; };
struct Large { int64_t a[192]; };  // 1536 bytes: a setup kernel's inputs and descriptor templates

__global__ void empty_small(Small) {}
__global__ void empty_large(const __grid_constant__ Large) {}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median over reps of the host µs per op of `iters` ops, the stream drained between reps.
double host_us(const std::function<void()>& op, int iters, int reps, cudaStream_t stream) {
  for (int i = 0; i < 3; ++i) op();  // warm: first-call setup (module loads, caches)
  CK(cudaStreamSynchronize(stream));
  std::vector<double> us;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) op();
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / iters);
    CK(cudaStreamSynchronize(stream));
  }
  return median(us);
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend = "sm90";
  int iters = 200, reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--backend") backend = argv[i + 1];
    else if (a == "--iters") iters = std::atoi(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: moekit_host_latency [--backend sm90|cublas] [--iters N] [--reps N]\n");
      return 2;
    }
  }
  if (Context::cuda_device_count() == 0) {
    std::fprintf(stderr, "moekit_host_latency: no CUDA device\n");
    return 2;
  }
  const Context ctx = Context::cuda(0).with_backend(backend);
  auto stream = static_cast<cudaStream_t>(ctx.stream());
  cudaMemPool_t pool;
  CK(cudaDeviceGetDefaultMemPool(&pool, 0));
  cudaEvent_t event;
  CK(cudaEventCreate(&event));

  std::printf("host µs per operation (median of %d reps of %d), backend %s\n", reps, iters, backend.c_str());
  auto row = [&](const char* what, const std::function<void()>& op) {
    std::printf("%-58s %8.2f\n", what, host_us(op, iters, reps, stream));
  };
  int current = 0;
  row("cudaGetDevice", [&] { CK(cudaGetDevice(&current)); });
  row("cudaEventRecord", [&] { CK(cudaEventRecord(event, stream)); });
  row("cudaMallocFromPoolAsync + cudaFreeAsync (64 KiB)", [&] {
    void* p = nullptr;
    CK(cudaMallocFromPoolAsync(&p, 65536, pool, stream));
    CK(cudaFreeAsync(p, stream));
  });
  row("launch <<<1, 256>>>, 32 bytes of parameters", [&] {
    empty_small<<<1, 256, 0, stream>>>(Small{});
    CK(cudaGetLastError());
  });
  row("launch <<<1, 256>>>, 1536 bytes of parameters", [&] {
    empty_large<<<1, 256, 0, stream>>>(Large{});
    CK(cudaGetLastError());
  });
  row("cudaLaunchKernelEx 132 CTAs, cluster 1x2, PDL, 1536 bytes", [&] {
    cudaLaunchAttribute attrs[2]{};
    attrs[0].id = cudaLaunchAttributeClusterDimension;
    attrs[0].val.clusterDim.x = 1;
    attrs[0].val.clusterDim.y = 2;
    attrs[0].val.clusterDim.z = 1;
    attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[1].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(1, 132, 1);
    config.blockDim = dim3(384);
    config.stream = stream;
    config.attrs = attrs;
    config.numAttrs = 2;
    CK(cudaLaunchKernelEx(&config, empty_large, Large{}));
  });

  // small_E64 through the public API (the suite's shape; inputs uninitialised: only the host's
  // enqueue is timed, and the kernels' time never reaches the host loop).
  const int64_t E = 64, T = 4096, N = 2048, K = 1024;
  Tensor x = Tensor::empty({T, K}, DType::BF16, ctx);
  Tensor w = Tensor::empty({E, N, K}, DType::BF16, ctx);
  Tensor y = Tensor::empty({T, N}, DType::BF16, ctx);
  Tensor dy = Tensor::empty({T, N}, DType::BF16, ctx);
  Tensor dw = Tensor::empty({E, N, K}, DType::BF16, ctx);
  CK(cudaMemsetAsync(x.data(), 0, static_cast<size_t>(T * K) * 2, stream));
  CK(cudaMemsetAsync(w.data(), 0, static_cast<size_t>(E * N * K) * 2, stream));
  CK(cudaMemsetAsync(dy.data(), 0, static_cast<size_t>(T * N) * 2, stream));
  std::vector<int64_t> counts(static_cast<size_t>(E), T / E);
  Tensor counts_dev = Tensor::empty({E}, DType::I64, ctx);
  CK(cudaMemcpyAsync(counts_dev.data(), counts.data(), counts.size() * 8, cudaMemcpyHostToDevice, stream));
  const Splits device = Splits::device(counts_dev), host = Splits::host(counts);
  row("moekit fprop small_E64, device splits", [&] {
    moekit::grouped_gemm_group_m(ctx, x, w, BOp::Transposed, device, y);
  });
  row("moekit dgrad small_E64, device splits", [&] {
    moekit::grouped_gemm_group_m(ctx, dy, w, BOp::Plain, device, x);
  });
  row("moekit wgrad small_E64 (bf16 dw), device splits", [&] {
    moekit::grouped_gemm_group_k(ctx, dy, x, device, dw, false);
  });
  row("moekit fprop small_E64, host splits", [&] {
    moekit::grouped_gemm_group_m(ctx, x, w, BOp::Transposed, host, y);
  });
  CK(cudaStreamSynchronize(stream));
  CK(cudaEventDestroy(event));
  return 0;
}
