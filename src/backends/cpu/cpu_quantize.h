// Internal: the CPU backend's entries in the quantize and quantized-GEMM tables (the reference
// semantics of SPEC §6: quantize / dequantize bit for bit, GEMMs as dequantize + fp32 sgemm).
#pragma once

#include "backends/contract/backend_table.h"
#include "backends/contract/quant_args.h"

namespace moekit::cpu {

extern const detail::Backend<detail::QuantizeArgs> kQuantize;
extern const detail::Backend<detail::DequantizeArgs> kDequantize;
extern const detail::Backend<detail::QuantGroupMArgs> kQuantGroupM;
extern const detail::Backend<detail::QuantGroupKArgs> kQuantGroupK;

}  // namespace moekit::cpu
