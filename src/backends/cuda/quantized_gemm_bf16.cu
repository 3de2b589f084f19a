// The quantized grouped GEMMs on Hopper's bf16 tensor cores (SPEC §6d, its GPU bullet), for the
// recipes whose every scale is a power of two: fp8-block (TE's default power_2_scales), mxfp8
// (e8m0 scales), fp8-current with power_2_scales. An e4m3 or e5m2 code times a power of two is
// exact in bf16 (8 significant bits, fp32's exponent range), so each operand is dequantized to
// bf16 in one pass (quantize.cu's dequantize_bf16_rows: the CPU's fp32 values, converted without
// rounding; a columnwise copy transposed back to rows), then multiplied by the library's own bf16
// grouped GEMMs (grouped_gemm.h: the sm_90a kernels, device splits, graph-safe), fp32
// accumulation, one rounding, written straight into `out` / `dw` (the caller's buffers). The
// result is the CPU reference's (dequantize + fp32 GEMM) up to the fp32 summation order — an
// emulation at bf16's speed plus the dequantize passes, not FP8's: the native FP8 grouped GEMMs
// (CUTLASS examples 57 / 68) take this table's first place when built (ARCHITECTURE.md
// "Quantized recipes"). nvfp4 (an fp32 per-tensor decode scale) and fp8 recipes with fp32 scales
// stay off this path: their dequantized values are not exact in bf16.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <vector>

#include "backends/contract/quant_args.h"
#include "backends/cuda/check.h"
#include "backends/cuda/cuda_quantize.h"
#include "backends/cuda/resources.h"
#include "moekit/primitives/grouped_gemm.h"

namespace moekit::cuda {
namespace {

// Every scale of `spec` a power of two (so every dequantized value is exact in bf16).
bool power_of_two_scales(const QuantSpec& spec) {
  if (spec.format != QuantFormat::E4M3 && spec.format != QuantFormat::E5M2) return false;
  if (spec.scaling == Scaling::Mx) return true;
  if (spec.scaling == Scaling::Nv) return false;
  return spec.power_2_scales;
}

std::string rejects_bf16(const Context& ctx, std::initializer_list<const QuantSpec*> specs,
                         DType out_dtype, const char* out_name) {
  std::string why = reject_unless_cuda(ctx);
  if (!why.empty()) return why;
  for (const QuantSpec* s : specs) {
    if (!power_of_two_scales(*s)) {
      return str("recipe ", Recipe{s->recipe}.name(),
                 ": the bf16 tensor-core emulation needs e4m3/e5m2 codes with power-of-two "
                 "scales (exact in bf16); this operand's are not");
    }
  }
  if (out_dtype != DType::BF16) {
    return str(out_name, " is ", name(out_dtype),
               ": the bf16 tensor-core emulation writes bf16 (the grouped GEMMs' output dtype)");
  }
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx.device().index) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    return str("cannot query CUDA device ", ctx.device().index);
  }
  if (major != 9) {
    return str("the bf16 tensor-core emulation runs on the sm_90a grouped GEMMs: cuda:",
               ctx.device().index, " is sm_", major, "x");
  }
  return "";
}

// One copy of q in bf16 [T, C] (a columnwise copy transposed back), in one pass (quantize.cu).
Tensor bf16_copy(const Context& ctx, const QuantizedTensor& q, const Splits& splits,
                 QuantUsage which) {
  // Rows past the valid count are never written, and never read by the GEMMs (each group's rows
  // are bounded by its count).
  Tensor out = Tensor::empty({q.rows, q.cols}, DType::BF16, ctx);
  dequantize_bf16_rows(ctx, q, splits, which, out);
  return out;
}

std::string group_m_rejects(const detail::QuantGroupMArgs& a) {
  return rejects_bf16(a.ctx, {&a.a.spec, &a.b.spec}, a.out.dtype(), "out");
}

// fprop: out = dq(a.rowwise) · dq(W.rowwise)ᵀ; dgrad: out = dq(dy.rowwise) · W' with W' the
// weight's columnwise copy [K, G·N] transposed back to [G·N, K] = [G, N, K] (BOp::Plain).
void group_m_run(const detail::QuantGroupMArgs& a) {
  if (a.groups == 0) return;
  DeviceGuard guard(resources(a.ctx).device);
  const bool fprop = a.op == BOp::Transposed;
  const Tensor a16 = bf16_copy(a.ctx, a.a, a.splits, QuantUsage::Rowwise);
  // With per-group or 128x128 scales both copies hold the same codes under the same scales
  // (SPEC §6b): dgrad's columnwise copy transposed back is the rowwise copy, read directly.
  const bool same_codes =
      a.b.spec.scaling == Scaling::PerGroup || a.b.spec.scaling == Scaling::Block2D;
  const QuantUsage w_copy = fprop || (same_codes && a.b.has_rowwise()) ? QuantUsage::Rowwise
                                                                       : QuantUsage::Columnwise;
  const Tensor w16 = bf16_copy(a.ctx, a.b, weight_splits(a.b), w_copy);
  const Tensor b = w16.view({a.groups, a.b.rows / a.groups, a.b.cols});
  grouped_gemm_group_m(a.ctx, a16, b, a.op, a.splits, a.out, a.bias);
}

std::string group_k_rejects(const detail::QuantGroupKArgs& a) {
  return rejects_bf16(a.ctx, {&a.dy.spec, &a.x.spec},
                      a.dw.dtype() == DType::F32 ? DType::BF16 : a.dw.dtype(), "dw");
}

// dw (+)= dq(dy.columnwise)ᵀ-as-rows · dq(x.columnwise)-as-rows: both copies back to [T, ·].
void group_k_run(const detail::QuantGroupKArgs& a) {
  if (a.groups == 0) return;
  DeviceGuard guard(resources(a.ctx).device);
  const Tensor dy16 = bf16_copy(a.ctx, a.dy, a.splits, QuantUsage::Columnwise);
  const Tensor x16 = bf16_copy(a.ctx, a.x, a.splits, QuantUsage::Columnwise);
  grouped_gemm_group_k(a.ctx, dy16, x16, a.splits, a.dw, a.accumulate);
}

}  // namespace

// This backend's entries in the quantized-GEMM tables (declared in cuda_quantize.h).
constexpr detail::Backend<detail::QuantGroupMArgs> kBf16QuantGroupM{"cuda-bf16", group_m_rejects,
                                                                    group_m_run};
constexpr detail::Backend<detail::QuantGroupKArgs> kBf16QuantGroupK{"cuda-bf16", group_k_rejects,
                                                                    group_k_run};

}  // namespace moekit::cuda
