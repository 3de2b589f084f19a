// Internal: what the in-process engines (CpuRanks, CudaRanks, NcclRanks) share: the collectives'
// size agreement and the GPU engines' rank rules.
#pragma once

#include <cstddef>
#include <set>
#include <string>
#include <vector>

#include "moekit/core/error.h"
#include "ep/ep_device.h"
#include "moekit/ep/communicator.h"

namespace moekit::detail {

// The first step of a collective allocate: every rank's size gathered over `comm`, so that a
// mismatch is an InvalidArgument on every rank (listing each rank's size) before anything is
// allocated.
inline void agree_allocation_size(Communicator& comm, size_t bytes) {
  const std::vector<std::string> sizes = comm.all_gather(std::to_string(bytes));
  for (const std::string& s : sizes) {
    if (s != sizes[0]) {
      std::string all;
      for (size_t r = 0; r < sizes.size(); ++r)
        all += str(r ? ", " : "", "rank ", r, ": ", sizes[r]);
      throw_invalid("bytes", "the same size on every rank (a collective allocation)", all);
    }
  }
}

// The GPU engines' ranks (CudaRanks, NcclRanks): 1 to kEpMaxRanks GPUs, each once. The devices
// are checked before any context is made (that touches the driver); InvalidArgument 'devices'.
inline std::vector<Context> gpu_rank_contexts(const std::vector<int>& devices) {
  const int n = static_cast<int>(devices.size());
  if (n < 1 || n > kEpMaxRanks) {
    throw_invalid("devices", str("1 to ", kEpMaxRanks, " GPUs (one NVLink domain)"), std::to_string(n));
  }
  std::set<int> seen;
  for (int d : devices) {
    if (!seen.insert(d).second) throw_invalid("devices", "a different GPU for every rank", str("GPU ", d, " twice"));
  }
  std::vector<Context> out;
  for (int d : devices) out.push_back(Context::cuda(d));
  return out;
}

// The same rules for contexts a caller made: each a CUDA context, each on a GPU of its own.
inline void check_gpu_rank_contexts(const std::vector<Context>& contexts) {
  const int n = static_cast<int>(contexts.size());
  if (n < 1 || n > kEpMaxRanks) {
    throw_invalid("contexts", str("1 to ", kEpMaxRanks, " GPUs (one NVLink domain)"), std::to_string(n));
  }
  std::set<int> seen;
  for (const Context& c : contexts) {
    if (!c.device().is_cuda()) throw_invalid("contexts", "a CUDA context for every rank", c.device().to_string());
    if (!seen.insert(c.device().index).second) {
      throw_invalid("devices", "a different GPU for every rank", str("GPU ", c.device().index, " twice"));
    }
  }
}

}  // namespace moekit::detail
