// Bias kernels of the CUDA backend:
//   grouped bias gradient    db[g] = Σ_{t in g} s_t·dy[t]  (s_t = 1, or the routing prob p_t)
//   prob gradient of a bias  dp_t  = Σ_n dy[t, n]·bias[g(t), n]
//   grouped bias add         out[t] = x[t] + s_t·bias[g(t)]
//   grouped bias broadcast   out[t] = bias[g(t)]             (K = 0 group-M GEMMs only)
// All fp32 math with one rounding into the output dtype; rows outside [off_g, off_g + m_g) are
// never touched.
//
// Splits: the gradient, prob-gradient and add kernels read the counts on the device
// (device_counts.cuh), so they never synchronise with the host and can be captured in a CUDA
// graph and replayed with new counts. Grids depend on T, G and N only (S is not known on the
// host). Every block checks the counts itself (block_valid_rows) and, when they are invalid,
// exits before writing anything; the launch reports the reason once in the context's error word.
// A block then builds the row offsets of all groups, off[0..G], in shared memory (one block-wide
// scan over the counts) and looks up any group's rows there. That is O(G) loads per block, from
// L2 after the first block; grids are one wave of blocks (kBlocksPerSm per SM), so G in the
// thousands costs a few microseconds at most — unlike a prefix sum per (group, tile) block,
// which would grow as G². The broadcast serves the cuBLAS group-M GEMM, which has the counts on
// the host already: it takes host row offsets as a by-value parameter block.
//
// Work split (bias grad): block (x, y) owns columns [128x, 128x + 128) of groups y, y + gridDim.y,
// ... in turn. Its 256 threads are 32 column lanes × 8 row lanes; thread (c, r) sums rows r, r + 8,
// ... of a group at columns c, c + 32, c + 64, c + 96 (coalesced: a warp reads 32 consecutive
// elements per load), then the 8 row-lane partials are added in a fixed order through shared
// memory. No atomics, and the order does not depend on the grid, so results are bit-reproducible
// run to run. The prob gradient and the bias add give each row to one block (rows grid-strided,
// the row's group by binary search in the offset table; dp_t: a fixed-order block sum). CPU
// oracles: cpu::bias_grad_run (cpu_gemm.cpp), cpu::bias_add_run and cpu::scaled_bias_grad_run
// (cpu_activation.cpp).
#include <algorithm>

#include "backends/cuda/check.h"
#include "backends/cuda/cuda_activation.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device_counts.cuh"
#include "backends/cuda/device_math.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/resources.h"

namespace moekit::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kColLanes = 32, kRowLanes = kThreads / kColLanes, kColsPerThread = 4;
constexpr int kTileCols = kColLanes * kColsPerThread;  // 128
constexpr int kBlocksPerSm = 8;  // 8 · 256 = 2048 threads: one wave of blocks fills an SM
// The offset table is (G + 1) int64 of dynamic shared memory: 64 KB at most, which every
// sm_70+ GPU allows once the kernel opts in above the default 48 KB.
constexpr int64_t kMaxGroups = 8191;
constexpr size_t kDefaultSharedBytes = 48 * 1024;

// ---------------------------------------------------------------- device helpers

/// Block-cooperative: off[0..G] (shared memory, G + 1 entries) = the exclusive prefix sums of
/// counts already known to be valid (off[G] = S). One pass over the counts in chunks of
/// blockDim.x: a warp shuffle scan, then the warp totals in a fixed order. Ends with a barrier.
__device__ void fill_group_offsets(const DeviceCounts& c, int64_t* off) {
  __shared__ int64_t warp_totals[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  int64_t base = 0;  // Σ of the counts of the chunks before this one
  for (int64_t g0 = 0; g0 < c.groups; g0 += blockDim.x) {
    const int64_t g = g0 + threadIdx.x;
    const int64_t m = g < c.groups ? count_at(c, g) : 0;
    int64_t inclusive = m;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t up = __shfl_up_sync(0xffffffffu, inclusive, o);
      if (lane >= o) inclusive += up;
    }
    if (lane == 31) warp_totals[warp] = inclusive;
    __syncthreads();
    int64_t before = base;
    for (int w = 0; w < warps; ++w) {
      if (w < warp) before += warp_totals[w];
      base += warp_totals[w];
    }
    if (g < c.groups) off[g] = before + inclusive - m;
    __syncthreads();  // warp_totals is rewritten by the next chunk
  }
  if (threadIdx.x == 0) off[c.groups] = base;
  __syncthreads();
}

