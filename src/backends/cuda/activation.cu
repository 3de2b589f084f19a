// SwiGLU (plain and prob-scaled) on the GPU — the CUDA entries of swiglu_forward/backward.
//
// Math (include/moekit/primitives/activation.h), per valid row t < S and column j < F, with a, b
// the gate and linear parts of h [T, 2F] in the call's GluLayout and p_t = probs[t] or 1:
//   forward   z[t, j]  = p_t · silu(a)·b
//   backward  dh[t, gate(j)] = p_t·dz·b·silu'(a),  dh[t, lin(j)] = p_t·dz·silu(a),
//             dp_t = Σ_j dz·silu(a)·b   (written or added to dprobs)
// Work split: one block per row at a time (grid-stride over rows), threads over j in packs of
// 16 bytes (8 bf16/f16 or 4 f32 columns; scalars for unaligned views); dp_t is a fixed-order
// block sum, so results are bit-reproducible run to run. The elementwise products
// are rounded one by one in the CPU oracle's order (no FMA contraction), so they differ from
// src/backends/cpu/cpu_activation.cpp only through expf. Rows [S, T) are never touched.
//
// Splits: the kernels read the counts on the device (device_counts.cuh) and find S themselves,
// so they never synchronise with the host and can be captured in a CUDA graph and replayed with
// new counts. The grid depends on T only (one wave of blocks at most); every block checks the
// counts (O(G / 256) loads per thread, from L2 after the first block) and, when they are
// invalid, writes nothing; the launch reports the reason once in the context's error word.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "backends/cuda/check.h"
#include "backends/cuda/cuda_activation.h"
#include "backends/cuda/device_counts.cuh"
#include "backends/cuda/device_math.cuh"
#include "backends/cuda/resources.h"

namespace moekit::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;  // 8 · 256 = 2048 threads: one wave of blocks fills an SM
static_assert(kGluInterleaveBlock % 8 == 0, "a 16-byte pack never straddles an interleave block");

__device__ __forceinline__ int64_t gate_col(int64_t j, bool interleaved) {
  return interleaved ? 2 * kGluInterleaveBlock * (j / kGluInterleaveBlock) + j % kGluInterleaveBlock
                     : j;
}
__device__ __forceinline__ int64_t lin_col(int64_t j, int64_t F, bool interleaved) {
  return interleaved ? gate_col(j, true) + kGluInterleaveBlock : F + j;
}
__device__ __forceinline__ float sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

// V consecutive elements, loaded and stored as one access (16 bytes when V = 16 / sizeof(T)).
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
template <class T, int V>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}
template <class T, int V>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, V>& x) {
  *reinterpret_cast<Pack<T, V>*>(p) = x;
}

// Each thread takes V consecutive columns j..j+V-1 at a time (j a multiple of V): their gate and
// linear parts are V consecutive elements too, in both layouts (V divides the interleave block of
// 32), so every access is one V-wide load or store. V = 1 is the scalar path for views whose
// rows are not 16-byte aligned (launch_swiglu picks V).
// h: [T, 2F] stride ldh; z: [T, F] stride ldz; probs: [T] or nullptr.
template <class T, int V>
__global__ void __launch_bounds__(kThreads)
    swiglu_forward_kernel(const T* __restrict__ h, int64_t ldh, const float* __restrict__ probs,
                          DeviceCounts counts, int64_t F, bool interleaved, T* __restrict__ z,
                          int64_t ldz) {
  const int64_t S = block_valid_rows(counts);  // -1 for invalid counts: no row is written
  for (int64_t t = blockIdx.x; t < S; t += gridDim.x) {
    const T* hr = h + t * ldh;
    T* zr = z + t * ldz;
    const float p = probs ? probs[t] : 1.0f;
    for (int64_t j = int64_t{threadIdx.x} * V; j < F; j += int64_t{blockDim.x} * V) {
      const Pack<T, V> ga = load_pack<T, V>(hr + gate_col(j, interleaved));
      const Pack<T, V> lb = load_pack<T, V>(hr + lin_col(j, F, interleaved));
      Pack<T, V> out;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float a = to_float(ga.v[e]), b = to_float(lb.v[e]);
        const float act = __fmul_rn(__fmul_rn(a, sigmoid(a)), b);
        out.v[e] = from_float<T>(__fmul_rn(p, act));
      }
      store_pack<T, V>(zr + j, out);
    }
  }
}

