// Internal: the CUDA backend's entries in the quantize tables. quantize.cu: quantize and
// dequantize of every recipe, bit for bit the CPU reference's (cpu_quantize.cpp), with the counts
// read on the device (graph-safe; invalid counts write nothing and set the context's error word).
// quantized_gemm_bf16.cu: the quantized GEMMs of the recipes with power-of-two scales on the bf16
// tensor cores (exact bf16 operands, the sm_90a grouped GEMMs). quantized_gemm_emulation.cu: the
// rest of MXFP8 and NVFP4 (f16 outputs, NVFP4's fp32 scales) as an fp32 SIMT emulation.
#pragma once

#include <vector>

#include "backends/contract/backend_table.h"
#include "backends/contract/quant_args.h"

namespace moekit::cuda {

extern const detail::Backend<detail::QuantizeArgs> kQuantize;
extern const detail::Backend<detail::DequantizeArgs> kDequantize;
extern const detail::Backend<detail::QuantGroupMArgs> kBf16QuantGroupM;
extern const detail::Backend<detail::QuantGroupKArgs> kBf16QuantGroupK;
extern const detail::Backend<detail::QuantGroupMArgs> kEmulatedQuantGroupM;
extern const detail::Backend<detail::QuantGroupKArgs> kEmulatedQuantGroupK;

/// The splits of a quantized weight [G·N, K]: G groups of N rows (host counts).
inline Splits weight_splits(const QuantizedTensor& w) {
  return Splits::host(std::vector<int64_t>(static_cast<size_t>(w.groups), w.rows / w.groups));
}

/// dequantize's run (quantize.cu), for the emulated GEMMs.
void dequantize_run(const detail::DequantizeArgs& args);
/// One copy of q dequantized into out, bf16 [T, C] whichever copy (a columnwise one is transposed
/// back), valid rows only, one pass (quantize.cu). For values exact in bf16 (power-of-two scales
/// on e4m3 / e5m2: quantized_gemm_bf16.cu); otherwise each is rounded once to bf16.
void dequantize_bf16_rows(const Context& ctx, const QuantizedTensor& q, const Splits& splits,
                          QuantUsage which, const Tensor& out);
/// Validates the counts on the device and writes, into ws (i64 [2·groups + 3]): S (or -1 when
/// the counts are invalid: the error word's bit is set), the row offsets [G+1] and the offsets of
/// each group's blocks of `block` rows [G+1] (quantize.cu's setup kernel).
void group_offsets_on_device(const Context& ctx, const Splits& splits, int64_t rows,
                             int64_t groups, int64_t block, const Tensor& ws);

}  // namespace moekit::cuda
