// GPU quantize of every recipe (SPEC §6b): the "cuda" entries of the quantize and dequantize
// tables. CPU oracle:
// cpu::quantize_run (src/backends/cpu/cpu_quantize.cpp); the scalar math is
// backends/contract/quant_math.h, checked against the CPU's on a million values in test_quant,
// so the copies and scales here equal the CPU reference's bit for bit (tests/test_quant.cpp,
// QuantizeCuda.*: written for a GPU, not run here).
//
// Graph-safe, no host synchronisation: the counts are read on the device (device splits as they
// are, host splits copied in stream order). One launch of a setup kernel validates them
// (block_valid_rows: invalid counts → the error word's bit, and every later kernel writes
// nothing) and writes the row offsets and the row-block offsets of every group; per-group amaxes
// (fp8-current, NVFP4) are atomic maxima of the fp32 bits (non-negative floats order as their
// bits; NaN never enters), then the group scales; then one cast kernel per copy:
//   rowwise 1-D (1×128 / 1×32 / 1×16): one thread per (row, block) — amax, scale, codes;
//   columnwise 1-D: one thread per (group row block, column) — amax down the block, codes
//     written into the transposed copy (e2m1: two rows per byte; groups hold even rows);
//   1×128 with 128×1 (fp8-block, C % 4 == 0): one CTA per (group row block, 128 columns), both
//     copies and both scales from one read (cp.async into the thread's slots);
//   128×128: one CTA per tile — a block-wide amax, then both copies;
//   per group: one CTA per 64×128 tile, both copies from one read (the columnwise one through
//     shared memory).
// With a bias gradient asked for (QuantizeArgs::db), the fp8-current and fp8-block one-read kernels
// also sum each tile's columns (kDb: the per-group kernel's tiles then follow the groups' blocks of
// 64 rows, as the fp8-block kernel's do), and db_reduce_kernel adds each group's tiles in order;
// every other path runs grouped_bias_grad's kernel after the quantize (a second read of x).
// Rows [S, T) are never read or written. NVFP4's columnwise copy needs even counts: an odd device
// count makes the call write nothing and sets Context::kCountsMisaligned. The fp8-block and
// per-group kernels read every element once, the other 1-D block kernels once per copy, the 128×128
// one twice (ARCHITECTURE.md: what the bandwidth target still needs).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "backends/contract/quant_args.h"
#include "backends/contract/quant_math.h"
#include "backends/cuda/check.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_quantize.h"
#include "backends/cuda/device_counts.cuh"
#include "backends/cuda/device_math.cuh"
#include "backends/cuda/resources.h"

namespace moekit::cuda {
namespace {
namespace qm = quant_math;

// What every kernel of one quantize shares (by value).
struct QuantParams {
  const void* x;  // [T, C] f32 / f16 / bf16
  int64_t T, C, G, block, RB;
  QuantFormat format;
  Scaling scaling;
  bool power_2;
  float epsilon, fp8_max, value_for_inf, max_norm_rcp;
  uint8_t* row;  // [T, C] (e2m1: [T, ⌈C/2⌉]) or null
  uint8_t* col;  // [C, T] (e2m1: [C, ⌈T/2⌉]) or null
  int64_t row_ld, col_ld;
  void* row_scale;  // see QuantizedTensor
  void* col_scale;
  float* amax;       // [G] or null
  float* group_dec;  // [G] (Nv) or null
  // The fused bias gradient (the kDb kernels): each tile row block's column sums [RB, C], the
  // tiles' row blocks never crossing a group (the setup kernel's row-block offsets of `block`).
  float* db_part;
  // Workspace written by the setup kernel: [0] = S (or -1: invalid counts), offsets [G+1] at
  // [1..], row-block offsets [G+1] after them.
  int64_t* ws;
};

__device__ __forceinline__ const int64_t* offsets(const QuantParams& p) {
  return p.ws + 1;
}
__device__ __forceinline__ const int64_t* rb_offsets(const QuantParams& p) {
  return p.ws + 2 + p.G;
}

template <class T>
__device__ __forceinline__ float load(const QuantParams& p, int64_t t, int64_t c) {
  return to_float(static_cast<const T*>(p.x)[t * p.C + c]);
}

__device__ __forceinline__ uint8_t encode(const QuantParams& p, float v) {
  switch (p.format) {
    case QuantFormat::E4M3:
      return qm::encode_fp8(v, qm::e4m3());
    case QuantFormat::E5M2:
      return qm::encode_fp8(v, qm::e5m2());
    default:
      return qm::encode_e2m1(v);
  }
}

// e4m3 / e5m2 codes of two values by the tensor cores' conversion (cvt.rn.satfinite: RNE,
// saturating to ±max, infinities too) — the same codes as qm::encode_fp8, which
// QuantizeCuda.Fp8CodesOfEdgesAndAMillionRandomFloatsEqualTheCpu checks on the GPU; NaN is set
// apart (encode_fp8's nan_code, unsigned) rather than left to the instruction's NaN.
__device__ __forceinline__ uint16_t encode_fp8_pair(const QuantParams& p, float a, float b) {
  const bool e4 = p.format == QuantFormat::E4M3;
  uint16_t r = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, e4 ? __NV_E4M3 : __NV_E5M2);
  const uint16_t nan = e4 ? 0x7F : 0x7E;
  if (a != a) r = static_cast<uint16_t>((r & 0xFF00u) | nan);
  if (b != b) r = static_cast<uint16_t>((r & 0x00FFu) | (nan << 8));
  return r;
}

__global__ void quant_setup_kernel(DeviceCounts counts, QuantParams p) {
  int64_t S = block_valid_rows(counts);  // every thread; reports invalid counts once
  if (threadIdx.x != 0) return;
  // e2m1's columnwise copy packs two rows per byte, never across groups: even counts only
  // (host counts were checked at bind; device counts are checked here).
  if (S >= 0 && p.format == QuantFormat::E2M1 && p.col) {
    for (int64_t g = 0; g < p.G; ++g) {
      if (count_at(counts, g) % 2 != 0) {
        if (counts.error_word) atomicOr(counts.error_word, kDeviceCountsMisaligned);
        S = -1;
        break;
      }
    }
  }
  p.ws[0] = S;
  if (S < 0) return;
  int64_t* off = p.ws + 1;
  int64_t* rb = p.ws + 2 + p.G;
  off[0] = rb[0] = 0;
  for (int64_t g = 0; g < p.G; ++g) {
    const int64_t m = count_at(counts, g);
    off[g + 1] = off[g] + m;
    rb[g + 1] = rb[g] + (p.block > 0 ? (m + p.block - 1) / p.block : 0);
    if (p.amax) p.amax[g] = 0.0f;
  }
}

// amax_g = max |x| over group g's rows: one warp per row, V elements a lane per load (V = 16 bytes'
// worth when C and x allow it), atomicMax on the fp32 bits.
template <class T, int V>
__global__ void group_amax_kernel(QuantParams p) {
  const int64_t S = p.ws[0];
  if (S < 0) return;
  struct alignas(V * sizeof(T)) Vec { T v[V]; };
  const int lane = threadIdx.x & 31;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t t = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; t < S;
       t += warps) {
    float m = 0.0f;
    const T* row = static_cast<const T*>(p.x) + t * p.C;
    for (int64_t c = lane * V; c < p.C; c += 32 * V) {
      const Vec x = *reinterpret_cast<const Vec*>(row + c);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float a = qm::abs_f(to_float(x.v[j]));
        if (a > m) m = a;  // NaN never wins
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, m, o);
      if (other > m) m = other;
    }
    if (lane == 0 && m > 0.0f) {
      const int64_t g = group_of_row(offsets(p), p.G, t);
      atomicMax(reinterpret_cast<unsigned int*>(p.amax + g), __float_as_uint(m));
    }
  }
}

// Per-group scales: fp8-current's scale_inv [G]; NVFP4's s_dec [G].
__global__ void group_scales_kernel(QuantParams p) {
  if (p.ws[0] < 0) return;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= p.G) return;
  if (p.scaling == Scaling::Nv) {
    float enc, dec;
    qm::nv_group_scales(p.amax[g], &enc, &dec);
    p.group_dec[g] = dec;
  } else {
    const float s =
        qm::scale_from_amax(p.amax[g], p.fp8_max, p.power_2, p.epsilon, p.value_for_inf);
    static_cast<float*>(p.row_scale)[g] = 1.0f / s;
  }
}

