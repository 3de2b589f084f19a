// Internal (device code): fp32 conversions of the storage types, a deterministic block sum, and
// the group of a row in a prefix table of group offsets.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace moekit::cuda {

/// The group of a valid row r < off[groups]: the last g with off[g] <= r, which is non-empty
/// (off[g + 1] > r), so zero-row groups are skipped. off[0..groups]: prefix offsets.
__device__ __forceinline__ int64_t group_of_row(const int64_t* off, int64_t groups, int64_t r) {
  int64_t lo = 0, hi = groups - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) >> 1;
    if (off[mid] <= r) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

/// Sum of `v` over the block (blockDim.x a multiple of 32, at most 1024), in a fixed order:
/// warp butterflies, then warp 0 over the warp sums. Every thread gets the result. `scratch`
/// holds 32 floats; the call ends with a barrier, so it may be called again right after.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float s = lane < warps ? scratch[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  __syncthreads();
  return s;
}

}  // namespace moekit::cuda
