// Internal: the unit arithmetic of moekit's grouped tile scheduler (blocked_scheduler.cuh), kept
// free of CUTLASS and CUDA so the CPU tests check it on fuzzed shapes (tests/test_tile_units.cpp):
// which units of the tile sequence a cluster takes in each order, which unit of its group's output
// a unit is, and which tile of that unit each CTA of the cluster takes. A unit is one cluster's
// worth of tiles: cluster_m M blocks x cluster_n N blocks; the sequence holds the groups' units in
// group order.
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
//   kSnakeOrder  CUTLASS's with every odd wave of `clusters` units dealt in reverse: cluster,
//           2·clusters - 1 - cluster, 2·clusters + cluster, ... Each wave holds the same units
//           as in CUTLASS's order (the L2 sharing between the clusters in flight is kept), but a
//           cluster that took a wave's first units takes the next wave's last: with the groups laid
//           out largest first (heavy_first, the setup kernels), the cheap units of each wave even
//           out the costly ones (design/PERFORMANCE.md, "The large shapes' skewed wgrad").
// (CUTLASS's order is chunks of 1.) `unit` is the current one while valid().
inline constexpr int32_t kSnakeOrder = -2;
struct UnitCursor {
  uint32_t unit = 0, end = 0;                // the current unit; units from end on are not ours
  uint32_t chunk = 0, chunk_end = 0, jump = 0;  // chunk size, current chunk's end, stride between
  uint32_t next_jump = 0;                    // snake: the stride after `jump` (they alternate)

  UnitCursor() = default;
  MOEKIT_UNITS_FN UnitCursor(int32_t order, uint64_t cluster, uint64_t clusters, uint64_t total) {
    if (order == kSnakeOrder) {  // chunks of 1, the strides to the mirrored place and back
      chunk = 1;
      unit = static_cast<uint32_t>(cluster);
      end = static_cast<uint32_t>(total);
      chunk_end = unit + 1;
      jump = static_cast<uint32_t>(2 * (clusters - cluster) - 2);  // + 1 from the chunk's end
      next_jump = static_cast<uint32_t>(2 * cluster);
    } else if (order == 1) {  // one range: past its end, the jump leaves the sequence
      unit = static_cast<uint32_t>(cluster * total / clusters);
      end = static_cast<uint32_t>((cluster + 1) * total / clusters);
      chunk = end - unit;
      chunk_end = end;
      jump = next_jump = static_cast<uint32_t>(total);
    } else {
      chunk = order == 0 ? 1u : static_cast<uint32_t>(order);
      unit = static_cast<uint32_t>(cluster) * chunk;
      end = static_cast<uint32_t>(total);
      chunk_end = unit + chunk;
      jump = next_jump = static_cast<uint32_t>(clusters - 1) * chunk;
    }
  }
  MOEKIT_UNITS_FN bool valid() const { return unit < end; }
  MOEKIT_UNITS_FN void advance() {
    if (++unit == chunk_end) {  // on to this cluster's next chunk
      unit += jump;
      chunk_end = unit + chunk;
      const uint32_t j = jump;  // the strides alternate (snake; the others' two are equal)
      jump = next_jump;
      next_jump = j;
    }
  }
};

// Where unit v of a group (0 <= v < units_m · units_n) lies in its output: M unit m, N unit n (in
// units of cluster_m M blocks and cluster_n N blocks; cta_tile below gives a CTA's own tile).
// stripe 1: M fastest over the whole group (CUTLASS's AlongM raster). stripe s > 1: stripes of s
// N units (the last one narrower), N fastest inside a stripe, stripes in N order — the swizzle
// CUTLASS's grouped scheduler cannot apply without host problem shapes (blocked_scheduler.cuh).
struct UnitTile {
  uint32_t m = 0, n = 0;
};
// A stripe width with kStripeMFirst set (study key swizzle=m4|m8|m16, bench/studies/sm90_study_settings.h): the same
// stripes, M fastest inside each — a stripe's units that share an A block (one M unit) are then
// units_m apart in the sequence instead of neighbours, so they run on clusters that far apart.
inline constexpr uint32_t kStripeMFirst = 1u << 16;
// (stripe >= 1, optionally | kStripeMFirst; with 1 this is v % units_m, v / units_m.)
MOEKIT_UNITS_FN UnitTile unit_tile(uint32_t v, uint32_t units_m, uint32_t units_n, uint32_t stripe) {
  const bool m_first = (stripe & kStripeMFirst) != 0;
  stripe &= ~kStripeMFirst;
  const uint32_t first = v / (units_m * stripe) * stripe;  // the stripe's first N unit
  const uint32_t rest = units_n - first;
  const uint32_t width = stripe < rest ? stripe : rest;
  const uint32_t r = v - first * units_m;
  if (m_first) return {r % units_m, first + r / units_m};
  return {r / width, first + r % width};
}

// Units along one extent of a group: `blocks` tiles (M or N blocks) in clusters of `cluster`,
// rounded up as CUTLASS's grouped scheduler rounds a group's tiles (a CTA of the last unit may
// get a tile past the output; the kernel's TMA loads and stores clip it).
// (32-bit in the scheduler warp, 64-bit on the host and in the setup kernels.)
template <class T>
MOEKIT_UNITS_FN T units_of(T blocks, T cluster) {
  return (blocks + cluster - 1) / cluster;
}