// The factor a block of amax `a` multiplies its elements by; writes its stored scale at `i`.
__device__ __forceinline__ float block_scale(const QuantParams& p, float a, int64_t g, void* scales,
                                             int64_t i) {
  switch (p.scaling) {
    case Scaling::Mx: {
      const uint8_t e = qm::e8m0_round_up(a * p.max_norm_rcp);
      static_cast<uint8_t*>(scales)[i] = e;
      return qm::e8m0_reciprocal(e);
    }
    case Scaling::Nv: {
      float enc, dec;
      qm::nv_group_scales(p.amax[g], &enc, &dec);
      float b = a * (enc * (1.0f / 6.0f));
      if (!(b <= 3.40282347e38f)) b = 3.40282347e38f;  // fminf(b, FLT_MAX)
      const uint8_t sb = qm::encode_fp8(b, qm::e4m3());
      static_cast<uint8_t*>(scales)[i] = sb;
      float f = 1.0f / (qm::decode_e4m3(sb) * dec);
      if (!(f <= 3.40282347e38f)) f = 3.40282347e38f;  // fminf(f, FLT_MAX)
      return f;
    }
    default: {
      const float s = qm::scale_from_amax(a, p.fp8_max, p.power_2, p.epsilon, p.value_for_inf);
      static_cast<float*>(scales)[i] = 1.0f / s;
      return s;
    }
  }
}

// Rowwise 1×b blocks: one warp per (row, block), its lanes along the row (coalesced loads and
// stores); the block's amax by a warp reduction (a max: the same value as any order), its scale
// from lane 0.
template <class T>
__global__ void rowwise_blocks_kernel(QuantParams p) {
  const int64_t S = p.ws[0];
  if (S < 0) return;
  const int64_t cb = (p.C + p.block - 1) / p.block;
  const bool fp4 = p.format == QuantFormat::E2M1;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t per_cta = blockDim.x / 32, warps = static_cast<int64_t>(gridDim.x) * per_cta;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * per_cta + threadIdx.x / 32; w < S * cb;
       w += warps) {  // w is the warp's: every lane takes the same trips
    const int64_t t = w / cb, j = w % cb, c0 = j * p.block;
    const int64_t c1 = c0 + p.block < p.C ? c0 + p.block : p.C;
    float a = 0.0f;
    for (int64_t c = c0 + lane; c < c1; c += 32) {
      const float v = qm::abs_f(load<T>(p, t, c));
      if (v > a) a = v;  // NaN never wins, as in the CPU's loop
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, a, o);
      if (other > a) a = other;
    }
    float f = 0.0f;
    if (lane == 0) {
      const int64_t g = p.scaling == Scaling::Nv ? group_of_row(offsets(p), p.G, t) : 0;
      f = block_scale(p, a, g, p.row_scale, t * cb + j);
    }
    f = __shfl_sync(0xffffffffu, f, 0);
    if (fp4) {  // C even, blocks of 16: whole bytes, a pair per lane
      for (int64_t c = c0 + 2 * lane; c < c1; c += 64) {
        const uint8_t lo = encode(p, load<T>(p, t, c) * f),
                      hi = encode(p, load<T>(p, t, c + 1) * f);
        p.row[t * p.row_ld + c / 2] = static_cast<uint8_t>((lo & 0xF) | (hi << 4));
      }
    } else {
      for (int64_t c = c0 + lane; c < c1; c += 32) p.row[t * p.row_ld + c] = encode(p, load<T>(p, t, c) * f);
    }
  }
}

// Columnwise b×1 blocks down each group's rows (b <= 128): one CTA of 8 warps per (row block, 32
// columns). Loads along the columns (coalesced); each column's amax by 8 partial maxima (a max:
// any order gives the CPU's value), its scale from warp 0; the codes staged in shared memory and
// stored along each column's row of the copy (coalesced bytes instead of one per column).
constexpr int kColStrip = 32, kColWarps = 8, kColMaxBlock = 128;
template <class T>
__global__ void __launch_bounds__(kColStrip * kColWarps) columnwise_blocks_kernel(QuantParams p) {
  if (p.ws[0] < 0) return;
  __shared__ float part[kColWarps][kColStrip];
  __shared__ float factor[kColStrip];
  __shared__ uint8_t codes[kColStrip][kColMaxBlock + 4];
  const int64_t* rb = rb_offsets(p);
  const int64_t strips = (p.C + kColStrip - 1) / kColStrip, tiles = rb[p.G] * strips;
  const bool fp4 = p.format == QuantFormat::E2M1;
  const int lane = static_cast<int>(threadIdx.x % kColStrip), warp = static_cast<int>(threadIdx.x / kColStrip);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {  // uniform per CTA
    const int64_t k = tile / strips, c0 = (tile % strips) * kColStrip;
    const int64_t g = group_of_row(rb, p.G, k);
    const int64_t end = offsets(p)[g + 1];
    const int64_t t0 = offsets(p)[g] + (k - rb[g]) * p.block;
    const int64_t t1 = t0 + p.block < end ? t0 + p.block : end;
    const int64_t c = c0 + lane;
    const bool in = c < p.C;
    float a = 0.0f;
    if (in) {
      for (int64_t t = t0 + warp; t < t1; t += kColWarps) {
        const float v = qm::abs_f(load<T>(p, t, c));
        if (v > a) a = v;  // NaN never wins, as in the CPU's loop
      }
    }
    part[warp][lane] = a;
    __syncthreads();
    if (warp == 0) {
      float m = 0.0f;
      for (int w = 0; w < kColWarps; ++w) m = part[w][lane] > m ? part[w][lane] : m;
      if (in) factor[lane] = block_scale(p, m, g, p.col_scale, k * p.C + c);
    }
    __syncthreads();
    if (in) {
      const float f = factor[lane];
      for (int64_t t = t0 + warp; t < t1; t += kColWarps) {
        codes[lane][t - t0] = encode(p, load<T>(p, t, c) * f);
      }
    }
    __syncthreads();
    // Column c0 + j of the strip is row c0 + j of the copy: warp w stores columns w, w + 8, ...
    const int64_t n = t1 - t0;
    for (int j = warp; j < kColStrip && c0 + j < p.C; j += kColWarps) {
      uint8_t* row = p.col + (c0 + j) * p.col_ld;
      if (fp4) {  // the group's rows even (t0 even): whole bytes, rows (t, t + 1) in one
        for (int64_t e = 2 * lane; e < n; e += 2 * kColStrip) {
          row[(t0 + e) / 2] =
              static_cast<uint8_t>((codes[j][e] & 0xF) | (codes[j][e + 1] << 4));
        }
      } else {
        for (int64_t e = lane; e < n; e += kColStrip) row[t0 + e] = codes[j][e];
      }
    }
    __syncthreads();  // part, factor, codes reused by the next tile
  }
}

// 128×128 tiles: one CTA per (group row block, column block), grid-strided.
template <class T>
__global__ void tile_blocks_kernel(QuantParams p) {
  if (p.ws[0] < 0) return;
  __shared__ float warp_max[32];
  __shared__ float tile_factor;
  const int64_t* rb = rb_offsets(p);
  const int64_t cb = (p.C + p.block - 1) / p.block, tiles = rb[p.G] * cb;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t k = tile / cb, j = tile % cb;
    const int64_t g = group_of_row(rb, p.G, k);
    const int64_t end = offsets(p)[g + 1];
    const int64_t t0 = offsets(p)[g] + (k - rb[g]) * p.block,
                  t1 = t0 + p.block < end ? t0 + p.block : end;
    const int64_t c0 = j * p.block, c1 = c0 + p.block < p.C ? c0 + p.block : p.C;
    const int64_t w = c1 - c0, n = (t1 - t0) * w;
    float a = 0.0f;
    for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
      const float v = qm::abs_f(load<T>(p, t0 + e / w, c0 + e % w));
      if (v > a) a = v;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, a, o);
      if (other > a) a = other;
    }
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = a;
    __syncthreads();
    if (threadIdx.x == 0) {
      float m = 0.0f;
      for (unsigned i = 0; i < blockDim.x / 32; ++i) m = warp_max[i] > m ? warp_max[i] : m;
      tile_factor = block_scale(p, m, g, p.row_scale, k * cb + j);
    }
    __syncthreads();
    const float f = tile_factor;
    for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
      const int64_t t = t0 + e / w, c = c0 + e % w;
      const uint8_t code = encode(p, load<T>(p, t, c) * f);
      if (p.row) p.row[t * p.row_ld + c] = code;
      if (p.col) p.col[c * p.col_ld + t] = code;
    }
    __syncthreads();  // tile_factor / warp_max reused by the next tile
  }
}

