// Internal: the CPU backend's entries in the primitive tables (reference semantics; GEMMs via
// OpenBLAS CBLAS with fp32 accumulation, 16-bit types converted to fp32 in row blocks).
#pragma once

#include <string>

#include "backends/contract/args.h"
#include "backends/contract/backend_table.h"

namespace moekit::cpu {

std::string group_m_rejects(const detail::GroupMArgs& args);
void group_m_run(const detail::GroupMArgs& args);
std::string group_k_rejects(const detail::GroupKArgs& args);
void group_k_run(const detail::GroupKArgs& args);
std::string bias_grad_rejects(const detail::BiasGradArgs& args);
void bias_grad_run(const detail::BiasGradArgs& args);


// The entries this backend exports to the primitives' tables (one per primitive).
inline constexpr detail::Backend<detail::GroupMArgs> kGroupM{"cpu", group_m_rejects, group_m_run};
inline constexpr detail::Backend<detail::GroupKArgs> kGroupK{"cpu", group_k_rejects, group_k_run};
inline constexpr detail::Backend<detail::BiasGradArgs> kBiasGrad{"cpu", bias_grad_rejects, bias_grad_run};

}  // namespace moekit::cpu
