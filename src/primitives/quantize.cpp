// Quantize primitives and quantized grouped GEMMs: the one place their arguments are validated,
// then backend dispatch (SPEC §6). The CPU entries are the reference. On a GPU context quantize
// and dequantize have their kernels (cuda/quantize.cu); the quantized GEMMs take the native FP8
// kernels (cuda-fp8: per-group scales), the bf16 tensor-core emulation (cuda-bf16: power-of-two
// scales) or the fp32 emulation (cuda: mxfp8, nvfp4), in that order; a call none of them takes is
// an Unsupported error naming the recipe (never a silent fallback). ARCHITECTURE.md "Quantized
// recipes".
#include "moekit/primitives/quantize.h"

#include "backends/contract/backend_table.h"
#include "backends/contract/quant_args.h"
#include "backends/cpu/cpu_quantize.h"
#include "core/checks.h"
#include "moekit/core/error.h"
#include "primitives/bind.h"
#ifdef MOEKIT_HAS_CUDA
#include "backends/cuda/cuda_quantize.h"
#endif
#ifdef MOEKIT_HAS_SM90
#include "backends/cuda/sm90/sm90_entries.h"
#endif

namespace moekit {
namespace {
using detail::Backend;

const Backend<detail::QuantizeArgs> kQuantize[] = {
#ifdef MOEKIT_HAS_CUDA
    cuda::kQuantize,  // quantize.cu: bit for bit the CPU entry's
#endif
    cpu::kQuantize,
};
const Backend<detail::DequantizeArgs> kDequantize[] = {
#ifdef MOEKIT_HAS_CUDA
    cuda::kDequantize,  // quantize.cu
#endif
    cpu::kDequantize,
};
const Backend<detail::QuantGroupMArgs> kQuantGroupM[] = {
#ifdef MOEKIT_HAS_SM90
    cuda::kFp8QuantGroupM,       // per-group scales (fp8-current): the native sm_90a FP8 GEMMs
#endif
#ifdef MOEKIT_HAS_CUDA
    cuda::kBf16QuantGroupM,      // power-of-two scales: exact bf16 operands, the sm_90a GEMMs
    cuda::kEmulatedQuantGroupM,  // the rest of mxfp8 and nvfp4 (fp32 SIMT); other fp8: refused
#endif
    cpu::kQuantGroupM,
};
const Backend<detail::QuantGroupKArgs> kQuantGroupK[] = {
#ifdef MOEKIT_HAS_SM90
    cuda::kFp8QuantGroupK,
#endif
#ifdef MOEKIT_HAS_CUDA
    cuda::kBf16QuantGroupK,
    cuda::kEmulatedQuantGroupK,
#endif
    cpu::kQuantGroupK,
};
const detail::RegisterBackendNames kRegisterQuantize(kQuantize);
const detail::RegisterBackendNames kRegisterDequantize(kDequantize);
const detail::RegisterBackendNames kRegisterQuantGroupM(kQuantGroupM);
const detail::RegisterBackendNames kRegisterQuantGroupK(kQuantGroupK);

void check_spec(const QuantSpec& s) {
  if (s.recipe == RecipeKind::None) {
    throw_invalid("spec", "the quantization of a recipe (Recipe::spec)", "recipe none");
  }
  const bool blocked = s.scaling != Scaling::PerGroup;
  const int64_t want = s.scaling == Scaling::PerGroup ? 0
                       : s.scaling == Scaling::Mx     ? 32
                       : s.scaling == Scaling::Nv     ? 16
                                                      : 128;
  if (s.block != want) {
    throw_invalid("spec.block", str(want, " for this scaling"), std::to_string(s.block));
  }
  if ((s.scaling == Scaling::Nv) != (s.format == QuantFormat::E2M1)) {
    throw_invalid("spec.format", "e2m1 exactly for NVFP4 scaling", name(s.format));
  }
  if (s.margin < 0) throw_invalid("spec.margin", "a margin >= 0", std::to_string(s.margin));
  (void)blocked;
}

// Every group's rows a multiple of `multiple` (host-readable counts).
void check_group_rows(std::string_view argument, const Context& ctx, const Splits& splits,
                      int64_t multiple, std::string_view rule) {
  if (multiple <= 1) return;
  // Device counts on a GPU: not read (no host sync); today's GPU paths take any counts (SPEC §6c).
  if (!splits.on_host() && !splits.device_counts().device().is_cpu()) return;
  const std::vector<int64_t> counts = read_counts(ctx, splits);
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] % multiple != 0) {
      throw_invalid(argument, str("rows per group a multiple of ", multiple, " (", rule, ")"),
                    str(counts[g], " rows in group ", g));
    }
  }
}