// Stores a tile's columnwise codes, staged as codes[column][row] (rows [0, rows) of kRows), into
// the copy: column c0 + j of the tile is row c0 + j of the copy, from its column t0. With `words`
// (t0, col_ld and the copy 4-byte aligned) whole 4-byte words, then the tail's bytes: a thread
// keeps one word position w of the columns j0, j0 + kPass, ... (a warp: kRows / 4 consecutive
// words of a column, whole 128-byte lines at kRows = 128), its addresses stepped, not recomputed
// (the index arithmetic of a word a pass was ~20% of the 1×128 quantize's instructions, ncu on
// an H100, bench/results/2026-12-06-nvidia-h100-2d0ebb6-quantize-instructions.md).
template <int kRows, int kCols, int kThreads>
__device__ __forceinline__ void store_columnwise(const QuantParams& p, const uint8_t (*codes)[kRows + 4],
                                                 int64_t t0, int rows, int64_t c0, int cols, bool words) {
  if (words) {
    constexpr int kWords = kRows / 4, kPass = kThreads / kWords;
    static_assert(kThreads % kWords == 0 && kCols % kPass == 0, "whole passes of whole columns");
    const int w = static_cast<int>(threadIdx.x) % kWords, j0 = static_cast<int>(threadIdx.x) / kWords;
    const int whole = rows / 4;
    uint8_t* out = p.col + (c0 + j0) * p.col_ld + t0 + 4 * w;
    const int64_t step = int64_t{kPass} * p.col_ld;
    if (w < whole) {
#pragma unroll
      for (int q = 0; q < kCols / kPass; ++q) {
        if (j0 + q * kPass < cols) {
          *reinterpret_cast<uint32_t*>(out + q * step) =
              *reinterpret_cast<const uint32_t*>(&codes[j0 + q * kPass][4 * w]);
        }
      }
    } else if (w == whole) {
      for (int q = 0; q < kCols / kPass; ++q) {
        if (j0 + q * kPass < cols) {
          for (int r = 4 * w; r < rows; ++r) out[q * step + r - 4 * w] = codes[j0 + q * kPass][r];
        }
      }
    }
  } else {
    for (int e = threadIdx.x; e < cols * kRows; e += kThreads) {
      const int j = e / kRows, r = e % kRows;
      if (r < rows) p.col[(c0 + j) * p.col_ld + t0 + r] = codes[j][r];
    }
  }
}

// Four codes of x · f, e4m3 (kE4) or e5m2, as one little-endian word: encode_fp8_pair with the
// format a constant and, without kNan (no NaN among x's elements), no NaN fix-up.
template <bool kE4, bool kNan>
__device__ __forceinline__ uint32_t encode_fp8_quad_f(const float (&x)[4], const float (&f)[4]) {
  const auto pair = [](float a, float b) {
    uint16_t r = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kE4 ? __NV_E4M3 : __NV_E5M2);
    if constexpr (kNan) {
      const uint16_t nan = kE4 ? 0x7F : 0x7E;
      if (a != a) r = static_cast<uint16_t>((r & 0xFF00u) | nan);
      if (b != b) r = static_cast<uint16_t>((r & 0x00FFu) | (nan << 8));
    }
    return uint32_t{r};
  };
  return pair(x[0] * f[0], x[1] * f[1]) | (pair(x[2] * f[2], x[3] * f[3]) << 16);
}

// The packed pair type of a 16-bit element type.
template <class T>
struct Pair2;
template <>
struct Pair2<__nv_bfloat16> {
  using type = __nv_bfloat162;
};
template <>
struct Pair2<__half> {
  using type = __half2;
};

// The four codes of a 4x4 byte block transposed: w[j] byte i = byte j of c_i.
__device__ __forceinline__ void transpose_bytes(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t (&w)[4]) {
  const uint32_t t0 = __byte_perm(c0, c1, 0x5140), t1 = __byte_perm(c0, c1, 0x7362);  // c0/c1 bytes 0,1 | 2,3
  const uint32_t t2 = __byte_perm(c2, c3, 0x5140), t3 = __byte_perm(c2, c3, 0x7362);
  w[0] = __byte_perm(t0, t2, 0x5410);
  w[1] = __byte_perm(t0, t2, 0x7632);
  w[2] = __byte_perm(t1, t3, 0x5410);
  w[3] = __byte_perm(t1, t3, 0x7632);
}

// A thread's vector of 4 elements of x as raw words (the one-read kernels' registers): 16-bit types
// as two packed pairs (uint2), f32 as uint4. Kept packed, the pairs feed the packed maxima and are
// widened once per use (a shift or a mask for bf16): as a struct of four 16-bit elements they were
// split into 16-bit registers and packed again (~8% of the kernel's instructions, ncu on an H100,
// bench/results/2026-12-06-nvidia-h100-2d0ebb6-quantize-instructions.md).
template <class T>
struct RawVec {
  using type = uint2;
};
template <>
struct RawVec<float> {
  using type = uint4;
};
template <class T, class R>
__device__ __forceinline__ float raw_elem(const R& r, int j) {  // j a constant after unrolling
  if constexpr (std::is_same_v<T, float>) {
    return __uint_as_float(j == 0 ? r.x : j == 1 ? r.y : j == 2 ? r.z : r.w);
  } else {
    const uint32_t w = j < 2 ? r.x : r.y;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      return __uint_as_float(j % 2 == 0 ? w << 16 : w & 0xffff0000u);  // bf16 is f32's top half
    } else {
      return __half2float(__ushort_as_half(static_cast<unsigned short>(j % 2 == 0 ? w : w >> 16)));
    }
  }
}
template <class T, class R>
__device__ __forceinline__ void raw_floats(const R& r, float (&x)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) x[j] = raw_elem<T>(r, j);
}
template <class P>
__device__ __forceinline__ P as_pair(uint32_t w) {
  P q;
  __builtin_memcpy(&q, &w, sizeof(q));
  return q;
}

// Whether any element of a thread's raw vectors is NaN (16-bit types: a NaN-propagating max over the
// packed |x| pairs; f32: per element).
template <class T, class R, int N>
__device__ __forceinline__ bool any_nan(const R (&v)[N]) {
  if constexpr (std::is_same_v<T, float>) {
    bool nan = false;
#pragma unroll
    for (int i = 0; i < N; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float e = raw_elem<T>(v[i], j);
        nan |= e != e;
      }
    }
    return nan;
  } else {
    using P = typename Pair2<T>::type;
    P seen;
    if constexpr (std::is_same_v<T, __half>) seen = __float2half2_rn(0.0f);
    else seen = __float2bfloat162_rn(0.0f);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      seen = __hmax2_nan(seen, __hmax2_nan(__habs2(as_pair<P>(v[i].x)), __habs2(as_pair<P>(v[i].y))));
    }
    return __hisnan(seen.x) || __hisnan(seen.y);
  }
}

// body(kE4, kNan) with the format (e4m3 or e5m2) and the NaN fix-up as compile-time constants
// (std::true_type / std::false_type): the encode loops of the one-read kernels, entered by
// warp-uniform branches.
template <class F>
__device__ __forceinline__ void with_format_and_nan(bool e4, bool fix_nan, F&& body) {
  if (e4) {
    if (fix_nan) body(std::true_type{}, std::true_type{});
    else body(std::true_type{}, std::false_type{});
  } else {
    if (fix_nan) body(std::false_type{}, std::true_type{});
    else body(std::false_type{}, std::false_type{});
  }
}

// The fused bias gradient's share of one tile (kDb kernels): thread (warp, lane) holds rows of the
// tile at columns 4·lane .. 4·lane + 3 as raw vectors v (rows past the tile's: zeros); it sums its
// columns down its rows in order, then the warps' sums are added in warp order and stored at
// out[j] for the tile's columns j < cols. part: shared [warps][128], free on entry and on return
// (every thread of the CTA calls it).
template <class T, class R, int kN, int kWarps>
__device__ __forceinline__ void tile_column_sums(const R (&v)[kN], float (*part)[128], float* out,
                                                 int cols) {
  const int warp = static_cast<int>(threadIdx.x / 32), c = static_cast<int>(threadIdx.x % 32) * 4;
  float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    float x[4];
    raw_floats<T>(v[i], x);
#pragma unroll
    for (int j = 0; j < 4; ++j) sum[j] += x[j];
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) part[warp][c + j] = sum[j];
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < cols) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += part[w][threadIdx.x];
    out[threadIdx.x] = total;
  }
  __syncthreads();
}

// db[g, c] = Σ db_part[k, c] over group g's tile row blocks k in order, rounded once; 0 for an
// empty group. Nothing is written when the counts are invalid.
template <class Out>
__global__ void db_reduce_kernel(QuantParams p, Out* __restrict__ db) {
  if (p.ws[0] < 0) return;
  const int64_t* rb = rb_offsets(p);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.G * p.C;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t g = i / p.C, c = i % p.C;
    float sum = 0.0f;
    for (int64_t k = rb[g]; k < rb[g + 1]; ++k) sum += p.db_part[k * p.C + c];
    db[i] = from_float<Out>(sum);
  }
}

