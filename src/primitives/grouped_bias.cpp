// Grouped (optionally prob-scaled) bias primitives: validation in one place, then dispatch.
#include "moekit/primitives/grouped_bias.h"

#include "backends/cpu/cpu_activation.h"
#include "core/checks.h"
#include "moekit/core/error.h"
#include "backends/contract/activation_args.h"
#include "backends/contract/backend_table.h"
#include "primitives/bind.h"
#ifdef MOEKIT_HAS_CUDA
#include "backends/cuda/cuda_activation.h"
#endif

namespace moekit {
namespace {
using detail::Backend;

const Backend<detail::BiasAddArgs> kBiasAdd[] = {
#ifdef MOEKIT_HAS_CUDA
    cuda::kBiasAdd,
#endif
    cpu::kBiasAdd,
};
const Backend<detail::ScaledBiasGradArgs> kScaledBiasGrad[] = {
#ifdef MOEKIT_HAS_CUDA
    cuda::kScaledBiasGrad,
#endif
    cpu::kScaledBiasGrad,
};
const detail::RegisterBackendNames kRegisterBiasAdd(kBiasAdd);
const detail::RegisterBackendNames kRegisterScaledBiasGrad(kScaledBiasGrad);

bool same_view(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.data() == b.data() && a.shape() == b.shape() &&
         a.strides() == b.strides() && a.dtype() == b.dtype() && a.device() == b.device();
}
}  // namespace

detail::Plan detail::bind_bias_add(const Context& ctx, const Tensor& x, const Tensor& bias, const Tensor& probs,
                      const Splits& splits, const Tensor& out) {
  const Device dev = ctx.device();
  if (!x.defined() || x.dim() != 2) throw_invalid("x", "a 2-D tensor [T, N]", x.describe());
  if (!bias.defined() || bias.dim() != 2)
    throw_invalid("bias", "a 2-D tensor [G, N]", bias.describe());
  if (!is_compute_dtype(x.dtype())) throw_invalid("x", "dtype f32, f16 or bf16", name(x.dtype()));
  const int64_t T = x.size(0), N = x.size(1), G = bias.size(0);
  check_input("x", x, {T, N}, x.dtype(), dev);
  check_input("bias", bias, {G, N}, x.dtype(), dev);
  if (probs.defined()) check_input("probs", probs, {T}, DType::F32, dev);
  validate_splits(splits, G, T, dev);
  const Tensor& counts = splits.device_counts();
  if (same_view(out, x)) {  // in place: out may alias x exactly, nothing else
    check_caller_buffer("out", out, {T, N}, x.dtype(), dev,
                        {{"bias", bias}, {"probs", probs}, {"splits", counts}});
  } else {
    check_caller_buffer("out", out, {T, N}, x.dtype(), dev,
                        {{"x", x}, {"bias", bias}, {"probs", probs}, {"splits", counts}});
  }
  return detail::bind<detail::BiasAddArgs>("grouped_bias_add", kBiasAdd, ctx,
                                        {ctx, x, bias, probs, splits, out, G, T, N});
}

void grouped_bias_add(const Context& ctx, const Tensor& x, const Tensor& bias, const Tensor& probs,
                      const Splits& splits, const Tensor& out) {
  detail::bind_bias_add(ctx, x, bias, probs, splits, out).run();
}

detail::Plan detail::bind_scaled_bias_grad(const Context& ctx, const Tensor& dy, const Tensor& probs,
                              const Tensor& bias, const Splits& splits, const Tensor& db,
                              const Tensor& dprobs, bool accumulate_dprobs) {
  const Device dev = ctx.device();
  if (!dy.defined() || dy.dim() != 2) throw_invalid("dy", "a 2-D tensor [T, N]", dy.describe());
  if (!bias.defined() || bias.dim() != 2)
    throw_invalid("bias", "a 2-D tensor [G, N]", bias.describe());
  if (!is_compute_dtype(dy.dtype()))
    throw_invalid("dy", "dtype f32, f16 or bf16", name(dy.dtype()));
  const int64_t T = dy.size(0), N = dy.size(1), G = bias.size(0);
  check_input("dy", dy, {T, N}, dy.dtype(), dev);
  check_input("probs", probs, {T}, DType::F32, dev);
  check_input("bias", bias, {G, N}, dy.dtype(), dev);
  validate_splits(splits, G, T, dev);
  if (!db.defined() && !dprobs.defined()) {
    throw_invalid("db", "db or dprobs (or both) to compute", "neither");
  }
  const Tensor& counts = splits.device_counts();
  if (db.defined()) {
    if (db.dtype() != DType::F32 && db.dtype() != dy.dtype()) {
      throw_invalid("db", str("dtype f32 or ", name(dy.dtype())), name(db.dtype()));
    }
    check_caller_buffer("db", db, {G, N}, db.dtype(), dev,
                        {{"dy", dy}, {"probs", probs}, {"bias", bias}, {"splits", counts}});
  }
  if (dprobs.defined()) {
    check_caller_buffer(
        "dprobs", dprobs, {T}, DType::F32, dev,
        {{"dy", dy}, {"probs", probs}, {"bias", bias}, {"splits", counts}, {"db", db}});
  }
  return detail::bind<detail::ScaledBiasGradArgs>("grouped_scaled_bias_grad", kScaledBiasGrad, ctx,
      {ctx, dy, probs, bias, splits, db, dprobs, accumulate_dprobs, G, T, N});
}

void grouped_scaled_bias_grad(const Context& ctx, const Tensor& dy, const Tensor& probs,
                              const Tensor& bias, const Splits& splits, const Tensor& db,
                              const Tensor& dprobs, bool accumulate_dprobs) {
  detail::bind_scaled_bias_grad(ctx, dy, probs, bias, splits, db, dprobs, accumulate_dprobs).run();
}

}  // namespace moekit
