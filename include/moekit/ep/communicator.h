// moekit/ep/communicator.h — the engine interface expert parallelism runs on (SPEC §7).
//
// A Communicator is one rank's end of a group of `world_size()` ranks. It gives the rank
//  - symmetric memory: a collective allocate(bytes) returns this rank's block and the base address
//    of every peer's block of the same call, which this rank may load from and store into (CPU
//    ranks: plain host memory of one process; GPUs of a node: NCCL symmetric windows, peers'
//    bases from ncclGetLsaPointer, or bases a caller brings, e.g. torch symmetric memory);
//  - barrier(): every rank's stores before it are visible to every rank after it;
//  - all_gather(bytes): small host metadata (argument status, counts for messages), rank order.
// Every call is collective: each rank makes the same calls in the same order.
//
// Engines live behind it. Built: CpuRanks — N ranks as threads of one process over shared host
// memory, each rank with its own CPU context; CudaRanks — N ranks as threads of one process,
// each driving one GPU of the node through peer pointers; NcclRanks and nccl_communicator — NCCL
// symmetric windows (moekit/ep/nccl.h); caller_communicator (below). If one rank's code throws, the group is aborted: the
// others' pending and later collective calls throw ErrorKind::Communication naming that rank, so
// a failure never hangs the group.
//
//   CpuRanks ranks(4);
//   ranks.run([&](Communicator& comm) {                 // one thread per rank
//     ExpertParallel ep(comm, {...});
//     ...
//   });                                                 // rethrows the lowest rank's error
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/core/context.h"
#include "moekit/core/tensor.h"

namespace moekit {

/// One collective allocation: this rank's block and every rank's base address (peers[rank()] is
/// local.data()). The block stays allocated while any copy of this object lives.
struct SymmetricMemory {
  Tensor local;              // u8 [bytes] on the rank's device
  std::vector<void*> peers;  // [world_size] base of each rank's block of the same call
  template <class T>
  T* peer_as(int rank) const {
    return static_cast<T*>(peers[static_cast<size_t>(rank)]);
  }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// Where this rank's memory lives and its work runs.
  virtual const Context& context() const = 0;
  /// "cpu-ranks", "nccl-symmetric", ... (reports).
  virtual std::string engine() const = 0;
  /// Collective: every rank asks for the same number of bytes (else InvalidArgument naming 'bytes'
  /// with every rank's value). Allocated through the rank's context (counted by its allocator;
  /// nccl-symmetric: from ncclMemAlloc, moekit/ep/nccl.h).
  virtual SymmetricMemory allocate(size_t bytes) = 0;
  /// Collective: stores before it are visible to every rank after it.
  virtual void barrier() = 0;
  /// Collective: every rank's `bytes`, in rank order.
  virtual std::vector<std::string> all_gather(std::string_view bytes) = 0;