// Per-group scaling (e4m3 / e5m2): one CTA per tile of kPgRows rows × kPgCols columns
// (grid-strided), each element read once for both copies. A tile may span groups: each row's factor
// is its group's (1/scale_inv[g], recomputed exactly as group_scales_kernel stored it). One column
// a thread: the path for any C, leading dimensions and pointers (the vector path, 4 columns a
// thread, is per_group_vec_kernel below); a thread's loads of the whole tile
// issue before any is used (the bytes in flight a memory-bound pass needs); the rowwise codes
// stored along the rows, the columnwise ones staged transposed in shared memory and stored along
// the copy's rows, four rows a 4-byte word.
constexpr int kPgRows = 64, kPgCols = 128, kPgThreads = 256;
template <class T>
__global__ void __launch_bounds__(kPgThreads) per_group_kernel(QuantParams p, bool col_words) {
  const int64_t S = p.ws[0];
  if (S < 0) return;
  __shared__ float factor[kPgRows];
  __shared__ __align__(16) uint8_t codes[kPgCols][kPgRows + 4];  // [column][row]: the copy's layout
  constexpr int kRowsPerPass = kPgThreads / kPgCols, kPasses = kPgRows / kRowsPerPass;
  const int c = static_cast<int>(threadIdx.x % kPgCols), sub = static_cast<int>(threadIdx.x / kPgCols);
  const int64_t strips = (p.C + kPgCols - 1) / kPgCols, tiles = (S + kPgRows - 1) / kPgRows * strips;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {  // uniform per CTA
    const int64_t t0 = tile / strips * kPgRows, c0 = tile % strips * kPgCols;
    const int rows = static_cast<int>(S - t0 < kPgRows ? S - t0 : kPgRows);
    const int cols = static_cast<int>(p.C - c0 < kPgCols ? p.C - c0 : kPgCols);
    const bool live = c < cols;  // this thread's column of the strip
    T x[kPasses];
    const T* src = static_cast<const T*>(p.x) + (t0 + sub) * p.C + c0 + c;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      if (live && sub + i * kRowsPerPass < rows) x[i] = src[i * kRowsPerPass * p.C];
    }
    if (threadIdx.x < rows) {
      const int64_t g = group_of_row(offsets(p), p.G, t0 + threadIdx.x);
      factor[threadIdx.x] = qm::scale_from_amax(p.amax[g], p.fp8_max, p.power_2, p.epsilon, p.value_for_inf);
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int r = sub + i * kRowsPerPass;
      if (!live || r >= rows) continue;
      const uint8_t q = static_cast<uint8_t>(encode_fp8_pair(p, to_float(x[i]) * factor[r], 0.0f));
      if (p.row) p.row[(t0 + r) * p.row_ld + c0 + c] = q;
      codes[c][r] = q;
    }
    __syncthreads();
    if (p.col) store_columnwise<kPgRows, kPgCols, kPgThreads>(p, codes, t0, rows, c0, cols, col_words);
    __syncthreads();  // factor and codes reused by the next tile
  }
}

// per_group_kernel's vector path (4 columns a thread), as the block kernel below: warp w owns rows 8w .. 8w + 7
// of the tile (a row's 128 columns a warp per load), the format a constant of the encode loop and
// NaN fix-ups only in warps that hold a NaN; the columnwise codes transposed four rows at a time by
// byte permutes and staged one word a column (rotated by lane group: no bank conflicts).
// kDb: also the bias gradient's tile sums (tile_column_sums), the tiles then group row block k of
// 64 rows × a strip (the setup kernel's row-block offsets), never across a group.
template <class T, bool kDb>
__global__ void __launch_bounds__(kPgThreads, 3) per_group_vec_kernel(QuantParams p, bool col_words) {
  const int64_t S = p.ws[0];
  if (S < 0) return;
  constexpr int kV = 4, kWarps = kPgThreads / 32, kRowsPerWarp = kPgRows / kWarps;
  static_assert(kPgCols == 32 * kV && kRowsPerWarp % 4 == 0, "a warp spans a row, whole words of rows");
  __shared__ float factor[kPgRows];
  __shared__ __align__(16) uint8_t codes[kPgCols][kPgRows + 4];  // [column][row]: the copy's layout
  using R = typename RawVec<T>::type;  // 4 elements of x, packed (RawVec)
  static_assert(sizeof(R) == kV * sizeof(T), "a raw vector holds 4 elements");
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int c = lane * kV, r0 = warp * kRowsPerWarp;
  const bool e4 = p.format == QuantFormat::E4M3;
  const int64_t strips = (p.C + kPgCols - 1) / kPgCols;
  const int64_t tiles = (kDb ? rb_offsets(p)[p.G] : (S + kPgRows - 1) / kPgRows) * strips;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {  // uniform per CTA
    const int64_t k = tile / strips, c0 = tile % strips * kPgCols;
    int64_t t0 = k * kPgRows, end = S;
    if constexpr (kDb) {  // group row block k: rows [t0, end) of its group
      const int64_t g = group_of_row(rb_offsets(p), p.G, k);
      t0 = offsets(p)[g] + (k - rb_offsets(p)[g]) * kPgRows;
      end = offsets(p)[g + 1];
    }
    const int rows = static_cast<int>(end - t0 < kPgRows ? end - t0 : kPgRows);
    const int cols = static_cast<int>(p.C - c0 < kPgCols ? p.C - c0 : kPgCols);
    const bool live = c < cols;
    R x[kRowsPerWarp];  // rows past the tile's: zeros, whose codes are never stored
    const T* src = static_cast<const T*>(p.x) + (t0 + r0) * p.C + c0 + c;
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      x[i] = live && r0 + i < rows ? *reinterpret_cast<const R*>(src + i * p.C) : R{};
    }
    if constexpr (kDb) {
      __shared__ float part[kWarps][kPgCols];
      tile_column_sums<T, R, kRowsPerWarp, kWarps>(x, part, p.db_part + k * p.C + c0, cols);
    }
    if (threadIdx.x < rows) {
      const int64_t g = group_of_row(offsets(p), p.G, t0 + threadIdx.x);
      factor[threadIdx.x] = qm::scale_from_amax(p.amax[g], p.fp8_max, p.power_2, p.epsilon, p.value_for_inf);
    }
    const bool fix_nan = __any_sync(0xffffffffu, any_nan<T>(x));
    __syncthreads();
    float f[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) f[i] = r0 + i < rows ? factor[r0 + i] : 0.0f;
    with_format_and_nan(e4, fix_nan, [&](auto kE4, auto kNan) {
      uint32_t code[kRowsPerWarp];
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const float fs[kV] = {f[i], f[i], f[i], f[i]};
        float xf[kV];
        raw_floats<T>(x[i], xf);
        code[i] = encode_fp8_quad_f<decltype(kE4)::value, decltype(kNan)::value>(xf, fs);
        if (p.row && live && r0 + i < rows) {
          *reinterpret_cast<uint32_t*>(p.row + (t0 + r0 + i) * p.row_ld + c0 + c) = code[i];
        }
      }
      if (p.col && live) {
        const int rot = lane >> 3;  // lane groups store their columns' words in rotated order
#pragma unroll
        for (int q = 0; q < kRowsPerWarp / 4; ++q) {
          uint32_t w[kV];
          transpose_bytes(code[4 * q], code[4 * q + 1], code[4 * q + 2], code[4 * q + 3], w);
#pragma unroll
          for (int j = 0; j < kV; ++j) {
            const int jj = (j + rot) & 3;
            const uint32_t word = jj == 0 ? w[0] : jj == 1 ? w[1] : jj == 2 ? w[2] : w[3];
            *reinterpret_cast<uint32_t*>(&codes[c + jj][r0 + 4 * q]) = word;
          }
        }
      }
    });
    __syncthreads();
    if (p.col) {
      store_columnwise<kPgRows, kPgCols, kPgThreads>(p, codes, t0, rows, c0, cols, col_words && t0 % 4 == 0);
    }
    __syncthreads();  // factor and codes reused by the next tile
  }
}