// Pairs of lanes that swap halves of their dh stores (Interleaved32, below): lanes L and L ^ kSwap
// hold the same columns of two neighbouring interleave blocks. 0: no swap possible (V = 1).
template <int V>
constexpr int kSwapLanes = V > 1 && kGluInterleaveBlock / V < 32 ? static_cast<int>(kGluInterleaveBlock / V) : 0;

// A pack as 32-bit words (the unit of a shuffle), with the pack's size and alignment.
template <class T, int V>
struct alignas(sizeof(T) * V) PackWords {
  static_assert(sizeof(T) * V % 4 == 0, "a pack moves as 32-bit words");
  uint32_t w[sizeof(T) * V / 4];
};
template <class T, int V>
__device__ __forceinline__ const PackWords<T, V>& words(const Pack<T, V>& p) {
  return *reinterpret_cast<const PackWords<T, V>*>(&p);
}

// dz: [T, F] stride ldz; dh: [T, 2F] stride ldd; dprobs: [T] or nullptr.
// Stores. With Interleaved32 a thread's gate and linear parts are the two 64-byte halves of one
// 128-byte line of dh, so storing da then db would make every warp store instruction write half
// of each line it touches (measured on the H200, dsv3: 0.71 TB/s, 7.5x dh's sectors into L2).
// With `swap` (Interleaved32, F a multiple of two interleave blocks, V > 1), lanes L and
// L ^ kSwapLanes<V> — same columns of blocks 2m and 2m + 1 — swap one pack first: the even lane
// then stores the gate halves of both lines and the odd lane the linear halves, so each store
// instruction writes whole lines (block 2m's, then block 2m + 1's). Values are unchanged.
template <class T, int V>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_kernel(const T* __restrict__ h, int64_t ldh, const float* __restrict__ probs,
                           const T* __restrict__ dz, int64_t ldz, DeviceCounts counts, int64_t F,
                           bool interleaved, bool swap, T* __restrict__ dh, int64_t ldd,
                           float* __restrict__ dprobs, bool accumulate) {
  __shared__ float scratch[32];
  const int64_t S = block_valid_rows(counts);  // -1 for invalid counts: no row is written
  const int lane = static_cast<int>(threadIdx.x & 31);
  for (int64_t t = blockIdx.x; t < S; t += gridDim.x) {
    const T* hr = h + t * ldh;
    const T* dzr = dz + t * ldz;
    T* dhr = dh + t * ldd;
    const float p = probs ? probs[t] : 1.0f;
    float dp = 0.0f;
    // j0 is the warp's first column: warp-uniform, so the whole warp takes part in the swap.
    for (int64_t j0 = int64_t{threadIdx.x - lane} * V; j0 < F; j0 += int64_t{blockDim.x} * V) {
      const int64_t j = j0 + int64_t{lane} * V;
      const bool active = j < F;  // with `swap`, a lane and its partner are both active or not
      const int64_t ia = gate_col(j, interleaved), ib = lin_col(j, F, interleaved);
      Pack<T, V> da{}, db{};
      if (active) {
        const Pack<T, V> ga = load_pack<T, V>(hr + ia), lb = load_pack<T, V>(hr + ib);
        const Pack<T, V> gz = load_pack<T, V>(dzr + j);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float a = to_float(ga.v[e]), b = to_float(lb.v[e]), g = to_float(gz.v[e]);
          const float sig = sigmoid(a);
          const float silu = __fmul_rn(a, sig);
          const float dsilu = __fmul_rn(sig, __fadd_rn(1.0f, __fmul_rn(a, __fsub_rn(1.0f, sig))));
          const float pdz = __fmul_rn(p, g);
          da.v[e] = from_float<T>(__fmul_rn(__fmul_rn(pdz, b), dsilu));
          db.v[e] = from_float<T>(__fmul_rn(pdz, silu));
          dp = __fadd_rn(dp, __fmul_rn(g, __fmul_rn(silu, b)));
        }
      }
      if constexpr (kSwapLanes<V> > 0) {
        if (swap) {  // block-uniform
          constexpr int kPartner = kSwapLanes<V>;
          constexpr int64_t kBlock = kGluInterleaveBlock;
          const bool even = (lane & kPartner) == 0;  // this lane's block is 2m (else 2m + 1)
          // Word by word (selects, no pack copies): the even lane sends db and keeps da, the odd
          // lane sends da and keeps db.
          const PackWords<T, V>& a_w = words(da);
          const PackWords<T, V>& b_w = words(db);
          PackWords<T, V> first, second;
#pragma unroll
          for (int i = 0; i < static_cast<int>(sizeof(first.w) / 4); ++i) {
            const uint32_t got = __shfl_xor_sync(0xffffffffu, even ? b_w.w[i] : a_w.w[i], kPartner);
            first.w[i] = even ? a_w.w[i] : got;
            second.w[i] = even ? got : b_w.w[i];
          }
          if (active) {
            // line of block 2m: gate half (even lane, own da), linear half (odd lane, partner's db)
            *reinterpret_cast<PackWords<T, V>*>(even ? dhr + ia : dhr + ib - 2 * kBlock) = first;
            // line of block 2m + 1: gate half (even lane, partner's da), linear half (odd lane)
            *reinterpret_cast<PackWords<T, V>*>(even ? dhr + ia + 2 * kBlock : dhr + ib) = second;
          }
          continue;
        }
      }
      if (active) {
        store_pack<T, V>(dhr + ia, da);
        store_pack<T, V>(dhr + ib, db);
      }
    }
    if (dprobs) {  // uniform across the block: every thread takes part in the sum
      const float sum = block_sum(dp, scratch);
      if (threadIdx.x == 0) dprobs[t] = accumulate ? dprobs[t] + sum : sum;
    }
  }
}

