// Internal: the CUDA backend's entries ("cuda") in the activation and grouped-bias primitive
// tables (src/primitives/activation.cpp, grouped_bias.cpp). Kernels: activation.cu (SwiGLU) and
// bias.cu (grouped bias add, prob-scaled bias gradient). Math as the CPU oracle
// (src/backends/cpu/cpu_activation.cpp): fp32, one rounding into the output dtype; row sums in a fixed
// order per backend (a block-wide tree, so bit-reproducible run to run, not bit-equal to the CPU).
//
// Splits: the kernels read the counts on the device (device_counts.cuh; host splits are copied
// there in stream order), so these entries never synchronise with the host and are capturable in
// a CUDA graph, replaying with whatever counts the device then holds. Invalid device counts (a
// negative count, S > T) make every kernel write nothing and set a bit in the context's error
// word, which Context::check_device_errors() turns into the SPEC §1 error. The grouped-bias
// entries reject more than 8191 groups (their per-block table of row offsets lives in shared
// memory).
#pragma once

#include <string>

#include "backends/contract/activation_args.h"
#include "backends/contract/backend_table.h"

namespace moekit::cuda {

// The entries this backend exports to the primitives' tables, one per primitive (defined
// beside the functions they name).
extern const detail::Backend<detail::SwigluForwardArgs> kSwigluForward;
extern const detail::Backend<detail::SwigluBackwardArgs> kSwigluBackward;
extern const detail::Backend<detail::BiasAddArgs> kBiasAdd;
extern const detail::Backend<detail::ScaledBiasGradArgs> kScaledBiasGrad;

}  // namespace moekit::cuda
