// Internal: the CUDA backend's entries ("cuda") in the router primitives' tables
// (src/primitives/router.cpp). Kernels: router.cu. Math and order as the CPU oracle
// (src/backends/cpu/cpu_router.cpp), in fp64 without fused multiply-adds; no host
// synchronisation (capturable).
#pragma once

#include "backends/contract/backend_table.h"
#include "backends/contract/router_args.h"

namespace moekit::cuda {

extern const detail::Backend<detail::RouterTopkArgs> kRouterTopk;
extern const detail::Backend<detail::RouterTopkBackwardArgs> kRouterTopkBackward;

}  // namespace moekit::cuda
