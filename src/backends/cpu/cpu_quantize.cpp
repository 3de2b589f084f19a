// CPU backend: quantize / dequantize of every recipe (the reference the GPU kernels must match bit
// for bit) and the quantized grouped GEMMs as emulation: dequantize to fp32, then cblas_sgemm
// with fp32 accumulation, the output rounded once (SPEC §6).
//
// How to read it: `BlockScale` turns a block's amax into its stored scale and the factor the
// elements are multiplied by before encoding, per scaling mode, in exactly TE's fp32 operations;
// quantize() walks a grouped matrix [T, C] group by group (blocks never cross a group boundary,
// rows [S, T) are never touched) and writes the copies; dequant_* turn a copy back into fp32.
#include "backends/cpu/cpu_quantize.h"

#include <cblas.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/contract/backend_table.h"
#include "backends/contract/quant_args.h"
#include "backends/contract/quant_math.h"
#include "backends/cpu/cpu_backend.h"
#include "moekit/core/error.h"

namespace moekit::cpu {
namespace {

// amax as TE's kernels take it (fmaxf): NaN never wins, inf does.
inline void amax_update(float& amax, float v) {
  const float a = std::fabs(v);
  if (a > amax) amax = a;
}

// A block's scale as stored (`stored`: f32 bits, or the e8m0 / e4m3 code in its low byte) and the
// factor each element is multiplied by before encoding.
struct BlockScale {
  float stored_f32 = 1.0f;  // PerGroup / Block1D / Block2D: scale_inv
  uint8_t stored_code = 0;  // Mx: e8m0, Nv: e4m3
  float encode_factor = 1.0f;
};

struct ScaleMath {
  QuantSpec spec;
  DType source;
  float fp8_max() const { return std::ldexp(max_finite(spec.format), -spec.margin); }

