// Internal (device code): the fixed summation tree of expert parallelism (SPEC §7) on one
// element: fp32 values keyed by ascending distinct leaf ids, siblings 2m, 2m + 1 added (left +
// right) level by level, absent leaves skipped. The CPU reference: tree_reduce in
// src/ep/expert_parallel.cpp (the same additions in the same order, so the same bits).
#pragma once

#include "ep/ep_device.h"

namespace moekit::cuda::ep {

__device__ inline float tree_sum(int* key, float* v, int n) {
  while (n > 1) {
    int out = 0;
    for (int i = 0; i < n; ++out) {
      if (i + 1 < n && (key[i] >> 1) == (key[i + 1] >> 1)) {
        v[out] = v[i] + v[i + 1];
        i += 2;
      } else {
        v[out] = v[i];
        i += 1;
      }
      key[out] = key[i - 1] >> 1;
    }
    n = out;
  }
  return v[0];
}

}  // namespace moekit::cuda::ep