// One block per row up to a wave (rows past S exit at once), and at least one block, so that
// every launch checks the counts (and reports invalid ones) even when there is nothing to write.
unsigned row_grid(int64_t rows, int sm_count) {
  return static_cast<unsigned>(
      std::clamp<int64_t>(rows, 1, int64_t{sm_count > 0 ? sm_count : 132} * kBlocksPerSm));
}

// The widest V whose accesses stay aligned: 16-byte packs when F, the row strides and the base
// pointers allow it (they do for dense tensors with F a multiple of 8), else scalars.
template <class T>
bool packs_aligned(int64_t F, std::initializer_list<std::pair<const void*, int64_t>> rows) {
  constexpr int64_t V = 16 / sizeof(T);
  if (F % V != 0) return false;
  for (const auto& [ptr, ld] : rows) {
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0 || ld % V != 0) return false;
  }
  return true;
}

template <class T>
void forward_typed(const detail::SwigluForwardArgs& a, const DeviceCounts& counts,
                   const CudaResources& res) {
  const T* h = static_cast<const T*>(a.h.data());
  T* z = static_cast<T*>(a.z.data());
  const float* probs = a.probs.defined() ? a.probs.data_as<const float>() : nullptr;
  const bool interleaved = a.layout == GluLayout::Interleaved32;
  const auto kernel = packs_aligned<T>(a.f, {{h, a.h.strides()[0]}, {z, a.z.strides()[0]}})
                          ? swiglu_forward_kernel<T, 16 / sizeof(T)>
                          : swiglu_forward_kernel<T, 1>;
  kernel<<<row_grid(a.rows, res.sm_count), kThreads, 0, res.stream>>>(
      h, a.h.strides()[0], probs, counts, a.f, interleaved, z, a.z.strides()[0]);
  MOEKIT_CUDA_CHECK_LAUNCH();
}

