// Internal: the CPU backend's entries in the primitive tables (reference semantics; GEMMs via
// OpenBLAS CBLAS with fp32 accumulation, 16-bit types converted to fp32 in row blocks).
#pragma once

#include <string>

#include "backends/contract/args.h"
#include "backends/contract/backend_table.h"

namespace moekit::cpu {

// The entries this backend exports to the primitives' tables, one per primitive (defined
// beside the functions they name).
extern const detail::Backend<detail::GroupMArgs> kGroupM;
extern const detail::Backend<detail::GroupKArgs> kGroupK;
extern const detail::Backend<detail::BiasGradArgs> kBiasGrad;

}  // namespace moekit::cpu
