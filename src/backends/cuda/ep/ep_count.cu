// ep_count: the first phase of a dispatch on the source rank (src/ep/ep_device.h). CPU
// reference: ExpertParallel::dispatch phases (1) (index checks) and (2a) (slots and counts).
//
// One block. Validation first: an index out of [0, E) or an expert twice in a token sets this
// rank's status word (kEpInvalidRouting) and the kernel writes nothing else. Then, without
// atomics, so the results are those of the CPU loops bit for bit: one thread per destination
// rank walks the tokens in order (a token's slot there = how many earlier tokens went there);
// one thread per global expert walks the entries in order (an entry's rank within its expert,
// which the destination turns into its row). Each walk is one warp's, 32 entries (tokens) at a time:
// __match_any_sync / __ballot_sync rank the 32 among themselves, a running count per expert
// (shared memory) or destination (registers) adds the earlier ones — the serial loops' results.
#include "backends/cuda/ep/ep_common.cuh"

namespace moekit::cuda::ep {
namespace {

template <class I>
__global__ void ep_count_kernel(EpDeviceArgs a, const I* __restrict__ topk, int64_t T,
                                int32_t* src_topk, int32_t* src_pos, int32_t* src_q) {
  if (!may_store(a, nullptr)) return;  // a rank refused the call (ep_plan refuses it everywhere)
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
  // Both walks in entry (token) order, 32 at a time by one warp each, so the results are the
  // serial loops' (an entry's rank within its expert = the earlier entries of that expert; a
  // token's slot at a destination = the earlier tokens going there), without atomics.
  extern __shared__ int32_t expert_base[];  // [E] entries of each expert so far
  for (int64_t g = threadIdx.x; g < E; g += blockDim.x) expert_base[g] = 0;
  __syncthreads();
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const unsigned below = (1u << lane) - 1u;
  if (warp == 0) {  // the experts' walk
    for (int64_t i0 = 0; i0 < T * k; i0 += 32) {
      const int64_t i = i0 + lane;
      const bool in = i < T * k;
      const int v = in ? static_cast<int>(topk[i]) : -1 - static_cast<int>(lane);  // unique off the end
      const unsigned peers = __match_any_sync(0xffffffffu, v);
      int32_t q = 0;
      if (in) q = expert_base[v] + __popc(peers & below);
      __syncwarp();
      if (in && (peers & below) == 0) expert_base[v] += __popc(peers);  // the lowest lane of its group
      __syncwarp();
      if (in) src_q[i] = q;
    }
  } else if (warp == 1) {  // the destinations' walk
    int32_t slot[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // W <= 8 (CudaRanks)
    for (int64_t t0 = 0; t0 < T; t0 += 32) {
      const int64_t t = t0 + lane;
      for (int64_t d = 0; d < a.W; ++d) {
        bool there = false;
        if (t < T)
          for (int64_t j = 0; j < k; ++j) there |= static_cast<int64_t>(topk[t * k + j]) / L == d;
        const unsigned ballot = __ballot_sync(0xffffffffu, there);
        if (t < T) src_pos[t * a.W + d] = there ? slot[d] + __popc(ballot & below) : -1;
        slot[d] += __popc(ballot);
      }
    }
    if (lane == 0)
      for (int64_t d = 0; d < a.W; ++d) counts[d * (L + 1) + L] = slot[d];
  }
  __syncthreads();
  for (int64_t g = threadIdx.x; g < E; g += blockDim.x) {
    counts[(g / L) * (L + 1) + g % L] = expert_base[g];
  }
}

}  // namespace
}  // namespace moekit::cuda::ep

namespace moekit::detail {

void ep_count(const Context& ctx, const EpDeviceArgs& a, const Tensor& topk_idx, int64_t T,
              const EpDeviceRouting& rt) {
  cuda::DeviceGuard guard(ctx.device().index);  // CudaRanks: a thread per GPU
  auto stream = static_cast<cudaStream_t>(ctx.stream());
  const size_t smem = static_cast<size_t>(a.W * a.L) * sizeof(int32_t);  // E <= 8 ranks x L
  if (topk_idx.dtype() == DType::I32) {
    cuda::ep::ep_count_kernel<<<1, 1024, smem, stream>>>(
        a, topk_idx.data_as<int32_t>(), T, rt.src_topk.data_as<int32_t>(),
        rt.src_pos.data_as<int32_t>(), rt.src_q.data_as<int32_t>());
  } else {
    cuda::ep::ep_count_kernel<<<1, 1024, smem, stream>>>(
        a, topk_idx.data_as<int64_t>(), T, rt.src_topk.data_as<int32_t>(),
        rt.src_pos.data_as<int32_t>(), rt.src_q.data_as<int32_t>());
  }
  MOEKIT_CUDA_CHECK_LAUNCH();
}

}  // namespace moekit::detail
