// Internal: the CPU backend's entries in the activation and grouped-bias primitive tables
// (reference semantics: fp32 math, one rounding into the output dtype, fixed summation order).
#pragma once

#include <string>

#include "primitives/activation_args.h"

namespace moekit::cpu {

std::string swiglu_forward_rejects(const detail::SwigluForwardArgs& args);
void swiglu_forward_run(const detail::SwigluForwardArgs& args);
std::string swiglu_backward_rejects(const detail::SwigluBackwardArgs& args);
void swiglu_backward_run(const detail::SwigluBackwardArgs& args);
std::string bias_add_rejects(const detail::BiasAddArgs& args);
void bias_add_run(const detail::BiasAddArgs& args);
std::string scaled_bias_grad_rejects(const detail::ScaledBiasGradArgs& args);
void scaled_bias_grad_run(const detail::ScaledBiasGradArgs& args);

}  // namespace moekit::cpu
