// moekit/ep/nccl.h — the NCCL symmetric-memory engine of expert parallelism ("nccl-symmetric";
// SPEC §7, design/ARCHITECTURE.md "Expert parallelism"). Built when moekit is configured with
// NCCL >= 2.28 (MOEKIT_WITH_NCCL; NcclRanks::built() says whether); otherwise every constructor
// here throws ErrorKind::Unsupported. No NCCL header is included: a communicator is passed as
// the ncclComm_t it is (a pointer).
//
// Each rank's communicator:
//  - allocate(bytes): collective; sizes agreed first (an InvalidArgument naming 'bytes' with every
//    rank's value, before anything is allocated); the block from ncclMemAlloc (cuMem memory, not
//    the context's allocator, so not in its counts), registered with ncclCommWindowRegister(...,
//    NCCL_WIN_COLL_SYMMETRIC); peers[r] the window's LSA pointer of rank r (ncclGetLsaPointer,
//    resolved once by a kernel and read back: bind time), peers[rank()] == local.data(). The
//    window is deregistered and the memory freed when the last copy of the block's tensor dies
//    (after the context's stream finished with it); the tensor keeps the NCCL communicator alive.
//    Not while a CUDA graph is being captured on the context's stream.
//  - barrier(): NCCL's device-API LSA barrier (ncclLsaBarrierSession, acquire-release at system
//    scope) in one CTA on the context's stream: every rank's stores queued before it are visible
//    to every rank's work queued after it; no host synchronisation, capturable in a CUDA graph
//    (every rank's graph replayed together when W > 1).
//  - all_gather(bytes): NcclRanks: its host threads meet (no GPU work); nccl_communicator:
//    ncclAllGather on the context's stream and a synchronisation (small host metadata, at
//    construction and allocation: its ExpertParallel calls agree in band, Communicator::
//    agreement(), so a step of one process per GPU captures; refused while capturing).
//  - every NCCL failure is ErrorKind::Communication naming the call and NCCL's error string.
// Every rank must reach every other rank's memory through NVLink / PCIe P2P (one LSA team: one
// node); otherwise construction is Unsupported.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "moekit/core/context.h"
#include "moekit/ep/communicator.h"

namespace moekit {

/// W ranks as host threads of one process driving W GPUs of a node over NCCL symmetric memory
/// (ncclCommInitAll over the ranks' devices): the same shape as CudaRanks — rank r on its own
/// CUDA context (Context::cuda(devices[r]), or one the caller gives), run(fn) on one host thread
/// per rank, a rank that throws aborts the group (the others' collective calls throw
/// ErrorKind::Communication naming it: its barrier() meets the host threads before queueing the
/// device barrier, so a failed rank never leaves the others' GPUs waiting). InvalidArgument for no
/// rank, more than 8, a repeated device or a non-CUDA context; Unsupported without NCCL, or when
/// the process loaded another NCCL than the one moekit was compiled against.
class NcclRanks {
 public:
  /// Whether this moekit was built with the NCCL engine.
  static bool built();
  explicit NcclRanks(const std::vector<int>& devices);
  explicit NcclRanks(const std::vector<Context>& contexts);
  ~NcclRanks();
  NcclRanks(const NcclRanks&) = delete;
  NcclRanks& operator=(const NcclRanks&) = delete;

  int world_size() const;
  Communicator& communicator(int rank);
  /// As CpuRanks::run: fn(communicator(r)) on one host thread per rank, joined; errors rethrown.
  void run(const std::function<void(Communicator&)>& fn);

  struct Impl;  // src/ep/nccl_ranks.cpp

 private:
  std::unique_ptr<Impl> impl_;
};

/// One rank of a group the caller runs, one process per GPU (e.g. torch.distributed):
/// `nccl_comm` is the caller's ncclComm_t (e.g. a ProcessGroupNCCL's), `ctx` a CUDA context on
/// its device (the caller's stream). Collective over nccl_comm: it is split (ncclCommSplit) into
/// the engine's own communicator, so windows, the barrier's resources and stream order are
/// private to it; the caller's communicator is not used after construction. InvalidArgument for
/// a null communicator or a non-CUDA context.
std::unique_ptr<Communicator> nccl_communicator(void* nccl_comm, Context ctx);

}  // namespace moekit
