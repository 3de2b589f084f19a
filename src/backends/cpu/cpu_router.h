// Internal: the CPU backend's entries ("cpu") in the router primitives' tables
// (src/primitives/router.cpp) — the reference semantics of moekit/primitives/router.h: fp64 host
// loops in the header's order, one rounding into each output.
#pragma once

#include "backends/contract/backend_table.h"
#include "backends/contract/router_args.h"

namespace moekit::cpu {

extern const detail::Backend<detail::RouterTopkArgs> kRouterTopk;
extern const detail::Backend<detail::RouterTopkBackwardArgs> kRouterTopkBackward;

}  // namespace moekit::cpu