  BlockScale of(float amax, float nv_s_enc = 1.0f, float nv_s_dec = 1.0f) const {
    BlockScale s;
    switch (spec.scaling) {
      case Scaling::PerGroup:
      case Scaling::Block1D:
      case Scaling::Block2D: {
        const float inf_value =
            quant_math::value_for_infinite_scale(spec.scaling == Scaling::PerGroup, source);
        const float scale =
            scale_from_amax(amax, fp8_max(), spec.power_2_scales, spec.amax_epsilon, inf_value);
        s.encode_factor = scale;
        s.stored_f32 = 1.0f / scale;
        break;
      }
      case Scaling::Mx: {
        const float max_norm_rcp = static_cast<float>(1.0 / max_finite(spec.format));
        s.stored_code = f32_to_e8m0_round_up(amax * max_norm_rcp);
        s.encode_factor = e8m0_reciprocal(s.stored_code);
        break;
      }
      case Scaling::Nv: {
        constexpr float kRcp6 = 1.0f / 6.0f;
        const float block_dec = std::fmin(amax * (nv_s_enc * kRcp6), FLT_MAX);
        s.stored_code = f32_to_f8e4m3(block_dec);
        s.encode_factor = std::fmin(1.0f / (f8e4m3_to_f32(s.stored_code) * nv_s_dec), FLT_MAX);
        break;
      }
    }
    return s;
  }
};

// NVFP4's per-group encode scale from the group's amax (TE's
// compute_global_encode_scaling_factor_FP4) and its decode scale.
void nv_group_scales(float amax, float* s_enc, float* s_dec) {
  float s = std::fmin(448.0f * 6.0f / amax, FLT_MAX);
  if (amax == 0.0f || s == 0.0f) s = 1.0f;
  *s_enc = s;
  *s_dec = static_cast<float>(1.0 / static_cast<double>(s));
}

// Element storage of one copy ([R, L] logical): a byte per element, or fp4 two per byte.
struct CopyView {
  uint8_t* data;
  int64_t ld;  // bytes per row
  bool fp4;
  void put(int64_t r, int64_t c, uint8_t code) const {
    if (!fp4) {
      data[r * ld + c] = code;
      return;
    }
    uint8_t& byte = data[r * ld + c / 2];
    byte = (c % 2 == 0) ? static_cast<uint8_t>((byte & 0xF0) | (code & 0xF))
                        : static_cast<uint8_t>((byte & 0x0F) | ((code & 0xF) << 4));
  }
  uint8_t get(int64_t r, int64_t c) const {
    if (!fp4) return data[r * ld + c];
    const uint8_t byte = data[r * ld + c / 2];
    return (c % 2 == 0) ? (byte & 0xF) : (byte >> 4);
  }
};

CopyView view_of(const Tensor& t, bool fp4) {
  return {t.data_as<uint8_t>(), t.size(1), fp4};
}

std::vector<int64_t> row_block_offsets(const std::vector<int64_t>& counts, int64_t block) {
  std::vector<int64_t> off(counts.size() + 1, 0);
  for (size_t g = 0; g < counts.size(); ++g) off[g + 1] = off[g] + (counts[g] + block - 1) / block;
  return off;
}

void store_scale(const Tensor& scales, int64_t i, const BlockScale& s, Scaling mode) {
  if (mode == Scaling::Mx || mode == Scaling::Nv) {
    scales.data_as<uint8_t>()[i] = s.stored_code;
  } else {
    scales.data_as<float>()[i] = s.stored_f32;
  }
}

}  // namespace

// ---------------------------------------------------------------- quantize
std::string quantize_rejects(const detail::QuantizeArgs& a) {
  return a.ctx.device().is_cpu() ? "" : str("the context's device is ", a.ctx.device().to_string());
}

void quantize_run(const detail::QuantizeArgs& args) {
  const QuantizedTensor& q = args.q;
  const QuantSpec& spec = q.spec;
  const ScaleMath math{spec, args.x.dtype()};
  const std::vector<int64_t> counts = read_counts(args.ctx, args.splits);
  const std::vector<int64_t> offs = offsets_of(counts);
  const int64_t C = args.cols, G = args.groups;
  const bool fp4 = spec.format == QuantFormat::E2M1;
  const int64_t b = spec.block;
  const std::vector<int64_t> rb_off = b > 0 ? row_block_offsets(counts, b) : std::vector<int64_t>();
  const CopyView row = q.has_rowwise() ? view_of(q.rowwise, fp4) : CopyView{};
  const CopyView col = q.has_columnwise() ? view_of(q.columnwise, fp4) : CopyView{};
  const size_t es = size_of(args.x.dtype());
  std::vector<float> xg;  // one group's rows in fp32 [m, C]

  for (int64_t g = 0; g < G; ++g) {
    const int64_t off = offs[static_cast<size_t>(g)], m = counts[static_cast<size_t>(g)];
    xg.resize(static_cast<size_t>(m * C));
    to_f32(static_cast<const char*>(args.x.data()) + static_cast<size_t>(off * C) * es,
           args.x.dtype(), xg.data(), static_cast<size_t>(m * C));
    auto x_at = [&](int64_t r, int64_t c) { return xg[static_cast<size_t>(r * C + c)]; };
    auto put_both = [&](int64_t r, int64_t c, float factor) {
      const uint8_t code = encode(spec.format, x_at(r, c) * factor);
      if (row.data) row.put(off + r, c, code);
      if (col.data) col.put(c, off + r, code);
    };

    // Per-group amax (PerGroup, Nv): over the group's rows, both copies share it.
    float group_amax = 0.0f;
    if (spec.scaling == Scaling::PerGroup || spec.scaling == Scaling::Nv) {
      for (float v : xg) amax_update(group_amax, v);
      q.amax.data_as<float>()[g] = group_amax;
    }
    float s_enc = 1.0f, s_dec = 1.0f;
    if (spec.scaling == Scaling::Nv) {
      nv_group_scales(group_amax, &s_enc, &s_dec);
      q.group_scale_inv.data_as<float>()[g] = s_dec;
    }

    switch (spec.scaling) {
      case Scaling::PerGroup: {
        const BlockScale s = math.of(group_amax);
        q.rowwise_scale_inv.data_as<float>()[g] = s.stored_f32;
        for (int64_t r = 0; r < m; ++r)
          for (int64_t c = 0; c < C; ++c) put_both(r, c, s.encode_factor);
        break;
      }
      case Scaling::Block2D: {
        const int64_t cb_count = (C + b - 1) / b;
        for (int64_t rb = 0; rb * b < m; ++rb) {
          const int64_t r0 = rb * b, r1 = std::min(m, r0 + b);
          for (int64_t cb = 0; cb < cb_count; ++cb) {
            const int64_t c0 = cb * b, c1 = std::min(C, c0 + b);
            float amax = 0.0f;
            for (int64_t r = r0; r < r1; ++r)
              for (int64_t c = c0; c < c1; ++c) amax_update(amax, x_at(r, c));
            const BlockScale s = math.of(amax);
            store_scale(q.rowwise_scale_inv, (rb_off[static_cast<size_t>(g)] + rb) * cb_count + cb,
                        s, spec.scaling);
            for (int64_t r = r0; r < r1; ++r)
              for (int64_t c = c0; c < c1; ++c) put_both(r, c, s.encode_factor);
          }
        }
        break;
      }
      case Scaling::Block1D:
      case Scaling::Mx:
      case Scaling::Nv: {
        if (row.data) {  // 1×b blocks along C
          const int64_t cb_count = (C + b - 1) / b;
          for (int64_t r = 0; r < m; ++r) {
            for (int64_t cb = 0; cb < cb_count; ++cb) {
              const int64_t c0 = cb * b, c1 = std::min(C, c0 + b);
              float amax = 0.0f;
              for (int64_t c = c0; c < c1; ++c) amax_update(amax, x_at(r, c));
              const BlockScale s = math.of(amax, s_enc, s_dec);
              store_scale(q.rowwise_scale_inv, (off + r) * cb_count + cb, s, spec.scaling);
              for (int64_t c = c0; c < c1; ++c)
                row.put(off + r, c, encode(spec.format, x_at(r, c) * s.encode_factor));
            }
          }
        }
        if (col.data) {  // b×1 blocks along the group's rows, per column
          for (int64_t rb = 0; rb * b < m; ++rb) {
            const int64_t r0 = rb * b, r1 = std::min(m, r0 + b);
            for (int64_t c = 0; c < C; ++c) {
              float amax = 0.0f;
              for (int64_t r = r0; r < r1; ++r) amax_update(amax, x_at(r, c));
              const BlockScale s = math.of(amax, s_enc, s_dec);
              store_scale(q.columnwise_scale_inv, (rb_off[static_cast<size_t>(g)] + rb) * C + c, s,
                          spec.scaling);
              for (int64_t r = r0; r < r1; ++r)
                col.put(c, off + r, encode(spec.format, x_at(r, c) * s.encode_factor));
            }
          }
        }
        break;
      }
    }
  }
  // The bias gradient beside it: grouped_bias_grad's CPU entry (its sums, in its order).
  if (args.db.defined()) kBiasGrad.run({args.ctx, args.x, args.splits, args.db, false, G, args.rows, C});
}

// ---------------------------------------------------------------- dequantize
namespace {

// Decodes element (r, c) of a copy whose scale for that element is found by `scale_index`.
struct Dequantizer {
  const QuantizedTensor& q;
  std::vector<int64_t> counts, offs, rb_off;

