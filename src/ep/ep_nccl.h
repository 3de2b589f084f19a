// Internal: the NCCL side of the symmetric-memory engine (moekit/ep/nccl.h), as
// src/ep/nccl_ranks.cpp calls it. Defined in src/backends/cuda/ep/ep_nccl.cu (NCCL calls and the
// two device-API kernels); a build without NCCL gets src/ep/ep_no_nccl.cpp, whose functions throw
// Unsupported. No NCCL or CUDA header here.
//
// An NcclRank is one rank's NCCL state: its communicator (owned: from ncclCommInitAll, or split
// from the caller's), the device communicator of the LSA barrier, and a small staging buffer for
// nccl_all_gather. Shared (shared_ptr) by the rank's Communicator and every block it allocated,
// so the communicator outlives the last window registered on it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/core/context.h"
#include "moekit/ep/communicator.h"

namespace moekit::detail {

struct NcclRank;

/// Whether this moekit was built with the NCCL engine.
bool nccl_built();
/// One process, W GPUs: ncclCommInitAll over the contexts' devices (rank r on contexts[r]'s
/// device). Checks the NCCL version first (the device API needs the one compiled against).
/// The ranks are not usable before nccl_init_rank ran on each (collective: one thread per rank).
std::vector<std::shared_ptr<NcclRank>> nccl_init_all(const std::vector<Context>& contexts);
/// One rank of a group the caller runs: ncclCommSplit of the caller's ncclComm_t `comm` (a
/// collective over it; the split is this engine's own, destroyed with the last NcclRank user),
/// then nccl_init_rank. `ctx` is a CUDA context on the communicator's device.
std::shared_ptr<NcclRank> nccl_split(void* comm, const Context& ctx);
/// Collective (every rank of the communicator, concurrently): the device communicator of the
/// barrier (ncclDevCommCreate with one LSA barrier), checked to span every rank (one LSA team:
/// every rank's memory loadable and storable by every rank), and the all_gather staging.
void nccl_init_rank(NcclRank& r);

int nccl_rank(const NcclRank& r);
int nccl_world_size(const NcclRank& r);
const Context& nccl_context(const NcclRank& r);

/// Collective: ncclMemAlloc + ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC) of `bytes` (the
/// same on every rank: the caller agreed them first), peers from ncclGetLsaPointer (one kernel,
/// read back once: host synchronisation, bind time), peers[rank] = local.data(). The block's
/// tensor holds `r` (deregistered and freed when its last copy dies).
SymmetricMemory nccl_allocate(const std::shared_ptr<NcclRank>& r, size_t bytes);
/// The LSA barrier on the context's stream (one CTA; no host synchronisation, capturable).
void nccl_barrier(NcclRank& r);
/// ncclAllGather on the context's stream, read back with a synchronisation (small host
/// metadata; not capturable).
std::vector<std::string> nccl_all_gather(NcclRank& r, std::string_view bytes);

}  // namespace moekit::detail
