// moekit_host_latency — what the host's enqueue of one moekit call is made of, on this machine.
// A call timed alone (every time in the suite: events around it) pays its host work before its
// first kernel reaches the GPU; back to back the host runs ahead and hides it. This times, per
// operation, the CUDA runtime calls a moekit sm90 call makes (each alone, in a loop), then the
// moekit calls themselves (small_E64: 64 experts, 4096 rows, N 2048, K 1024; device splits), so
// their difference is moekit's own host work.
//
//   moekit_host_latency [--backend sm90|cublas] [--iters 200] [--reps 7] [--profile PASS]
//
// Each line: the median over reps of (host time of `iters` operations / iters), in µs; the
// stream is synchronised between reps so the launch queue never fills (a full queue blocks the
// host and would be timed as enqueue).
// --profile fprop|dgrad|wgrad: then samples where the host spends one moekit call (a signal to the
// main thread every 200 µs of wall time, its stack kept while it enqueues, never while it waits
// for the GPU) and prints one line per sample frame: "<hits> <module> <offset>" with the
// frame's depth, to be symbolised by addr2line (tools/host-profile does both).
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <utility>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench_common.cuh"  // tensor_map_encoder
#include "group_view.h"
#include "moekit/moekit.h"

using moekit::BOp;
using moekit::Context;
using moekit::DType;
using moekit::Splits;
using moekit::Tensor;

namespace {

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
  MOEKIT_BENCH_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> us;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) op();
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / iters);
    MOEKIT_BENCH_CHECK(cudaStreamSynchronize(stream));
  }
  return median(us);
}

// ---- the sampler: the main thread's return addresses at each timer signal, while `g_enqueue` is set ----
constexpr int kDepth = 48;
constexpr int kMaxSamples = 200000;
struct Sample {
  int depth;
  void* pc[kDepth];
};
Sample* g_samples = nullptr;
std::atomic<int> g_count{0};
std::atomic<bool> g_enqueue{false};
pid_t g_main_tid = 0;

void on_sigprof(int) {
  if (!g_enqueue.load(std::memory_order_relaxed)) return;
  const int i = g_count.fetch_add(1, std::memory_order_relaxed);
  if (i >= kMaxSamples) return;
  g_samples[i].depth = backtrace(g_samples[i].pc, kDepth);
}

