// Bias kernels of the CUDA backend:
//   grouped bias gradient    db[g] = Σ_{t in g} s_t·dy[t]  (s_t = 1, or the routing prob p_t)
//   prob gradient of a bias  dp_t  = Σ_n dy[t, n]·bias[g(t), n]
//   grouped bias add         out[t] = x[t] + s_t·bias[g(t)]
//   grouped bias broadcast   out[t] = bias[g(t)]             (K = 0 group-M GEMMs only)
// All fp32 math with one rounding into the output dtype; rows outside [off_g, off_g + m_g) are
// never touched. Groups reach the kernels as row offsets in a by-value parameter block (up to
// 256 groups per launch).
//
// Work split (bias grad): block (x, y) owns columns [128x, 128x + 128) of group g0 + y. Its 256
// threads are 32 column lanes × 8 row lanes; thread (c, r) sums rows r, r + 8, ... of the group
// at columns c, c + 32, c + 64, c + 96 (coalesced: a warp reads 32 consecutive elements per load),
// then the 8 row-lane partials are added in a fixed order through shared memory. No atomics, so
// results are bit-reproducible run to run. The prob gradient and the bias add give each row to
// one block (dp_t: a fixed-order block sum). CPU oracles: cpu::bias_grad_run (cpu_gemm.cpp),
// cpu::bias_add_run and cpu::scaled_bias_grad_run (cpu_activation.cpp).
#include <algorithm>

#include "cuda/check.h"
#include "cuda/cuda_activation.h"
#include "cuda/device_math.cuh"
#include "cuda/kernels.h"
#include "cuda/resources.h"

