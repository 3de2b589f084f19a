// The router on the GPU (moekit/primitives/router.h), four kernels, fp64 throughout, each step in
// the CPU oracle's order (src/backends/cpu/cpu_router.cpp) with explicit round-to-nearest
// intrinsics (__dadd_rn, __dmul_rn, __ddiv_rn: nvcc never contracts them into an FMA, which the
// CPU loops do not use either), so logits, sums and gradients are the CPU's bits; only exp()
// (the device's fp64 exp, ≤ 1 ulp) may differ.
//   router_logits_kernel   l[t, e] = Σ_h x[t, h]·Wg[e, h]   32×32 (token, expert) tile per block;
//                          x and Wg chunks of 32 columns staged in shared memory (coalesced
//                          loads); each thread one sequential dot, h ascending
//   router_select_kernel   one thread per token: scores in place, top-k by k passes over E (the
//                          next element of the order "score descending, then index ascending"),
//                          weights rounded to f32 once
//   router_dlogits_kernel  one thread per token: d scores (sparse over the k) → d logits [T, E]
//   router_dgate_kernel    dWg[e, h] = Σ_t dl[t, e]·x[t, h], one thread per (e, h), t ascending;
//                          32 h × 8 e a block, 32-token chunks of x and dl staged in shared memory
//   router_dx_kernel       dx[t, h] = dx_e[t, h] + Σ_e dl[t, e]·Wg[e, h], one thread per (t, h)
// No atomics, no host synchronisation, grids from T, E and H only: capturable and bit-reproducible.
// The work is T·E·H fp64 FMAs per kernel of the GEMM kind; a tensor-core logits path is the
// optimisation (router.h says why the GEMM primitives are not used).
#include <cfloat>
#include <cmath>

#include "backends/cuda/check.h"
#include "backends/cuda/cuda_router.h"
#include "backends/cuda/device_math.cuh"
#include "backends/cuda/resources.h"

namespace moekit::cuda {
namespace {

constexpr int kTile = 32;  // tokens × experts per logits block, and the h chunk staged per step
constexpr int kThreads = 256;

template <class T>
__device__ __forceinline__ double to_double(T v) {
  return static_cast<double>(to_float(v));
}

// fp64 → fp32 rounded to odd (the CPU's f64_to_f32_round_to_odd, src/core/dtype.cpp): a 16-bit
// rounding after it is a single rounding of the fp64 value.
__device__ __forceinline__ float f64_to_f32_round_to_odd(double v) {
  if (isnan(v) || isinf(v)) return __double2float_rn(v);
  float f = __double2float_rn(v);
  if (static_cast<double>(f) == v) return f;
  if (isinf(f)) return copysignf(FLT_MAX, f);
  if ((__float_as_uint(f) & 1u) == 0) f = nextafterf(f, v > f ? INFINITY : -INFINITY);
  return f;
}

// One rounding of an fp64 value into T (the CPU's from_f64).
template <class T>
__device__ __forceinline__ T round_from_f64(double v) {
  return from_float<T>(f64_to_f32_round_to_odd(v));
}
template <>
__device__ __forceinline__ float round_from_f64<float>(double v) {
  return __double2float_rn(v);
}

// x [T, H], gate [E, H] → scores [T, E] (the logits, fp64). Block (32, 32): threadIdx.x the
// expert of the tile, threadIdx.y the token; token tiles grid-strided over blockIdx.y.
template <class In>
__global__ void __launch_bounds__(kTile* kTile)
    router_logits_kernel(const In* __restrict__ x, const In* __restrict__ gate, int64_t tokens,
                         int64_t hidden, int64_t experts, double* __restrict__ scores) {
  __shared__ double xs[kTile][kTile + 1], gs[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t e0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t tiles_t = (tokens + kTile - 1) / kTile;
  for (int64_t tile = blockIdx.y; tile < tiles_t; tile += gridDim.y) {
    const int64_t t0 = tile * kTile;
    double l = 0;
    for (int64_t h0 = 0; h0 < hidden; h0 += kTile) {
      const int64_t h = h0 + tx;
      xs[ty][tx] = t0 + ty < tokens && h < hidden ? to_double(x[(t0 + ty) * hidden + h]) : 0.0;
      gs[ty][tx] = e0 + ty < experts && h < hidden ? to_double(gate[(e0 + ty) * hidden + h]) : 0.0;
      __syncthreads();
      const int n = static_cast<int>(hidden - h0 < kTile ? hidden - h0 : kTile);
      for (int i = 0; i < n; ++i) l = __dadd_rn(l, __dmul_rn(xs[ty][i], gs[tx][i]));
      __syncthreads();
    }
    if (t0 + ty < tokens && e0 + tx < experts) scores[(t0 + ty) * experts + e0 + tx] = l;
  }
}

// One thread per token: scores (in place over the logits), then top-k and the weights.
__global__ void __launch_bounds__(kThreads)
    router_select_kernel(double* __restrict__ scores, int64_t tokens, int64_t experts, int64_t k,
                         bool softmax, bool normalize, int64_t* __restrict__ topk_idx,
                         float* __restrict__ topk_weights) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < tokens;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double* s = scores + t * experts;
    if (softmax) {
      double m = s[0];
      for (int64_t e = 1; e < experts; ++e) m = s[e] > m ? s[e] : m;
      double z = 0;
      for (int64_t e = 0; e < experts; ++e) {
        const double v = exp(__dsub_rn(s[e], m));
        s[e] = v;
        z = __dadd_rn(z, v);
      }
      for (int64_t e = 0; e < experts; ++e) s[e] = __ddiv_rn(s[e], z);
    } else {
      for (int64_t e = 0; e < experts; ++e) s[e] = __ddiv_rn(1.0, __dadd_rn(1.0, exp(-s[e])));
    }
    // Pass j takes the first element, in the order (score descending, index ascending), after
    // the one pass j - 1 took: the CPU's partial_sort with the same strict order.
    int64_t* idx = topk_idx + t * k;
    double sum = 0, prev_s = 0;
    int64_t prev_e = -1;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < experts; ++e) {
        const bool after = j == 0 || s[e] < prev_s || (s[e] == prev_s && e > prev_e);
        if (after && (best < 0 || s[e] > s[best])) best = e;
      }
      if (best < 0) {  // only NaN scores are left: the lowest index not taken (never out of range)
        for (int64_t e = 0; e < experts && best < 0; ++e) {
          bool taken = false;
          for (int64_t i = 0; i < j; ++i) taken = taken || idx[i] == e;
          if (!taken) best = e;
        }
      }
      idx[j] = best;
      prev_e = best;
      prev_s = s[best];
      sum = __dadd_rn(sum, prev_s);
    }
    for (int64_t j = 0; j < k; ++j) {
      const double v = s[idx[j]];
      topk_weights[t * k + j] = __double2float_rn(normalize ? __ddiv_rn(v, sum) : v);
    }
  }
}

