// ep_sum: the source's side of combine / dispatch_backward (src/ep/ep_device.h). CPU reference:
// sum_returned and dispatch_backward's weight gradients in src/ep/expert_parallel.cpp.
//
// A block per token, threads over the hidden elements: what each rank returned for it (ret_flag:
// nothing / a row in the dtype / an fp32 partial) summed by the tree over ranks in fp32, rounded
// once into out [T, H]; a token with nothing returned gets a zero row. With gw [T, k] f32: each
// column's d(weight) as its expert's rank returned it. Nothing when the dispatch was refused.
#include "backends/cuda/ep/ep_common.cuh"
#include "backends/cuda/ep/ep_tree.cuh"

namespace moekit::cuda::ep {
namespace {

template <class T>
__global__ void ep_sum_kernel(EpDeviceArgs a, const int64_t* plan, const int32_t* pos,
                              const int32_t* topk, int64_t Tn, T* out, float* gw) {
  if (!may_store(a, plan)) return;
  const int64_t k = a.k, L = a.L, Tm = a.Tm, H = a.H;
  const int32_t* flags = peer<const int32_t>(a.ret_flag, a.r);  // [W dst][Tm]
  const float* ret = peer<const float>(a.ret, a.r);             // [W dst][Tm][H]
  const float* ret_w = peer<const float>(a.ret_w, a.r);         // [W dst][Tm][k]
  for (int64_t t = blockIdx.x; t < Tn; t += gridDim.x) {
    int key[detail::kEpMaxRanks];
    int64_t at[detail::kEpMaxRanks];
    int32_t flag[detail::kEpMaxRanks];
    int n = 0;
    for (int d = 0; d < a.W; ++d) {
      const int32_t slot = pos[t * a.W + d];
      if (slot < 0) continue;
      const int64_t i = static_cast<int64_t>(d) * Tm + slot;
      if (flags[i] == 0) continue;
      key[n] = d;
      at[n] = i;
      flag[n] = flags[i];
      ++n;
    }
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
      if (n == 0) {
        out[t * H + h] = from_float<T>(0.0f);
        continue;
      }
      int kk[detail::kEpMaxRanks];
      float v[detail::kEpMaxRanks];
      for (int i = 0; i < n; ++i) {
        kk[i] = key[i];
        v[i] = flag[i] == 1 ? to_float(reinterpret_cast<const T*>(ret + at[i] * H)[h])
                            : ret[at[i] * H + h];
      }
      out[t * H + h] = from_float<T>(tree_sum(kk, v, n));
    }
    if (gw) {
      for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
        const int32_t d = topk[t * k + j] / static_cast<int32_t>(L);
        const int64_t slot = pos[t * a.W + d];
        gw[t * k + j] = ret_w[(d * Tm + slot) * k + j];
      }
    }
  }
}

}  // namespace
}  // namespace moekit::cuda::ep

namespace moekit::detail {

void ep_sum(const Context& ctx, const EpDeviceArgs& a, const EpDeviceRouting& rt, int64_t T,
            const Tensor& out, const Tensor& gw) {
  cuda::DeviceGuard guard(ctx.device().index);  // CudaRanks: a thread per GPU
  if (T == 0) return;
  cuda::ep::with_dtype(a.dtype, [&](auto zero) {
    using V = decltype(zero);
    cuda::ep::ep_sum_kernel<V><<<cuda::ep::grid_of(T), 128, 0,
                                 static_cast<cudaStream_t>(ctx.stream())>>>(
        a, rt.plan.data_as<int64_t>(), rt.src_pos.data_as<int32_t>(),
        rt.src_topk.data_as<int32_t>(), T, static_cast<V*>(out.data()),
        gw.defined() ? gw.data_as<float>() : nullptr);
  });
  MOEKIT_CUDA_CHECK_LAUNCH();
}

}  // namespace moekit::detail
