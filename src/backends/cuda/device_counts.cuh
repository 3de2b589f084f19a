// Internal (device code): split counts read by kernels from device memory — the one place that
// decides, on the device, whether counts are valid (SPEC §1: every count >= 0, S = Σ m_g <= T).
//
// Kernels that take a DeviceCounts never need the counts on the host: they are capturable in a
// CUDA graph and replay with whatever counts the device holds. Invalid counts make a kernel
// write nothing; it ORs the reason into the context's error word (Context::device_error_bits,
// bit values Context::kNegativeCount / kCountsExceedRows) for check_device_errors() to raise.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/device_counts.h"

namespace moekit::cuda {

/// m_g.
__device__ __forceinline__ int64_t count_at(const DeviceCounts& c, int64_t g) {
  return c.i64 ? static_cast<const int64_t*>(c.counts)[g]
               : static_cast<int64_t>(static_cast<const int32_t*>(c.counts)[g]);
}

/// Why one count m_g is invalid on its own (0: it is not): negative, or above T (then the sum
/// cannot be checked without overflow: the call is invalid anyway). The sum S <= T is the caller's.
/// With `multiple` > 1 a count that is not a multiple of it is invalid too (misaligned).
__device__ __forceinline__ uint32_t count_error(int64_t m, int64_t rows, int64_t multiple = 1) {
  return m < 0               ? kDeviceCountNegative
         : m > rows          ? kDeviceCountsExceedRows
         : multiple > 1 && m % multiple != 0 ? kDeviceCountsMisaligned
                             : 0u;
}

/// ORs `reason` (non-zero) into the error word, from thread 0 of block (0,0,0) only: one report per
/// launch.
__device__ __forceinline__ void report_count_error(const DeviceCounts& c, uint32_t reason) {
  if (c.error_word && threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) {
    atomicOr(c.error_word, reason);
  }
}

/// Block-cooperative (every thread of the block calls it; blockDim.x a multiple of 32, <= 1024):
/// S = Σ m_g when the counts are valid, else -1, and then thread 0 of block (0,0,0) ORs the
/// reason into error_word (one report per launch). A count above T is caught on its own, so the
/// sum cannot overflow. O(G / blockDim.x) loads per thread; the counts are L2-resident after the
/// first block. Ends with a barrier, so shared memory may be reused right after.
/// `multiple` as count_error's.
__device__ __forceinline__ int64_t block_valid_rows(const DeviceCounts& c, int64_t multiple = 1) {
  __shared__ unsigned long long warp_sums[32];
  __shared__ uint32_t bad;
  if (threadIdx.x == 0) bad = 0;
  __syncthreads();
  unsigned long long sum = 0;
  uint32_t my_bad = 0;
  for (int64_t g = threadIdx.x; g < c.groups; g += blockDim.x) {
    const int64_t m = count_at(c, g);
    const uint32_t why = count_error(m, c.rows, multiple);
    my_bad |= why;
    if (!why) sum += static_cast<unsigned long long>(m);
  }
  if (my_bad) atomicOr(&bad, my_bad);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  unsigned long long total = 0;
  for (int w = 0; w < warps; ++w) total += warp_sums[w];
  uint32_t reason = bad;
  if (reason == 0 && total > static_cast<unsigned long long>(c.rows)) reason = kDeviceCountsExceedRows;
  if (reason != 0) report_count_error(c, reason);
  __syncthreads();
  return reason == 0 ? static_cast<int64_t>(total) : -1;
}

/// off_g = Σ_{j<g} m_j for one group (the counts already known valid), by the calling thread
/// alone: O(g) loads. For kernels whose blocks each own one group of a small-G problem.
__device__ __forceinline__ int64_t group_offset(const DeviceCounts& c, int64_t g) {
  int64_t off = 0;
  for (int64_t j = 0; j < g; ++j) off += count_at(c, j);
  return off;
}

}  // namespace moekit::cuda