  /// How ExpertParallel's calls agree on every rank's arguments before anything is sent (SPEC §7):
  ///  - Host: an all_gather per call; when a rank refuses its arguments, every rank throws at the
  ///    call (the engines whose all_gather is host memory of one process: CpuRanks, CudaRanks,
  ///    NcclRanks, and caller groups on the CPU);
  ///  - InBand: no host collective per call (so a step of one process per GPU captures in a CUDA
  ///    graph): each rank writes its verdict into its own symmetric status block and the call's
  ///    kernels read every rank's after the call's first barrier; a refused call stores nothing on
  ///    any rank, the rank at fault throws its error at the call, every other rank's context gets
  ///    Context::kEpPeerRefused (check_device_errors()). nccl_communicator and caller groups on a
  ///    GPU, whose all_gather would synchronise with the host.
  enum class Agreement { Host, InBand };
  virtual Agreement agreement() const { return Agreement::Host; }
};

/// The offset alignment of every block a collective allocate() carves from a caller's region.
inline constexpr size_t kSymmetricAlignment = 256;

/// One rank of a group the caller runs — typically one process per GPU in a torch.distributed
/// job — with symmetric memory the caller brings: its rank's block `region` of a region every rank
/// allocated with the same size, and every rank's base address of it (`peer_bases`, e.g.
/// torch.distributed._symmetric_memory's buffer_ptrs, or NCCL window pointers), loadable and
/// storable from this rank's context. The host collectives are the caller's too:
///  - barrier(): every rank's stores queued before it are visible to every rank's work queued
///    after it, in the order of each rank's context (GPUs: a stream-ordered barrier on the
///    context's stream, such as torch symmetric memory's barrier; CPU ranks: a host barrier);
///  - all_gather(bytes): every rank's bytes in rank order (small host metadata).
/// On a GPU context the group agrees in band (Communicator::Agreement::InBand): its all_gather runs
/// at construction and allocation only, never during an ExpertParallel call, so a step captures
/// in a CUDA graph when the caller's barrier is stream-ordered; on the CPU, per call (Host).
/// allocate(bytes) carves the region: collective (sizes checked over all_gather), the same offset
/// on every rank, offsets multiples of kSymmetricAlignment, held until the communicator is destroyed (blocks
/// are not reused); running out is an InvalidArgument naming 'bytes' with what is left.
/// ExpertParallel::symmetric_bytes says how much an ExpertParallel needs.
struct CallerGroup {
  int rank = 0;
  int world_size = 1;
  Context context;                // this rank's device and stream
  Tensor region;                  // u8 [bytes], contiguous, on context's device
  std::vector<void*> peer_bases;  // [world_size]; peer_bases[rank] == region.data()
  std::function<void()> barrier;
  std::function<std::vector<std::string>(std::string_view)> all_gather;
  std::string engine = "caller-symmetric";  // for reports
};

/// A Communicator over `group` (checked: rank in [0, world_size), peer_bases of world_size
/// entries with this rank's equal to region.data(), every base 16-byte aligned, the
/// region a contiguous u8 tensor on the context's device, both collectives given; an
/// InvalidArgument naming the field otherwise). Construction is local (no collective).
std::unique_ptr<Communicator> caller_communicator(CallerGroup group);

/// N ranks as threads of one process over shared host memory (the CPU engine).
class CpuRanks {
 public:
  /// world_size >= 1 ranks; each rank's context is Context::cpu(threads_per_rank) with its own
  /// allocator (so its allocation counts are the rank's own).
  explicit CpuRanks(int world_size, int threads_per_rank = 1);
  /// Each rank's context from make_context(rank) (a CPU context; e.g. one with a test allocator).
  CpuRanks(int world_size, const std::function<Context(int rank)>& make_context);
  ~CpuRanks();
  CpuRanks(const CpuRanks&) = delete;
  CpuRanks& operator=(const CpuRanks&) = delete;

  int world_size() const;
  Communicator& communicator(int rank);
  /// Runs fn(communicator(r)) on one thread per rank and joins them. When ranks throw, the first
  /// error of the lowest rank that threw something other than the abort is rethrown (the others
  /// saw ErrorKind::Communication); the group is usable again afterwards.
  void run(const std::function<void(Communicator&)>& fn);

  struct Group;  // shared state (src/ep/cpu_ranks.cpp)

 private:
  std::shared_ptr<Group> group_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

/// W ranks as host threads of one process driving W GPUs of a node (the single-process GPU
/// engine, "cuda-ranks"): rank r runs on its own CUDA context (Context::cuda(devices[r]), a stream
/// of its own, or a context the caller gives). Peer access is enabled between every pair of the
/// ranks' devices (cudaDeviceEnablePeerAccess; the devices' stream-ordered memory pools are
/// opened to each other), so a symmetric block — allocated by every rank from its own context,
/// the same size, bases exchanged at the collective — is loadable and storable by every rank.
/// barrier() is stream-ordered, no host synchronisation: every rank records an event on its
/// stream, the host threads meet, every rank's stream waits for every other rank's event. With
/// W = 1 it queues nothing (stream order is the barrier), so a layer step on one GPU captures in
/// a CUDA graph; with W > 1 the cross-device event waits are not captured (run eagerly). A rank
/// that throws aborts the group as CpuRanks does. Unsupported when two devices lack peer access;
/// InvalidArgument for a repeated device or more than 8 ranks.
class CudaRanks {
 public:
  explicit CudaRanks(const std::vector<int>& devices);
  /// One CUDA context per rank (e.g. on the caller's streams), each on a different device.
  explicit CudaRanks(const std::vector<Context>& contexts);
  ~CudaRanks();
  CudaRanks(const CudaRanks&) = delete;
  CudaRanks& operator=(const CudaRanks&) = delete;

  int world_size() const;
  Communicator& communicator(int rank);
  /// As CpuRanks::run: fn(communicator(r)) on one host thread per rank, joined; errors rethrown.
  void run(const std::function<void(Communicator&)>& fn);

  struct Impl;  // src/ep/cuda_ranks.cpp

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace moekit
