// Internal: turning CUDA runtime / cuBLAS status codes into moekit::Error(ErrorKind::Runtime).
//
//   MOEKIT_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream));
//   MOEKIT_CUBLAS_CHECK(cublasGemmEx(...));
//   MOEKIT_CUDA_CHECK_LAUNCH();   // after a <<<...>>> launch
// The message names the call, the status name and its description, and where it happened:
//   moekit: runtime error: cudaMallocFromPoolAsync(&p, bytes, pool, stream) failed:
//   cudaErrorMemoryAllocation (out of memory) [src/backends/cuda/runtime.cu:123]
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstring>

#include "moekit/core/error.h"

namespace moekit::cuda {

[[noreturn]] inline void throw_status(const char* call, const char* status, const char* what,
                                      const char* file, int line) {
  const char* src = std::strstr(file, "src/");  // a path relative to the repository
  if (src) file = src;
  throw_error(ErrorKind::Runtime, str(call, " failed: ", status, " (", what, ") [", file, ":", line, "]"));
}

inline void check_cuda(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess) throw_status(call, cudaGetErrorName(e), cudaGetErrorString(e), file, line);
}

inline void check_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw_status(call, cublasGetStatusName(s), cublasGetStatusString(s), file, line);
  }
}

}  // namespace moekit::cuda

#define MOEKIT_CUDA_CHECK(call) ::moekit::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define MOEKIT_CUBLAS_CHECK(call) ::moekit::cuda::check_cublas((call), #call, __FILE__, __LINE__)
#define MOEKIT_CUDA_CHECK_LAUNCH() \
  ::moekit::cuda::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

namespace moekit::cuda {

// Whether work queued on `stream` is being captured into a CUDA graph (a failed query throws).
inline bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  MOEKIT_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace moekit::cuda