// Block scaling 1×128 and 128×1 (fp8-block's activations and gradients), both copies from one
// read: one CTA per (group row block k, 128-column strip), grid-strided. 512 threads: 32 lanes × 4
// columns × 16 warps; warp w owns rows 8w .. 8w + 7 of the tile (kPasses). Each thread's 8 vectors
// of the tile arrive by cp.async into slots of its own in shared memory and are read once into
// registers for the amaxes and both encodes; the next tile's loads then go into the same slots,
// in flight while this one is cast (no thread reads another's slots, so a cp.async.wait_group is
// the only wait; one stage: 2% faster than two on qwen3's x on an H100, 32 KiB less shared
// memory; 512 threads at 2 CTAs an SM — 64 registers, no spills, 50% occupancy — took 7-11% off
// each of qwen3's four quantizes against 256 threads, 25%, on an H100, bench/results/
// 2026-12-06-nvidia-h100-bd37e0f-fp8-swiglu-quantize512.md; at 3 or 4 CTAs an SM the register cap
// spills and it is 18-80% slower). The maxima of 16-bit inputs run on packed pairs (block1d_amax);
// the encodes have the format as a constant and fix up NaN codes only in a warp that holds a NaN
// (warp-uniform branches: the common path is the conversion alone). A row's 1×128 amax is one
// warp's (a redux.sync a row), its scale computed by lane r % kPasses (kPasses rows' scales at
// once) and stored at [t, c / 128]; a column's 128×1 amax over 16 warps' partial maxima in shared
// memory, its scale stored at [row block k, c]. Rowwise codes go out as 4-byte words along the
// rows; the columnwise ones are transposed four rows at a time by byte permutes, staged in shared
// memory one word a column (the word order rotated by lane group: no bank conflicts) and stored
// along the copy's rows (words when the tile's first row t0 and col_ld allow). Instructions are
// what bounds it (ncu, qwen3 on an H100: issue slots 72% busy, DRAM 60%, at 98.5 M instructions
// for x; the raw vectors, the redux maxima and the stepped column stores took them to 77.4 M and
// x from 134 to 113 µs, 88% of the copy ceiling: bench/results/2026-12-06-nvidia-h100-2d0ebb6-
// quantize-instructions.md). Needs C % 4 == 0 and 4-element-aligned x / row copy (launch_all
// checks; else the one-copy kernels above).
constexpr int kB1Rows = 128, kB1Cols = 128, kB1Threads = 512, kB1MinBlocks = 2;

// The |x| maxima of a thread's raw vectors of 4: each vector's (a[i], its row's share) and each
// of the 4 columns' (cmax), NaN never winning — a NaN element leaves a maximum as it was, as in the
// CPU's loop (from 0, so an all-NaN row's is 0) — and whether any element is NaN. 16-bit types on
// the packed pairs: |x| clears the sign bits, max keeps the non-NaN operand (fmax's rule), both
// exact in the element type, so the results are the f32 loop's; f32 per element.
template <class T, class R, int N>
__device__ __forceinline__ void block1d_amax(const R (&v)[N], float (&a)[N], float (&cmax)[4], bool& nan) {
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int j = 0; j < 4; ++j) cmax[j] = 0.0f;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      a[i] = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float m = qm::abs_f(raw_elem<T>(v[i], j));
        nan |= m != m;
        if (m > a[i]) a[i] = m;
        if (m > cmax[j]) cmax[j] = m;
      }
    }
  } else {
    using P = typename Pair2<T>::type;
    const auto lo = [](P q) { if constexpr (std::is_same_v<T, __half>) return __low2half(q); else return __low2bfloat16(q); };
    const auto hi = [](P q) { if constexpr (std::is_same_v<T, __half>) return __high2half(q); else return __high2bfloat16(q); };
    P zero;
    if constexpr (std::is_same_v<T, __half>) zero = __float2half2_rn(0.0f);
    else zero = __float2bfloat162_rn(0.0f);
    P c01 = zero, c23 = zero, seen = zero;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const P x01 = __habs2(as_pair<P>(v[i].x)), x23 = __habs2(as_pair<P>(v[i].y));
      c01 = __hmax2(c01, x01);
      c23 = __hmax2(c23, x23);
      seen = __hmax2_nan(seen, __hmax2_nan(x01, x23));  // NaN-propagating: did one occur?
      const P m = __hmax2(__hmax2(x01, x23), zero);
      a[i] = to_float(__hmax(lo(m), hi(m)));
    }
    cmax[0] = to_float(lo(c01));
    cmax[1] = to_float(hi(c01));
    cmax[2] = to_float(lo(c23));
    cmax[3] = to_float(hi(c23));
    nan = __hisnan(lo(seen)) || __hisnan(hi(seen));
  }
}

template <class T>
constexpr size_t block1d_stage_bytes() {
  return size_t{kB1Rows} * kB1Cols * sizeof(T);
}
template <class T>
__device__ __forceinline__ void cp_async_vec(void* smem, const T* gmem) {
  constexpr int kBytes = 4 * sizeof(T);  // 8 (f16 / bf16) or 16 (f32)
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(s), "l"(gmem) : "memory");
  }
}
// One tile of block1d_tiles_kernel: group row block k of 128 rows (rows [t0, t0 + rows) of
// group g), 128-column strip jb starting at c0 (cols of them inside C).
struct B1Tile {
  int64_t k, jb, c0, g, t0;
  int rows, cols;
};
__device__ __forceinline__ B1Tile b1_tile_at(const QuantParams& p, int64_t tile) {
  const int64_t cb = (p.C + kB1Cols - 1) / kB1Cols;
  const int64_t* rb = rb_offsets(p);
  B1Tile t;
  t.k = tile / cb, t.jb = tile % cb, t.c0 = t.jb * kB1Cols;
  t.g = group_of_row(rb, p.G, t.k);
  const int64_t end = offsets(p)[t.g + 1];
  t.t0 = offsets(p)[t.g] + (t.k - rb[t.g]) * kB1Rows;
  t.rows = static_cast<int>(end - t.t0 < kB1Rows ? end - t.t0 : kB1Rows);
  t.cols = static_cast<int>(p.C - t.c0 < kB1Cols ? p.C - t.c0 : kB1Cols);
  return t;
}
__device__ __forceinline__ int64_t b1_tiles(const QuantParams& p) {
  return rb_offsets(p)[p.G] * ((p.C + kB1Cols - 1) / kB1Cols);
}

// What block1d_tiles_kernel's CTAs share, in static shared memory (block1d_cast_tile's).
struct B1Shared {
  float part[kB1Threads / 32][kB1Cols];
  float col_factor[kB1Cols];
  __align__(16) uint8_t codes[kB1Cols][kB1Rows + 4];  // [column][row]: the copy's layout
};

// Both copies of one tile from its values in registers: thread (warp, lane) holds rows
// kPasses·warp .. kPasses·warp + kPasses − 1 of the tile at columns 4·lane .. 4·lane + 3 (v[i]:
// row kPasses·warp + i; rows and columns past the tile's: zeros, whose codes are never stored).
// Ends with the CTA's shared memory free for the next tile.
// kDb: first the bias gradient's tile sums (tile_column_sums, through sh.part).
template <class T, bool kDb, class R>
__device__ __forceinline__ void block1d_cast_tile(const QuantParams& p, const B1Tile& cur,
                                                  const R (&v)[kB1Rows / (kB1Threads / 32)],
                                                  B1Shared& sh, bool col_words) {
  constexpr int kV = 4, kWarps = kB1Threads / 32, kPasses = kB1Rows / kWarps;
  if constexpr (kDb) {
    tile_column_sums<T, R, kPasses, kWarps>(v, sh.part, p.db_part + cur.k * p.C + cur.c0, cur.cols);
  }
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int c = lane * kV;  // this thread's first column in the strip
  const int r0 = kPasses * warp;  // this warp's first row in the tile
  const bool live = c < cur.cols;
  const int64_t cb = (p.C + kB1Cols - 1) / kB1Cols;
  float a[kPasses], cmax[kV];
  bool nan = false;
  block1d_amax<T>(v, a, cmax, nan);
  // NaN codes are fixed up only in warps that hold a NaN (the common case skips them), and the
  // format is a constant of each encode loop: warp-uniform branches.
  const bool e4 = p.format == QuantFormat::E4M3, fix_nan = __any_sync(0xffffffffu, nan);
  const auto dispatch = [&](auto&& body) { with_format_and_nan(e4, fix_nan, body); };
  if (p.row) {
    // Every lane gets the warp's kPasses row amaxes, one redux.sync each: a maximum here is never
    // NaN and never negative, so its f32 bits order as unsigned integers as the values do (one
    // instruction a row where the butterflies took fifteen); lane i computes row r0 + i's scale,
    // then each row's codes with its factor from that lane.
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      a[i] = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(a[i])));
    }
    float mine = 0.0f;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) mine = lane == i ? a[i] : mine;
    float f_mine = 0.0f;
    if (lane < kPasses && r0 + lane < cur.rows) {
      f_mine = block_scale(p, mine, cur.g, p.row_scale, (cur.t0 + r0 + lane) * cb + cur.jb);
    }
    float f[kPasses];