Shape scale_shape(const QuantizedTensor& q, bool columnwise) {
  const int64_t b = q.spec.block, RB = q.row_block_capacity();
  const int64_t cb = b > 0 ? (q.cols + b - 1) / b : 0;
  switch (q.spec.scaling) {
    case Scaling::PerGroup:
      return {q.groups};
    case Scaling::Block2D:
      return {RB, cb};
    default:
      return columnwise ? Shape{RB, q.cols} : Shape{q.rows, cb};
  }
}

DType scale_dtype(Scaling s) {
  return s == Scaling::Mx || s == Scaling::Nv ? DType::U8 : DType::F32;
}

void check_quantized(std::string_view argument, const QuantizedTensor& q, QuantUsage need,
                     Device dev) {
  if (has(need, QuantUsage::Rowwise) && !q.has_rowwise()) {
    throw_invalid(argument, "a quantized tensor with its rowwise copy", "no rowwise copy");
  }
  if (has(need, QuantUsage::Columnwise) && !q.has_columnwise()) {
    throw_invalid(argument, "a quantized tensor with its columnwise (transposed) copy",
                  "no columnwise copy");
  }
  const Tensor& any = q.has_rowwise() ? q.rowwise : q.columnwise;
  if (!(any.device() == dev)) {
    throw_invalid(argument, str("device ", dev.to_string()), any.device().to_string());
  }
}

}  // namespace

QuantizedTensor allocate_quantized(const Context& ctx, const QuantSpec& spec, DType source_dtype,
                                   int64_t rows, int64_t cols, int64_t groups, QuantUsage usage) {
  check_spec(spec);
  QuantizedTensor q;
  q.spec = spec;
  q.source_dtype = source_dtype;
  q.rows = rows;
  q.cols = cols;
  q.groups = groups;
  q.usage = usage;
  const bool fp4 = spec.format == QuantFormat::E2M1;
  const DType sdt = scale_dtype(spec.scaling);
  const bool shared = spec.scaling == Scaling::PerGroup || spec.scaling == Scaling::Block2D;
  if (shared) {
    q.rowwise_scale_inv = Tensor::empty(scale_shape(q, false), sdt, ctx);
    q.columnwise_scale_inv = q.rowwise_scale_inv;
  }
  if (has(usage, QuantUsage::Rowwise)) {
    q.rowwise = Tensor::empty({rows, fp4 ? (cols + 1) / 2 : cols}, DType::U8, ctx);
    if (!shared) q.rowwise_scale_inv = Tensor::empty(scale_shape(q, false), sdt, ctx);
  }
  if (has(usage, QuantUsage::Columnwise)) {
    const int64_t bytes = fp4 ? (rows + 1) / 2 : rows, a = kColumnwiseRowAlignment;
    q.columnwise = Tensor::empty({cols, (bytes + a - 1) / a * a}, DType::U8, ctx);
    if (!shared) q.columnwise_scale_inv = Tensor::empty(scale_shape(q, true), sdt, ctx);
  }
  if (spec.scaling == Scaling::PerGroup || spec.scaling == Scaling::Nv) {
    q.amax = Tensor::empty({groups}, DType::F32, ctx);
  }
  if (spec.scaling == Scaling::Nv) q.group_scale_inv = Tensor::empty({groups}, DType::F32, ctx);
  return q;
}