// One thread per token: d topk_weights → d scores (nonzero at the k chosen) → d logits [T, E].
__global__ void __launch_bounds__(kThreads)
    router_dlogits_kernel(const double* __restrict__ scores, const int64_t* __restrict__ topk_idx,
                          const float* __restrict__ grad_w, int64_t tokens, int64_t experts,
                          int64_t k, bool softmax, bool normalize, double* __restrict__ dlogits) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < tokens;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double* sc = scores + t * experts;
    const int64_t* idx = topk_idx + t * k;
    const float* gw = grad_w + t * k;
    double z = 0, gdotw = 0;
    if (normalize) {
      for (int64_t j = 0; j < k; ++j) z = __dadd_rn(z, sc[idx[j]]);
      for (int64_t j = 0; j < k; ++j)
        gdotw = __dadd_rn(gdotw, __ddiv_rn(__dmul_rn(static_cast<double>(gw[j]), sc[idx[j]]), z));
    }
    auto ds = [&](int64_t e) {  // d score of expert e (0 unless chosen)
      double d = 0.0;
      for (int64_t j = 0; j < k; ++j) {
        if (idx[j] == e) {
          d = normalize ? __ddiv_rn(__dsub_rn(static_cast<double>(gw[j]), gdotw), z)
                        : static_cast<double>(gw[j]);
        }
      }
      return d;
    };
    double* dl = dlogits + t * experts;
    if (softmax) {
      double dot = 0;
      for (int64_t e = 0; e < experts; ++e) dot = __dadd_rn(dot, __dmul_rn(ds(e), sc[e]));
      for (int64_t e = 0; e < experts; ++e) dl[e] = __dmul_rn(sc[e], __dsub_rn(ds(e), dot));
    } else {
      for (int64_t e = 0; e < experts; ++e)
        dl[e] = __dmul_rn(__dmul_rn(ds(e), sc[e]), __dsub_rn(1.0, sc[e]));
    }
  }
}