// ---------------------------------------------------------------- kernels (device counts)

// dy: [T, N] row stride ld; probs: [T] or nullptr; db: [G, N] contiguous. Dynamic shared memory:
// the offset table, (G + 1) int64.
template <class In, class Out>
__global__ void __launch_bounds__(kThreads)
    grouped_bias_grad_kernel(const In* __restrict__ dy, int64_t ld, int64_t n,
                             const float* __restrict__ probs, DeviceCounts counts,
                             Out* __restrict__ db, bool accumulate) {
  extern __shared__ int64_t offsets_table[];
  __shared__ float partial[kRowLanes][kTileCols];
  if (block_valid_rows(counts) < 0) return;  // invalid counts: nothing is written
  fill_group_offsets(counts, offsets_table);
  const int lane = threadIdx.x % kColLanes, row_lane = threadIdx.x / kColLanes;
  const int64_t col0 = int64_t{blockIdx.x} * kTileCols + lane;

  for (int64_t g = blockIdx.y; g < counts.groups; g += gridDim.y) {
    const int64_t r_begin = offsets_table[g], r_end = offsets_table[g + 1];
    if (r_begin == r_end && accumulate) continue;  // db[g] += 0 (uniform over the block)
    float acc[kColsPerThread] = {};
#pragma unroll 4
    for (int64_t r = r_begin + row_lane; r < r_end; r += kRowLanes) {
      const In* row = dy + r * ld;
      const float p = probs ? probs[r] : 1.0f;
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) {
        const int64_t c = col0 + j * kColLanes;
        if (c < n) acc[j] += p * to_float(row[c]);
      }
    }
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) partial[row_lane][lane + j * kColLanes] = acc[j];
    __syncthreads();
    if (row_lane == 0) {
      Out* out = db + g * n;
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) {
        const int64_t c = col0 + j * kColLanes;
        if (c >= n) continue;
        float s = 0.0f;
#pragma unroll
        for (int r = 0; r < kRowLanes; ++r) s += partial[r][lane + j * kColLanes];
        if (accumulate) {
          out[c] = from_float<Out>(to_float(out[c]) + s);
        } else {
          out[c] = from_float<Out>(s);
        }
      }
    }
    __syncthreads();  // partial is reused by the next group
  }
}

// out[t, :] = x[t, :] + s_t · bias[g(t), :] for t < S (out may be x). Explicitly rounded mul and
// add (no FMA contraction): the same bits as the CPU oracle. Dynamic shared memory: the offset
// table.
template <class T>
__global__ void __launch_bounds__(kThreads)
    grouped_bias_add_kernel(const T* __restrict__ x, int64_t ldx, const T* __restrict__ bias,
                            int64_t n, const float* __restrict__ probs, DeviceCounts counts,
                            T* out, int64_t ldo) {
  extern __shared__ int64_t offsets_table[];
  const int64_t S = block_valid_rows(counts);
  if (S <= static_cast<int64_t>(blockIdx.x)) return;  // invalid counts (S = -1), or no row here
  fill_group_offsets(counts, offsets_table);
  for (int64_t r = blockIdx.x; r < S; r += gridDim.x) {
    const T* b = bias + group_of_row(offsets_table, counts.groups, r) * n;
    const float p = probs ? probs[r] : 1.0f;
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
      const float add = probs ? __fmul_rn(p, to_float(b[c])) : to_float(b[c]);
      out[r * ldo + c] = from_float<T>(__fadd_rn(to_float(x[r * ldx + c]), add));
    }
  }
}

