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
// memory, each rank with its own CPU context. If one rank's code throws, the group is aborted: the
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
  /// with every rank's value). Allocated through the rank's context (counted by its allocator).
  virtual SymmetricMemory allocate(size_t bytes) = 0;
  /// Collective: stores before it are visible to every rank after it.
  virtual void barrier() = 0;
  /// Collective: every rank's `bytes`, in rank order.
  virtual std::vector<std::string> all_gather(std::string_view bytes) = 0;
};

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

}  // namespace moekit
