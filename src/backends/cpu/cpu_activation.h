// Internal: the CPU backend's entries in the activation and grouped-bias primitive tables
// (reference semantics: fp32 math, one rounding into the output dtype, fixed summation order).
#pragma once

#include <string>

#include "backends/contract/activation_args.h"
#include "backends/contract/backend_table.h"

namespace moekit::cpu {

// The entries this backend exports to the primitives' tables, one per primitive (defined
// beside the functions they name).
extern const detail::Backend<detail::SwigluForwardArgs> kSwigluForward;
extern const detail::Backend<detail::SwigluBackwardArgs> kSwigluBackward;
extern const detail::Backend<detail::BiasAddArgs> kBiasAdd;
extern const detail::Backend<detail::ScaledBiasGradArgs> kScaledBiasGrad;

}  // namespace moekit::cpu
