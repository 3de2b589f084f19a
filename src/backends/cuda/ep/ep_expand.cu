// ep_expand: the destination's rows from its own staging (src/ep/ep_device.h). CPU reference:
// dispatch phase (4) and expand_rows in src/ep/expert_parallel.cpp.
//
// A block per (source, slot) received: with `first` (dispatch) its entries' rows from the plan —
// row = base[src][e] + (the entry's rank within its source's rows of e), kept while it is below
// off_e + kept_e, else dropped (-1) — which is the CPU engine's (expert, source, slot) order
// without atomics; the entries are kept in the handle (dst_e/j/row) and each kept row gets the
// entry's weight. Then the staged row copied into each of its recv rows; a second launch zeroes
// the padding rows [off_e + kept_e, off_{e+1}) (and their weights). Nothing when refused.
#include "backends/cuda/ep/ep_common.cuh"

namespace moekit::cuda::ep {
namespace {

__global__ void ep_expand_kernel(EpDeviceArgs a, const int64_t* plan, char* recv, float* weights,
                                 int32_t* dst_e, int32_t* dst_j, int32_t* dst_row, bool first,
                                 int64_t row_bytes) {
  if (!may_store(a, plan)) return;
  const int64_t k = a.k, L = a.L, Tm = a.Tm;
  const int src = static_cast<int>(blockIdx.y);
  const int64_t sent = plan[plan_sent(a.W, L, src)];
  __shared__ int32_t rows[detail::kEpMaxTopk];
  for (int64_t slot = blockIdx.x; slot < sent; slot += gridDim.x) {
    const int64_t at = static_cast<int64_t>(src) * Tm + slot;
    if (threadIdx.x < k) {
      const int64_t i = threadIdx.x;
      if (first) {
        const int32_t e = peer<const int32_t>(a.meta_e, a.r)[at * k + i];
        int32_t row = -1;
        if (e >= 0) {
          const int64_t p = plan[plan_base(L, src, e)] + peer<const int32_t>(a.meta_q, a.r)[at * k + i];
          if (p < plan[plan_off(e)] + plan[plan_kept(L, e)]) row = static_cast<int32_t>(p);
        }
        dst_e[at * k + i] = e;
        dst_j[at * k + i] = peer<const int32_t>(a.meta_j, a.r)[at * k + i];
        dst_row[at * k + i] = row;
        if (row >= 0 && weights) weights[row] = peer<const float>(a.meta_w, a.r)[at * k + i];
        rows[i] = row;
      } else {
        rows[i] = dst_row[at * k + i];
      }
    }
    __syncthreads();
    const char* staged = peer<const char>(a.stage_x, a.r) + at * row_bytes;
    for (int64_t i = 0; i < k; ++i) {
      if (rows[i] >= 0) copy_row(recv + rows[i] * row_bytes, staged, row_bytes, threadIdx.x, blockDim.x);
    }
    __syncthreads();
  }
}

__global__ void ep_pad_kernel(EpDeviceArgs a, const int64_t* plan, char* recv, float* weights,
                              int64_t row_bytes) {
  if (!may_store(a, plan)) return;
  const int64_t e = blockIdx.y;
  const int64_t begin = plan[plan_off(e)] + plan[plan_kept(a.L, e)], end = plan[plan_off(e + 1)];
  for (int64_t p = begin + blockIdx.x; p < end; p += gridDim.x) {
    zero_row(recv + p * row_bytes, row_bytes, threadIdx.x, blockDim.x);
    if (weights && threadIdx.x == 0) weights[p] = 0.0f;
  }
}

}  // namespace
}  // namespace moekit::cuda::ep

namespace moekit::detail {

void ep_expand(const Context& ctx, const EpDeviceArgs& a, const EpDeviceRouting& rt,
               const Tensor& recv, const Tensor& weights, bool first) {
  cuda::DeviceGuard guard(ctx.device().index);  // CudaRanks: a thread per GPU
  auto stream = static_cast<cudaStream_t>(ctx.stream());
  const int64_t row_bytes = a.H * static_cast<int64_t>(size_of(static_cast<DType>(a.dtype)));
  float* w = weights.defined() ? weights.data_as<float>() : nullptr;
  char* out = static_cast<char*>(recv.data());
  const dim3 grid(cuda::ep::grid_of(a.Tm), static_cast<unsigned>(a.W));
  cuda::ep::ep_expand_kernel<<<grid, 128, 0, stream>>>(
      a, rt.plan.data_as<int64_t>(), out, w, rt.dst_e.data_as<int32_t>(),
      rt.dst_j.data_as<int32_t>(), rt.dst_row.data_as<int32_t>(), first, row_bytes);
  MOEKIT_CUDA_CHECK_LAUNCH();
  const dim3 pad(cuda::ep::grid_of(a.A), static_cast<unsigned>(a.L));
  cuda::ep::ep_pad_kernel<<<pad, 128, 0, stream>>>(a, rt.plan.data_as<int64_t>(), out, w,
                                                   row_bytes);
  MOEKIT_CUDA_CHECK_LAUNCH();
}

}  // namespace moekit::detail
