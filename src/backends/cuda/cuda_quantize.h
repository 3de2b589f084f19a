// Internal: the CUDA backend's entry in the quantize table (quantize.cu): every recipe's copies
// and scales, bit for bit the CPU reference's (cpu_quantize.cpp), with the counts read on the
// device (graph-safe; invalid counts write nothing and set the context's error word).
#pragma once

#include "backends/contract/backend_table.h"
#include "backends/contract/quant_args.h"

namespace moekit::cuda {

extern const detail::Backend<detail::QuantizeArgs> kQuantize;
extern const detail::Backend<detail::DequantizeArgs> kDequantize;

}  // namespace moekit::cuda
