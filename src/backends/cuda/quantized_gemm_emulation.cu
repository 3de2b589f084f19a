// The quantized grouped GEMMs of MXFP8 and NVFP4 on the GPU, as emulation (SPEC §6d): Hopper has
// no tensor-core path for 1×32 / 1×16 block scales (CUTLASS's sm90 blockwise mainloop needs
// K-blocks >= 128), so the operands are dequantized to fp32 (quantize.cu's dequantize, bit for
// bit the CPU's) and multiplied by a tiled fp32 SIMT GEMM that writes the output straight into
// `out` / `dw` (the caller's buffers), rounded once, bias added in fp32 first. CPU oracle:
// cpu::quant_group_m_run / quant_group_k_run (cpu_quantize.cpp): the same products in fp32, in
// another summation order (the GPU matches within the fp32 accumulation tolerance). Counts are
// read on the device (graph-safe); invalid counts write nothing (quantize.cu's setup kernel sets
// the error word). The table tries quantized_gemm_bf16.cu's tensor-core path first (every recipe
// with power-of-two scales and bf16 outputs: mxfp8 lands here only for f16 / f32 outputs or when
// forced); fp8-current and fp8-block are refused here: they run on the sm_90a FP8 grouped GEMMs
// (cuda-fp8, bf16 or f16 outputs) or, with power-of-two scales, on the bf16 path — an f32 output
// waits for an f32 FP8 instance, not an emulation.
//
// Tiles: 16×16 outputs per CTA of 16×16 threads, the reduction walked in steps of 16 through
// shared memory, each thread summing its output in order (deterministic run to run). Group-M: a
// CTA's 16 rows belong to one group (row tiles are laid out per group: the setup kernel's block
// offsets with block 16). Group-K: one CTA per (16 outputs × 16 inputs) tile of one group.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backends/contract/quant_args.h"
#include "backends/cuda/check.h"
#include "backends/cuda/cuda_quantize.h"
#include "backends/cuda/device_math.cuh"
#include "backends/cuda/resources.h"

namespace moekit::cuda {
namespace {

constexpr int kTile = 16;

// out[t, j] = Σ_r a[t, r] · b_g[j · ldb + r] (+ bias[g, j]) for the rows t of group g.
template <class T>
__global__ void emulated_group_m_kernel(const float* a, const float* b, int64_t b_group_stride,
                                        int64_t ldb, const T* bias, T* out, int64_t G,
                                        int64_t reduction, int64_t n, const int64_t* ws) {
  if (ws[0] < 0) return;  // invalid counts: nothing written
  const int64_t* off = ws + 1;
  const int64_t* tiles = ws + 2 + G;
  const int64_t k = blockIdx.x;
  if (k >= tiles[G]) return;
  const int64_t g = group_of_row(tiles, G, k);
  const int64_t t0 = off[g] + (k - tiles[g]) * kTile, t_end = off[g + 1];
  const int64_t t = t0 + threadIdx.y, j = static_cast<int64_t>(blockIdx.y) * kTile + threadIdx.x;
  const float* bg = b + g * b_group_stride;
  __shared__ float as[kTile][kTile + 1], bs[kTile][kTile + 1];
  float acc = 0.0f;
  for (int64_t r0 = 0; r0 < reduction; r0 += kTile) {
    const int64_t ra = r0 + threadIdx.x;
    as[threadIdx.y][threadIdx.x] = t < t_end && ra < reduction ? a[t * reduction + ra] : 0.0f;
    const int64_t jb = static_cast<int64_t>(blockIdx.y) * kTile + threadIdx.y;
    bs[threadIdx.y][threadIdx.x] = jb < n && ra < reduction ? bg[jb * ldb + ra] : 0.0f;
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kTile; ++r) acc += as[threadIdx.y][r] * bs[threadIdx.x][r];
    __syncthreads();
  }
  if (t < t_end && j < n) {
    if (bias) acc += to_float(bias[g * n + j]);
    out[t * n + j] = from_float<T>(acc);
  }
}

// dw[g, i, j] (+)= Σ_{t in g} dyc[i · T + t] · xc[j · T + t]   (dyc [N, T], xc [K, T]).
template <class T>
__global__ void emulated_group_k_kernel(const float* dyc, const float* xc, T* dw, int64_t rows,
                                        int64_t n, int64_t k, bool accumulate, const int64_t* ws) {
  if (ws[0] < 0) return;
  const int64_t g = blockIdx.z;
  const int64_t* off = ws + 1;
  const int64_t t_begin = off[g], t_end = off[g + 1];
  const int64_t i = static_cast<int64_t>(blockIdx.y) * kTile + threadIdx.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
  __shared__ float ds[kTile][kTile + 1], xs[kTile][kTile + 1];
  float acc = 0.0f;
  for (int64_t t0 = t_begin; t0 < t_end; t0 += kTile) {
    const int64_t t = t0 + threadIdx.x;
    const int64_t ir = static_cast<int64_t>(blockIdx.y) * kTile + threadIdx.y;
    const int64_t jr = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.y;
    ds[threadIdx.y][threadIdx.x] = ir < n && t < t_end ? dyc[ir * rows + t] : 0.0f;
    xs[threadIdx.y][threadIdx.x] = jr < k && t < t_end ? xc[jr * rows + t] : 0.0f;
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kTile; ++r) acc += ds[threadIdx.y][r] * xs[threadIdx.x][r];
    __syncthreads();
  }
  if (i >= n || j >= k) return;
  T* d = dw + (g * n + i) * k + j;
  if (accumulate) {
    if (t_end > t_begin) *d = from_float<T>(to_float(*d) + acc);  // an empty group: unchanged
  } else {
    *d = from_float<T>(acc);
  }
}

