// Activation primitives (SwiGLU): the one place their arguments are validated, then dispatch.
#include "moekit/primitives/activation.h"

#include "backends/cpu/cpu_activation.h"
#include "core/checks.h"
#include "moekit/core/error.h"
#include "moekit/primitives/grouped_gemm.h"
#include "backends/contract/activation_args.h"
#include "backends/contract/backend_table.h"
#include "primitives/bind.h"
#ifdef MOEKIT_HAS_CUDA
#include "backends/cuda/cuda_activation.h"
#endif
#ifdef MOEKIT_HAS_SM90
#include "backends/cuda/sm90/sm90_entries.h"
#endif

namespace moekit {
namespace {
using detail::Backend;

const Backend<detail::SwigluForwardArgs> kSwigluForward[] = {
#ifdef MOEKIT_HAS_CUDA
    cuda::kSwigluForward,
#endif
    cpu::kSwigluForward,
};
const Backend<detail::SwigluBackwardArgs> kSwigluBackward[] = {
#ifdef MOEKIT_HAS_CUDA
    cuda::kSwigluBackward,
#endif
    cpu::kSwigluBackward,
};
const detail::RegisterBackendNames kRegisterSwigluForward(kSwigluForward);

const detail::RegisterBackendNames kRegisterSwigluBackward(kSwigluBackward);

// h [T, 2F]: defined, 2-D, compute dtype, even width, the layout's width rule, contiguous.
// Returns F.
int64_t check_glu_input(const Tensor& h, GluLayout layout, Device dev) {
  if (!h.defined() || h.dim() != 2) throw_invalid("h", "a 2-D tensor [T, 2F]", h.describe());
  if (!is_compute_dtype(h.dtype())) throw_invalid("h", "dtype f32, f16 or bf16", name(h.dtype()));
  const int64_t width = h.size(1);
  if (width % 2 != 0) {
    throw_invalid("h", "an even column count 2F (gate and linear parts of F columns each)",
                  str(width, " columns"));
  }
  if (layout == GluLayout::Interleaved32 && width % (2 * kGluInterleaveBlock) != 0) {
    throw_invalid("h",
                  str("2F a multiple of ", 2 * kGluInterleaveBlock,
                      " for the interleaved GLU layout (blocks of ", kGluInterleaveBlock,
                      " gate and ", kGluInterleaveBlock, " linear columns)"),
                  str("2F = ", width));
  }
  check_input("h", h, {h.size(0), width}, h.dtype(), dev);
  return width / 2;
}

void check_row_splits(const Splits& splits, int64_t rows, Device dev) {
  if (splits.groups() < 1) {
    throw_invalid("splits", "at least one group count (host counts or a [G] counts tensor)",
                  splits.on_host() ? "0 counts" : splits.device_counts().describe());
  }
  validate_splits(splits, splits.groups(), rows, dev);
}
}  // namespace

std::string_view name(GluLayout layout) {
  return layout == GluLayout::Halves ? "halves" : "interleaved32";
}

detail::Plan detail::bind_swiglu_forward(const Context& ctx, const Tensor& h, const Tensor& probs, const Splits& splits,
                    GluLayout layout, const Tensor& z) {
  const Device dev = ctx.device();
  const int64_t F = check_glu_input(h, layout, dev);
  const int64_t T = h.size(0);
  if (probs.defined()) check_input("probs", probs, {T}, DType::F32, dev);
  check_row_splits(splits, T, dev);
  check_caller_buffer("z", z, {T, F}, h.dtype(), dev,
                      {{"h", h}, {"probs", probs}, {"splits", splits.device_counts()}});
  return detail::bind<detail::SwigluForwardArgs>("swiglu_forward", kSwigluForward, ctx,
                                              {ctx, h, probs, splits, layout, z, T, F});
}

void swiglu_forward(const Context& ctx, const Tensor& h, const Tensor& probs, const Splits& splits,
                    GluLayout layout, const Tensor& z) {
  detail::bind_swiglu_forward(ctx, h, probs, splits, layout, z).run();
}

detail::Plan detail::bind_gemm_swiglu(const Context& ctx, const Tensor& x, const Tensor& w,
                         const Splits& splits, const Tensor& bias, const Tensor& probs,
                         GluLayout layout, const Tensor& h, const Tensor& z) {
  const Device dev = ctx.device();
  if (!x.defined() || x.dim() != 2) throw_invalid("x", "a 2-D tensor [T, K]", x.describe());
  if (!w.defined() || w.dim() != 3) throw_invalid("w", "a 3-D tensor [G, 2F, K]", w.describe());
  if (!is_compute_dtype(x.dtype())) throw_invalid("x", "dtype f32, f16 or bf16", name(x.dtype()));
  const int64_t T = x.size(0), K = x.size(1), G = w.size(0), W = w.size(1);
  check_input("x", x, {T, K}, x.dtype(), dev);
  check_input("w", w, {G, W, K}, x.dtype(), dev);
  if (bias.defined()) check_input("bias", bias, {G, W}, x.dtype(), dev);
  if (probs.defined()) check_input("probs", probs, {T}, DType::F32, dev);
  validate_splits(splits, G, T, dev);
  const Tensor& counts = splits.device_counts();
  check_caller_buffer("h", h, {T, W}, x.dtype(), dev,
                      {{"x", x}, {"w", w}, {"bias", bias}, {"probs", probs}, {"splits", counts}});
  const int64_t F = check_glu_input(h, layout, dev);
  check_caller_buffer(
      "z", z, {T, F}, x.dtype(), dev,
      {{"x", x}, {"w", w}, {"bias", bias}, {"probs", probs}, {"splits", counts}, {"h", h}});
  // The fused kernel runs where the GEMM would run on sm90 anyway (nothing or "sm90" forced, and
  // no decline). Otherwise — another backend forced, or a call the fused kernel cannot take (e.g.
  // the Halves layout) — the two primitives run, each choosing its backend as usual.
#ifdef MOEKIT_HAS_SM90
  detail::Plan fused = detail::bind_first<detail::GemmSwigluArgs>(
      "grouped_gemm_swiglu", cuda::kSm90GemmSwiglu, ctx, {ctx, x, w, splits, bias, probs, layout, h, z, G, T, K, F});
  if (!fused.empty()) return fused;
#else
  (void)K;
#endif
  detail::Plan plan = bind_group_m(ctx, x, w, BOp::Transposed, splits, h, bias);
  return std::move(plan.then(bind_swiglu_forward(ctx, h, probs, splits, layout, z)));
}

void grouped_gemm_swiglu(const Context& ctx, const Tensor& x, const Tensor& w,
                         const Splits& splits, const Tensor& bias, const Tensor& probs,
                         GluLayout layout, const Tensor& h, const Tensor& z) {
  detail::bind_gemm_swiglu(ctx, x, w, splits, bias, probs, layout, h, z).run();
}

detail::Plan detail::bind_gemm_dswiglu(const Context& ctx, const Tensor& dy, const Tensor& w,
                          const Splits& splits, const Tensor& h, const Tensor& probs,
                          GluLayout layout, const Tensor& dh, const Tensor& dprobs,
                          bool accumulate_dprobs) {
  const Device dev = ctx.device();
  if (!dy.defined() || dy.dim() != 2) throw_invalid("dy", "a 2-D tensor [T, H]", dy.describe());
  if (!w.defined() || w.dim() != 3) throw_invalid("w", "a 3-D tensor [G, H, F]", w.describe());
  if (!is_compute_dtype(dy.dtype())) throw_invalid("dy", "dtype f32, f16 or bf16", name(dy.dtype()));
  const int64_t T = dy.size(0), H = dy.size(1), G = w.size(0), F = w.size(2);
  check_input("dy", dy, {T, H}, dy.dtype(), dev);
  check_input("w", w, {G, H, F}, dy.dtype(), dev);
  if (check_glu_input(h, layout, dev) != F) {
    throw_invalid("h", str("2F = ", 2 * F, " columns (fc2's F = ", F, ")"), h.describe());
  }
  check_input("h", h, {T, 2 * F}, dy.dtype(), dev);
  if (probs.defined()) check_input("probs", probs, {T}, DType::F32, dev);
  validate_splits(splits, G, T, dev);
  const Tensor& counts = splits.device_counts();
  check_caller_buffer("dh", dh, {T, 2 * F}, dy.dtype(), dev,
                      {{"dy", dy}, {"w", w}, {"h", h}, {"probs", probs}, {"splits", counts}});
  if (dprobs.defined()) {
    if (!probs.defined()) {
      throw_invalid("dprobs", "no tensor when probs are not given (plain SwiGLU has no probs)",
                    dprobs.describe());
    }
    check_caller_buffer("dprobs", dprobs, {T}, DType::F32, dev,
                        {{"dy", dy}, {"w", w}, {"h", h}, {"probs", probs}, {"splits", counts},
                         {"dh", dh}});
  }
  // As grouped_gemm_swiglu: the fused kernel where the GEMM would run on sm90 anyway.
#ifdef MOEKIT_HAS_SM90
  detail::Plan fused = detail::bind_first<detail::GemmDSwigluArgs>(
      "grouped_gemm_dswiglu", cuda::kSm90GemmDSwiglu, ctx,
      {ctx, dy, w, splits, h, probs, layout, dh, dprobs, accumulate_dprobs, G, T, H, F});
  if (!fused.empty()) return fused;
#else
  (void)H;
#endif
  const Tensor dz = Tensor::empty({T, F}, dy.dtype(), ctx);  // the bound calls hold it
  detail::Plan plan = bind_group_m(ctx, dy, w, BOp::Plain, splits, dz);
  return std::move(
      plan.then(bind_swiglu_backward(ctx, h, probs, dz, splits, layout, dh, dprobs, accumulate_dprobs)));
}

void grouped_gemm_dswiglu(const Context& ctx, const Tensor& dy, const Tensor& w,
                          const Splits& splits, const Tensor& h, const Tensor& probs,
                          GluLayout layout, const Tensor& dh, const Tensor& dprobs,
                          bool accumulate_dprobs) {
  detail::bind_gemm_dswiglu(ctx, dy, w, splits, h, probs, layout, dh, dprobs, accumulate_dprobs).run();
}

detail::Plan detail::bind_swiglu_backward(const Context& ctx, const Tensor& h, const Tensor& probs, const Tensor& dz,
                     const Splits& splits, GluLayout layout, const Tensor& dh, const Tensor& dprobs,
                     bool accumulate_dprobs) {
  const Device dev = ctx.device();
  const int64_t F = check_glu_input(h, layout, dev);
  const int64_t T = h.size(0);
  if (probs.defined()) check_input("probs", probs, {T}, DType::F32, dev);
  check_input("dz", dz, {T, F}, h.dtype(), dev);
  check_row_splits(splits, T, dev);
  const Tensor& counts = splits.device_counts();
  check_caller_buffer("dh", dh, {T, 2 * F}, h.dtype(), dev,
                      {{"h", h}, {"probs", probs}, {"dz", dz}, {"splits", counts}});
  if (dprobs.defined()) {
    if (!probs.defined()) {
      throw_invalid("dprobs", "no tensor when probs are not given (plain SwiGLU has no probs)",
                    dprobs.describe());
    }
    check_caller_buffer("dprobs", dprobs, {T}, DType::F32, dev,
                        {{"h", h}, {"probs", probs}, {"dz", dz}, {"splits", counts}, {"dh", dh}});
  }
  return detail::bind<detail::SwigluBackwardArgs>("swiglu_backward", kSwigluBackward, ctx,
      {ctx, h, probs, dz, splits, layout, dh, dprobs, accumulate_dprobs, T, F});
}

void swiglu_backward(const Context& ctx, const Tensor& h, const Tensor& probs, const Tensor& dz,
                     const Splits& splits, GluLayout layout, const Tensor& dh, const Tensor& dprobs,
                     bool accumulate_dprobs) {
  detail::bind_swiglu_backward(ctx, h, probs, dz, splits, layout, dh, dprobs, accumulate_dprobs).run();
}

}  // namespace moekit
