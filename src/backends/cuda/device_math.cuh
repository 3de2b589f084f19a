// Internal (device code): fp32 conversions of the storage types, a deterministic block sum, and
// the group of a row in a prefix table of group offsets.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "moekit/primitives/activation.h"

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

// ---- SwiGLU's element math (activation.cu's kernels, and quantize.cu's SwiGLU-fed quantize,
// which must produce the same z bit for bit)

/// h's column of z column j's gate part a_j and linear part b_j (GluLayout, activation.h).
__device__ __forceinline__ int64_t gate_col(int64_t j, bool interleaved) {
  return interleaved ? 2 * kGluInterleaveBlock * (j / kGluInterleaveBlock) + j % kGluInterleaveBlock
                     : j;
}
__device__ __forceinline__ int64_t lin_col(int64_t j, int64_t F, bool interleaved) {
  return interleaved ? gate_col(j, true) + kGluInterleaveBlock : F + j;
}
__device__ __forceinline__ float sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }
/// z = p · silu(a) · b in fp32, each product rounded in the CPU oracle's order (no contraction).
__device__ __forceinline__ float swiglu_value(float a, float b, float p) {
  return __fmul_rn(p, __fmul_rn(__fmul_rn(a, sigmoid(a)), b));
}
/// SwiGLU's backward at one element (z = p·silu(a)·b, dz = g): the gate part's gradient
/// da = p·g·b·silu'(a), the linear part's db = p·g·silu(a), and g·silu(a)·b, dp's term — each
/// product rounded in the CPU oracle's order.
struct DSwigluValues {
  float da, db, dp;
};
__device__ __forceinline__ DSwigluValues dswiglu_values(float a, float b, float g, float p) {
  const float sig = sigmoid(a);
  const float silu = __fmul_rn(a, sig);
  const float dsilu = __fmul_rn(sig, __fadd_rn(1.0f, __fmul_rn(a, __fsub_rn(1.0f, sig))));
  const float pdz = __fmul_rn(p, g);
  return {__fmul_rn(__fmul_rn(pdz, b), dsilu), __fmul_rn(pdz, silu), __fmul_rn(g, __fmul_rn(silu, b))};
}

}  // namespace moekit::cuda
