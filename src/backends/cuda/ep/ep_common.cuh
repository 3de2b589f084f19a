// Internal (device code) shared by the expert-parallel kernels (src/ep/ep_device.h): the
// symmetric layout's index math, the dtype dispatch and the refused-call guard.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backends/cuda/check.h"
#include "backends/cuda/device_math.cuh"
#include "backends/cuda/resources.h"
#include "ep/ep_device.h"
#include "moekit/core/dtype.h"

namespace moekit::cuda::ep {

using detail::EpDeviceArgs;

// plan words (EpDeviceRouting::plan)
__host__ __device__ inline int64_t plan_off(int64_t e) { return 1 + e; }
__host__ __device__ inline int64_t plan_kept(int64_t L, int64_t e) { return L + 2 + e; }
__host__ __device__ inline int64_t plan_base(int64_t L, int64_t src, int64_t e) {
  return 2 * L + 2 + src * L + e;
}
__host__ __device__ inline int64_t plan_sent(int64_t W, int64_t L, int64_t src) {
  return 2 * L + 2 + W * L + src;
}

template <class P>
__device__ inline P* peer(const detail::EpPeers& p, int rank) {
  return static_cast<P*>(p.p[rank]);
}

// In-band agreement (EpDeviceArgs::verdict >= 0): whether some rank refused this call's arguments
// — its verdict word, read from every rank's status block after the call's first barrier.
__device__ inline bool refused_by_a_rank(const EpDeviceArgs& a) {
  if (a.verdict < 0) return false;
  for (int q = 0; q < a.W; ++q) {
    if (peer<const uint32_t>(a.status, q)[a.verdict] != 0) return true;
  }
  return false;
}
// Whether a kernel of the call may store: the dispatch was accepted (plan[0]) and no rank refused
// this call. A refusal is ORed into the error word (kEpPeerRefused) by the grid's first thread.
__device__ inline bool may_store(const EpDeviceArgs& a, const int64_t* plan) {
  if (refused_by_a_rank(a)) {
    if (blockIdx.x == 0 && threadIdx.x == 0 && a.error_word) {
      atomicOr(a.error_word, detail::kEpPeerRefusedBit);
    }
    return false;
  }
  return plan == nullptr || plan[0] != 0;
}

// Copies `bytes` (a multiple of 4) from src to dst, 16 bytes a store when both are 16-byte
// aligned and bytes % 16 == 0, by the threads [tid, tid + n).
__device__ inline void copy_row(void* dst, const void* src, int64_t bytes, int tid, int n) {
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | bytes) & 15) == 0) {
    const auto* s = static_cast<const uint4*>(src);
    auto* d = static_cast<uint4*>(dst);
    for (int64_t i = tid; i < bytes / 16; i += n) d[i] = s[i];
  } else {
    const auto* s = static_cast<const uint16_t*>(src);
    auto* d = static_cast<uint16_t*>(dst);
    for (int64_t i = tid; i < bytes / 2; i += n) d[i] = s[i];
  }
}
__device__ inline void zero_row(void* dst, int64_t bytes, int tid, int n) {
  auto* d = static_cast<uint16_t*>(dst);
  for (int64_t i = tid; i < bytes / 2; i += n) d[i] = 0;
}

// Calls f(T{}) with T the storage type of dtype (f32, f16, bf16).
template <class F>
void with_dtype(int dtype, F&& f) {
  switch (static_cast<DType>(dtype)) {
    case DType::F32: f(float{}); break;
    case DType::F16: f(__half{}); break;
    default: f(__nv_bfloat16{}); break;
  }
}

inline unsigned grid_of(int64_t n) {
  return static_cast<unsigned>(n < 1 ? 1 : (n > 65535 ? 65535 : n));
}

}  // namespace moekit::cuda::ep