// dprobs[t] (+)= Σ_n dy[t, n] · bias[g(t), n] for t < S; one block per row at a time, fixed-order
// block sum. dprobs == nullptr: the launch only checks the counts. Dynamic shared memory: the
// offset table.
template <class T>
__global__ void __launch_bounds__(kThreads)
    grouped_bias_dprobs_kernel(const T* __restrict__ dy, int64_t ld, const T* __restrict__ bias,
                               int64_t n, DeviceCounts counts, float* __restrict__ dprobs,
                               bool accumulate) {
  extern __shared__ int64_t offsets_table[];
  __shared__ float scratch[32];
  const int64_t S = block_valid_rows(counts);
  if (dprobs == nullptr || S <= static_cast<int64_t>(blockIdx.x)) return;
  fill_group_offsets(counts, offsets_table);
  for (int64_t r = blockIdx.x; r < S; r += gridDim.x) {
    const T* b = bias + group_of_row(offsets_table, counts.groups, r) * n;
    float local = 0.0f;
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
      local += to_float(dy[r * ld + c]) * to_float(b[c]);
    }
    const float dp = block_sum(local, scratch);
    if (threadIdx.x == 0) dprobs[r] = accumulate ? dprobs[r] + dp : dp;
  }
}

// ---------------------------------------------------------------- launchers (device counts)

int64_t blocks_per_wave(const CudaResources& res) {
  return int64_t{res.sm_count > 0 ? res.sm_count : 132} * kBlocksPerSm;
}

// Row kernels: one block per row up to a wave, and at least one block, so that every launch
// checks the counts (and reports invalid ones) even when there is nothing to write.
unsigned row_grid(int64_t rows, const CudaResources& res) {
  return static_cast<unsigned>(std::clamp<int64_t>(rows, 1, blocks_per_wave(res)));
}

// The dynamic shared memory of the offset table for `kernel`, which must opt in above 48 KB.
template <class Kernel>
size_t offsets_table_bytes(Kernel* kernel, int64_t groups) {
  const size_t bytes = static_cast<size_t>(groups + 1) * sizeof(int64_t);
  if (bytes > kDefaultSharedBytes) {
    MOEKIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes)));
  }
  return bytes;
}

template <class In, class Out>
void bias_grad_typed(const Tensor& dy, const float* probs, const DeviceCounts& counts,
                     const Tensor& db, bool accumulate, const CudaResources& res) {
  const int64_t n = dy.size(1);
  // N = 0 still launches one column tile (it writes nothing) so that the counts are checked.
  const int64_t tiles = std::max<int64_t>(1, (n + kTileCols - 1) / kTileCols);
  // Enough groups side by side to fill a wave; each block takes every gridDim.y-th group.
  const int64_t group_blocks =
      std::clamp<int64_t>(blocks_per_wave(res) / tiles, 1, std::min<int64_t>(counts.groups, 65535));
  auto* kernel = grouped_bias_grad_kernel<In, Out>;
  const size_t table = offsets_table_bytes(kernel, counts.groups);
  kernel<<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(group_blocks)), kThreads,
           table, res.stream>>>(static_cast<const In*>(dy.data()), dy.strides()[0], n, probs,
                                counts, static_cast<Out*>(db.data()), accumulate);
  MOEKIT_CUDA_CHECK_LAUNCH();
}

template <class In>
void bias_grad_out(const Tensor& dy, const float* probs, const DeviceCounts& counts,
                   const Tensor& db, bool accumulate, const CudaResources& res) {
  switch (db.dtype()) {
    case DType::F32: return bias_grad_typed<In, float>(dy, probs, counts, db, accumulate, res);
    case DType::F16: return bias_grad_typed<In, __half>(dy, probs, counts, db, accumulate, res);
    case DType::BF16:
      return bias_grad_typed<In, __nv_bfloat16>(dy, probs, counts, db, accumulate, res);
    default: throw_invalid("db", "dtype f32, f16 or bf16", name(db.dtype()));
  }
}

// db[g, :] (+)= Σ_{t in g} s_t·dy[t, :] (s_t = probs[t], or 1 when probs is null); an empty group
// gets 0 (unchanged when accumulating).
void launch_bias_grad(const Tensor& dy, const float* probs, const DeviceCounts& counts,
                      const Tensor& db, bool accumulate, const CudaResources& res) {
  switch (dy.dtype()) {
    case DType::F32: return bias_grad_out<float>(dy, probs, counts, db, accumulate, res);
    case DType::F16: return bias_grad_out<__half>(dy, probs, counts, db, accumulate, res);
    case DType::BF16: return bias_grad_out<__nv_bfloat16>(dy, probs, counts, db, accumulate, res);
    default: throw_invalid("dy", "dtype f32, f16 or bf16", name(dy.dtype()));
  }
}