namespace moekit::cuda {
namespace {

constexpr int kColLanes = 32, kRowLanes = 8, kColsPerThread = 4;
constexpr int kTileCols = kColLanes * kColsPerThread;  // 128
constexpr int kMaxGroupsPerLaunch = 256;               // keeps the parameter block < 4 KB

struct GroupRows {
  int64_t begin[kMaxGroupsPerLaunch + 1];  // row offsets of the launch's groups (+ the end)
};

// dy: [T, N] row stride ld; probs: [T] or nullptr; db: [G, N] contiguous, group g0 + blockIdx.y.
template <class In, class Out>
__global__ void __launch_bounds__(kColLanes* kRowLanes)
    grouped_bias_grad_kernel(const In* __restrict__ dy, int64_t ld, int64_t n, GroupRows rows,
                             const float* __restrict__ probs, int64_t g0, Out* __restrict__ db,
                             bool accumulate) {
  const int g = blockIdx.y;
  const int64_t r_begin = rows.begin[g], r_end = rows.begin[g + 1];
  if (r_begin == r_end && accumulate) return;  // db[g] += 0
  const int lane = threadIdx.x, row_lane = threadIdx.y;
  const int64_t col0 = int64_t{blockIdx.x} * kTileCols + lane;

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

  __shared__ float partial[kRowLanes][kTileCols];
#pragma unroll
  for (int j = 0; j < kColsPerThread; ++j) partial[row_lane][lane + j * kColLanes] = acc[j];
  __syncthreads();
  if (row_lane != 0) return;
  Out* out = db + (g0 + g) * n;
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

template <class In, class Out>
void bias_grad_typed(const Tensor& dy, const float* probs, const std::vector<int64_t>& offsets,
                     const Tensor& db, bool accumulate, cudaStream_t stream) {
  const int64_t n = dy.size(1);
  if (n == 0) return;
  for_each_launch(offsets, [&](int64_t g0, int64_t count, const GroupRows& rows) {
    const dim3 grid(static_cast<unsigned>((n + kTileCols - 1) / kTileCols),
                    static_cast<unsigned>(count));
    const dim3 block(kColLanes, kRowLanes);
    grouped_bias_grad_kernel<In, Out><<<grid, block, 0, stream>>>(
        static_cast<const In*>(dy.data()), dy.strides()[0], n, rows, probs, g0,
        static_cast<Out*>(db.data()), accumulate);
    MOEKIT_CUDA_CHECK_LAUNCH();
  });
}

template <class In>
void bias_grad_out(const Tensor& dy, const float* probs, const std::vector<int64_t>& offsets,
                   const Tensor& db, bool accumulate, cudaStream_t stream) {
  switch (db.dtype()) {
    case DType::F32: return bias_grad_typed<In, float>(dy, probs, offsets, db, accumulate, stream);
    case DType::F16: return bias_grad_typed<In, __half>(dy, probs, offsets, db, accumulate, stream);
    case DType::BF16:
      return bias_grad_typed<In, __nv_bfloat16>(dy, probs, offsets, db, accumulate, stream);
    default: throw_invalid("db", "dtype f32, f16 or bf16", name(db.dtype()));
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

// out[t, :] = x[t, :] + s_t · bias[g, :] for the rows t of group g0 + blockIdx.y (out may be x).
// Explicitly rounded mul and add (no FMA contraction): the same bits as the CPU oracle.
template <class T>
__global__ void grouped_bias_add_kernel(const T* __restrict__ x, int64_t ldx,
                                        const T* __restrict__ bias, int64_t n,
                                        const float* __restrict__ probs, GroupRows rows,
                                        int64_t g0, T* out, int64_t ldo) {
  const int g = blockIdx.y;
  const T* b = bias + (g0 + g) * n;
  for (int64_t r = rows.begin[g] + blockIdx.x; r < rows.begin[g + 1]; r += gridDim.x) {
    const float p = probs ? probs[r] : 1.0f;
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
      const float add = probs ? __fmul_rn(p, to_float(b[c])) : to_float(b[c]);
      out[r * ldo + c] = from_float<T>(__fadd_rn(to_float(x[r * ldx + c]), add));
    }
  }
}

// dprobs[t] (+)= Σ_n dy[t, n] · bias[g, n] for the rows t of group g0 + blockIdx.y; one block per
// row at a time, fixed-order block sum.
template <class T>
__global__ void grouped_bias_dprobs_kernel(const T* __restrict__ dy, int64_t ld,
                                           const T* __restrict__ bias, int64_t n, GroupRows rows,
                                           int64_t g0, float* __restrict__ dprobs,
                                           bool accumulate) {
  __shared__ float scratch[32];
  const int g = blockIdx.y;
  const T* b = bias + (g0 + g) * n;
  for (int64_t r = rows.begin[g] + blockIdx.x; r < rows.begin[g + 1]; r += gridDim.x) {
    float local = 0.0f;
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
      local += to_float(dy[r * ld + c]) * to_float(b[c]);
    }
    const float dp = block_sum(local, scratch);
    if (threadIdx.x == 0) dprobs[r] = accumulate ? dprobs[r] + dp : dp;
  }
}

// Blocks along x for a per-group row loop: enough to fill the GPU when one group holds most rows.
unsigned row_blocks(const std::vector<int64_t>& offsets) {
  int64_t most = 0;
  for (size_t g = 0; g + 1 < offsets.size(); ++g) most = std::max(most, offsets[g + 1] - offsets[g]);
  return static_cast<unsigned>(std::clamp<int64_t>(most, 1, 1024));
}

template <class T>
void bias_add_typed(const detail::BiasAddArgs& args, const std::vector<int64_t>& offsets,
                    cudaStream_t stream) {
  const unsigned blocks = row_blocks(offsets);
  for_each_launch(offsets, [&](int64_t g0, int64_t count, const GroupRows& rows) {
    grouped_bias_add_kernel<T><<<dim3(blocks, static_cast<unsigned>(count)), 256, 0, stream>>>(
        static_cast<const T*>(args.x.data()), args.x.strides()[0],
        static_cast<const T*>(args.bias.data()), args.n,
        args.probs.defined() ? args.probs.data_as<const float>() : nullptr, rows, g0,
        static_cast<T*>(args.out.data()), args.out.strides()[0]);
    MOEKIT_CUDA_CHECK_LAUNCH();
  });
}

template <class T>
void dprobs_typed(const detail::ScaledBiasGradArgs& args, const std::vector<int64_t>& offsets,
                  cudaStream_t stream) {
  const unsigned blocks = row_blocks(offsets);
  for_each_launch(offsets, [&](int64_t g0, int64_t count, const GroupRows& rows) {
    grouped_bias_dprobs_kernel<T><<<dim3(blocks, static_cast<unsigned>(count)), 256, 0, stream>>>(
        static_cast<const T*>(args.dy.data()), args.dy.strides()[0],
        static_cast<const T*>(args.bias.data()), args.n, rows, g0, args.dprobs.data_as<float>(),
        args.accumulate_dprobs);
    MOEKIT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void launch_grouped_bias_grad(const Tensor& dy, const float* probs,
                              const std::vector<int64_t>& offsets, const Tensor& db,
                              bool accumulate, cudaStream_t stream) {
  switch (dy.dtype()) {
    case DType::F32: return bias_grad_out<float>(dy, probs, offsets, db, accumulate, stream);
    case DType::F16: return bias_grad_out<__half>(dy, probs, offsets, db, accumulate, stream);
    case DType::BF16: return bias_grad_out<__nv_bfloat16>(dy, probs, offsets, db, accumulate, stream);
    default: throw_invalid("dy", "dtype f32, f16 or bf16", name(dy.dtype()));
  }
}

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
std::string bias_add_rejects(const detail::BiasAddArgs& args) { return reject_unless_cuda(args.ctx); }

void bias_add_run(const detail::BiasAddArgs& args) {
  CudaResources& res = resources(args.ctx);
  DeviceGuard guard(res.device);
  const std::vector<int64_t> offsets =
      offsets_of(checked_host_counts(args.ctx, args.splits, args.rows));
  if (args.n == 0 || offsets.back() == 0) return;
  switch (args.x.dtype()) {
    case DType::F32: return bias_add_typed<float>(args, offsets, res.stream);
    case DType::F16: return bias_add_typed<__half>(args, offsets, res.stream);
    case DType::BF16: return bias_add_typed<__nv_bfloat16>(args, offsets, res.stream);
    default: throw_invalid("x", "dtype f32, f16 or bf16", name(args.x.dtype()));
  }
}

std::string scaled_bias_grad_rejects(const detail::ScaledBiasGradArgs& args) {
  return reject_unless_cuda(args.ctx);
}

void scaled_bias_grad_run(const detail::ScaledBiasGradArgs& args) {
  CudaResources& res = resources(args.ctx);
  DeviceGuard guard(res.device);
  const std::vector<int64_t> offsets =
      offsets_of(checked_host_counts(args.ctx, args.splits, args.rows));
  if (args.db.defined()) {
    launch_grouped_bias_grad(args.dy, args.probs.data_as<const float>(), offsets, args.db,
                             /*accumulate=*/false, res.stream);
  }
  if (!args.dprobs.defined() || offsets.back() == 0) return;
  if (args.n == 0) {  // empty sums: dp = 0 (unchanged when accumulating)
    if (!args.accumulate_dprobs) {
      MOEKIT_CUDA_CHECK(cudaMemsetAsync(args.dprobs.data(), 0,
                                        static_cast<size_t>(offsets.back()) * sizeof(float),
                                        res.stream));
    }
    return;
  }
  switch (args.dy.dtype()) {
    case DType::F32: return dprobs_typed<float>(args, offsets, res.stream);
    case DType::F16: return dprobs_typed<__half>(args, offsets, res.stream);
    case DType::BF16: return dprobs_typed<__nv_bfloat16>(args, offsets, res.stream);
    default: throw_invalid("dy", "dtype f32, f16 or bf16", name(args.dy.dtype()));
  }
}

}  // namespace moekit::cuda