#pragma unroll
    for (int i = 0; i < kPasses; ++i) f[i] = __shfl_sync(0xffffffffu, f_mine, i);
    dispatch([&](auto kE4, auto kNan) {
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        if (live && r0 + i < cur.rows) {
          const float fs[kV] = {f[i], f[i], f[i], f[i]};
          float x[kV];
          raw_floats<T>(v[i], x);
          *reinterpret_cast<uint32_t*>(p.row + (cur.t0 + r0 + i) * p.row_ld + cur.c0 + c) =
              encode_fp8_quad_f<decltype(kE4)::value, decltype(kNan)::value>(x, fs);
        }
      }
    });
  }
  if (p.col) {
#pragma unroll
    for (int j = 0; j < kV; ++j) sh.part[warp][c + j] = cmax[j];
    __syncthreads();
    if (threadIdx.x < cur.cols) {
      float m = 0.0f;
      for (int w = 0; w < kWarps; ++w) m = sh.part[w][threadIdx.x] > m ? sh.part[w][threadIdx.x] : m;
      sh.col_factor[threadIdx.x] =
          block_scale(p, m, cur.g, p.col_scale, cur.k * p.C + cur.c0 + threadIdx.x);
    }
    __syncthreads();
    if (live) {
      const float fs[kV] = {sh.col_factor[c], sh.col_factor[c + 1], sh.col_factor[c + 2],
                            sh.col_factor[c + 3]};
      const int rot = lane >> 3;  // lane groups store their columns' words in rotated order
      dispatch([&](auto kE4, auto kNan) {
#pragma unroll
        for (int q = 0; q < kPasses / 4; ++q) {  // rows r0 + 4q .. r0 + 4q + 3: one word a column
          uint32_t w[kV], code[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            float x[kV];
            raw_floats<T>(v[4 * q + k], x);
            code[k] = encode_fp8_quad_f<decltype(kE4)::value, decltype(kNan)::value>(x, fs);
          }
          transpose_bytes(code[0], code[1], code[2], code[3], w);
#pragma unroll
          for (int j = 0; j < kV; ++j) {
            const int jj = (j + rot) & 3;
            const uint32_t word = jj == 0 ? w[0] : jj == 1 ? w[1] : jj == 2 ? w[2] : w[3];
            *reinterpret_cast<uint32_t*>(&sh.codes[c + jj][r0 + 4 * q]) = word;
          }
        }
      });
    }
    __syncthreads();
    store_columnwise<kB1Rows, kB1Cols, kB1Threads>(p, sh.codes, cur.t0, cur.rows, cur.c0, cur.cols,
                                          col_words && cur.t0 % 4 == 0);
    __syncthreads();  // part, col_factor and codes reused by the next tile
  }
}

template <class T, bool kDb>
__global__ void __launch_bounds__(kB1Threads, kB1MinBlocks) block1d_tiles_kernel(QuantParams p, bool col_words) {
  if (p.ws[0] < 0) return;
  constexpr int kV = 4, kLanes = kB1Cols / kV, kWarps = kB1Threads / 32, kPasses = kB1Rows / kWarps;
  static_assert(kLanes == 32 && kPasses % 4 == 0, "a warp spans one row of the strip, whole quads of rows a warp");
  struct alignas(kV * sizeof(T)) Vec { T v[kV]; };
  extern __shared__ __align__(16) unsigned char block1d_smem[];
  Vec* stage = reinterpret_cast<Vec*>(block1d_smem);  // [stage][pass][thread]
  __shared__ B1Shared sh;
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int c = static_cast<int>(threadIdx.x % 32) * kV;  // this thread's first column in the strip
  const int64_t tiles = b1_tiles(p);
  const auto load = [&](const B1Tile& t) {  // this thread's kPasses vectors of tile t → its slots
    if (c < t.cols) {
      const T* src = static_cast<const T*>(p.x) + (t.t0 + kPasses * warp) * p.C + t.c0 + c;
      Vec* dst = stage + threadIdx.x;
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        if (kPasses * warp + i < t.rows) cp_async_vec<T>(dst + i * kB1Threads, src + int64_t{i} * p.C);
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  int64_t tile = blockIdx.x;
  B1Tile cur = b1_tile_at(p, tile < tiles ? tile : 0);
  if (tile < tiles) load(cur);
  for (; tile < tiles; tile += gridDim.x) {  // uniform per CTA
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    const bool live = c < cur.cols;
    const int r0 = kPasses * warp;  // this warp's first row in the tile
    // The thread's kPasses vectors, read from its slots once (rows past the tile's: zeros, which
    // change no maximum, and whose codes are never stored); then the next tile's loads into the
    // same slots, in flight while this one is cast.
    using R = typename RawVec<T>::type;
    static_assert(sizeof(R) == sizeof(Vec), "a raw vector is a slot");
    R v[kPasses];
    {
      const R* x = reinterpret_cast<const R*>(stage) + threadIdx.x;  // pass i at x[i * kB1Threads]
#pragma unroll
      for (int i = 0; i < kPasses; ++i) v[i] = live && r0 + i < cur.rows ? x[i * kB1Threads] : R{};
    }
    const int64_t next = tile + gridDim.x;
    B1Tile nxt = cur;
    if (next < tiles) {
      nxt = b1_tile_at(p, next);
      load(nxt);
    }
    block1d_cast_tile<T, kDb>(p, cur, v, sh, col_words);
    cur = nxt;
  }
}

unsigned grid_for(int64_t work, int threads, int sms) {
  const int64_t blocks = (work + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(sms) * 8;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks < cap ? blocks : cap);
}

// db[g] (QuantizeArgs::db) from the kDb kernels' tile sums in p.db_part.
void launch_db_reduce(const QuantParams& p, const Tensor& db, CudaResources& res) {
  const unsigned grid = grid_for(p.G * p.C, 256, res.sm_count);
  switch (db.dtype()) {
    case DType::F32:
      db_reduce_kernel<<<grid, 256, 0, res.stream>>>(p, db.data_as<float>());
      break;
    case DType::F16:
      db_reduce_kernel<<<grid, 256, 0, res.stream>>>(p, db.data_as<__half>());
      break;
    default:
      db_reduce_kernel<<<grid, 256, 0, res.stream>>>(p, db.data_as<__nv_bfloat16>());
  }
  MOEKIT_CUDA_CHECK_LAUNCH();
}

// Every kernel of one quantize of x (p) into q's copies. With db defined, the bias gradient too:
// fused into the fp8-current and fp8-block one-read kernels (their kDb instances, tile sums into a
// workspace from ctx's allocator, then launch_db_reduce); returns false when the chosen path does
// not fuse it, and the caller runs it apart.
template <class T>
bool launch_all(QuantParams p, const DeviceCounts& counts, const Tensor& db, const Context& ctx,
                CudaResources& res) {
  const int sms = res.sm_count;
  const cudaStream_t stream = res.stream;
  // The one-read kernels' vector paths: 4 elements of x a load, 4 rowwise codes a store, and the
  // columnwise copy stored as 4-byte words.
  const auto aligned = [](const void* q, int64_t bytes) {
    return q == nullptr || reinterpret_cast<uintptr_t>(q) % bytes == 0;
  };
  const bool vec = p.C % 4 == 0 && aligned(p.x, 4 * sizeof(T)) && aligned(p.row, 4) &&
                   (p.row == nullptr || p.row_ld % 4 == 0);
  const bool col_words = aligned(p.col, 4) && p.col_ld % 4 == 0;
  const bool per_group = p.scaling == Scaling::PerGroup;
  const bool block1d = p.scaling == Scaling::Block1D && p.block == kB1Rows && vec;
  const bool fuse_db = db.defined() && ((per_group && vec) || block1d);
  Tensor part;  // the kDb kernels' tile sums: a row of C per tile row block
  if (fuse_db) {
    if (per_group) p.block = kPgRows;  // the setup's row blocks are the per-group kernel's tiles
    const int64_t row_blocks = per_group ? (p.T + kPgRows - 1) / kPgRows + p.G : p.RB;
    part = Tensor::empty({std::max<int64_t>(1, row_blocks * p.C)}, DType::F32, ctx);
    p.db_part = part.data_as<float>();
  }
  quant_setup_kernel<<<1, 256, 0, stream>>>(counts, p);
  MOEKIT_CUDA_CHECK_LAUNCH();
  if (per_group || p.scaling == Scaling::Nv) {
    constexpr int kV = 16 / sizeof(T);
    if (p.C % kV == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0) {
      group_amax_kernel<T, kV><<<grid_for(p.T * 32, 256, sms), 256, 0, stream>>>(p);
    } else {
      group_amax_kernel<T, 1><<<grid_for(p.T * 32, 256, sms), 256, 0, stream>>>(p);
    }
    MOEKIT_CUDA_CHECK_LAUNCH();
    group_scales_kernel<<<static_cast<unsigned>((p.G + 255) / 256), 256, 0, stream>>>(p);
    MOEKIT_CUDA_CHECK_LAUNCH();
  }
  if (per_group) {
    const int64_t row_tiles = (p.T + kPgRows - 1) / kPgRows + (fuse_db ? p.G : 0);
    const int64_t tiles = row_tiles * ((p.C + kPgCols - 1) / kPgCols);
    const unsigned grid = grid_for(tiles * kPgThreads, kPgThreads, sms);  // a CTA a tile, capped
    if (fuse_db) {
      per_group_vec_kernel<T, true><<<grid, kPgThreads, 0, stream>>>(p, col_words);
    } else if (vec) {
      per_group_vec_kernel<T, false><<<grid, kPgThreads, 0, stream>>>(p, col_words);
    } else {
      per_group_kernel<T><<<grid, kPgThreads, 0, stream>>>(p, col_words);
    }
  } else if (p.scaling == Scaling::Block2D) {
    tile_blocks_kernel<T><<<static_cast<unsigned>(sms * 4), 256, 0, stream>>>(p);
  } else if (block1d) {
    const int64_t tiles = p.RB * ((p.C + kB1Cols - 1) / kB1Cols);
    const unsigned grid = grid_for(tiles * kB1Threads, kB1Threads, sms);
    constexpr size_t smem = block1d_stage_bytes<T>();  // > 48 KiB: opted in once per device and type
    const auto launch = [&](auto kernel, std::atomic<uint64_t>& opted_devices) {
      const uint64_t bit = uint64_t{1} << (res.device & 63);
      if ((opted_devices.load(std::memory_order_acquire) & bit) == 0) {
        MOEKIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem)));
        opted_devices.fetch_or(bit, std::memory_order_acq_rel);
      }
      kernel<<<grid, kB1Threads, smem, stream>>>(p, col_words);
    };
    static std::atomic<uint64_t> opted_plain{0}, opted_db{0};
    if (fuse_db) {
      launch(block1d_tiles_kernel<T, true>, opted_db);
    } else {
      launch(block1d_tiles_kernel<T, false>, opted_plain);
    }
  } else {
    if (p.row)
      rowwise_blocks_kernel<T>  // a warp per (row, block)
          <<<grid_for(p.T * ((p.C + p.block - 1) / p.block) * 32, 256, sms), 256, 0, stream>>>(p);
    if (p.col) {
      const int64_t strips = (p.C + kColStrip - 1) / kColStrip;
      columnwise_blocks_kernel<T><<<grid_for(p.RB * strips * kColStrip * kColWarps,
                                             kColStrip * kColWarps, sms),
                                    kColStrip * kColWarps, 0, stream>>>(p);
    }
  }
  MOEKIT_CUDA_CHECK_LAUNCH();
  if (fuse_db) launch_db_reduce(p, db, res);
  return fuse_db;
}

