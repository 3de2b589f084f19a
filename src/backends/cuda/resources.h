// Internal: what a CUDA Context owns — its stream, cuBLAS/cuBLASLt handles and their workspace —
// and the helpers every CUDA backend file uses to reach them.
//
// One CudaResources per Context::cuda() call, shared by the copies of that context (with_backend,
// with_allocator) and kept alive by the context's allocator, so tensors allocated on the stream
// can be freed on it after the context itself is gone. A context (and its copies) must be used
// from one host thread at a time: the cuBLAS handle is not thread-safe.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "backends/cuda/device_counts.h"
#include "moekit/core/context.h"
#include "moekit/core/splits.h"
#include "moekit/core/tensor.h"

namespace moekit::cuda {

/// A cuBLASLt algorithm chosen once for a problem and reused (keyed by everything that the
/// heuristic looks at: types, transposes, sizes, leading dimensions, pointer alignments, the
/// SM-count target).
struct LtPlanKey {
  int dtype, op_a, epilogue;
  int64_t m, n, k, lda, ldb, ldd;
  int align_a, align_b, align_d, align_bias;
  int sms;  // gemm_sm_target: 0 = every SM
  auto tie() const {
    return std::tie(dtype, op_a, epilogue, m, n, k, lda, ldb, ldd, align_a, align_b, align_d,
                    align_bias, sms);
  }
  friend bool operator<(const LtPlanKey& x, const LtPlanKey& y) { return x.tie() < y.tie(); }
};

struct CudaResources {
  int device = 0;
  cudaStream_t stream = nullptr;
  bool owns_stream = false;
  cudaMemPool_t pool = nullptr;        // per-device pool shared by every context (caches memory)
  cublasHandle_t blas = nullptr;       // bound to `stream`, using `workspace`
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;           // cudaMalloc'ed once; used by cuBLAS and cuBLASLt calls,
  size_t workspace_bytes = 0;          // which run in stream order and never overlap
  void** gemm_pointers = nullptr;      // after the workspace: 3 · kMaxBatchedGemms pointers for
                                       // cublasGemmGroupedBatchedEx (same allocation)
  int sm_count = 0;
  uint32_t* error_word = nullptr;      // device argument errors (Context::device_error_bits),
                                       // after the pointers (same allocation), zeroed at creation;
                                       // a side stream's points at its owner's
  cudaEvent_t order_event = nullptr;   // recorded on `stream` when another stream must wait for
                                       // what is queued here (detail::cuda_order_after)
  // The side stream (detail::cuda_side_context): its resources and allocator, made on first use.
  std::shared_ptr<CudaResources> side;
  std::shared_ptr<Allocator> side_allocator;

  std::mutex lt_mutex;
  std::map<LtPlanKey, cublasLtMatmulAlgo_t> lt_plans;

  CudaResources() = default;
  CudaResources(const CudaResources&) = delete;
  CudaResources& operator=(const CudaResources&) = delete;
  ~CudaResources();  // synchronises the stream (and the side's), then releases everything
                     // (errors ignored)
};

/// The resources of a CUDA context (throws InvalidArgument for a CPU context).
CudaResources& resources(const Context& ctx);

/// The SMs a context's persistent GEMM kernels may use (Context::with_sm_margin): 0 = all of them.
inline int gemm_sm_target(const Context& ctx) {
  return ctx.sm_margin() > 0 ? resources(ctx).sm_count - ctx.sm_margin() : 0;
}

/// Makes `device` current for the scope and restores the previous device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  int device_ = -1;
};

/// "" when the context can run CUDA backends, else the reason (for the tables' rejects()).
std::string reject_unless_cuda(const Context& ctx);

/// Host copies of the group counts, validated (each >= 0, S <= rows) when they came from the GPU.
/// Device counts are copied to the host: this synchronises the context's stream. Only the cuBLAS
/// GEMM entries use it (they are not graph-capturable with device splits; see cuda_backend.h);
/// moekit's own kernels take the counts on the device instead (counts_on_device,
/// device_counts.h).
std::vector<int64_t> checked_host_counts(const Context& ctx, const Splits& splits, int64_t rows,
                                         const char* argument = "splits");

/// The counts of `splits` where kernels can read them, with no host synchronisation: device
/// splits as they are; host splits (already validated) copied to the device in stream order.
/// `holder` keeps the copy alive (freed in stream order after the kernels that use it).
struct CountsOnDevice {
  Tensor holder;
  DeviceCounts view;
};
CountsOnDevice counts_on_device(const Context& ctx, const Splits& splits, int64_t rows);

}  // namespace moekit::cuda