std::string reject_unless_emulated(const Context& ctx, RecipeKind recipe) {
  std::string why = reject_unless_cuda(ctx);
  if (!why.empty()) return why;
  if (recipe == RecipeKind::Mxfp8 || recipe == RecipeKind::Nvfp4) return "";
  return str("recipe ", Recipe{recipe}.name(),
             " has no GPU path for this call yet: the native sm_90a FP8 GEMMs (cuda-fp8) write "
             "bf16 or f16 outputs, the bf16 tensor-core path (cuda-bf16) takes bf16 outputs with "
             "power-of-two scales, and this fp32 emulation mxfp8 and nvfp4 only");
}

Tensor dequantized(const Context& ctx, const QuantizedTensor& q, const Splits& splits,
                   QuantUsage which) {
  const Shape shape = which == QuantUsage::Rowwise ? Shape{q.rows, q.cols} : Shape{q.cols, q.rows};
  Tensor out = Tensor::empty(shape, DType::F32, ctx);
  // Elements outside the valid rows are never read by the GEMMs (rows of other groups are
  // bounded by the offsets), so no fill is needed.
  dequantize_run(detail::DequantizeArgs{ctx, q, splits, which, out});
  return out;
}

template <class T>
void group_m_typed(const detail::QuantGroupMArgs& a, const Tensor& a32, const Tensor& b32,
                   const Tensor& ws, CudaResources& res) {
  const bool fprop = a.op == BOp::Transposed;
  const int64_t per_group = a.b.rows / a.groups;
  const int64_t stride = fprop ? per_group * a.k : per_group;
  const int64_t ldb = fprop ? a.k : a.b.rows;
  const dim3 grid(static_cast<unsigned>((a.rows + kTile - 1) / kTile + a.groups),
                  static_cast<unsigned>((a.n + kTile - 1) / kTile));
  emulated_group_m_kernel<T><<<grid, dim3(kTile, kTile), 0, res.stream>>>(
      a32.data_as<const float>(), b32.data_as<const float>(), stride, ldb,
      a.bias.defined() ? a.bias.data_as<const T>() : nullptr, a.out.data_as<T>(), a.groups, a.k,
      a.n, ws.data_as<const int64_t>());
  MOEKIT_CUDA_CHECK_LAUNCH();
}

