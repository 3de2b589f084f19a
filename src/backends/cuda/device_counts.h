// Internal: split counts as kernels read them from device memory (device code:
// device_counts.cuh; the host call that provides them for any Splits: counts_on_device in
// resources.h). Plain data, no moekit or CUDA types: cheap to include anywhere.
#pragma once

#include <cstdint>

namespace moekit::cuda {

inline constexpr uint32_t kDeviceCountNegative = 1;     // = Context::kNegativeCount
inline constexpr uint32_t kDeviceCountsExceedRows = 2;  // = Context::kCountsExceedRows
inline constexpr uint32_t kDeviceCountsMisaligned = 4;  // = Context::kCountsMisaligned

/// Counts in device memory (int32 or int64), the group count G and the row count T they split.
struct DeviceCounts {
  const void* counts = nullptr;
  bool i64 = true;
  int64_t groups = 0;
  int64_t rows = 0;
  uint32_t* error_word = nullptr;  // the context's device error word (may be null)
};

}  // namespace moekit::cuda
