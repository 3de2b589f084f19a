// ep_plan: the verdict and this rank's receive plan of a dispatch (src/ep/ep_device.h). CPU
// reference: ExpertParallel::dispatch phase (2b).
//
// Every rank reads every rank's status word and counts block (peer loads, after the barrier that
// follows ep_count), so every rank reaches the same verdict without another round: a rank's bad
// index, or (OverflowPolicy::Error) any rank needing more than R padded rows, or (in-band
// agreement) a rank that refused its arguments on the host, refuses the call on
// every rank — plan[0] = 0, the bits ORed into the error word, zero splits — and no later kernel
// of the call (or of the handle's combine / backward) stores anything. One thread: W·W·(L+1)
// loads.
#include "backends/cuda/ep/ep_common.cuh"

namespace moekit::cuda::ep {
namespace {

__device__ inline int64_t round_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

__global__ void ep_plan_kernel(EpDeviceArgs a, int64_t* plan, int64_t* splits, int64_t* tpe) {
  if (threadIdx.x != 0) return;
  const int64_t L = a.L, W = a.W;
  auto cnt = [&](int64_t src, int64_t dst, int64_t e) {
    return peer<const int64_t>(a.counts, static_cast<int>(src))[dst * (L + 1) + e];
  };
  // A rank that refused its arguments (in-band agreement) ran no ep_count: its status and counts
  // are stale, so the verdict is that refusal alone.
  uint32_t bits = refused_by_a_rank(a) ? detail::kEpPeerRefusedBit : 0u;
  for (int s = 0; s < W && bits == 0; ++s) bits |= peer<const uint32_t>(a.status, s)[0];
  if (bits == 0 && !a.drop) {
    for (int64_t d = 0; d < W; ++d) {
      int64_t need = 0;
      for (int64_t e = 0; e < L; ++e) {
        int64_t c = 0;
        for (int64_t s = 0; s < W; ++s) c += cnt(s, d, e);
        need += round_up(c, a.A);
      }
      if (need > a.R) bits |= detail::kEpCapacityExceededBit;
    }
  }
  if (bits != 0) {
    if (a.error_word) atomicOr(a.error_word, bits);
    plan[0] = 0;
    for (int64_t e = 0; e < L; ++e) splits[e] = tpe[e] = 0;
    return;
  }
  plan[0] = 1;
  int64_t off = 0;
  for (int64_t e = 0; e < L; ++e) {
    int64_t c = 0;
    for (int64_t s = 0; s < W; ++s) c += cnt(s, a.r, e);
    const int64_t room = a.R - off > 0 ? (a.R - off) / a.A * a.A : 0;
    const int64_t kept = c < room ? c : room;
    plan[plan_off(e)] = off;
    plan[plan_kept(L, e)] = kept;
    int64_t b = off;
    for (int64_t s = 0; s < W; ++s) {
      plan[plan_base(L, s, e)] = b;
      b += cnt(s, a.r, e);
    }
    splits[e] = round_up(kept, a.A);
    tpe[e] = kept;
    off += round_up(kept, a.A);
  }
  plan[plan_off(L)] = off;
  for (int64_t s = 0; s < W; ++s) plan[plan_sent(W, L, s)] = cnt(s, a.r, L);
}

}  // namespace
}  // namespace moekit::cuda::ep

namespace moekit::detail {

void ep_plan(const Context& ctx, const EpDeviceArgs& a, const EpDeviceRouting& rt,
             const Tensor& splits, const Tensor& tokens_per_expert) {
  cuda::DeviceGuard guard(ctx.device().index);  // CudaRanks: a thread per GPU
  cuda::ep::ep_plan_kernel<<<1, 32, 0, static_cast<cudaStream_t>(ctx.stream())>>>(
      a, rt.plan.data_as<int64_t>(), splits.data_as<int64_t>(),
      tokens_per_expert.data_as<int64_t>());
  MOEKIT_CUDA_CHECK_LAUNCH();
}

}  // namespace moekit::detail