template <class T>
void group_k_typed(const detail::QuantGroupKArgs& a, const Tensor& dyc, const Tensor& xc,
                   const Tensor& ws, CudaResources& res) {
  const dim3 grid(static_cast<unsigned>((a.k + kTile - 1) / kTile),
                  static_cast<unsigned>((a.n + kTile - 1) / kTile),
                  static_cast<unsigned>(a.groups));
  emulated_group_k_kernel<T><<<grid, dim3(kTile, kTile), 0, res.stream>>>(
      dyc.data_as<const float>(), xc.data_as<const float>(), a.dw.data_as<T>(), a.rows, a.n, a.k,
      a.accumulate, ws.data_as<const int64_t>());
  MOEKIT_CUDA_CHECK_LAUNCH();
}

}  // namespace

std::string emulated_group_m_rejects(const detail::QuantGroupMArgs& a) {
  std::string why = reject_unless_emulated(a.ctx, a.a.spec.recipe);
  if (why.empty() && (a.n + kTile - 1) / kTile > 65535) {
    why = str("out's ", a.n, " columns exceed the emulation's grid (65535 tiles of 16)");
  }
  return why;
}

void emulated_group_m_run(const detail::QuantGroupMArgs& a) {
  if (a.groups == 0) return;
  CudaResources& res = resources(a.ctx);
  DeviceGuard guard(res.device);
  const bool fprop = a.op == BOp::Transposed;
  const Tensor ws = Tensor::empty({2 * a.groups + 3}, DType::I64, a.ctx);
  group_offsets_on_device(a.ctx, a.splits, a.rows, a.groups, kTile, ws);
  const Tensor a32 = dequantized(a.ctx, a.a, a.splits, QuantUsage::Rowwise);
  const Tensor b32 = dequantized(a.ctx, a.b, weight_splits(a.b),
                                 fprop ? QuantUsage::Rowwise : QuantUsage::Columnwise);
  switch (a.out.dtype()) {
    case DType::F32:
      return group_m_typed<float>(a, a32, b32, ws, res);
    case DType::F16:
      return group_m_typed<__half>(a, a32, b32, ws, res);
    case DType::BF16:
      return group_m_typed<__nv_bfloat16>(a, a32, b32, ws, res);
    default:
      throw_invalid("out", "dtype f32, f16 or bf16", name(a.out.dtype()));
  }
}

std::string emulated_group_k_rejects(const detail::QuantGroupKArgs& a) {
  std::string why = reject_unless_emulated(a.ctx, a.dy.spec.recipe);
  if (why.empty() && (a.groups > 65535 || (a.n + kTile - 1) / kTile > 65535)) {
    why = str(a.groups, " groups or ", a.n, " rows of dw exceed the emulation's grid");
  }
  return why;
}

void emulated_group_k_run(const detail::QuantGroupKArgs& a) {
  if (a.groups == 0) return;
  CudaResources& res = resources(a.ctx);
  DeviceGuard guard(res.device);
  const Tensor ws = Tensor::empty({2 * a.groups + 3}, DType::I64, a.ctx);
  group_offsets_on_device(a.ctx, a.splits, a.rows, a.groups, kTile, ws);
  const Tensor dyc = dequantized(a.ctx, a.dy, a.splits, QuantUsage::Columnwise);
  const Tensor xc = dequantized(a.ctx, a.x, a.splits, QuantUsage::Columnwise);
  switch (a.dw.dtype()) {
    case DType::F32:
      return group_k_typed<float>(a, dyc, xc, ws, res);
    case DType::F16:
      return group_k_typed<__half>(a, dyc, xc, ws, res);
    case DType::BF16:
      return group_k_typed<__nv_bfloat16>(a, dyc, xc, ws, res);
    default:
      throw_invalid("dw", "dtype f32, f16 or bf16", name(a.dw.dtype()));
  }
}

// This backend's entries in the quantized-GEMM tables (declared in cuda_quantize.h).
constexpr detail::Backend<detail::QuantGroupMArgs> kEmulatedQuantGroupM{
    "cuda", emulated_group_m_rejects, emulated_group_m_run};
constexpr detail::Backend<detail::QuantGroupKArgs> kEmulatedQuantGroupK{
    "cuda", emulated_group_k_rejects, emulated_group_k_run};

}  // namespace moekit::cuda