// A CTA's place in the grid of CUTLASS's AlongM launch (grid (clusters · cluster_m, cluster_n),
// clusters of cluster_m x cluster_n CTAs: a cluster is cluster_m consecutive x blocks by every y):
// its cluster, and its M and N offsets inside it.
struct CtaPlace {
  uint32_t cluster = 0, m = 0, n = 0;
};
MOEKIT_UNITS_FN CtaPlace cta_place(uint32_t block_x, uint32_t block_y, uint32_t cluster_m) {
  return {block_x / cluster_m, block_x % cluster_m, block_y};
}
// The tile (M block, N block) the CTA at `place` takes of unit `u`: the cluster's CTAs at one M
// offset share an M block (A multicast along N), those at one N offset an N block (B along M).
MOEKIT_UNITS_FN UnitTile cta_tile(UnitTile u, CtaPlace place, uint32_t cluster_m, uint32_t cluster_n) {
  return {u.m * cluster_m + place.m, u.n * cluster_n + place.n};
}

// The DRAM reads a group's walk costs in each stripe width: the estimate heuristics.h's
// choose_stripe minimises. Per group, with A the operand indexed by M (its rows x K: the panel) and
// B the one indexed by N, and `clusters` units in flight (a wave; one cluster each; a unit's A is
// cluster_m tile rows, its B cluster_n tile columns):
//   M fastest   B once; A once if the panel, a wave's B units and the output written while the
//               walk sweeps all M blocks (between two uses of an A block) fit in the L2, else once
//               per wave (a wave sweeps all M blocks before the next N units)
//   stripes w   A once per stripe (a wave's rows use each A block w times); B once if a stripe's
//               B units and a wave's A rows fit in the L2, else once per wave of the stripe
// The output counts where M fastest reuses A a whole sweep later, because the L2 allocates the
// lines the epilogue writes (a shallow-K group's output pushes its panel out); inside a stripe
// (reuse w units later) it is left out. Fit to the H200's ncu DRAM reads with an LRU model of the
// L2 (25 MB effective, half its 50 MB); the suite's picks and the model's agree (tests/
// test_tile_units.cpp has them; design/PERFORMANCE-LOG.md, the stripes, has the numbers).
struct StripeProblem {
  int64_t rows = 0, k = 0, n = 0;  // one group's output rows (M) and columns (N), and its K
  int64_t tile_m = 128, tile_n = 128, cluster_m = 1, cluster_n = 1;
  int64_t clusters = 66;   // units (clusters) in flight
  double l2_bytes = 25e6;  // the L2 capacity the estimate assumes (effective, not nominal)
  int64_t out_bytes = 2;   // bytes of one output element (0: the output left out of the estimate)
};
// A group's operands in units: blocks_m unit rows of a_block bytes of A each, units_n unit
// columns of b_unit bytes of B; a and b all of each; d_unit the output bytes of one unit.
struct StripeBytes {
  int64_t blocks_m = 0, units_n = 0;
  double a_block = 0, b_unit = 0, a = 0, b = 0, d_unit = 0;
};
MOEKIT_UNITS_FN StripeBytes stripe_bytes(const StripeProblem& p) {
  StripeBytes s;
  s.blocks_m = units_of((p.rows + p.tile_m - 1) / p.tile_m, p.cluster_m);
  s.units_n = units_of((p.n + p.tile_n - 1) / p.tile_n, p.cluster_n);
  s.a_block = double(p.cluster_m) * double(p.tile_m) * double(p.k) * 2.0;  // 16-bit
  s.b_unit = double(p.cluster_n) * double(p.tile_n) * double(p.k) * 2.0;
  s.a = double(s.blocks_m) * s.a_block;
  s.b = double(s.units_n) * s.b_unit;
  s.d_unit = double(p.cluster_m * p.tile_m) * double(p.cluster_n * p.tile_n) * double(p.out_bytes);
  return s;
}
MOEKIT_UNITS_FN double stripe_reads(const StripeProblem& p, int64_t stripe) {
  const StripeBytes s = stripe_bytes(p);
  const int64_t blocks_m = s.blocks_m, units_n = s.units_n;
  const double a_block = s.a_block, b_unit = s.b_unit, a = s.a, b = s.b, d_unit = s.d_unit;
  const double wave = double(p.clusters);
  if (stripe <= 1 || units_n == 1) {
    const double units_per_wave = wave / double(blocks_m) > 1.0 ? wave / double(blocks_m) : 1.0;
    const double b_wave = (units_per_wave < double(units_n) ? units_per_wave : double(units_n)) * b_unit;
    const double waves = double(units_n) * (double(blocks_m) < wave ? double(blocks_m) / wave : 1.0);
    return (a + b_wave + double(blocks_m) * d_unit <= p.l2_bytes ? a : a * waves) + b;
  }
  const int64_t w = stripe < units_n ? stripe : units_n;
  const double stripes = double((units_n + stripe - 1) / stripe);
  const double rows_per_wave = wave / double(w) < double(blocks_m) ? wave / double(w) : double(blocks_m);
  const double waves = double(blocks_m) * double(w) / wave;
  const bool b_stays = double(w) * b_unit + rows_per_wave * a_block <= p.l2_bytes;
  return a * stripes + (b_stays ? b : b * (waves > 1.0 ? waves : 1.0));
}
}  // namespace moekit::cuda::sm90
