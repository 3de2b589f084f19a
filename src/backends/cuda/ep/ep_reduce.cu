// ep_reduce: the destination's side of combine / dispatch_backward (src/ep/ep_device.h). CPU
// reference: reduce_and_return in src/ep/expert_parallel.cpp.
//
// A block per (source, slot) received, threads over the hidden elements: the kept rows of its
// entries (ascending local expert) read from `in` [R, H], summed in fp32 by the tree over local
// expert ids, stored once into the source's ret [W dst][Tm][H] through its base, with the flag
// that says what the entry holds: nothing (every row dropped), the one row in the dtype (exact,
// fewer bytes), or the fp32 sum. With dw_rows: each entry's d(weight) into the source's ret_w.
// Nothing when the dispatch was refused.
#include "backends/cuda/ep/ep_common.cuh"
#include "backends/cuda/ep/ep_tree.cuh"

namespace moekit::cuda::ep {
namespace {

constexpr int32_t kNothing = 0, kRowInDtype = 1, kPartialF32 = 2;  // as the CPU engine's

template <class T>
__global__ void ep_reduce_kernel(EpDeviceArgs a, const int64_t* plan, const int32_t* dst_e,
                                 const int32_t* dst_j, const int32_t* dst_row, const T* in,
                                 const float* dw) {
  if (!may_store(a, plan)) return;
  const int64_t k = a.k, L = a.L, Tm = a.Tm, H = a.H;
  const int src = static_cast<int>(blockIdx.y);
  const int64_t sent = plan[plan_sent(a.W, L, src)];
  __shared__ int32_t keys[detail::kEpMaxTopk], rows[detail::kEpMaxTopk];
  __shared__ int n;
  for (int64_t slot = blockIdx.x; slot < sent; slot += gridDim.x) {
    const int64_t at = static_cast<int64_t>(src) * Tm + slot;            // here: [src][slot]
    const int64_t back = static_cast<int64_t>(a.r) * Tm + slot;          // at src: [dst][slot]
    if (threadIdx.x == 0) {
      int m = 0;
      for (int64_t i = 0; i < k; ++i) {
        const int32_t e = dst_e[at * k + i];
        if (e < 0) break;
        const int32_t row = dst_row[at * k + i];
        if (dw) peer<float>(a.ret_w, src)[back * k + dst_j[at * k + i]] = row >= 0 ? dw[row] : 0.0f;
        if (row < 0) continue;
        keys[m] = e;
        rows[m] = row;
        ++m;
      }
      n = m;
      peer<int32_t>(a.ret_flag, src)[back] = m == 0 ? kNothing : (m == 1 ? kRowInDtype : kPartialF32);
    }
    __syncthreads();
    float* ret = peer<float>(a.ret, src) + back * H;
    if (n == 1) {
      T* out = reinterpret_cast<T*>(ret);
      for (int64_t h = threadIdx.x; h < H; h += blockDim.x) out[h] = in[rows[0] * H + h];
    } else if (n > 1) {
      for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
        int key[detail::kEpMaxTopk];
        float v[detail::kEpMaxTopk];
        for (int i = 0; i < n; ++i) {
          key[i] = keys[i];
          v[i] = to_float(in[rows[i] * H + h]);
        }
        ret[h] = tree_sum(key, v, n);
      }
    }
    __syncthreads();
  }
}

}  // namespace
}  // namespace moekit::cuda::ep

namespace moekit::detail {

void ep_reduce(const Context& ctx, const EpDeviceArgs& a, const EpDeviceRouting& rt,
               const Tensor& in, const Tensor& dw_rows) {
  cuda::DeviceGuard guard(ctx.device().index);  // CudaRanks: a thread per GPU
  const dim3 grid(cuda::ep::grid_of(a.Tm), static_cast<unsigned>(a.W));
  cuda::ep::with_dtype(a.dtype, [&](auto zero) {
    using T = decltype(zero);
    cuda::ep::ep_reduce_kernel<T><<<grid, 128, 0, static_cast<cudaStream_t>(ctx.stream())>>>(
        a, rt.plan.data_as<int64_t>(), rt.dst_e.data_as<int32_t>(), rt.dst_j.data_as<int32_t>(),
        rt.dst_row.data_as<int32_t>(), static_cast<const T*>(in.data()),
        dw_rows.defined() ? dw_rows.data_as<float>() : nullptr);
  });
  MOEKIT_CUDA_CHECK_LAUNCH();
}

}  // namespace moekit::detail
