// CUDA runtime hooks of core (src/core/runtime.h): device count, context resources (stream,
// stream-ordered allocator, cuBLAS/cuBLASLt handles and workspace), copies and synchronisation.
// The fill kernel is in fill.cu.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <atomic>
#include <deque>
#include <mutex>
#include <vector>

#include "core/block_cache.h"
#include "core/runtime.h"
#include "backends/cuda/check.h"
#include "backends/cuda/device_counts.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/resources.h"
#include "moekit/core/error.h"

namespace moekit {
namespace cuda {
namespace {

// cuBLAS recommends 32 MiB of workspace on Hopper; cuBLASLt shares it (same stream).
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr size_t kPointerBytes = 3 * kMaxBatchedGemms * sizeof(void*);  // grouped-batched GEMMs

// One memory pool per device for every moekit context on it: freed blocks stay cached in the
// pool (release threshold: never trim at synchronisation), so steady-state allocation costs no
// cudaMalloc. Created on first use and deliberately never destroyed: contexts may outlive any
// static destructor, and the driver reclaims the memory at exit.
cudaMemPool_t device_pool(int device) {
  static std::mutex mutex;
  static std::vector<cudaMemPool_t> pools;
  std::lock_guard<std::mutex> lock(mutex);
  if (pools.size() <= static_cast<size_t>(device)) pools.resize(static_cast<size_t>(device) + 1);
  cudaMemPool_t& pool = pools[static_cast<size_t>(device)];
  if (!pool) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    MOEKIT_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
    uint64_t threshold = UINT64_MAX;
    MOEKIT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  }
  return pool;
}

// The bytes the allocators of a device hold in their caches together (CudaAllocator).
std::atomic<size_t>& cached_on_device(int device) {
  static std::mutex mutex;
  static std::deque<std::atomic<size_t>> counters;  // a deque: the counters never move
  std::lock_guard<std::mutex> lock(mutex);
  while (counters.size() <= static_cast<size_t>(device)) counters.emplace_back(0);
  return counters[static_cast<size_t>(device)];
}

// Stream-ordered allocator: memory is allocated and freed in the order of the context's stream,
// so a tensor freed right after the kernels that use it were queued is reused only by work queued
// after them. Work on other streams must be ordered with the context's stream by the caller.
//
// Large blocks (>= kCacheMinBytes, rounded up to kCacheRound) are also kept by the allocator when
// freed, for the next allocation of about their size on the same stream (the same stream order
// makes the reuse safe, as the pool's own reuse; the policy is core/block_cache.h's: a request
// takes a kept block up to an eighth larger, the device's caches hold at most 1/kCacheMaxShare of
// its memory together, a block not taken within kCacheMaxAge requests goes back to the pool). The
// pool alone carves a freed large block for the next smaller requests and then maps fresh memory
// for the large one: a training loop that drops its weight gradients before the forward
// (zero_grad(set_to_none=True)) paid a 0.35-0.6 ms cudaMallocFromPoolAsync per step at qwen3 for
// it (bench/results/2026-12-06-nvidia-h100-c31ad62-pyperf-recipes-peers.md, "Host allocation").
// An allocation the pool refuses is retried once after the kept blocks are released. Stream
// capture bypasses the cache both ways: a block allocated in a capture belongs to the graph, and
// a kept block handed to a capture would be reused by work queued after it while the graph still
// writes it at every replay.
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(std::shared_ptr<CudaResources> res)
      : res_(std::move(res)),
        cache_(cached_on_device(res_->device), device_memory(res_->device) / kCacheMaxShare,
               kCacheMaxAge) {}
  CudaAllocator(const CudaAllocator&) = delete;
  CudaAllocator& operator=(const CudaAllocator&) = delete;
  ~CudaAllocator() override {  // may run at process exit, after the runtime: errors ignored
    int previous = -1;
    const bool restore = cudaGetDevice(&previous) == cudaSuccess && previous != res_->device;
    if (restore) (void)cudaSetDevice(res_->device);
    release_kept();
    if (restore) (void)cudaSetDevice(previous);
    (void)cudaGetLastError();
  }
  Device device() const override { return Device::cuda(res_->device); }
  void release_cached() override {
    DeviceGuard guard(res_->device);
    release_kept();
  }

