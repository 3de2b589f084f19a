// Small arrays written on the device by kernels from their by-value parameters (stream-ordered:
// no host synchronisation, no copy from pageable host memory, capturable in a CUDA graph): the
// pointer arrays of a cublasGemmGroupedBatchedEx call, and host counts. See kernels.h.
#include <algorithm>
#include <cstddef>

#include "backends/cuda/check.h"
#include "backends/cuda/kernels.h"

namespace moekit::cuda {
namespace {

__global__ void write_gemm_pointers(const __grid_constant__ GemmPointers ptrs, void** dst) {
  const int n = ptrs.count;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    dst[i] = const_cast<void*>(ptrs.a[i]);
    dst[n + i] = const_cast<void*>(ptrs.b[i]);
    dst[2 * n + i] = ptrs.c[i];
  }
}

struct CountsChunk {
  int n;
  int64_t v[kCountsPerLaunch];
};

__global__ void write_counts(const __grid_constant__ CountsChunk chunk, int64_t* dst) {
  for (int i = threadIdx.x; i < chunk.n; i += blockDim.x) dst[i] = chunk.v[i];
}

}  // namespace

void launch_write_counts(const std::vector<int64_t>& counts, int64_t* dst, cudaStream_t stream) {
  const size_t total = counts.size();
  for (size_t start = 0; start < total; start += kCountsPerLaunch) {
    CountsChunk chunk;
    chunk.n = static_cast<int>(std::min<size_t>(kCountsPerLaunch, total - start));
    std::copy_n(counts.begin() + static_cast<std::ptrdiff_t>(start), chunk.n, chunk.v);
    write_counts<<<1, 256, 0, stream>>>(chunk, dst + start);
    MOEKIT_CUDA_CHECK_LAUNCH();
  }
}

void launch_write_gemm_pointers(const GemmPointers& ptrs, void** dst, cudaStream_t stream) {
  write_gemm_pointers<<<1, 256, 0, stream>>>(ptrs, dst);
  MOEKIT_CUDA_CHECK_LAUNCH();
}

}  // namespace moekit::cuda
