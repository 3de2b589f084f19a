// Internal: how the sm90 kernels are launched and ordered after the kernel before them — the launch
// shape and cudaLaunchKernelEx call, programmatic dependent launch's two sides, and the device's SM
// count. No CUTLASS: included by kernel_common.cuh and blocked_scheduler.cuh, and usable by a kernel
// that does not include CUTLASS.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <mutex>
#include <utility>

#include "backends/cuda/check.h"
#include "moekit/core/error.h"

namespace moekit::cuda::sm90 {

// The first thing a kernel launched with programmatic dependent launch does before it reads what
// the kernel before it wrote: griddepcontrol.wait (a no-op without that launch attribute) returns
// once that grid has completed and its writes are visible. (CUTLASS 4.2's ptr-array kernels do not
// wait themselves: blocked_scheduler.cuh, GridDependencyWait.)
__host__ __device__ inline void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the kernel launched next on the stream with programmatic dependent launch (the GEMM after
// its setup kernel) be scheduled now; it still waits for this grid to complete before it reads
// anything (wait_for_prior_grid). Without that launch attribute on the next kernel: no effect.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// How a kernel is launched (launch_kernel): grid, block, dynamic shared memory, cluster, and
// programmatic dependent launch after the kernel before it on the stream.
struct LaunchShape {
  dim3 grid{1, 1, 1};
  dim3 block{1, 1, 1};
  size_t smem = 0;
  dim3 cluster{1, 1, 1};  // the cluster attribute is set only for clusters of more than one CTA
  bool programmatic = false;
  const char* name = "kernel";  // what a failed launch's error names: "setup", a GEMM's label
};

// Every sm90 launch goes through cudaLaunchKernelEx: on the H200 machine its host cost is below
// a <<<...>>> launch's for these large parameter blocks, and CUTLASS's GemmUniversalAdapter::run,
// which it replaces for the GEMMs, sets the kernel's non-portable-cluster-size attribute on every
// clustered launch (a tenth of a small call's host time) — clusters of 2 need no such attribute
// (design/PERFORMANCE-LOG.md, the host's cost of a call).
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), const LaunchShape& shape, cudaStream_t stream,
                   Args&&... args) {
  cudaLaunchAttribute attrs[2]{};
  unsigned n = 0;
  if (shape.cluster.x * shape.cluster.y * shape.cluster.z > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = shape.cluster.x;
    attrs[n].val.clusterDim.y = shape.cluster.y;
    attrs[n].val.clusterDim.z = shape.cluster.z;
    ++n;
  }
  if (shape.programmatic) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = shape.grid;
  config.blockDim = shape.block;
  config.dynamicSmemBytes = shape.smem;
  config.stream = stream;
  config.attrs = n > 0 ? attrs : nullptr;
  config.numAttrs = n;
  const cudaError_t e = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (e != cudaSuccess) {
    throw_status(str("launch of sm90 kernel '", shape.name, "'").c_str(), cudaGetErrorName(e), cudaGetErrorString(e),
                 __FILE__, __LINE__);
  }
}

// The per-device caches (facts queried once per device) hold 64 devices.
template <class T>
T& device_slot(std::array<T, 64>& cache, int device) {
  if (device < 0 || device >= static_cast<int>(cache.size())) {
    throw_error(ErrorKind::Unsupported, str("sm90 grouped GEMM: device index ", device, " >= 64"));
  }
  return cache[static_cast<size_t>(device)];
}

// The SMs of `device` (queried once).
inline int device_sm_count(int device) {
  static std::mutex mutex;
  static std::array<int, 64> cache{};
  std::lock_guard<std::mutex> lock(mutex);
  int& sms = device_slot(cache, device);
  if (sms == 0) MOEKIT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

}  // namespace moekit::cuda::sm90