  Dequantizer(const QuantizedTensor& qt, std::vector<int64_t> c)
      : q(qt), counts(std::move(c)), offs(offsets_of(counts)) {
    if (q.spec.block > 0) rb_off = row_block_offsets(counts, q.spec.block);
  }

  float scale_value(const Tensor& scales, int64_t i, int64_t g) const {
    switch (q.spec.scaling) {
      case Scaling::Mx:
        return e8m0_to_f32(scales.data_as<uint8_t>()[i]);
      case Scaling::Nv:
        return f8e4m3_to_f32(scales.data_as<uint8_t>()[i]) * q.group_scale_inv.data_as<float>()[g];
      default:
        return scales.data_as<float>()[i];
    }
  }

  // The copy `which` into out (f32, as stored: [T, C] or [C, T]); valid rows only.
  void run(QuantUsage which, const Tensor& out) const {
    const bool rowwise = which == QuantUsage::Rowwise;
    const bool fp4 = q.spec.format == QuantFormat::E2M1;
    const CopyView v = view_of(rowwise ? q.rowwise : q.columnwise, fp4);
    const Tensor& scales = rowwise ? q.rowwise_scale_inv : q.columnwise_scale_inv;
    const int64_t C = q.cols, T = q.rows, b = q.spec.block;
    const int64_t cb_count = b > 0 ? (C + b - 1) / b : 0;
    float* o = out.data_as<float>();
    for (size_t g = 0; g < counts.size(); ++g) {
      for (int64_t r = 0; r < counts[g]; ++r) {
        const int64_t t = offs[g] + r;
        for (int64_t c = 0; c < C; ++c) {
          int64_t si = 0;
          switch (q.spec.scaling) {
            case Scaling::PerGroup:
              si = static_cast<int64_t>(g);
              break;
            case Scaling::Block2D:
              si = (rb_off[g] + r / b) * cb_count + c / b;
              break;
            default:
              si = rowwise ? t * cb_count + c / b : (rb_off[g] + r / b) * C + c;
              break;
          }
          const uint8_t code = rowwise ? v.get(t, c) : v.get(c, t);
          const float value =
              decode(q.spec.format, code) * scale_value(scales, si, static_cast<int64_t>(g));
          if (rowwise) {
            o[t * C + c] = value;
          } else {
            o[c * T + t] = value;
          }
        }
      }
    }
  }
};

}  // namespace

std::string dequantize_rejects(const detail::DequantizeArgs& a) {
  return a.ctx.device().is_cpu() ? "" : str("the context's device is ", a.ctx.device().to_string());
}

void dequantize_run(const detail::DequantizeArgs& args) {
  Dequantizer(args.q, read_counts(args.ctx, args.splits)).run(args.which, args.out);
}

// ---------------------------------------------------------------- quantized grouped GEMMs
namespace {

constexpr int64_t kRowBlock = 256;

// Rounds an fp32 block into rows of out (f32 / f16 / bf16).
void store_rows(const float* src, const Tensor& out, int64_t row, int64_t rows) {
  const int64_t n = out.size(1);
  char* dst = static_cast<char*>(out.data()) + static_cast<size_t>(row * n) * size_of(out.dtype());
  from_f32(src, dst, out.dtype(), static_cast<size_t>(rows * n));
}

std::vector<float> dequantized(const Context& ctx, const QuantizedTensor& q, const Splits& splits,
                               QuantUsage which) {
  std::vector<float> out(static_cast<size_t>(q.rows * q.cols), 0.0f);
  const Shape shape = which == QuantUsage::Rowwise ? Shape{q.rows, q.cols} : Shape{q.cols, q.rows};
  Dequantizer(q, read_counts(ctx, splits))
      .run(which, Tensor::wrap(out.data(), shape, DType::F32, ctx.device()));
  return out;
}

// The weight's groups are its experts: N rows each.
Splits weight_splits(const QuantizedTensor& w) {
  return Splits::host(std::vector<int64_t>(static_cast<size_t>(w.groups), w.rows / w.groups));
}

}  // namespace

std::string quant_group_m_rejects(const detail::QuantGroupMArgs& a) {
  return a.ctx.device().is_cpu() ? "" : str("the context's device is ", a.ctx.device().to_string());
}

void quant_group_m_run(const detail::QuantGroupMArgs& args) {
  openblas_set_num_threads(args.ctx.threads());
  const std::vector<int64_t> counts = read_counts(args.ctx, args.splits);
  const int64_t Kr = args.k, Nout = args.n, G = args.groups;
  const bool fprop = args.op == BOp::Transposed;
  const std::vector<float> a32 = dequantized(args.ctx, args.a, args.splits, QuantUsage::Rowwise);
  const std::vector<float> b32 = dequantized(args.ctx, args.b, weight_splits(args.b),
                                             fprop ? QuantUsage::Rowwise : QuantUsage::Columnwise);
  const int64_t per_group = args.b.rows / G;  // the weight's N
  std::vector<float> y32, bias32(static_cast<size_t>(Nout));
  int64_t off = 0;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t m = counts[static_cast<size_t>(g)];
    if (m == 0) continue;
    // B_g as a row-major [Nout, Kr] matrix with leading dimension ldb: fprop rows g·N.. of the
    // rowwise [G·N, K]; dgrad columns g·N.. of the columnwise [K, G·N].
    const float* bg = fprop ? b32.data() + g * per_group * Kr : b32.data() + g * per_group;
    const int ldb = static_cast<int>(fprop ? Kr : args.b.rows);
    if (args.bias.defined()) {
      to_f32(static_cast<const char*>(args.bias.data()) +
                 static_cast<size_t>(g * Nout) * size_of(args.bias.dtype()),
             args.bias.dtype(), bias32.data(), static_cast<size_t>(Nout));
    }
    for (int64_t r0 = 0; r0 < m; r0 += kRowBlock) {
      const int64_t rows = std::min(kRowBlock, m - r0);
      y32.resize(static_cast<size_t>(rows * Nout));
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                  static_cast<int>(Nout), static_cast<int>(Kr), 1.0f, a32.data() + (off + r0) * Kr,
                  static_cast<int>(Kr), bg, ldb, 0.0f, y32.data(), static_cast<int>(Nout));
      if (args.bias.defined()) {
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < Nout; ++j)
            y32[static_cast<size_t>(r * Nout + j)] += bias32[static_cast<size_t>(j)];
      }
      store_rows(y32.data(), args.out, off + r0, rows);
    }
    off += m;
  }
}