 protected:
  void* do_allocate(size_t bytes) override {
    DeviceGuard guard(res_->device);
    const bool cacheable = bytes >= kCacheMinBytes && !capturing();
    const size_t block = cacheable ? (bytes + kCacheRound - 1) / kCacheRound * kCacheRound : bytes;
    if (cacheable) {
      detail::BlockCache::Taken taken;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        taken = cache_.take(block);
      }
      free_all(taken.evicted);
      if (taken.block) return taken.block;
    }
    void* p = nullptr;
    cudaError_t e = cudaMallocFromPoolAsync(&p, block, res_->pool, res_->stream);
    if (e != cudaSuccess && release_kept() > 0) {  // retried once without the kept blocks
      (void)cudaGetLastError();
      e = cudaMallocFromPoolAsync(&p, block, res_->pool, res_->stream);
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw_error(ErrorKind::Runtime,
                  str("cudaMallocFromPoolAsync of ", bytes, " bytes on cuda:", res_->device,
                      " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
    }
    if (cacheable) {
      std::lock_guard<std::mutex> lock(mutex_);
      cache_.allocated(p, block);
    }
    return p;
  }
  void do_deallocate(void* p, size_t) noexcept override {
    DeviceGuard guard(res_->device);
    detail::BlockCache::Freed freed;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      freed = cache_.freed(p, [this] { return !capturing(); });
    }
    free_all(freed.evicted);
    if (!freed.kept) free_async(p);
  }

 private:
  static constexpr size_t kCacheMinBytes = size_t{1} << 20;
  static constexpr size_t kCacheRound = size_t{2} << 20;  // the driver's mapping granularity
  static constexpr size_t kCacheMaxShare = 8;             // at most 1/8 of the device's memory
  static constexpr uint64_t kCacheMaxAge = 4096;          // requests (a step makes ~6 per layer)
  static size_t device_memory(int device) {
    size_t free_bytes = 0, total = 0;
    DeviceGuard guard(device);
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) (void)cudaGetLastError();
    return total;
  }
  bool capturing() const {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(res_->stream, &st) != cudaSuccess) {
      (void)cudaGetLastError();
      return true;  // unknown: as a capture (no cache)
    }
    return st != cudaStreamCaptureStatusNone;
  }
  void free_async(void* p) noexcept {
    if (cudaFreeAsync(p, res_->stream) != cudaSuccess) (void)cudaGetLastError();
  }
  void free_all(const std::vector<void*>& blocks) noexcept {
    for (void* p : blocks) free_async(p);
  }
  // Every kept block back to the pool (on the current device); how many there were.
  size_t release_kept() noexcept {
    std::vector<void*> kept;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      kept = cache_.release_all();
    }
    free_all(kept);
    return kept.size();
  }

  std::shared_ptr<CudaResources> res_;  // keeps the stream alive while tensors are
  std::mutex mutex_;
  detail::BlockCache cache_;  // freed blocks kept, and the cacheable ones in use (under mutex_)
};

}  // namespace

