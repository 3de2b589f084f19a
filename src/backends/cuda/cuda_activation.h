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

std::string swiglu_forward_rejects(const detail::SwigluForwardArgs& args);
void swiglu_forward_run(const detail::SwigluForwardArgs& args);
std::string swiglu_backward_rejects(const detail::SwigluBackwardArgs& args);
void swiglu_backward_run(const detail::SwigluBackwardArgs& args);
std::string bias_add_rejects(const detail::BiasAddArgs& args);
void bias_add_run(const detail::BiasAddArgs& args);
std::string scaled_bias_grad_rejects(const detail::ScaledBiasGradArgs& args);
void scaled_bias_grad_run(const detail::ScaledBiasGradArgs& args);


// The entries this backend exports to the primitives' tables (one per primitive).
inline constexpr detail::Backend<detail::SwigluForwardArgs> kSwigluForward{"cuda", swiglu_forward_rejects, swiglu_forward_run};
inline constexpr detail::Backend<detail::SwigluBackwardArgs> kSwigluBackward{"cuda", swiglu_backward_rejects, swiglu_backward_run};
inline constexpr detail::Backend<detail::BiasAddArgs> kBiasAdd{"cuda", bias_add_rejects, bias_add_run};
inline constexpr detail::Backend<detail::ScaledBiasGradArgs> kScaledBiasGrad{"cuda", scaled_bias_grad_rejects, scaled_bias_grad_run};

}  // namespace moekit::cuda
