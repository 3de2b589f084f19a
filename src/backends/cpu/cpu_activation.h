// Internal: the CPU backend's entries in the activation and grouped-bias primitive tables
// (reference semantics: fp32 math, one rounding into the output dtype, fixed summation order).
#pragma once

#include <string>

#include "backends/contract/activation_args.h"
#include "backends/contract/backend_table.h"

namespace moekit::cpu {

std::string swiglu_forward_rejects(const detail::SwigluForwardArgs& args);
void swiglu_forward_run(const detail::SwigluForwardArgs& args);
std::string swiglu_backward_rejects(const detail::SwigluBackwardArgs& args);
void swiglu_backward_run(const detail::SwigluBackwardArgs& args);
std::string bias_add_rejects(const detail::BiasAddArgs& args);
void bias_add_run(const detail::BiasAddArgs& args);
std::string scaled_bias_grad_rejects(const detail::ScaledBiasGradArgs& args);
void scaled_bias_grad_run(const detail::ScaledBiasGradArgs& args);


// The entries this backend exports to the primitives' tables (one per primitive).
inline constexpr detail::Backend<detail::SwigluForwardArgs> kSwigluForward{"cpu", swiglu_forward_rejects, swiglu_forward_run};
inline constexpr detail::Backend<detail::SwigluBackwardArgs> kSwigluBackward{"cpu", swiglu_backward_rejects, swiglu_backward_run};
inline constexpr detail::Backend<detail::BiasAddArgs> kBiasAdd{"cpu", bias_add_rejects, bias_add_run};
inline constexpr detail::Backend<detail::ScaledBiasGradArgs> kScaledBiasGrad{"cpu", scaled_bias_grad_rejects, scaled_bias_grad_run};

}  // namespace moekit::cpu