CudaResources::~CudaResources() {
  // Errors are ignored: this may run at process exit, after the CUDA runtime has shut down.
  int previous = -1;
  const bool restore = cudaGetDevice(&previous) == cudaSuccess && previous != device;
  if (restore) (void)cudaSetDevice(device);
  // The side stream's work ends first: it may write our error word. (Tensors it allocated may
  // keep its resources alive a while longer.)
  if (side && side->stream) (void)cudaStreamSynchronize(side->stream);
  side_allocator.reset();
  side.reset();
  if (stream) (void)cudaStreamSynchronize(stream);
  if (order_event) (void)cudaEventDestroy(order_event);
  if (blas) (void)cublasDestroy(blas);
  if (lt) (void)cublasLtDestroy(lt);
  if (workspace) (void)cudaFree(workspace);
  if (owns_stream && stream) (void)cudaStreamDestroy(stream);
  if (restore) (void)cudaSetDevice(previous);
  (void)cudaGetLastError();
}

namespace {

// A context's resources on `stream` (nullptr: a stream of its own, non-blocking): the device
// pool, a cuBLAS + cuBLASLt handle bound to the stream, their workspace, the zeroed error word
// and the ordering event. Partly built resources are released by their destructor on a throw.
std::shared_ptr<CudaResources> make_resources(int device, cudaStream_t stream) {
  auto res = std::make_shared<CudaResources>();
  res->device = device;
  DeviceGuard guard(device);
  if (stream) {
    res->stream = stream;  // borrowed: the caller keeps it alive
  } else {
    MOEKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&res->stream, cudaStreamNonBlocking));
    res->owns_stream = true;
  }
  MOEKIT_CUDA_CHECK(cudaDeviceGetAttribute(&res->sm_count, cudaDevAttrMultiProcessorCount, device));
  res->pool = device_pool(device);
  MOEKIT_CUDA_CHECK(cudaMalloc(&res->workspace, kWorkspaceBytes + kPointerBytes + sizeof(uint32_t)));
  res->workspace_bytes = kWorkspaceBytes;
  res->gemm_pointers = reinterpret_cast<void**>(static_cast<char*>(res->workspace) + kWorkspaceBytes);
  res->error_word = reinterpret_cast<uint32_t*>(static_cast<char*>(res->workspace) +
                                                kWorkspaceBytes + kPointerBytes);
  MOEKIT_CUDA_CHECK(cudaMemset(res->error_word, 0, sizeof(uint32_t)));
  MOEKIT_CUDA_CHECK(cudaEventCreateWithFlags(&res->order_event, cudaEventDisableTiming));
  MOEKIT_CUBLAS_CHECK(cublasCreate(&res->blas));
  // cublasSetStream resets the workspace to cuBLAS's own pool: set the stream first.
  MOEKIT_CUBLAS_CHECK(cublasSetStream(res->blas, res->stream));
  MOEKIT_CUBLAS_CHECK(cublasSetWorkspace(res->blas, res->workspace, res->workspace_bytes));
  // fp32 compute is exact fp32 (no TF32) and split-K reductions stay in fp32.
  MOEKIT_CUBLAS_CHECK(cublasSetMathMode(
      res->blas, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                           CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  MOEKIT_CUBLAS_CHECK(cublasLtCreate(&res->lt));
  return res;
}

}  // namespace

CudaResources& resources(const Context& ctx) {
  if (!ctx.device().is_cuda() || !detail::ContextAccess::impl(ctx)->cuda) {
    throw_invalid("context", "a CUDA context", ctx.device().to_string());
  }
  return *static_cast<CudaResources*>(detail::ContextAccess::impl(ctx)->cuda.get());
}

DeviceGuard::DeviceGuard(int device) : device_(device) {
  MOEKIT_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device_) MOEKIT_CUDA_CHECK(cudaSetDevice(device_));
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0 && previous_ != device_) (void)cudaSetDevice(previous_);
}

std::string reject_unless_cuda(const Context& ctx) {
  if (!ctx.device().is_cuda()) return str("the context's device is ", ctx.device().to_string());
  return "";
}


std::vector<int64_t> checked_host_counts(const Context& ctx, const Splits& splits, int64_t rows,
                                         const char* argument) {
  std::vector<int64_t> counts = read_counts(ctx, splits);
  if (splits.on_host()) return counts;  // validated by the primitive before dispatch
  // Device counts were only read now: the same checks as host counts, before any GEMM runs.
  check_counts(counts, rows, argument);
  return counts;
}