// dWg[e, h] = Σ_t dl[t, e]·x[t, h] (t ascending), one thread per (e, h); T = 0 writes zeros.
// Block (32 h, 8 e), tokens in chunks of 32 staged in shared memory (x's chunk coalesced along h,
// dl's along e) and the next chunk read into registers while the current one is summed: a thread's
// chain of T products runs from shared memory, and the 8 experts' threads of a block share each x
// load (x was read once per expert, from one thread per (e, h): 1.56 ms of a 2.33 ms EP step at
// the tiny preset, H100, d4e5788). blockIdx.x walks the expert tiles fastest, so the blocks in
// flight read the same rows of x. The sum's order, and so its bits, unchanged.
constexpr int kGateH = 32, kGateE = 8, kGateT = 32;
template <class In>
__global__ void __launch_bounds__(kGateH* kGateE)
    router_dgate_kernel(const double* __restrict__ dlogits, const In* __restrict__ x,
                        int64_t tokens, int64_t hidden, int64_t experts, In* __restrict__ dgate) {
  __shared__ double xs[kGateT][kGateH];      // [token][h]
  __shared__ double ds[kGateT][kGateE + 1];  // [token][e]
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kGateH + tx;
  constexpr int kXRows = kGateT / kGateE;  // x rows a thread stages per chunk
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kGateE + ty;
  const int64_t de = static_cast<int64_t>(blockIdx.x) * kGateE + tid % kGateE;  // dl's column it stages
  const int64_t tiles_h = (hidden + kGateH - 1) / kGateH;
  for (int64_t tile = blockIdx.y; tile < tiles_h; tile += gridDim.y) {
    const int64_t h = tile * kGateH + tx;
    double xr[kXRows], dr;
    auto load = [&](int64_t t0) {
#pragma unroll
      for (int j = 0; j < kXRows; ++j) {
        const int64_t t = t0 + ty + kGateE * j;
        xr[j] = t < tokens && h < hidden ? to_double(x[t * hidden + h]) : 0.0;
      }
      const int64_t t = t0 + tid / kGateE;
      dr = t < tokens && de < experts ? dlogits[t * experts + de] : 0.0;
    };
    double acc = 0;
    if (tokens > 0) load(0);
    for (int64_t t0 = 0; t0 < tokens; t0 += kGateT) {
#pragma unroll
      for (int j = 0; j < kXRows; ++j) xs[ty + kGateE * j][tx] = xr[j];
      ds[tid / kGateE][tid % kGateE] = dr;
      __syncthreads();
      if (t0 + kGateT < tokens) load(t0 + kGateT);
      const int n = static_cast<int>(tokens - t0 < kGateT ? tokens - t0 : kGateT);
      for (int i = 0; i < n; ++i) acc = __dadd_rn(acc, __dmul_rn(ds[i][ty], xs[i][tx]));
      __syncthreads();
    }
    if (e < experts && h < hidden) dgate[e * hidden + h] = round_from_f64<In>(acc);
  }
}

// dx[t, h] = dx_e[t, h] + Σ_e dl[t, e]·Wg[e, h] (e ascending), one thread per (t, h); dx may be
// dx_e itself (each thread reads its element before writing it).
template <class In>
__global__ void __launch_bounds__(kThreads)
    router_dx_kernel(const double* __restrict__ dlogits, const In* __restrict__ gate,
                     const In* dx_expert, int64_t tokens, int64_t hidden, int64_t experts, In* dx) {
  const int64_t n = tokens * hidden;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / hidden, h = i % hidden;
    double acc = dx_expert ? to_double(dx_expert[i]) : 0.0;
    for (int64_t e = 0; e < experts; ++e)
      acc = __dadd_rn(acc, __dmul_rn(dlogits[t * experts + e], to_double(gate[e * hidden + h])));
    dx[i] = round_from_f64<In>(acc);
  }
}

// ---------------------------------------------------------------- launchers

unsigned grid_for(int64_t items, const CudaResources& res) {
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  const int64_t wave = static_cast<int64_t>(res.sm_count) * 8;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks < wave ? blocks : wave));
}