detail::Plan detail::bind_quantize(const Context& ctx, const Tensor& x, const Splits& splits,
                                   const QuantizedTensor& q, const Tensor& db) {
  const Device dev = ctx.device();
  if (!x.defined() || x.dim() != 2) throw_invalid("x", "a 2-D tensor [T, C]", x.describe());
  if (!is_compute_dtype(x.dtype())) throw_invalid("x", "dtype f32, f16 or bf16", name(x.dtype()));
  check_input("x", x, {-1, -1}, x.dtype(), dev);
  const int64_t T = x.size(0), C = x.size(1), G = splits.groups();
  check_spec(q.spec);
  validate_splits(splits, G, T, dev);
  if (q.rows != T || q.cols != C || q.groups != G) {
    throw_invalid("q", str("a quantized tensor allocated for [", T, ", ", C, "] in ", G, " groups"),
                  str("[", q.rows, ", ", q.cols, "] in ", q.groups, " groups"));
  }
  check_quantized("q", q, q.usage, dev);
  if (q.spec.scaling == Scaling::Nv) {
    if (q.has_rowwise() && C % 2 != 0) {
      throw_invalid("x", "an even number of columns (NVFP4 packs two e2m1 values per byte)",
                    str(C, " columns"));
    }
    if (q.has_columnwise()) {
      check_group_rows("splits", ctx, splits, 2,
                       "NVFP4's columnwise copy packs two rows per byte, never across groups");
    }
  }
  if (db.defined()) {
    if (!is_compute_dtype(db.dtype())) throw_invalid("db", "dtype f32, f16 or bf16", name(db.dtype()));
    check_caller_buffer("db", db, {G, C}, db.dtype(), dev, {{"x", x}});
  }
  return detail::bind<detail::QuantizeArgs>("quantize", kQuantize, ctx,
                                            {ctx, x, splits, q, G, T, C, db});
}

QuantizedTensor quantize(const Context& ctx, const Tensor& x, const Splits& splits,
                         const QuantSpec& spec, QuantUsage usage) {
  if (!x.defined() || x.dim() != 2) throw_invalid("x", "a 2-D tensor [T, C]", x.describe());
  QuantizedTensor q =
      allocate_quantized(ctx, spec, x.dtype(), x.size(0), x.size(1), splits.groups(), usage);
  detail::bind_quantize(ctx, x, splits, q).run();
  return q;
}

QuantizedTensor quantize_weight(const Context& ctx, const Tensor& w, const QuantSpec& spec,
                                QuantUsage usage) {
  if (!w.defined() || w.dim() != 3) throw_invalid("w", "a 3-D tensor [G, N, K]", w.describe());
  if (!w.is_contiguous()) throw_invalid("w", "a contiguous tensor", w.describe());
  const int64_t G = w.size(0), N = w.size(1), K = w.size(2);
  return quantize(ctx, w.view({G * N, K}),
                  Splits::host(std::vector<int64_t>(static_cast<size_t>(G), N)), spec, usage);
}

void dequantize(const Context& ctx, const QuantizedTensor& q, const Splits& splits,
                QuantUsage which, const Tensor& out) {
  if (which != QuantUsage::Rowwise && which != QuantUsage::Columnwise) {
    throw_invalid("which", "Rowwise or Columnwise (one copy)", "Both");
  }
  const Device dev = ctx.device();
  check_quantized("q", q, which, dev);
  validate_splits(splits, q.groups, q.rows, dev);
  const Shape shape = which == QuantUsage::Rowwise ? Shape{q.rows, q.cols} : Shape{q.cols, q.rows};
  check_input("out", out, shape, DType::F32, dev);
  detail::dispatch<detail::DequantizeArgs>("dequantize", kDequantize, ctx,
                                           {ctx, q, splits, which, out});
}