static_assert(kDeviceCountNegative == Context::kNegativeCount &&
              kDeviceCountsExceedRows == Context::kCountsExceedRows &&
              kDeviceCountsMisaligned == Context::kCountsMisaligned);

CountsOnDevice counts_on_device(const Context& ctx, const Splits& splits, int64_t rows) {
  CountsOnDevice out;
  if (splits.on_host() && splits.device_copy().defined() &&
      splits.device_copy().device() == ctx.device()) {
    out.holder = splits.device_copy();  // resolved once for the call (resolve_splits)
  } else if (splits.on_host()) {
    // Validated by the primitive. Written by kernels from their parameters, not copied from
    // pageable memory: one stream operation fewer per call before the setup kernel, and a CUDA
    // graph can capture it (a replay sees the counts of the capture).
    const std::vector<int64_t>& host = splits.host_counts();
    out.holder = Tensor::empty({static_cast<int64_t>(host.size())}, DType::I64, ctx);
    launch_write_counts(host, out.holder.data_as<int64_t>(), resources(ctx).stream);
  } else {
    out.holder = splits.device_counts();
  }
  out.view.counts = out.holder.data();
  out.view.i64 = out.holder.dtype() == DType::I64;
  out.view.groups = out.holder.numel();
  out.view.rows = rows;
  out.view.error_word = resources(ctx).error_word;
  return out;
}

}  // namespace cuda

