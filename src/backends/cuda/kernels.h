// Internal: host launchers of moekit's own CUDA kernels (device code lives in the .cu files
// named beside each). Arguments are already validated; every launcher queues work on `stream`
// and checks the launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "moekit/core/tensor.h"

namespace moekit::cuda {

// pointer_arrays.cu: the device arrays of operand pointers of a cublasGemmGroupedBatchedEx call,
// written by a kernel from its (by-value) parameters: dst[0, n) = a, dst[n, 2n) = b,
// dst[2n, 3n) = c. dst holds 3 · kMaxBatchedGemms pointers (CudaResources::gemm_pointers).
inline constexpr size_t kMaxBatchedGemms = 1024;  // 24 KB of kernel parameters (sm_70+: < 32 KB)
struct GemmPointers {
  int count;
  const void* a[kMaxBatchedGemms];
  const void* b[kMaxBatchedGemms];
  void* c[kMaxBatchedGemms];
};
void launch_write_gemm_pointers(const GemmPointers& ptrs, void** dst, cudaStream_t stream);

// pointer_arrays.cu: host counts written to dst[0, counts.size()) by kernels from their by-value
// parameters, kCountsPerLaunch per launch: stream-ordered with no copy from pageable host memory,
// and capturable in a CUDA graph (which replays the counts it captured).
inline constexpr int kCountsPerLaunch = 2048;  // 16 KB of kernel parameters (sm_70+: < 32 KB)
void launch_write_counts(const std::vector<int64_t>& counts, int64_t* dst, cudaStream_t stream);

// fill.cu: each of the `elems` elements at `data` set to the `elem_bytes`-byte pattern `value`.
void launch_fill(void* data, size_t elems, const void* value, size_t elem_bytes, int sm_count,
                 cudaStream_t stream);

// bias.cu: out[r, :] = bias[g, :] for every row r of group g (rows [S, T) untouched): the C of
// a beta = 1 group-M GEMM when the cuBLASLt bias epilogue is not used, and the whole result of
// the degenerate K = 0 GEMM. Host row offsets (offsets_of(counts)): that GEMM has the counts on
// the host already. The bias kernels that take device counts (no host synchronisation) are
// reached through the primitive tables only: cuda_backend.h and cuda_activation.h.
void launch_grouped_bias_broadcast(const Tensor& bias, const std::vector<int64_t>& offsets,
                                   const Tensor& out, cudaStream_t stream);

}  // namespace moekit::cuda