template <class T>
void bias_add_typed(const detail::BiasAddArgs& args, const DeviceCounts& counts,
                    const CudaResources& res) {
  auto* kernel = grouped_bias_add_kernel<T>;
  const size_t table = offsets_table_bytes(kernel, counts.groups);
  kernel<<<row_grid(args.rows, res), kThreads, table, res.stream>>>(
      static_cast<const T*>(args.x.data()), args.x.strides()[0],
      static_cast<const T*>(args.bias.data()), args.n,
      args.probs.defined() ? args.probs.data_as<const float>() : nullptr, counts,
      static_cast<T*>(args.out.data()), args.out.strides()[0]);
  MOEKIT_CUDA_CHECK_LAUNCH();
}

template <class T>
void dprobs_typed(const detail::ScaledBiasGradArgs& args, const DeviceCounts& counts,
                  float* dprobs, const CudaResources& res) {
  auto* kernel = grouped_bias_dprobs_kernel<T>;
  const size_t table = offsets_table_bytes(kernel, counts.groups);
  kernel<<<row_grid(args.rows, res), kThreads, table, res.stream>>>(
      static_cast<const T*>(args.dy.data()), args.dy.strides()[0],
      static_cast<const T*>(args.bias.data()), args.n, counts, dprobs, args.accumulate_dprobs);
  MOEKIT_CUDA_CHECK_LAUNCH();
}

// "" when the offset table of `groups` groups fits in shared memory, else the reason.
std::string reject_groups(int64_t groups) {
  if (groups <= kMaxGroups) return "";
  return str("G = ", groups, " groups: the CUDA bias kernels keep the G + 1 row offsets in shared ",
             "memory (at most ", kMaxGroups, " groups)");
}

std::string reject_unless_cuda_and_groups_fit(const Context& ctx, int64_t groups) {
  std::string reason = reject_unless_cuda(ctx);
  return reason.empty() ? reject_groups(groups) : reason;
}

// ---------------------------------------------------------------- broadcast (host offsets)

constexpr int kMaxGroupsPerLaunch = 256;  // keeps the parameter block < 4 KB

struct GroupRows {
  int64_t begin[kMaxGroupsPerLaunch + 1];  // row offsets of the launch's groups (+ the end)
};

// out: [T, N] row stride ld_out; bias: [G, N] contiguous.
template <class T>
__global__ void grouped_bias_broadcast_kernel(const T* __restrict__ bias, int64_t n,
                                              GroupRows rows, int64_t g0, T* __restrict__ out,
                                              int64_t ld_out) {
  const int g = blockIdx.y;
  const T* b = bias + (g0 + g) * n;
  for (int64_t r = rows.begin[g] + blockIdx.x; r < rows.begin[g + 1]; r += gridDim.x) {
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) out[r * ld_out + c] = b[c];
  }
}

template <class F>
void for_each_launch(const std::vector<int64_t>& offsets, F&& launch_batch) {
  const int64_t groups = static_cast<int64_t>(offsets.size()) - 1;
  for (int64_t g0 = 0; g0 < groups; g0 += kMaxGroupsPerLaunch) {
    const int64_t count = std::min<int64_t>(kMaxGroupsPerLaunch, groups - g0);
    GroupRows rows{};
    for (int64_t i = 0; i <= count; ++i) rows.begin[i] = offsets[static_cast<size_t>(g0 + i)];
    launch_batch(g0, count, rows);
  }
}