namespace detail {

int cuda_device_count() {
  int n = 0;
  // No driver, no GPU, or a driver older than the runtime: no usable device, never an error.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

void init_cuda_context(ContextImpl& impl, int device, void* stream) {
  auto res = cuda::make_resources(device, static_cast<cudaStream_t>(stream));
  impl.stream = res->stream;
  impl.allocator = std::make_shared<cuda::CudaAllocator>(res);
  impl.cuda = std::move(res);
}

std::shared_ptr<ContextImpl> cuda_side_context(const Context& ctx) {
  auto& res = cuda::resources(ctx);
  if (!res.side) {
    cuda::DeviceGuard guard(res.device);
    if (cuda::stream_capturing(res.stream)) return nullptr;
    int priority = 0;  // the side stream's work is as urgent as its owner's
    MOEKIT_CUDA_CHECK(cudaStreamGetPriority(res.stream, &priority));
    cudaStream_t side_stream = nullptr;
    MOEKIT_CUDA_CHECK(cudaStreamCreateWithPriority(&side_stream, cudaStreamNonBlocking, priority));
    std::shared_ptr<cuda::CudaResources> side;
    try {
      side = cuda::make_resources(res.device, side_stream);
    } catch (...) {
      (void)cudaStreamDestroy(side_stream);
      throw;
    }
    side->owns_stream = true;
    side->error_word = res.error_word;
    res.side_allocator = std::make_shared<cuda::CudaAllocator>(side);
    res.side = std::move(side);
  }
  auto impl = std::make_shared<ContextImpl>();
  impl->device = ctx.device();
  impl->stream = res.side->stream;
  impl->allocator = res.side_allocator;
  impl->threads = 1;
  impl->backend = ctx.forced_backend();
  impl->sm_margin = ctx.sm_margin();
  impl->cuda = res.side;
  impl->log = detail::ContextAccess::impl(ctx)->log;
  return impl;
}

Tensor cuda_counts_to_device(const Context& ctx, const std::vector<int64_t>& counts) {
  auto& res = cuda::resources(ctx);
  cuda::DeviceGuard guard(res.device);
  Tensor t = Tensor::empty({static_cast<int64_t>(counts.size())}, DType::I64, ctx);
  if (!counts.empty()) cuda::launch_write_counts(counts, t.data_as<int64_t>(), res.stream);
  return t;
}

bool cuda_stream_capturing(const Context& ctx) {
  if (!ctx.device().is_cuda()) return false;
  auto& res = cuda::resources(ctx);
  cuda::DeviceGuard guard(res.device);
  return cuda::stream_capturing(res.stream);
}

void cuda_order_after(const Context& to, const Context& from) {
  auto& f = cuda::resources(from);
  auto& t = cuda::resources(to);
  if (f.stream == t.stream) return;
  cuda::DeviceGuard guard(f.device);
  MOEKIT_CUDA_CHECK(cudaEventRecord(f.order_event, f.stream));
  MOEKIT_CUDA_CHECK(cudaStreamWaitEvent(t.stream, f.order_event, 0));
}

void cuda_copy(const Context& ctx, void* dst, Device dst_device, const void* src,
               Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (ctx.device().is_cuda()) {
    auto& res = cuda::resources(ctx);
    cuda::DeviceGuard guard(res.device);
    MOEKIT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, res.stream));
    // The host may read what lands there as soon as we return.
    if (dst_device.is_cpu()) MOEKIT_CUDA_CHECK(cudaStreamSynchronize(res.stream));
    return;
  }
  // A CPU context moving CUDA memory: no stream of its own, so a synchronous copy.
  cuda::DeviceGuard guard(dst_device.is_cuda() ? dst_device.index : src_device.index);
  MOEKIT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

uint32_t cuda_take_error_bits(const Context& ctx) {
  auto& res = cuda::resources(ctx);
  cuda::DeviceGuard guard(res.device);
  uint32_t bits = 0;
  MOEKIT_CUDA_CHECK(cudaMemcpyAsync(&bits, res.error_word, sizeof bits, cudaMemcpyDeviceToHost,
                                    res.stream));
  MOEKIT_CUDA_CHECK(cudaMemsetAsync(res.error_word, 0, sizeof bits, res.stream));
  MOEKIT_CUDA_CHECK(cudaStreamSynchronize(res.stream));
  return bits;
}

int cuda_sm_count(const Context& ctx) {
  return cuda::resources(ctx).sm_count;
}

void cuda_synchronize(const Context& ctx) {
  auto& res = cuda::resources(ctx);
  cuda::DeviceGuard guard(res.device);
  MOEKIT_CUDA_CHECK(cudaStreamSynchronize(res.stream));
}

void cuda_release_cached_memory(const Context& ctx) {
  auto& res = cuda::resources(ctx);
  cuda::DeviceGuard guard(res.device);
  for (cudaStream_t s : {res.stream, res.side ? res.side->stream : nullptr}) {
    if (s && cuda::stream_capturing(s)) {
      throw_error(ErrorKind::Unsupported,
                  "release_cached_memory: the context's stream is being captured into a CUDA "
                  "graph (the call waits for the stream; run it outside the capture)");
    }
  }
  ctx.allocator().release_cached();
  if (res.side_allocator) res.side_allocator->release_cached();
  // The kept blocks' frees (and every free queued before) complete, then the pool lets go of
  // what no allocation holds: it never trims by itself (device_pool's release threshold).
  if (res.side && res.side->stream) MOEKIT_CUDA_CHECK(cudaStreamSynchronize(res.side->stream));
  MOEKIT_CUDA_CHECK(cudaStreamSynchronize(res.stream));
  MOEKIT_CUDA_CHECK(cudaMemPoolTrimTo(res.pool, 0));
}

size_t cuda_memory_reserved(const Context& ctx) {
  auto& res = cuda::resources(ctx);
  cuda::DeviceGuard guard(res.device);
  uint64_t reserved = 0;  // the attribute is a cuuint64_t (64 bits)
  MOEKIT_CUDA_CHECK(cudaMemPoolGetAttribute(res.pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  return static_cast<size_t>(reserved);
}

}  // namespace detail
}  // namespace moekit
