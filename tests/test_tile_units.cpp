// The unit arithmetic of the sm90 grouped tile scheduler (src/cuda/sm90/tile_units.h), on the CPU:
// every order hands each unit of the sequence to exactly one cluster, CUTLASS's order is the
// grid-strided one, and every stripe width maps a group's units one to one onto its output tiles,
// N fastest inside a stripe. Fuzzed sequence lengths, grids and group shapes; the GPU tests run
// the same code inside the kernels (tests/test_sm90.cpp, ctest sm90_tile_order_*, sm90_swizzle*).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda/sm90/tile_units.h"

namespace moekit::cuda::sm90 {
namespace {

// The units each cluster takes, in its order, until the cursor runs out.
std::vector<std::vector<uint32_t>> units_by_cluster(int32_t order, uint64_t clusters, uint64_t total) {
  std::vector<std::vector<uint32_t>> out(clusters);
  for (uint64_t c = 0; c < clusters; ++c) {
    for (UnitCursor u(order, c, clusters, total); u.valid(); u.advance()) {
      out[c].push_back(u.unit);
      if (out[c].size() > total) break;  // a cursor that never ends fails below, not here
    }
  }
  return out;
}

TEST(TileUnits, EveryOrderHandsEachUnitToExactlyOneCluster) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    const uint64_t clusters = 1 + rng() % 140;
    const uint64_t total = trial < 20 ? trial : rng() % 3000;  // 0 and small totals included
    for (int32_t order : {0, 1, 2, 3, 4, 8}) {
      SCOPED_TRACE("order " + std::to_string(order) + ", " + std::to_string(clusters) +
                   " clusters, " + std::to_string(total) + " units");
      std::vector<int> taken(total, 0);
      for (const auto& units : units_by_cluster(order, clusters, total)) {
        for (size_t i = 0; i < units.size(); ++i) {
          ASSERT_LT(units[i], total);
          if (i > 0) {
            ASSERT_GT(units[i], units[i - 1]) << "units must only grow (find_group)";
          }
          ++taken[units[i]];
        }
      }
      for (uint64_t v = 0; v < total; ++v) ASSERT_EQ(taken[v], 1) << "unit " << v;
    }
  }
}

TEST(TileUnits, CutlassOrderIsGridStridedAndBlockedRangesAreBalanced) {
  const uint64_t clusters = 66, total = 1000;
  const auto strided = units_by_cluster(0, clusters, total);
  for (uint64_t c = 0; c < clusters; ++c) {
    for (size_t i = 0; i < strided[c].size(); ++i) EXPECT_EQ(strided[c][i], c + i * clusters);
  }
  const auto blocked = units_by_cluster(1, clusters, total);
  for (uint64_t c = 0; c < clusters; ++c) {
    EXPECT_GE(blocked[c].size(), total / clusters);
    EXPECT_LE(blocked[c].size(), total / clusters + 1);
    for (size_t i = 1; i < blocked[c].size(); ++i) EXPECT_EQ(blocked[c][i], blocked[c][i - 1] + 1);
  }
}

TEST(TileUnits, EveryStripeWidthMapsAGroupOntoItsTilesOneToOne) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const uint32_t blocks_m = 1 + rng() % 60, units_n = 1 + rng() % 40;
    for (uint32_t stripe : {1u, 2u, 4u, 8u}) {
      SCOPED_TRACE("stripe " + std::to_string(stripe) + ", " + std::to_string(blocks_m) + " x " +
                   std::to_string(units_n));
      std::vector<int> hit(size_t{blocks_m} * units_n, 0);
      for (uint32_t v = 0; v < blocks_m * units_n; ++v) {
        const UnitTile t = unit_tile(v, blocks_m, units_n, stripe);
        ASSERT_LT(t.m, blocks_m);
        ASSERT_LT(t.n, units_n);
        ++hit[size_t{t.m} * units_n + t.n];
        if (stripe == 1) {  // CUTLASS's AlongM: M fastest
          EXPECT_EQ(t.m, v % blocks_m);
          EXPECT_EQ(t.n, v / blocks_m);
        } else {  // N fastest inside the stripe v falls in; stripes in N order
          const uint32_t first = v / (blocks_m * stripe) * stripe;
          EXPECT_GE(t.n, first);
          EXPECT_LT(t.n, first + stripe);
          if (v > 0 && t.n > first) {
            const UnitTile prev = unit_tile(v - 1, blocks_m, units_n, stripe);
            EXPECT_EQ(prev.m, t.m);
            EXPECT_EQ(prev.n + 1, t.n);
          }
        }
      }
      for (size_t i = 0; i < hit.size(); ++i) ASSERT_EQ(hit[i], 1) << "tile " << i;
    }
  }
}

}  // namespace
}  // namespace moekit::cuda::sm90