// ---------------------------------------------------------------- dequantize (CPU oracle:
// cpu::dequantize_run): value = decode(code) · the element's scale, fp32, valid rows only.
struct DequantParams {
  const uint8_t* data;  // the copy: [T, C] or [C, T] (e2m1 packed)
  int64_t ld, T, C, G, block, RB;
  int block_shift;  // log2(block): every block size (16, 32, 128) is a power of two; 0 per group
  int64_t cb;       // blocks per row of the rowwise scales, ⌈C / block⌉ (0 per group)
  bool rowwise;
  QuantFormat format;
  Scaling scaling;
  const void* scales;
  const float* group_dec;
  float* out;   // [T, C] or [C, T]
  int64_t* ws;  // the setup kernel's: S, offsets, row-block offsets
};

__device__ __forceinline__ float decode_code(QuantFormat f, uint8_t c) {
  switch (f) {
    case QuantFormat::E4M3:
      return qm::decode_e4m3(c);
    case QuantFormat::E5M2:
      return qm::decode_e5m2(c);
    default:
      return qm::decode_e2m1(c);
  }
}

// The scale of element (t, c) of X (row t < S, column c) in the copy p names.
__device__ __forceinline__ float element_scale(const DequantParams& p, int64_t t, int64_t c) {
  const int64_t* off = p.ws + 1;
  const int64_t* rb = p.ws + 2 + p.G;
  const int64_t g = group_of_row(off, p.G, t), local = t - off[g];
  // Shifts, not 64-bit divisions: the index math is most of the dequantize kernels' work.
  const int sh = p.block_shift;
  int64_t si;
  switch (p.scaling) {
    case Scaling::PerGroup:
      si = g;
      break;
    case Scaling::Block2D:
      si = (rb[g] + (local >> sh)) * p.cb + (c >> sh);
      break;
    default:
      si = p.rowwise ? t * p.cb + (c >> sh) : (rb[g] + (local >> sh)) * p.C + c;
  }
  switch (p.scaling) {
    case Scaling::Mx:
      return qm::e8m0_value(static_cast<const uint8_t*>(p.scales)[si]);
    case Scaling::Nv:
      return qm::decode_e4m3(static_cast<const uint8_t*>(p.scales)[si]) * p.group_dec[g];
    default:
      return static_cast<const float*>(p.scales)[si];
  }
}

// The value of element (t, c): decode(code) · its scale, in fp32 (the CPU reference's arithmetic).
__device__ __forceinline__ float dequantized_value(const DequantParams& p, int64_t t, int64_t c) {
  const bool fp4 = p.format == QuantFormat::E2M1;
  const int64_t r = p.rowwise ? t : c, k = p.rowwise ? c : t;  // element (r, k) of the copy
  uint8_t code = fp4 ? p.data[r * p.ld + k / 2] : p.data[r * p.ld + k];
  if (fp4) code = (k % 2 == 0) ? (code & 0xF) : (code >> 4);
  return decode_code(p.format, code) * element_scale(p, t, c);
}

// f32 out, in the copy's layout ([T, C] rowwise, [C, T] columnwise), valid rows only.
__global__ void dequantize_kernel(DequantParams p) {
  const int64_t S = p.ws[0];
  if (S < 0) return;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < S * p.C;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / p.C, c = i % p.C;
    p.out[p.rowwise ? t * p.C + c : c * p.T + t] = dequantized_value(p, t, c);
  }
}

// bf16 out [T, C] from an 8-bit rowwise copy with C and the copy's row a multiple of 8: 8
// elements per thread, one 8-byte load of codes and one 16-byte store; the 8 share one scale
// (every block is >= 16 columns and 8-aligned), the same products as dequantized_value.
__global__ void dequantize_bf16_rowwise8_kernel(DequantParams p, __nv_bfloat16* out) {
  const int64_t S = p.ws[0];
  if (S < 0) return;
  const int64_t vc = p.C / 8;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < S * vc;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = v / vc, c = (v % vc) * 8;
    const float scale = element_scale(p, t, c);
    const uint2 word = *reinterpret_cast<const uint2*>(p.data + t * p.ld + c);
    const uint8_t* codes = reinterpret_cast<const uint8_t*>(&word);
    alignas(16) __nv_bfloat16 vals[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) vals[i] = __float2bfloat16_rn(decode_code(p.format, codes[i]) * scale);
    *reinterpret_cast<uint4*>(out + t * p.C + c) = *reinterpret_cast<const uint4*>(vals);
  }
}

// bf16 out [T, C] from either copy, valid rows only (the values exact in bf16: the caller's
// rule). 32×32 tiles through shared memory, so both the copy's reads (along its own rows) and
// out's writes (along c) are coalesced: a columnwise copy is read along t.
constexpr int kDqTile = 32;
__global__ void dequantize_bf16_rows_kernel(DequantParams p, __nv_bfloat16* out) {
  const int64_t S = p.ws[0];
  if (S < 0) return;
  __shared__ float tile[kDqTile][kDqTile + 1];
  const int64_t t_tiles = (S + kDqTile - 1) / kDqTile, c_tiles = (p.C + kDqTile - 1) / kDqTile;
  for (int64_t b = blockIdx.x; b < t_tiles * c_tiles; b += gridDim.x) {
    const int64_t t0 = (b / c_tiles) * kDqTile, c0 = (b % c_tiles) * kDqTile;
    for (int i = threadIdx.y; i < kDqTile; i += blockDim.y) {
      // rowwise: lanes along c; columnwise: lanes along t (the copy's contiguous dimension)
      const int64_t t = p.rowwise ? t0 + i : t0 + threadIdx.x;
      const int64_t c = p.rowwise ? c0 + threadIdx.x : c0 + i;
      if (t < S && c < p.C) {
        const float v = dequantized_value(p, t, c);
        if (p.rowwise) tile[i][threadIdx.x] = v; else tile[threadIdx.x][i] = v;
      }
    }
    __syncthreads();
    for (int i = threadIdx.y; i < kDqTile; i += blockDim.y) {
      const int64_t t = t0 + i, c = c0 + threadIdx.x;
      if (t < S && c < p.C) out[t * p.C + c] = __float2bfloat16_rn(tile[i][threadIdx.x]);
    }
    __syncthreads();
  }
}

}  // namespace