template <class T>
void broadcast_typed(const Tensor& bias, const std::vector<int64_t>& offsets, const Tensor& out,
                     cudaStream_t stream) {
  const int64_t n = out.size(1);
  if (n == 0) return;
  for_each_launch(offsets, [&](int64_t g0, int64_t count, const GroupRows& rows) {
    const dim3 grid(64, static_cast<unsigned>(count));
    grouped_bias_broadcast_kernel<T><<<grid, 256, 0, stream>>>(
        static_cast<const T*>(bias.data()), n, rows, g0, static_cast<T*>(out.data()),
        out.strides()[0]);
    MOEKIT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void launch_grouped_bias_broadcast(const Tensor& bias, const std::vector<int64_t>& offsets,
                                   const Tensor& out, cudaStream_t stream) {
  switch (out.dtype()) {
    case DType::F32: return broadcast_typed<float>(bias, offsets, out, stream);
    case DType::F16: return broadcast_typed<__half>(bias, offsets, out, stream);
    case DType::BF16: return broadcast_typed<__nv_bfloat16>(bias, offsets, out, stream);
    default: throw_invalid("out", "dtype f32, f16 or bf16", name(out.dtype()));
  }
}

// ---------------------------------------------------------------- table entries
// G = 0: there are no counts to check and no rows to write, so nothing is launched.

std::string bias_grad_rejects(const detail::BiasGradArgs& args) {
  return reject_unless_cuda_and_groups_fit(args.ctx, args.groups);
}

void bias_grad_run(const detail::BiasGradArgs& args) {
  if (args.groups == 0) return;
  CudaResources& res = resources(args.ctx);
  DeviceGuard guard(res.device);
  const CountsOnDevice counts = counts_on_device(args.ctx, args.splits, args.rows);
  launch_bias_grad(args.dy, nullptr, counts.view, args.db, args.accumulate, res);
}

std::string bias_add_rejects(const detail::BiasAddArgs& args) {
  return reject_unless_cuda_and_groups_fit(args.ctx, args.groups);
}

void bias_add_run(const detail::BiasAddArgs& args) {
  if (args.groups == 0) return;
  CudaResources& res = resources(args.ctx);
  DeviceGuard guard(res.device);
  const CountsOnDevice counts = counts_on_device(args.ctx, args.splits, args.rows);
  switch (args.x.dtype()) {
    case DType::F32: return bias_add_typed<float>(args, counts.view, res);
    case DType::F16: return bias_add_typed<__half>(args, counts.view, res);
    case DType::BF16: return bias_add_typed<__nv_bfloat16>(args, counts.view, res);
    default: throw_invalid("x", "dtype f32, f16 or bf16", name(args.x.dtype()));
  }
}

std::string scaled_bias_grad_rejects(const detail::ScaledBiasGradArgs& args) {
  return reject_unless_cuda_and_groups_fit(args.ctx, args.groups);
}

void scaled_bias_grad_run(const detail::ScaledBiasGradArgs& args) {
  if (args.groups == 0) return;
  CudaResources& res = resources(args.ctx);
  DeviceGuard guard(res.device);
  const CountsOnDevice counts = counts_on_device(args.ctx, args.splits, args.rows);
  if (args.db.defined()) {
    launch_bias_grad(args.dy, args.probs.data_as<const float>(), counts.view, args.db,
                     /*accumulate=*/false, res);
  }
  if (!args.dprobs.defined()) return;
  // N = 0: dp_t is an empty sum, 0. Written as 0; added, it changes nothing (not even a -0), so
  // the launch only checks the counts.
  float* dprobs =
      args.n == 0 && args.accumulate_dprobs ? nullptr : args.dprobs.data_as<float>();
  switch (args.dy.dtype()) {
    case DType::F32: return dprobs_typed<float>(args, counts.view, dprobs, res);
    case DType::F16: return dprobs_typed<__half>(args, counts.view, dprobs, res);
    case DType::BF16: return dprobs_typed<__nv_bfloat16>(args, counts.view, dprobs, res);
    default: throw_invalid("dy", "dtype f32, f16 or bf16", name(args.dy.dtype()));
  }
}

// This backend's entries in the primitives' tables (declared in its header).
constexpr detail::Backend<detail::BiasGradArgs> kBiasGrad{"cuda", bias_grad_rejects, bias_grad_run};
constexpr detail::Backend<detail::BiasAddArgs> kBiasAdd{"cuda", bias_add_rejects, bias_add_run};
constexpr detail::Backend<detail::ScaledBiasGradArgs> kScaledBiasGrad{
    "cuda", scaled_bias_grad_rejects, scaled_bias_grad_run};

}  // namespace moekit::cuda