// Samples `calls` enqueues of `op`, `batch` at a time with the stream drained in between, and
// prints the frames: "frame <depth> <module> <hex offset> <hits>" (depth 0: the sampled PC;
// frames 0-1 are the handler's own and are skipped).
void profile(const std::function<void()>& op, int calls, int batch, cudaStream_t stream) {
  g_samples = new Sample[kMaxSamples];
  g_main_tid = static_cast<pid_t>(syscall(SYS_gettid));
  struct sigaction sa {};
  sa.sa_handler = on_sigprof;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGPROF, &sa, nullptr);
  void* warm[4];
  backtrace(warm, 4);  // loads libgcc's unwinder outside the handler
  sigevent ev{};
  ev.sigev_notify = SIGEV_THREAD_ID;
  ev.sigev_signo = SIGPROF;
  ev._sigev_un._tid = g_main_tid;
  timer_t timer;
  if (timer_create(CLOCK_MONOTONIC, &ev, &timer) != 0) {
    std::perror("timer_create");
    std::exit(1);
  }
  const itimerspec every{{0, 200000}, {0, 200000}};
  timer_settime(timer, 0, &every, nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  double enqueue_us = 0;
  for (int done = 0; done < calls; done += batch) {
    const auto b0 = std::chrono::steady_clock::now();
    g_enqueue = true;
    for (int i = 0; i < batch; ++i) op();
    g_enqueue = false;
    enqueue_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - b0).count();
    MOEKIT_BENCH_CHECK(cudaStreamSynchronize(stream));
  }
  timer_delete(timer);
  const int n = std::min(g_count.load(), kMaxSamples);
  std::printf("profile: %d calls, %.2f us/call enqueue, %d samples in %.1f s\n", calls, enqueue_us / calls, n,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  // (depth, pc) -> hits; a frame counted once per sample even when recursion repeats it.
  std::map<std::pair<int, void*>, int> hits;
  for (int i = 0; i < n; ++i) {
    for (int d = 2; d < g_samples[i].depth; ++d) ++hits[{d - 2, g_samples[i].pc[d]}];
  }
  for (const auto& [key, count] : hits) {
    Dl_info info{};
    // Return addresses (depth > 0) point after the call: one byte back lands in the call.
    const auto pc = reinterpret_cast<uintptr_t>(key.second) - (key.first > 0 ? 1 : 0);
    if (dladdr(reinterpret_cast<void*>(pc), &info) && info.dli_fname) {
      std::printf("frame %d %s 0x%lx %d\n", key.first, info.dli_fname,
                  static_cast<unsigned long>(pc - reinterpret_cast<uintptr_t>(info.dli_fbase)), count);
    } else {
      std::printf("frame %d ? 0x%lx %d\n", key.first, static_cast<unsigned long>(pc), count);
    }
  }
  delete[] g_samples;
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend = "sm90", profile_pass;
  int iters = 200, reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--backend") backend = argv[i + 1];
    else if (a == "--iters") iters = std::atoi(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else if (a == "--profile") profile_pass = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: moekit_host_latency [--backend sm90|cublas] [--iters N] [--reps N] "
                           "[--profile fprop|dgrad|wgrad]\n");
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
  MOEKIT_BENCH_CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
  cudaEvent_t event;
  MOEKIT_BENCH_CHECK(cudaEventCreate(&event));

  std::printf("host µs per operation (median of %d reps of %d), backend %s\n", reps, iters, backend.c_str());
  auto row = [&](const char* what, const std::function<void()>& op) {
    std::printf("%-58s %8.2f\n", what, host_us(op, iters, reps, stream));
  };
  int current = 0;
  row("cudaGetDevice", [&] { MOEKIT_BENCH_CHECK(cudaGetDevice(&current)); });
  row("cudaEventRecord", [&] { MOEKIT_BENCH_CHECK(cudaEventRecord(event, stream)); });
  row("cudaMallocFromPoolAsync + cudaFreeAsync (64 KiB)", [&] {
    void* p = nullptr;
    MOEKIT_BENCH_CHECK(cudaMallocFromPoolAsync(&p, 65536, pool, stream));
    MOEKIT_BENCH_CHECK(cudaFreeAsync(p, stream));
  });
  row("launch <<<1, 256>>>, 32 bytes of parameters", [&] {
    empty_small<<<1, 256, 0, stream>>>(Small{});
    MOEKIT_BENCH_CHECK(cudaGetLastError());
  });
  row("launch <<<1, 256>>>, 1536 bytes of parameters", [&] {
    empty_large<<<1, 256, 0, stream>>>(Large{});
    MOEKIT_BENCH_CHECK(cudaGetLastError());
  });
  row("cudaLaunchKernelEx 1 x 256, no attributes, 1536 bytes", [&] {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(1);
    config.blockDim = dim3(256);
    config.stream = stream;
    MOEKIT_BENCH_CHECK(cudaLaunchKernelEx(&config, empty_large, Large{}));
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
    MOEKIT_BENCH_CHECK(cudaLaunchKernelEx(&config, empty_large, Large{}));
  });

  // As the GEMMs launch: dynamic shared memory near the SM's limit (the grouped kernels take what
  // the epilogue leaves, ~200 KiB), no cluster (ConfigSmallM), PDL.
  int smem_limit = 0;
  MOEKIT_BENCH_CHECK(cudaDeviceGetAttribute(&smem_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  MOEKIT_BENCH_CHECK(cudaFuncSetAttribute(empty_large, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_limit));
  auto gemm_like = [&] {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(132);
    config.blockDim = dim3(384);
    config.dynamicSmemBytes = static_cast<size_t>(smem_limit);
    config.stream = stream;
    config.attrs = &attr;
    config.numAttrs = 1;
    MOEKIT_BENCH_CHECK(cudaLaunchKernelEx(&config, empty_large, Large{}));
  };
  row("cudaLaunchKernelEx 132 CTAs, PDL, 1536 bytes, max dynamic smem", gemm_like);

  // A call's pair: a one-block kernel, then another kernel with PDL after it (the setup kernel and
  // the GEMM). Against the two rows above: whether a programmatic edge between two different
  // kernels costs the host more than PDL after the same kernel.
  row("pair: <<<1, 256>>> then cudaLaunchKernelEx 132 CTAs, PDL, max smem", [&] {
    empty_small<<<1, 256, 0, stream>>>(Small{});
    gemm_like();
  });

  // What a call would pay to encode its operands' TMA descriptors on the host (design/PERFORMANCE.md
  // Next 1 (i): one view per operand instead of the setup kernel's per-group descriptors): one
  // cuTensorMapEncodeTiled of small_E64's x [4096, 1024] bf16 as a group view, boxes 64 x 64.
  {
    const auto encode = moekit_bench::tensor_map_encoder();
    void* rows = nullptr;
    MOEKIT_BENCH_CHECK(cudaMalloc(&rows, size_t{4096} * 1024 * 2));
    const auto view = moekit::cuda::sm90::group_view(rows, 4096, 1024, 2, 4096);
    const cuuint64_t dims[3] = {view.dims[0], view.dims[1], view.dims[2]};
    const cuuint64_t strides[2] = {view.strides[0], view.strides[1]};
    const cuuint32_t box[3] = {64, 64, 1}, elem_strides[3] = {1, 1, 1};
    CUtensorMap map{};
    row("cuTensorMapEncodeTiled, a 3-D group view, 128B swizzle", [&] {
      if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(view.base), dims, strides, box,
                 elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
        std::fprintf(stderr, "cuTensorMapEncodeTiled failed\n");
        std::exit(1);
      }
    });
    MOEKIT_BENCH_CHECK(cudaFree(rows));
  }

  // small_E64 through the public API (the suite's shape; inputs uninitialised: only the host's
  // enqueue is timed, and the kernels' time never reaches the host loop).
  const int64_t E = 64, T = 4096, N = 2048, K = 1024;
  Tensor x = Tensor::empty({T, K}, DType::BF16, ctx);
  Tensor w = Tensor::empty({E, N, K}, DType::BF16, ctx);
  Tensor y = Tensor::empty({T, N}, DType::BF16, ctx);
  Tensor dy = Tensor::empty({T, N}, DType::BF16, ctx);
  Tensor dw = Tensor::empty({E, N, K}, DType::BF16, ctx);
  MOEKIT_BENCH_CHECK(cudaMemsetAsync(x.data(), 0, static_cast<size_t>(T * K) * 2, stream));
  MOEKIT_BENCH_CHECK(cudaMemsetAsync(w.data(), 0, static_cast<size_t>(E * N * K) * 2, stream));
  MOEKIT_BENCH_CHECK(cudaMemsetAsync(dy.data(), 0, static_cast<size_t>(T * N) * 2, stream));
  std::vector<int64_t> counts(static_cast<size_t>(E), T / E);
  Tensor counts_dev = Tensor::empty({E}, DType::I64, ctx);
  MOEKIT_BENCH_CHECK(cudaMemcpyAsync(counts_dev.data(), counts.data(), counts.size() * 8, cudaMemcpyHostToDevice, stream));
  const Splits device = Splits::device(counts_dev), host = Splits::host(counts);
  const std::function<void()> fprop = [&] {
    moekit::grouped_gemm_group_m(ctx, x, w, BOp::Transposed, device, y);
  };
  const std::function<void()> dgrad = [&] { moekit::grouped_gemm_group_m(ctx, dy, w, BOp::Plain, device, x); };
  const std::function<void()> wgrad = [&] { moekit::grouped_gemm_group_k(ctx, dy, x, device, dw, false); };
  if (!profile_pass.empty()) {
    if (profile_pass != "fprop" && profile_pass != "dgrad" && profile_pass != "wgrad") {
      std::fprintf(stderr, "--profile fprop, dgrad or wgrad, got %s\n", profile_pass.c_str());
      return 2;
    }
    profile(profile_pass == "fprop" ? fprop : profile_pass == "dgrad" ? dgrad : wgrad, 100000, 40, stream);
    return 0;
  }
  row("moekit fprop small_E64, device splits", fprop);
  row("moekit dgrad small_E64, device splits", dgrad);
  row("moekit wgrad small_E64 (bf16 dw), device splits", wgrad);
  row("moekit fprop small_E64, host splits", [&] {
    moekit::grouped_gemm_group_m(ctx, x, w, BOp::Transposed, host, y);
  });
  MOEKIT_BENCH_CHECK(cudaStreamSynchronize(stream));
  MOEKIT_BENCH_CHECK(cudaEventDestroy(event));
  return 0;
}
