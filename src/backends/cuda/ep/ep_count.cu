// ep_count: the first phase of a dispatch on the source rank (src/ep/ep_device.h). CPU
// reference: ExpertParallel::dispatch phases (1) (index checks) and (2a) (slots and counts).
//
// One block. Validation first: an index out of [0, E) or an expert twice in a token sets this
// rank's status word (kEpInvalidRouting) and the kernel writes nothing else. Then, without
// atomics, so the results are those of the CPU loops bit for bit: one thread per destination
// rank walks the tokens in order (a token's slot there = how many earlier tokens went there);
// one thread per global expert walks the entries in order (an entry's rank within its expert,
// which the destination turns into its row). First slice: these walks are serial per thread
// (T·k loads each, broadcast across the block); a block-wide scan is the optimisation.
#include "backends/cuda/ep/ep_common.cuh"

namespace moekit::cuda::ep {
namespace {

template <class I>
__global__ void ep_count_kernel(EpDeviceArgs a, const I* __restrict__ topk, int64_t T,
                                int32_t* src_topk, int32_t* src_pos, int32_t* src_q) {
  const int64_t k = a.k, L = a.L, E = a.W * L;
  int bad = 0;
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t v = static_cast<int64_t>(topk[t * k + j]);
      if (v < 0 || v >= E) bad = 1;
      for (int64_t i = 0; i < j; ++i) {
        if (static_cast<int64_t>(topk[t * k + i]) == v) bad = 1;
      }
    }
  }
  uint32_t* status = peer<uint32_t>(a.status, a.r);
  if (__syncthreads_or(bad)) {
    if (threadIdx.x == 0) status[0] = detail::kEpInvalidRoutingBit;
    return;
  }
  if (threadIdx.x == 0) status[0] = 0;
  for (int64_t i = threadIdx.x; i < T * k; i += blockDim.x) {
    src_topk[i] = static_cast<int32_t>(topk[i]);
  }
  int64_t* counts = peer<int64_t>(a.counts, a.r);  // [W dst][L + 1], this rank's own block
  for (int64_t g = threadIdx.x; g < E; g += blockDim.x) {
    int32_t n = 0;
    for (int64_t i = 0; i < T * k; ++i) {
      if (static_cast<int64_t>(topk[i]) == g) src_q[i] = n++;
    }
    counts[(g / L) * (L + 1) + g % L] = n;
  }
  for (int64_t d = threadIdx.x; d < a.W; d += blockDim.x) {
    int32_t s = 0;
    for (int64_t t = 0; t < T; ++t) {
      bool there = false;
      for (int64_t j = 0; j < k; ++j) there |= static_cast<int64_t>(topk[t * k + j]) / L == d;
      src_pos[t * a.W + d] = there ? s++ : -1;
    }
    counts[d * (L + 1) + L] = s;
  }
}

}  // namespace
}  // namespace moekit::cuda::ep

namespace moekit::detail {

void ep_count(const Context& ctx, const EpDeviceArgs& a, const Tensor& topk_idx, int64_t T,
              const EpDeviceRouting& rt) {
  cuda::DeviceGuard guard(ctx.device().index);  // CudaRanks: a thread per GPU
  auto stream = static_cast<cudaStream_t>(ctx.stream());
  if (topk_idx.dtype() == DType::I32) {
    cuda::ep::ep_count_kernel<<<1, 1024, 0, stream>>>(
        a, topk_idx.data_as<int32_t>(), T, rt.src_topk.data_as<int32_t>(),
        rt.src_pos.data_as<int32_t>(), rt.src_q.data_as<int32_t>());
  } else {
    cuda::ep::ep_count_kernel<<<1, 1024, 0, stream>>>(
        a, topk_idx.data_as<int64_t>(), T, rt.src_topk.data_as<int32_t>(),
        rt.src_pos.data_as<int32_t>(), rt.src_q.data_as<int32_t>());
  }
  MOEKIT_CUDA_CHECK_LAUNCH();
}

}  // namespace moekit::detail
