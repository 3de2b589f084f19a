// Internal: what the in-process engines (CpuRanks, CudaRanks) share in their collectives.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "moekit/core/error.h"
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

}  // namespace moekit::detail
