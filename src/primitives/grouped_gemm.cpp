// Grouped GEMM primitives: the one place their arguments are validated, then backend dispatch.
#include "moekit/primitives/grouped_gemm.h"

#include <array>

#include "backends/cpu/cpu_backend.h"
#include "core/checks.h"
#include "moekit/core/error.h"
#include "backends/contract/args.h"
#include "backends/contract/backend_table.h"
#include "primitives/bind.h"
#ifdef MOEKIT_HAS_CUDA
#include "backends/cuda/cuda_backend.h"
#endif
#ifdef MOEKIT_HAS_SM90
#include "backends/cuda/sm90/sm90_entries.h"
#endif

namespace moekit {
namespace {
using detail::Backend;

void check_compute_dtype(std::string_view argument, DType t) {
  if (!is_compute_dtype(t)) throw_invalid(argument, "dtype f32, f16 or bf16", name(t));
}

const Backend<detail::GroupMArgs> kGroupM[] = {
#ifdef MOEKIT_HAS_SM90
    cuda::kSm90GroupM,
#endif
#ifdef MOEKIT_HAS_CUDA
    cuda::kCublasGroupM,
#endif
    cpu::kGroupM,
};
const Backend<detail::GroupKArgs> kGroupK[] = {
#ifdef MOEKIT_HAS_SM90
    cuda::kSm90GroupK,
#endif
#ifdef MOEKIT_HAS_CUDA
    cuda::kCublasGroupK,
#endif
    cpu::kGroupK,
};
const Backend<detail::BiasGradArgs> kBiasGrad[] = {
#ifdef MOEKIT_HAS_CUDA
    cuda::kBiasGrad,
#endif
    cpu::kBiasGrad,
};
const detail::RegisterBackendNames kRegisterGroupM(kGroupM);
const detail::RegisterBackendNames kRegisterGroupK(kGroupK);
const detail::RegisterBackendNames kRegisterBiasGrad(kBiasGrad);
}  // namespace

detail::Plan detail::bind_group_m(const Context& ctx, const Tensor& a, const Tensor& b, BOp op,
                          const Splits& splits, const Tensor& out, const Tensor& bias) {
  const Device dev = ctx.device();
  if (!a.defined() || a.dim() != 2) throw_invalid("a", "a 2-D tensor [T, K]", a.describe());
  if (!b.defined() || b.dim() != 3) throw_invalid("b", "a 3-D tensor [G, *, *]", b.describe());
  const int64_t T = a.size(0), K = a.size(1), G = b.size(0);
  const int64_t N = op == BOp::Transposed ? b.size(1) : b.size(2);
  check_compute_dtype("a", a.dtype());
  check_input("a", a, {T, K}, a.dtype(), dev);
  check_input("b", b, op == BOp::Transposed ? Shape{G, N, K} : Shape{G, K, N}, a.dtype(), dev);
  if (bias.defined()) check_input("bias", bias, {G, N}, a.dtype(), dev);
  validate_splits(splits, G, T, dev);
  check_caller_buffer("out", out, {T, N}, a.dtype(), dev, {{"a", a}, {"b", b}, {"bias", bias}});
  return detail::bind<detail::GroupMArgs>("grouped_gemm_group_m", kGroupM, ctx,
                                       {ctx, a, b, op, splits, out, bias, G, T, K, N});
}

void grouped_gemm_group_m(const Context& ctx, const Tensor& a, const Tensor& b, BOp op,
                          const Splits& splits, const Tensor& out, const Tensor& bias) {
  detail::bind_group_m(ctx, a, b, op, splits, out, bias).run();
}

detail::Plan detail::bind_group_k(const Context& ctx, const Tensor& dy, const Tensor& x,
                          const Splits& splits, const Tensor& dw, bool accumulate) {
  const Device dev = ctx.device();
  if (!dy.defined() || dy.dim() != 2) throw_invalid("dy", "a 2-D tensor [T, N]", dy.describe());
  if (!dw.defined() || dw.dim() != 3) throw_invalid("dw", "a 3-D tensor [G, N, K]", dw.describe());
  const int64_t T = dy.size(0), N = dy.size(1), G = dw.size(0);
  const int64_t K = x.defined() && x.dim() == 2 ? x.size(1) : -1;
  check_compute_dtype("dy", dy.dtype());
  check_input("dy", dy, {T, N}, dy.dtype(), dev);
  check_input("x", x, {T, K}, dy.dtype(), dev);
  validate_splits(splits, G, T, dev);
  if (accumulate && dw.dtype() != DType::F32) {
    throw_invalid("dw", "dtype f32 when accumulating (main_grad)", name(dw.dtype()));
  }
  if (dw.dtype() != DType::F32 && dw.dtype() != dy.dtype()) {
    throw_invalid("dw", str("dtype f32 or ", name(dy.dtype())), name(dw.dtype()));
  }
  check_caller_buffer("dw", dw, {G, N, K}, dw.dtype(), dev, {{"dy", dy}, {"x", x}});
  return detail::bind<detail::GroupKArgs>("grouped_gemm_group_k", kGroupK, ctx,
                                       {ctx, dy, x, splits, dw, accumulate, G, T, K, N});
}

void grouped_gemm_group_k(const Context& ctx, const Tensor& dy, const Tensor& x,
                          const Splits& splits, const Tensor& dw, bool accumulate) {
  detail::bind_group_k(ctx, dy, x, splits, dw, accumulate).run();
}

detail::Plan detail::bind_bias_grad(const Context& ctx, const Tensor& dy, const Splits& splits,
                       const Tensor& db, bool accumulate) {
  const Device dev = ctx.device();
  if (!dy.defined() || dy.dim() != 2) throw_invalid("dy", "a 2-D tensor [T, N]", dy.describe());
  if (!db.defined() || db.dim() != 2) throw_invalid("db", "a 2-D tensor [G, N]", db.describe());
  const int64_t T = dy.size(0), N = dy.size(1), G = db.size(0);
  check_compute_dtype("dy", dy.dtype());
  check_input("dy", dy, {T, N}, dy.dtype(), dev);
  validate_splits(splits, G, T, dev);
  if (accumulate && db.dtype() != DType::F32) {
    throw_invalid("db", "dtype f32 when accumulating", name(db.dtype()));
  }
  check_compute_dtype("db", db.dtype());
  check_caller_buffer("db", db, {G, N}, db.dtype(), dev, {{"dy", dy}});
  return detail::bind<detail::BiasGradArgs>("grouped_bias_grad", kBiasGrad, ctx,
                                         {ctx, dy, splits, db, accumulate, G, T, N});
}

void grouped_bias_grad(const Context& ctx, const Tensor& dy, const Splits& splits,
                       const Tensor& db, bool accumulate) {
  detail::bind_bias_grad(ctx, dy, splits, db, accumulate).run();
}

}  // namespace moekit
