// Internal: the unit arithmetic of moekit's grouped tile scheduler (blocked_scheduler.cuh), kept
// free of CUTLASS and CUDA so the CPU tests check it on fuzzed shapes (tests/test_tile_units.cpp):
// which units of the tile sequence a cluster takes in each order, and which tile of its group's
// output a unit is. A unit is one cluster's worth of tiles: 1 M block x cluster_n N blocks; the
// sequence holds the groups' units in group order.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MOEKIT_UNITS_FN __host__ __device__ __forceinline__
#else
#define MOEKIT_UNITS_FN inline
#endif

namespace moekit::cuda::sm90 {

// The units cluster `cluster` of `clusters` takes from a sequence of `total` (< 2^31, so
// unit + jump cannot wrap), in tile order `order`:
//   0       CUTLASS's: units cluster, cluster + clusters, cluster + 2·clusters, ...
//   1       blocked: one contiguous range, ranges balanced to ±1 unit
//   c >= 2  chunks of c consecutive units, strided by the grid: cluster·c .. cluster·c + c - 1,
//           then (cluster + clusters)·c ..
// (CUTLASS's order is chunks of 1.) `unit` is the current one while valid().
struct UnitCursor {
  uint32_t unit = 0, end = 0;                // the current unit; units from end on are not ours
  uint32_t chunk = 0, chunk_end = 0, jump = 0;  // chunk size, current chunk's end, stride between

  UnitCursor() = default;
  MOEKIT_UNITS_FN UnitCursor(int32_t order, uint64_t cluster, uint64_t clusters, uint64_t total) {
    if (order == 1) {  // one range: past its end, the jump leaves the sequence
      unit = static_cast<uint32_t>(cluster * total / clusters);
      end = static_cast<uint32_t>((cluster + 1) * total / clusters);
      chunk = end - unit;
      chunk_end = end;
      jump = static_cast<uint32_t>(total);
    } else {
      chunk = order == 0 ? 1u : static_cast<uint32_t>(order);
      unit = static_cast<uint32_t>(cluster) * chunk;
      end = static_cast<uint32_t>(total);
      chunk_end = unit + chunk;
      jump = static_cast<uint32_t>(clusters - 1) * chunk;
    }
  }
  MOEKIT_UNITS_FN bool valid() const { return unit < end; }
  MOEKIT_UNITS_FN void advance() {
    if (++unit == chunk_end) {  // on to this cluster's next chunk
      unit += jump;
      chunk_end = unit + chunk;
    }
  }
};

// Where unit v of a group (0 <= v < blocks_m · units_n) lies in its output: M block m, N unit n.
// stripe 1: M fastest over the whole group (CUTLASS's AlongM raster). stripe s > 1: stripes of s
// N units (the last one narrower), N fastest inside a stripe, stripes in N order — the swizzle
// CUTLASS's grouped scheduler cannot apply without host problem shapes (blocked_scheduler.cuh).
struct UnitTile {
  uint32_t m = 0, n = 0;
};
MOEKIT_UNITS_FN UnitTile unit_tile(uint32_t v, uint32_t blocks_m, uint32_t units_n, uint32_t stripe) {
  if (stripe <= 1) return {v % blocks_m, v / blocks_m};
  const uint32_t first = v / (blocks_m * stripe) * stripe;  // the stripe's first N unit
  const uint32_t rest = units_n - first;
  const uint32_t width = stripe < rest ? stripe : rest;
  const uint32_t r = v - first * blocks_m;
  return {r / width, first + r % width};
}

}  // namespace moekit::cuda::sm90
