// ep_send: the source's stores into its destinations' staging (src/ep/ep_device.h). CPU
// reference: send_rows and dispatch phase (3) in src/ep/expert_parallel.cpp.
//
// A block per token: its row once into each destination rank's stage_x [W src][Tm][H] at its slot
// (16-byte vector stores through the peer's base when the row allows, else 2-byte ones); with
// topk_weights (dispatch) also its entries for that rank into meta_e/j/w/q [W src][Tm][k], in
// ascending local expert (an entry's place = how many of the token's experts on that rank are
// smaller: no sort), unused places -1. Nothing when the call was refused (plan[0] == 0).
#include "backends/cuda/ep/ep_common.cuh"

namespace moekit::cuda::ep {
namespace {

__global__ void ep_send_kernel(EpDeviceArgs a, const int64_t* plan, const char* rows, int64_t T,
                               const int32_t* pos, const int32_t* topk, const int32_t* q,
                               const float* w, int64_t row_bytes) {
  if (!may_store(a, plan)) return;
  const int64_t k = a.k, L = a.L, Tm = a.Tm;
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    for (int d = 0; d < a.W; ++d) {
      const int32_t slot = pos[t * a.W + d];
      if (slot < 0) continue;
      const int64_t at = static_cast<int64_t>(a.r) * Tm + slot;  // [src][slot] at rank d
      copy_row(peer<char>(a.stage_x, d) + at * row_bytes, rows + t * row_bytes, row_bytes,
               threadIdx.x, blockDim.x);
      if (w == nullptr) continue;
      for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
        const int32_t g = topk[t * k + j];
        int n = 0, place = 0;
        for (int64_t i = 0; i < k; ++i) {
          const int32_t gi = topk[t * k + i];
          if (gi / L == d) {
            ++n;
            place += gi < g;
          }
        }
        if (g / L == d) {
          peer<int32_t>(a.meta_e, d)[at * k + place] = static_cast<int32_t>(g % L);
          peer<int32_t>(a.meta_j, d)[at * k + place] = static_cast<int32_t>(j);
          peer<float>(a.meta_w, d)[at * k + place] = w[t * k + j];
          peer<int32_t>(a.meta_q, d)[at * k + place] = q[t * k + j];
        }
        if (j >= n) {  // the unused places [n, k)
          peer<int32_t>(a.meta_e, d)[at * k + j] = -1;
          peer<int32_t>(a.meta_j, d)[at * k + j] = -1;
          peer<float>(a.meta_w, d)[at * k + j] = 0.0f;
          peer<int32_t>(a.meta_q, d)[at * k + j] = -1;
        }
      }
    }
  }
}

}  // namespace
}  // namespace moekit::cuda::ep

namespace moekit::detail {

void ep_send(const Context& ctx, const EpDeviceArgs& a, const EpDeviceRouting& rt,
             const Tensor& rows, int64_t T, const Tensor& topk_weights) {
  cuda::DeviceGuard guard(ctx.device().index);  // CudaRanks: a thread per GPU
  if (T == 0) return;
  const int64_t row_bytes = a.H * static_cast<int64_t>(size_of(static_cast<DType>(a.dtype)));
  cuda::ep::ep_send_kernel<<<cuda::ep::grid_of(T), 128, 0,
                             static_cast<cudaStream_t>(ctx.stream())>>>(
      a, rt.plan.data_as<int64_t>(), static_cast<const char*>(rows.data()), T,
      rt.src_pos.data_as<int32_t>(), rt.src_topk.data_as<int32_t>(), rt.src_q.data_as<int32_t>(),
      topk_weights.defined() ? topk_weights.data_as<float>() : nullptr, row_bytes);
  MOEKIT_CUDA_CHECK_LAUNCH();
}

}  // namespace moekit::detail