detail::Plan detail::bind_group_m_quantized(const Context& ctx, const QuantizedTensor& a,
                                            const QuantizedTensor& b, BOp op, const Splits& splits,
                                            const Tensor& out, const Tensor& bias) {
  const Device dev = ctx.device();
  const bool fprop = op == BOp::Transposed;
  check_quantized("a", a, QuantUsage::Rowwise, dev);
  check_quantized("b", b, fprop ? QuantUsage::Rowwise : QuantUsage::Columnwise, dev);
  const int64_t T = a.rows, G = b.groups;
  if (G <= 0 || b.rows % G != 0)
    throw_invalid("b", "a quantized weight [G·N, K]", str(b.rows, " rows"));
  const int64_t per_group = b.rows / G;
  // fprop: a [T, K] · W_gᵀ (W_g [N, K]); dgrad: a = dy [T, N] · W_g → [T, K].
  const int64_t k = a.cols, n = fprop ? per_group : b.cols;
  const int64_t b_red = fprop ? b.cols : per_group;
  if (k != b_red) {
    throw_invalid("b", str("a weight whose reduction dimension is a's ", k, " columns"),
                  std::to_string(b_red));
  }
  if (a.spec.recipe != b.spec.recipe) {
    throw_invalid("b", str("an operand of recipe ", Recipe{a.spec.recipe}.name()),
                  str("recipe ", Recipe{b.spec.recipe}.name()));
  }
  validate_splits(splits, G, T, dev);
  if (!is_compute_dtype(out.dtype()))
    throw_invalid("out", "dtype f32, f16 or bf16", name(out.dtype()));
  if (bias.defined()) check_input("bias", bias, {G, n}, out.dtype(), dev);
  check_caller_buffer("out", out, {T, n}, out.dtype(), dev, {{"bias", bias}});
  return detail::bind<detail::QuantGroupMArgs>("grouped_gemm_group_m_quantized", kQuantGroupM, ctx,
                                               {ctx, a, b, op, splits, out, bias, G, T, k, n});
}

void grouped_gemm_group_m_quantized(const Context& ctx, const QuantizedTensor& a,
                                    const QuantizedTensor& b, BOp op, const Splits& splits,
                                    const Tensor& out, const Tensor& bias) {
  detail::bind_group_m_quantized(ctx, a, b, op, splits, out, bias).run();
}

detail::Plan detail::bind_group_k_quantized(const Context& ctx, const QuantizedTensor& dy,
                                            const QuantizedTensor& x, const Splits& splits,
                                            const Tensor& dw, bool accumulate) {
  const Device dev = ctx.device();
  check_quantized("dy", dy, QuantUsage::Columnwise, dev);
  check_quantized("x", x, QuantUsage::Columnwise, dev);
  if (x.rows != dy.rows)
    throw_invalid("x", str("a quantized tensor of ", dy.rows, " rows (dy's)"),
                  std::to_string(x.rows));
  if (dy.spec.recipe != x.spec.recipe) {
    throw_invalid("x", str("an operand of recipe ", Recipe{dy.spec.recipe}.name()),
                  str("recipe ", Recipe{x.spec.recipe}.name()));
  }
  const int64_t T = dy.rows, N = dy.cols, K = x.cols;
  if (!dw.defined() || dw.dim() != 3) throw_invalid("dw", "a 3-D tensor [G, N, K]", dw.describe());
  const int64_t G = dw.size(0);
  validate_splits(splits, G, T, dev);
  if (accumulate && dw.dtype() != DType::F32) {
    throw_invalid("dw", "dtype f32 when accumulating (main_grad)", name(dw.dtype()));
  }
  if (!is_compute_dtype(dw.dtype()))
    throw_invalid("dw", "dtype f32, f16 or bf16", name(dw.dtype()));
  check_caller_buffer("dw", dw, {G, N, K}, dw.dtype(), dev, {});
  return detail::bind<detail::QuantGroupKArgs>("grouped_gemm_group_k_quantized", kQuantGroupK, ctx,
                                               {ctx, dy, x, splits, dw, accumulate, G, T, K, N});
}

void grouped_gemm_group_k_quantized(const Context& ctx, const QuantizedTensor& dy,
                                    const QuantizedTensor& x, const Splits& splits,
                                    const Tensor& dw, bool accumulate) {
  detail::bind_group_k_quantized(ctx, dy, x, splits, dw, accumulate).run();
}

}  // namespace moekit