std::string quant_group_k_rejects(const detail::QuantGroupKArgs& a) {
  return a.ctx.device().is_cpu() ? "" : str("the context's device is ", a.ctx.device().to_string());
}

void quant_group_k_run(const detail::QuantGroupKArgs& args) {
  openblas_set_num_threads(args.ctx.threads());
  const std::vector<int64_t> counts = read_counts(args.ctx, args.splits);
  const int64_t K = args.k, N = args.n, T = args.rows;
  const std::vector<float> dyc =
      dequantized(args.ctx, args.dy, args.splits, QuantUsage::Columnwise);  // [N, T]
  const std::vector<float> xc =
      dequantized(args.ctx, args.x, args.splits, QuantUsage::Columnwise);  // [K, T]
  const bool f32_out = args.dw.dtype() == DType::F32;
  std::vector<float> acc;
  int64_t off = 0;
  for (int64_t g = 0; g < args.groups; ++g) {
    const int64_t m = counts[static_cast<size_t>(g)];
    char* dw_g = static_cast<char*>(args.dw.data()) +
                 static_cast<size_t>(g * N * K) * size_of(args.dw.dtype());
    float* c = f32_out ? reinterpret_cast<float*>(dw_g) : nullptr;
    if (!f32_out) {
      acc.assign(static_cast<size_t>(N * K), 0.0f);
      c = acc.data();
    }
    if (m == 0) {
      if (!args.accumulate) {
        if (f32_out)
          std::fill_n(c, N * K, 0.0f);
        else
          std::memset(dw_g, 0, static_cast<size_t>(N * K) * size_of(args.dw.dtype()));
      }
      continue;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(N), static_cast<int>(K),
                static_cast<int>(m), 1.0f, dyc.data() + off, static_cast<int>(T), xc.data() + off,
                static_cast<int>(T), args.accumulate ? 1.0f : 0.0f, c, static_cast<int>(K));
    if (!f32_out) from_f32(c, dw_g, args.dw.dtype(), static_cast<size_t>(N * K));
    off += m;
  }
}

// This backend's entries in the quantize tables (declared in cpu_quantize.h).
constexpr detail::Backend<detail::QuantizeArgs> kQuantize{"cpu", quantize_rejects, quantize_run};
constexpr detail::Backend<detail::DequantizeArgs> kDequantize{"cpu", dequantize_rejects,
                                                              dequantize_run};
constexpr detail::Backend<detail::QuantGroupMArgs> kQuantGroupM{"cpu", quant_group_m_rejects,
                                                                quant_group_m_run};
constexpr detail::Backend<detail::QuantGroupKArgs> kQuantGroupK{"cpu", quant_group_k_rejects,
                                                                quant_group_k_run};

}  // namespace moekit::cpu
