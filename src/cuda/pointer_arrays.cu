// The device pointer arrays of a cublasGemmGroupedBatchedEx call, written by one small kernel
// from its by-value parameters (stream-ordered: no host synchronisation and no copy from
// pageable host memory). See kernels.h.
#include "cuda/check.h"
#include "cuda/kernels.h"

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

}  // namespace

void launch_write_gemm_pointers(const GemmPointers& ptrs, void** dst, cudaStream_t stream) {
  write_gemm_pointers<<<1, 256, 0, stream>>>(ptrs, dst);
  MOEKIT_CUDA_CHECK_LAUNCH();
}

}  // namespace moekit::cuda