void group_offsets_on_device(const Context& ctx, const Splits& splits, int64_t rows, int64_t groups,
                             int64_t block, const Tensor& ws) {
  CudaResources& res = resources(ctx);
  const CountsOnDevice counts = counts_on_device(ctx, splits, rows);
  QuantParams setup{};  // only what the setup kernel reads
  setup.G = groups;
  setup.block = block;
  setup.ws = ws.data_as<int64_t>();
  quant_setup_kernel<<<1, 256, 0, res.stream>>>(counts.view, setup);
  MOEKIT_CUDA_CHECK_LAUNCH();
}

std::string dequantize_rejects(const detail::DequantizeArgs& a) {
  return reject_unless_cuda(a.ctx);
}

namespace {

// The setup kernel's workspace (S, offsets, row-block offsets) for q's splits, and the params of
// one copy of q; ws must outlive the kernels (stream order).
DequantParams dequant_params(const Context& ctx, const QuantizedTensor& q, const Splits& splits,
                             QuantUsage which, const Tensor& ws) {
  int shift = 0;  // check_spec allows blocks of 16, 32, 128 only: powers of two
  while (q.spec.block > 0 && (int64_t{1} << shift) < q.spec.block) ++shift;
  if (q.spec.block > 0 && (int64_t{1} << shift) != q.spec.block) {
    throw_invalid("spec.block", "a power of two", std::to_string(q.spec.block));
  }
  CudaResources& res = resources(ctx);
  const CountsOnDevice counts = counts_on_device(ctx, splits, q.rows);
  QuantParams setup{};  // only what the setup kernel reads
  setup.G = q.groups;
  setup.block = q.spec.block;
  setup.ws = ws.data_as<int64_t>();
  quant_setup_kernel<<<1, 256, 0, res.stream>>>(counts.view, setup);
  MOEKIT_CUDA_CHECK_LAUNCH();
  const bool rowwise = which == QuantUsage::Rowwise;
  const Tensor& copy = rowwise ? q.rowwise : q.columnwise;
  DequantParams p{};
  p.data = copy.data_as<const uint8_t>();
  p.ld = copy.size(1);
  p.T = q.rows;
  p.C = q.cols;
  p.G = q.groups;
  p.block = q.spec.block;
  p.block_shift = shift;
  p.cb = p.block > 0 ? (q.cols + p.block - 1) / p.block : 0;
  p.RB = q.row_block_capacity();
  p.rowwise = rowwise;
  p.format = q.spec.format;
  p.scaling = q.spec.scaling;
  p.scales = (rowwise ? q.rowwise_scale_inv : q.columnwise_scale_inv).data();
  p.group_dec = q.group_scale_inv.defined() ? q.group_scale_inv.data_as<const float>() : nullptr;
  p.ws = ws.data_as<int64_t>();
  return p;
}

}  // namespace

void dequantize_run(const detail::DequantizeArgs& a) {
  const QuantizedTensor& q = a.q;
  if (q.groups == 0) return;
  CudaResources& res = resources(a.ctx);
  DeviceGuard guard(res.device);
  const Tensor ws = Tensor::empty({2 * q.groups + 3}, DType::I64, a.ctx);
  DequantParams p = dequant_params(a.ctx, q, a.splits, a.which, ws);
  p.out = a.out.data_as<float>();
  dequantize_kernel<<<grid_for(q.rows * q.cols, 256, res.sm_count), 256, 0, res.stream>>>(p);
  MOEKIT_CUDA_CHECK_LAUNCH();
}

void dequantize_bf16_rows(const Context& ctx, const QuantizedTensor& q, const Splits& splits,
                          QuantUsage which, const Tensor& out) {
  if (q.groups == 0 || q.rows == 0 || q.cols == 0) return;
  CudaResources& res = resources(ctx);
  DeviceGuard guard(res.device);
  const Tensor ws = Tensor::empty({2 * q.groups + 3}, DType::I64, ctx);
  const DequantParams p = dequant_params(ctx, q, splits, which, ws);
  if (p.rowwise && p.format != QuantFormat::E2M1 && p.C % 8 == 0 && p.ld % 8 == 0 &&
      (p.block == 0 || p.block % 8 == 0) && reinterpret_cast<uintptr_t>(out.data()) % 16 == 0) {
    dequantize_bf16_rowwise8_kernel<<<grid_for(q.rows * q.cols / 8, 256, res.sm_count), 256, 0,
                                      res.stream>>>(p, out.data_as<__nv_bfloat16>());
    MOEKIT_CUDA_CHECK_LAUNCH();
    return;
  }
  const int64_t tiles = ((q.rows + kDqTile - 1) / kDqTile) * ((q.cols + kDqTile - 1) / kDqTile);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(tiles, int64_t{res.sm_count} * 16));
  dequantize_bf16_rows_kernel<<<blocks, dim3(kDqTile, 8), 0, res.stream>>>(
      p, out.data_as<__nv_bfloat16>());
  MOEKIT_CUDA_CHECK_LAUNCH();
}

namespace {}  // namespace

std::string quantize_rejects(const detail::QuantizeArgs& a) {
  // A bias gradient may take grouped_bias_grad's kernel (the paths that do not fuse it): its limits.
  if (a.db.defined()) return kBiasGrad.rejects({a.ctx, a.x, a.splits, a.db, false, a.groups, a.rows, a.cols});
  return reject_unless_cuda(a.ctx);
}

// The parameters every kernel of one quantize of x [T, C] (dtype xt) into q's copies shares; ws:
// the setup kernel's workspace (i64 [2·G + 3]).
QuantParams quant_params(const QuantizedTensor& q, const void* x, DType xt, int64_t T, int64_t C,
                         int64_t G, const Tensor& ws) {
  QuantParams p{};
  p.x = x;
  p.T = T;
  p.C = C;
  p.G = G;
  p.block = q.spec.block;
  p.RB = q.row_block_capacity();
  p.format = q.spec.format;
  p.scaling = q.spec.scaling;
  p.power_2 = q.spec.power_2_scales;
  p.epsilon = q.spec.amax_epsilon;
  p.fp8_max = max_finite(q.spec.format) * qm::exp2i(-q.spec.margin);
  p.value_for_inf = qm::value_for_infinite_scale(q.spec.scaling == Scaling::PerGroup, xt);
  p.max_norm_rcp = static_cast<float>(1.0 / max_finite(q.spec.format));
  p.row = q.has_rowwise() ? q.rowwise.data_as<uint8_t>() : nullptr;
  p.col = q.has_columnwise() ? q.columnwise.data_as<uint8_t>() : nullptr;
  p.row_ld = q.has_rowwise() ? q.rowwise.size(1) : 0;
  p.col_ld = q.has_columnwise() ? q.columnwise.size(1) : 0;
  p.row_scale = q.rowwise_scale_inv.defined() ? q.rowwise_scale_inv.data() : nullptr;
  p.col_scale = q.columnwise_scale_inv.defined() ? q.columnwise_scale_inv.data() : nullptr;
  p.amax = q.amax.defined() ? q.amax.data_as<float>() : nullptr;
  p.group_dec = q.group_scale_inv.defined() ? q.group_scale_inv.data_as<float>() : nullptr;
  p.ws = ws.data_as<int64_t>();
  return p;
}

void quantize_run(const detail::QuantizeArgs& a) {
  if (a.groups == 0) return;
  CudaResources& res = resources(a.ctx);
  DeviceGuard guard(res.device);
  const CountsOnDevice counts = counts_on_device(a.ctx, a.splits, a.rows);
  // Setup workspace: S, offsets [G+1], row-block offsets [G+1], from the context's allocator.
  const Tensor ws = Tensor::empty({2 * a.groups + 3}, DType::I64, a.ctx);
  const QuantParams p = quant_params(a.q, a.x.data(), a.x.dtype(), a.rows, a.cols, a.groups, ws);
  bool db_done = false;
  switch (a.x.dtype()) {
    case DType::F32:
      db_done = launch_all<float>(p, counts.view, a.db, a.ctx, res);
      break;
    case DType::F16:
      db_done = launch_all<__half>(p, counts.view, a.db, a.ctx, res);
      break;
    case DType::BF16:
      db_done = launch_all<__nv_bfloat16>(p, counts.view, a.db, a.ctx, res);
      break;
    default:
      throw_invalid("x", "dtype f32, f16 or bf16", name(a.x.dtype()));
  }
  // A path that does not fuse the bias gradient: grouped_bias_grad's kernel, a second read of x.
  if (a.db.defined() && !db_done) {
    kBiasGrad.run({a.ctx, a.x, a.splits, a.db, false, a.groups, a.rows, a.cols});
  }
}

// This backend's entry in the quantize table (declared in cuda_quantize.h).
constexpr detail::Backend<detail::QuantizeArgs> kQuantize{"cuda", quantize_rejects, quantize_run};
constexpr detail::Backend<detail::DequantizeArgs> kDequantize{"cuda", dequantize_rejects,
                                                              dequantize_run};

}  // namespace moekit::cuda