template <class T>
void backward_typed(const detail::SwigluBackwardArgs& a, const DeviceCounts& counts,
                    const CudaResources& res) {
  // F = 0: dp_t is an empty sum, 0. Written as 0 (the block sum of nothing); added, it changes
  // nothing (not even a -0), so dprobs is left alone.
  float* dprobs = a.dprobs.defined() && !(a.f == 0 && a.accumulate_dprobs)
                      ? a.dprobs.data_as<float>()
                      : nullptr;
  const T* h = static_cast<const T*>(a.h.data());
  const T* dz = static_cast<const T*>(a.dz.data());
  T* dh = static_cast<T*>(a.dh.data());
  const float* probs = a.probs.defined() ? a.probs.data_as<const float>() : nullptr;
  const bool interleaved = a.layout == GluLayout::Interleaved32;
  const bool packs =
      packs_aligned<T>(a.f, {{h, a.h.strides()[0]}, {dz, a.dz.strides()[0]}, {dh, a.dh.strides()[0]}});
  const auto kernel = packs ? swiglu_backward_kernel<T, 16 / sizeof(T)> : swiglu_backward_kernel<T, 1>;
  // Whole-line dh stores (kernel comment): pairs of interleave blocks, packed accesses.
  const bool swap = interleaved && packs && a.f % (2 * kGluInterleaveBlock) == 0;
  kernel<<<row_grid(a.rows, res.sm_count), kThreads, 0, res.stream>>>(
      h, a.h.strides()[0], probs, dz, a.dz.strides()[0], counts, a.f, interleaved, swap, dh,
      a.dh.strides()[0], dprobs, a.accumulate_dprobs);
  MOEKIT_CUDA_CHECK_LAUNCH();
}

}  // namespace

std::string swiglu_forward_rejects(const detail::SwigluForwardArgs& args) {
  return reject_unless_cuda(args.ctx);
}

void swiglu_forward_run(const detail::SwigluForwardArgs& args) {
  CudaResources& res = resources(args.ctx);
  DeviceGuard guard(res.device);
  const CountsOnDevice counts = counts_on_device(args.ctx, args.splits, args.rows);
  switch (args.h.dtype()) {
    case DType::F32: return forward_typed<float>(args, counts.view, res);
    case DType::F16: return forward_typed<__half>(args, counts.view, res);
    case DType::BF16: return forward_typed<__nv_bfloat16>(args, counts.view, res);
    default: throw_invalid("h", "dtype f32, f16 or bf16", name(args.h.dtype()));
  }
}

std::string swiglu_backward_rejects(const detail::SwigluBackwardArgs& args) {
  return reject_unless_cuda(args.ctx);
}

void swiglu_backward_run(const detail::SwigluBackwardArgs& args) {
  CudaResources& res = resources(args.ctx);
  DeviceGuard guard(res.device);
  const CountsOnDevice counts = counts_on_device(args.ctx, args.splits, args.rows);
  switch (args.h.dtype()) {
    case DType::F32: return backward_typed<float>(args, counts.view, res);
    case DType::F16: return backward_typed<__half>(args, counts.view, res);
    case DType::BF16: return backward_typed<__nv_bfloat16>(args, counts.view, res);
    default: throw_invalid("h", "dtype f32, f16 or bf16", name(args.h.dtype()));
  }
}

// This backend's entries in the primitives' tables (declared in its header).
constexpr detail::Backend<detail::SwigluForwardArgs> kSwigluForward{
    "cuda", swiglu_forward_rejects, swiglu_forward_run};
constexpr detail::Backend<detail::SwigluBackwardArgs> kSwigluBackward{
    "cuda", swiglu_backward_rejects, swiglu_backward_run};

}  // namespace moekit::cuda