template <class In>
void router_topk_typed(const detail::RouterTopkArgs& a, const CudaResources& res) {
  const int64_t T = a.tokens, H = a.hidden, E = a.experts;
  double* scores = static_cast<double*>(a.scores.data());
  const int64_t tiles_t = (T + kTile - 1) / kTile, tiles_e = (E + kTile - 1) / kTile;
  const dim3 grid(static_cast<unsigned>(tiles_e),
                  static_cast<unsigned>(tiles_t < 65535 ? tiles_t : 65535));
  router_logits_kernel<In><<<grid, dim3(kTile, kTile), 0, res.stream>>>(
      static_cast<const In*>(a.x.data()), static_cast<const In*>(a.gate.data()), T, H, E, scores);
  MOEKIT_CUDA_CHECK_LAUNCH();
  router_select_kernel<<<grid_for(T, res), kThreads, 0, res.stream>>>(
      scores, T, E, a.options.topk, a.options.score == RouterScore::Softmax, a.options.normalize,
      a.topk_idx.data_as<int64_t>(), a.topk_weights.data_as<float>());
  MOEKIT_CUDA_CHECK_LAUNCH();
}

template <class In>
void router_topk_backward_typed(const detail::RouterTopkBackwardArgs& a, const CudaResources& res) {
  const int64_t T = a.tokens, H = a.hidden, E = a.experts;
  double* dl = static_cast<double*>(a.grad_logits.data());
  if (T > 0) {
    router_dlogits_kernel<<<grid_for(T, res), kThreads, 0, res.stream>>>(
        static_cast<const double*>(a.scores.data()), a.topk_idx.data_as<const int64_t>(),
        a.grad_topk_weights.data_as<const float>(), T, E, a.options.topk,
        a.options.score == RouterScore::Softmax, a.options.normalize, dl);
    MOEKIT_CUDA_CHECK_LAUNCH();
  }
  if (E * H > 0) {
    const int64_t tiles_e = (E + kGateE - 1) / kGateE, tiles_h = (H + kGateH - 1) / kGateH;
    const dim3 grid(static_cast<unsigned>(tiles_e), static_cast<unsigned>(tiles_h < 65535 ? tiles_h : 65535));
    router_dgate_kernel<In><<<grid, dim3(kGateH, kGateE), 0, res.stream>>>(
        dl, static_cast<const In*>(a.x.data()), T, H, E, static_cast<In*>(a.grad_gate.data()));
    MOEKIT_CUDA_CHECK_LAUNCH();
  }
  if (T * H > 0) {
    router_dx_kernel<In><<<grid_for(T * H, res), kThreads, 0, res.stream>>>(
        dl, static_cast<const In*>(a.gate.data()),
        a.grad_expert_input.defined() ? static_cast<const In*>(a.grad_expert_input.data())
                                      : nullptr,
        T, H, E, static_cast<In*>(a.grad_input.data()));
    MOEKIT_CUDA_CHECK_LAUNCH();
  }
}

std::string router_topk_rejects(const detail::RouterTopkArgs& a) {
  return reject_unless_cuda(a.ctx);
}

void router_topk_run(const detail::RouterTopkArgs& a) {
  if (a.tokens == 0) return;
  CudaResources& res = resources(a.ctx);
  DeviceGuard guard(res.device);
  switch (a.x.dtype()) {
    case DType::F32:
      return router_topk_typed<float>(a, res);
    case DType::F16:
      return router_topk_typed<__half>(a, res);
    case DType::BF16:
      return router_topk_typed<__nv_bfloat16>(a, res);
    default:
      throw_invalid("x", "dtype f32, f16 or bf16", name(a.x.dtype()));
  }
}

std::string router_topk_backward_rejects(const detail::RouterTopkBackwardArgs& a) {
  std::string reason = reject_unless_cuda(a.ctx);
  if (reason.empty() && !a.grad_logits.defined())
    reason = "no d-logits workspace was bound (bind_router_topk_backward allocates it)";
  return reason;
}

void router_topk_backward_run(const detail::RouterTopkBackwardArgs& a) {
  CudaResources& res = resources(a.ctx);
  DeviceGuard guard(res.device);
  switch (a.x.dtype()) {
    case DType::F32:
      return router_topk_backward_typed<float>(a, res);
    case DType::F16:
      return router_topk_backward_typed<__half>(a, res);
    case DType::BF16:
      return router_topk_backward_typed<__nv_bfloat16>(a, res);
    default:
      throw_invalid("x", "dtype f32, f16 or bf16", name(a.x.dtype()));
  }
}

}  // namespace

// This backend's entries in the router primitives' tables (declared in cuda_router.h).
constexpr detail::Backend<detail::RouterTopkArgs> kRouterTopk{"cuda", router_topk_rejects,
                                                              router_topk_run};
constexpr detail::Backend<detail::RouterTopkBackwardArgs> kRouterTopkBackward{
    "cuda", router_topk_backward_rejects, router_topk_backward_run};

}  // namespace moekit::cuda
