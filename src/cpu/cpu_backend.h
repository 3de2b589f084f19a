// Internal: the CPU backend's entries in the primitive tables (reference semantics; GEMMs via
// OpenBLAS CBLAS with fp32 accumulation, 16-bit types converted to fp32 in row blocks).
#pragma once

#include <string>

#include "primitives/args.h"

namespace moekit::cpu {

std::string group_m_rejects(const detail::GroupMArgs& args);
void group_m_run(const detail::GroupMArgs& args);
std::string group_k_rejects(const detail::GroupKArgs& args);
void group_k_run(const detail::GroupKArgs& args);
std::string bias_grad_rejects(const detail::BiasGradArgs& args);
void bias_grad_run(const detail::BiasGradArgs& args);

}  // namespace moekit::cpu
