// The unit arithmetic of the sm90 grouped tile scheduler (src/backends/cuda/sm90/scheduler/tile_units.h), on the CPU:
// every order hands each unit of the sequence to exactly one cluster, CUTLASS's order is the
// grid-strided one, and every stripe width maps a group's units one to one onto its output tiles,
// N fastest inside a stripe. Fuzzed sequence lengths, grids and group shapes; the GPU tests run
// the same code inside the kernels (tests/test_sm90.cpp, ctest sm90_study_paths). Also the stripe
// rule (src/backends/cuda/sm90/heuristics.h) and the study override's parser (bench/studies/sm90_study_override.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/sm90/heuristics.h"
#include "backends/cuda/sm90/scheduler/tile_units.h"
#include "../bench/studies/sm90_study_override.h"
#include "moekit/core/error.h"

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
    for (int32_t order : {0, 1, 2, 3, 4, 8, kSnakeOrder}) {
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

// The snake walk: CUTLASS's waves, every odd one dealt in reverse (tools/balance-model's "snake").
TEST(TileUnits, SnakeOrderDealsOddWavesInReverse) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const uint64_t clusters = 1 + rng() % 140, total = rng() % 3000;
    const auto units = units_by_cluster(kSnakeOrder, clusters, total);
    for (uint64_t c = 0; c < clusters; ++c) {
      for (size_t w = 0; w < units[c].size(); ++w) {
        const uint64_t place = w % 2 == 0 ? c : clusters - 1 - c;
        ASSERT_EQ(units[c][w], w * clusters + place)
            << "cluster " << c << " of " << clusters << ", wave " << w << ", " << total << " units";
      }
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
    for (uint32_t stripe : {1u, 2u, 4u, 8u, 16u, 4u | kStripeMFirst, 8u | kStripeMFirst,
                            16u | kStripeMFirst}) {
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
        } else if ((stripe & kStripeMFirst) != 0) {  // M fastest inside the stripe v falls in
          const uint32_t width = stripe & ~kStripeMFirst;
          const uint32_t first = v / (blocks_m * width) * width;
          EXPECT_GE(t.n, first);
          EXPECT_LT(t.n, first + width);
          EXPECT_EQ(t.m, (v - first * blocks_m) % blocks_m);
          if (v > 0 && t.m > 0) {
            const UnitTile prev = unit_tile(v - 1, blocks_m, units_n, stripe);
            EXPECT_EQ(prev.m + 1, t.m);
            EXPECT_EQ(prev.n, t.n);
          }
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

// The CTAs of a cluster split each unit among them: over every unit of a group (any stripe) and
// every place in a cluster of 1 or 2 CTAs along M and N, each tile of the group's rounded grid
// (units_of, as CUTLASS rounds it) goes to exactly one CTA; the CTAs at one M offset of a cluster
// share their M block (A multicast along N), those at one N offset their N block. cta_place reads
// CUTLASS's AlongM launch: x = cluster x cluster_m + m offset, y = n offset.
TEST(TileUnits, ClusterCtasSplitEachUnitIntoDistinctTiles) {
  std::mt19937 rng(13);
  for (int trial = 0; trial < 200; ++trial) {
    const uint32_t blocks_m = 1 + rng() % 40, blocks_n = 1 + rng() % 30;
    for (uint32_t cm : {1u, 2u}) {
      for (uint32_t cn : {1u, 2u}) {
        const uint32_t units_m = units_of(blocks_m, cm), units_n = units_of(blocks_n, cn);
        ASSERT_GE(units_m * cm, blocks_m);
        ASSERT_LT(units_m * cm, blocks_m + cm);
        for (uint32_t stripe : {1u, 4u, 8u, 16u, 8u | kStripeMFirst}) {
          SCOPED_TRACE("cluster " + std::to_string(cm) + "x" + std::to_string(cn) + ", stripe " +
                       std::to_string(stripe) + ", " + std::to_string(blocks_m) + " x " +
                       std::to_string(blocks_n) + " blocks");
          std::vector<int> hit(size_t{units_m} * cm * units_n * cn, 0);
          const uint32_t cluster = static_cast<uint32_t>(rng() % 66);
          for (uint32_t v = 0; v < units_m * units_n; ++v) {
            const UnitTile u = unit_tile(v, units_m, units_n, stripe);
            for (uint32_t x = 0; x < cm; ++x) {
              for (uint32_t y = 0; y < cn; ++y) {
                const CtaPlace place = cta_place(cluster * cm + x, y, cm);
                ASSERT_EQ(place.cluster, cluster);
                const UnitTile t = cta_tile(u, place, cm, cn);
                ASSERT_LT(t.m, units_m * cm);
                ASSERT_LT(t.n, units_n * cn);
                ++hit[size_t{t.m} * units_n * cn + t.n];
                EXPECT_EQ(t.m, cta_tile(u, cta_place(cluster * cm + x, 0, cm), cm, cn).m);
                EXPECT_EQ(t.n, cta_tile(u, cta_place(cluster * cm, y, cm), cm, cn).n);
              }
            }
          }
          for (size_t i = 0; i < hit.size(); ++i) ASSERT_EQ(hit[i], 1) << "tile " << i;
        }
      }
    }
  }
}

// A unit of a 2x1 cluster is two tile rows of A: the estimate counts its A in those, so a 2x1
// cluster of 128-row tiles reads what a 1x1 cluster of 256-row tiles reads (same units in flight).
TEST(TileUnits, StripeEstimateCountsAClusterAlongMAsOneTallerTile) {
  StripeProblem two_by_one, tall;
  for (StripeProblem* p : {&two_by_one, &tall}) {
    p->rows = 4096;
    p->k = 7168;
    p->n = 4096;
    p->tile_n = 256;
    p->clusters = 66;
  }
  two_by_one.tile_m = 128;
  two_by_one.cluster_m = 2;
  tall.tile_m = 256;
  for (int stripe : {1, 4, 8}) {
    EXPECT_DOUBLE_EQ(stripe_reads(two_by_one, stripe), stripe_reads(tall, stripe)) << stripe;
  }
  EXPECT_EQ(choose_stripe(two_by_one), choose_stripe(tall));
}

// The suite's 21 problems (design/PERFORMANCE.md: 7 shapes x fprop, dgrad, wgrad, uniform routing)
// on the tiles the library takes for them (and the seven of them that have two tiles, on the other),
// with the stripe width that tools/l2-model (the LRU model fit to the H200's ncu DRAM reads, L2 of
// 25 MB) reads the least with, among 1, 4, 8 and 16 (ties: the narrower; `tools/l2-model G ROWS K N
// TMxTN CLUSTER --stripes 1,4,8,16`). choose_stripe's closed-form estimate must pick the same.
struct SuiteProblem {
  const char* name;
  int64_t groups, rows, k, n, tile_m, tile_n, cluster_m, cluster_n;
  int best;  // tools/l2-model's
};
TEST(TileUnits, StripeChoiceMatchesTheL2ModelOnTheSuite) {
  // fprop: rows T/E, K, N on ping-pong 128x128 1x2 (kSmallM 64x128 1x1 under 128 rows; bf16 of
  // K >= 4096: cooperative 128x256 2x1); dgrad:
  // rows, N, K on cooperative 128x256 1x2; wgrad: N, T/E, K on cooperative 128x256 (bf16: 2x1,
  // f16: 1x2) from 2048 rows per group, else ping-pong 128x128 1x2.
  const SuiteProblem suite[] = {
      {"dsv3_fc1_E8 fprop", 8, 4096, 7168, 4096, 128, 128, 1, 2, 8},
      {"dsv3_fc1_E8 dgrad", 8, 4096, 4096, 7168, 128, 256, 1, 2, 4},
      {"dsv3_fc1_E8 wgrad", 8, 4096, 4096, 7168, 128, 256, 2, 1, 8},
      {"dsv3_fc2_E8 fprop", 8, 4096, 2048, 7168, 128, 128, 1, 2, 1},
      {"dsv3_fc2_E8 dgrad", 8, 4096, 7168, 2048, 128, 256, 1, 2, 4},
      {"dsv3_fc2_E8 wgrad", 8, 7168, 4096, 2048, 128, 256, 2, 1, 8},
      {"dsv3_fc1_E32 fprop", 32, 1024, 7168, 4096, 128, 128, 1, 2, 1},
      {"dsv3_fc1_E32 dgrad", 32, 1024, 4096, 7168, 128, 256, 1, 2, 1},
      {"dsv3_fc1_E32 wgrad", 32, 4096, 1024, 7168, 128, 128, 1, 2, 1},
      {"qwen3_fc1_E16 fprop", 16, 1024, 4096, 3072, 128, 128, 1, 2, 1},
      {"qwen3_fc1_E16 dgrad", 16, 1024, 3072, 4096, 128, 256, 1, 2, 1},
      {"qwen3_fc1_E16 wgrad", 16, 3072, 1024, 4096, 128, 128, 1, 2, 1},
      {"qwen3_fc2_E16 fprop", 16, 1024, 1536, 4096, 128, 128, 1, 2, 1},
      {"qwen3_fc2_E16 dgrad", 16, 1024, 4096, 1536, 128, 256, 1, 2, 1},
      {"qwen3_fc2_E16 wgrad", 16, 4096, 1024, 1536, 128, 128, 1, 2, 1},
      {"mixtral_fc1_E8 fprop", 8, 2048, 4096, 28672, 128, 128, 1, 2, 1},
      {"mixtral_fc1_E8 dgrad", 8, 2048, 28672, 4096, 128, 256, 1, 2, 1},
      {"mixtral_fc1_E8 wgrad", 8, 28672, 2048, 4096, 128, 256, 2, 1, 16},
      {"small_E64 fprop", 64, 64, 2048, 1024, 64, 128, 1, 1, 1},
      {"small_E64 dgrad", 64, 64, 1024, 2048, 64, 128, 1, 1, 1},
      {"small_E64 wgrad", 64, 1024, 64, 2048, 128, 128, 1, 2, 1},
      // bf16 fprop of K >= 4096 on cooperative 128x256 2x1 (the rows above: f16's tile)
      {"dsv3_fc1_E8 fprop 2x1", 8, 4096, 7168, 4096, 128, 256, 2, 1, 8},
      {"dsv3_fc1_E32 fprop 2x1", 32, 1024, 7168, 4096, 128, 256, 2, 1, 1},
      {"qwen3_fc1_E16 fprop 2x1", 16, 1024, 4096, 3072, 128, 256, 2, 1, 1},
      {"mixtral_fc1_E8 fprop 2x1", 8, 2048, 4096, 28672, 128, 256, 2, 1, 1},
      // bf16 group-K of >= 2048 rows per group on cooperative 128x256 1x2 (the wide group-K with
      // MOEKIT_SM90_GROUP_K_WIDE21=0 until 3baaae0 removed it; no call's tile now): the stripe rule
      // on the other cluster of the 2x1 wgrad rows above
      {"dsv3_fc1_E8 wgrad 1x2", 8, 4096, 4096, 7168, 128, 256, 1, 2, 4},
      {"dsv3_fc2_E8 wgrad 1x2", 8, 7168, 4096, 2048, 128, 256, 1, 2, 4},
      {"mixtral_fc1_E8 wgrad 1x2", 8, 28672, 2048, 4096, 128, 256, 1, 2, 8},
  };
  for (const SuiteProblem& q : suite) {
    StripeProblem p;
    p.rows = q.rows;
    p.k = q.k;
    p.n = q.n;
    p.tile_m = q.tile_m;
    p.tile_n = q.tile_n;
    p.cluster_m = q.cluster_m;
    p.cluster_n = q.cluster_n;
    p.clusters = 132 / (q.cluster_m * q.cluster_n);
    p.l2_bytes = 25e6;
    EXPECT_EQ(choose_stripe(p), q.best)
        << q.name << ": estimated reads per group " << stripe_reads(p, 1) << " / " << stripe_reads(p, 4)
        << " / " << stripe_reads(p, 8) << " / " << stripe_reads(p, 16) << " bytes for widths 1 / 4 / 8 / 16";
    // The same width for an fp32 output (wgrad_f32: added into main_grad) and with the output left
    // out of the estimate (the model's calibration): on the suite the output decides no pick.
    for (const int64_t out_bytes : {0, 4}) {
      p.out_bytes = out_bytes;
      EXPECT_EQ(choose_stripe(p), q.best) << q.name << " with " << out_bytes << "-byte output";
    }
  }
}

// By hand: a panel that fits is read once with M fastest (A + B); with stripes A is read once per
// stripe. 4 M blocks of 128 x 64 (16 KB each), 8 N units of 1 x 128 (16 KB each), 66 in flight.
TEST(TileUnits, StripeReadsCountPanelsByHand) {
  StripeProblem p;
  p.rows = 512;
  p.k = 64;
  p.n = 1024;
  p.tile_m = 128;
  p.tile_n = 128;
  p.cluster_n = 1;
  p.clusters = 66;
  p.l2_bytes = 25e6;
  EXPECT_DOUBLE_EQ(stripe_reads(p, 1), 4 * 16384.0 + 8 * 16384.0);
  EXPECT_DOUBLE_EQ(stripe_reads(p, 4), 2 * 4 * 16384.0 + 8 * 16384.0);
  EXPECT_EQ(choose_stripe(p), 1);
  p.rows = 0;  // an empty group: nothing to choose
  EXPECT_EQ(choose_stripe(p), 1);
}

// The output the epilogue writes takes L2 too. One 65536 x 2048 bf16 dW from 64 rows (group-K:
// rows = the layer's N, K = the group's rows, n = the layer's K) on ping-pong 128 x 128 1 x 2:
// a panel of 512 A blocks of 128 x 64 (8 MB) and 8 B units of 256 x 64 (256 KB) fit, but M
// fastest writes 512 units of 64 KB (32 MB) between two uses of an A block, so A is read once
// per sweep (8 times); stripes of 8 (the whole width) read it once. On the H200 (ncu,
// bench/results/2026-12-02-nvidia-h200-9d9ba49-chunk-raster.md): 37 MB of DRAM reads against
// 10, 0.103 against 0.092 ms. Without the output in the estimate every width ties and M fastest
// is kept.
TEST(TileUnits, StripeEstimateCountsTheOutputInTheL2) {
  StripeProblem p{.rows = 65536,
                  .k = 64,
                  .n = 2048,
                  .tile_m = 128,
                  .tile_n = 128,
                  .cluster_m = 1,
                  .cluster_n = 2,
                  .clusters = 66,
                  .l2_bytes = 25e6,
                  .out_bytes = 2};
  const double a = 512 * 128 * 64 * 2.0, b = 8 * 256 * 64 * 2.0;
  EXPECT_DOUBLE_EQ(stripe_reads(p, 1), 8 * a + b);
  EXPECT_DOUBLE_EQ(stripe_reads(p, 8), a + b);
  EXPECT_EQ(choose_stripe(p), 8);
  p.out_bytes = 4;  // an fp32 main_grad: more so
  EXPECT_EQ(choose_stripe(p), 8);
  p.out_bytes = 0;
  EXPECT_DOUBLE_EQ(stripe_reads(p, 1), a + b);
  EXPECT_EQ(choose_stripe(p), 1);
  // Half the rows: 16 MB written per sweep, with the panel under 25 MB: M fastest again.
  p.out_bytes = 2;
  p.rows = 32768;
  EXPECT_EQ(choose_stripe(p), 1);
}

// choose_stripe's early exit (A and B fit in the L2 together with the output of a sweep of the M
// blocks: width 1 without the estimates) picks
// what comparing the four estimates picks, on random groups around that bound (rows 1-4096, K and
// N 64-8192, both tiles and cluster shapes the kernels use, L2 sizes from 4 to 50 MB, no output or
// bf16 or fp32 output): the exit is exact, not a heuristic. And it is taken where it is meant to
// be: small_E64's groups.
TEST(TileUnits, StripeEarlyExitPicksWhatTheEstimatesPick) {
  std::mt19937_64 rng(20261201);
  auto pick = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  int exits = 0, estimated = 0;
  for (int i = 0; i < 20000; ++i) {
    StripeProblem p;
    p.rows = pick(1, 4096);
    p.k = 8 * pick(8, 1024);
    p.n = 8 * pick(8, 1024);
    const bool small = rng() % 2 == 0;
    p.tile_m = small ? 64 : 128;
    p.tile_n = small ? 128 : 128 * pick(1, 2);
    const int cluster = static_cast<int>(pick(0, 2));  // 1x1, 1x2, 2x1
    p.cluster_m = cluster == 2 ? 2 : 1;
    p.cluster_n = cluster == 1 ? 2 : 1;
    p.clusters = 132 / (p.cluster_m * p.cluster_n);
    p.l2_bytes = 1e6 * static_cast<double>(pick(4, 50));
    p.out_bytes = 2 * pick(0, 2);  // none, bf16, fp32
    // The comparison choose_stripe makes when it does not exit early.
    int best = 1;
    double fewest = stripe_reads(p, 1);
    for (int stripe = 4; stripe <= 16; stripe *= 2) {
      const double reads = stripe_reads(p, stripe);
      if (reads < fewest * (1.0 - 1e-9)) best = stripe, fewest = reads;
    }
    const StripeBytes b = stripe_bytes(p);
    (b.a + b.b + double(b.blocks_m) * b.d_unit <= p.l2_bytes ? exits : estimated) += 1;
    ASSERT_EQ(choose_stripe(p), best)
        << "rows " << p.rows << " k " << p.k << " n " << p.n << " tile " << p.tile_m << "x"
        << p.tile_n << " cluster " << p.cluster_m << "x" << p.cluster_n << " L2 " << p.l2_bytes
        << " out " << p.out_bytes;
  }
  EXPECT_GT(exits, 1000);  // both paths taken many times
  EXPECT_GT(estimated, 1000);
  // small_E64 fprop on kSmallM's 64x128 tile (its fused SwiGLU instance; the plain one runs A and
  // B swapped since 373b910): 64 rows, K 1024, N 2048, 132 clusters, 25 MB.
  const StripeProblem small_e64{.rows = 64, .k = 1024, .n = 2048, .tile_m = 64, .tile_n = 128,
                                .clusters = 132, .l2_bytes = 25e6};
  const StripeBytes b = stripe_bytes(small_e64);
  EXPECT_LE(b.a + b.b, small_e64.l2_bytes);
  EXPECT_EQ(choose_stripe(small_e64), 1);
}


// The study override (MOEKIT_SM90_STUDY, bench/studies/sm90_study_override.h): every key and value it lists parses to
// its index; unset and empty mean automatic; anything else is an error naming the key — a typo
// never runs the defaults silently.
TEST(StudySettings, ParsesEveryKeyAndRefusesWhatItCannotTake) {
  const StudySettings none = parse_study_settings(nullptr);
  EXPECT_EQ(none.order, -1);
  EXPECT_EQ(parse_study_settings("").config, -1);
  const StudySettings s = parse_study_settings("order=balanced,swizzle=m8,pdl=0,fused_backward=1,config=small");
  EXPECT_EQ(s.order, 6);
  EXPECT_EQ(s.swizzle, 6);
  EXPECT_EQ(s.pdl, 0);
  EXPECT_EQ(s.fused_backward, 1);
  EXPECT_EQ(s.config, 1);
  EXPECT_EQ(s.raster, -1);
  EXPECT_EQ(s.group_k_own, -1);
  for (const auto& k : study_detail::keys()) {
    for (int i = 0; i < k.count; ++i) {
      const std::string spec = std::string(k.name) + "=" + std::string(k.values[i]);
      EXPECT_EQ(parse_study_settings(spec.c_str()).*k.field, i) << spec;
    }
  }
  using ::testing::AllOf;
  using ::testing::HasSubstr;
  const auto message = [](const char* spec) {
    try {
      parse_study_settings(spec);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << spec;
      return std::string(e.what());
    }
    ADD_FAILURE() << spec << " parsed";
    return std::string();
  };
  EXPECT_THAT(message("ordr=blocked"), AllOf(HasSubstr("MOEKIT_SM90_STUDY"), HasSubstr("ordr")));
  EXPECT_THAT(message("order=blockd"), AllOf(HasSubstr("order"), HasSubstr("blockd"), HasSubstr("blocked")));
  EXPECT_THAT(message("pdl=2"), AllOf(HasSubstr("pdl"), HasSubstr("'2'")));
  EXPECT_THAT(message("pdl"), HasSubstr("'pdl'"));
  EXPECT_THAT(message("=1"), HasSubstr("MOEKIT_SM90_STUDY"));
  EXPECT_THAT(message("pdl=0,,k_order=alternate"), HasSubstr("MOEKIT_SM90_STUDY"));
  EXPECT_THAT(message("pdl=0,pdl=1"), AllOf(HasSubstr("pdl"), HasSubstr("twice")));
  EXPECT_THAT(message("tile=coop"), HasSubstr("tile"));  // a removed study key
}

// The automatic rules of heuristics.h at their thresholds (the kernels' choice follows them).
TEST(Heuristics, RulesSwitchAtTheirThresholds) {
  EXPECT_TRUE(takes_small_m(127 * 8, 8));
  EXPECT_FALSE(takes_small_m(128 * 8, 8));
  EXPECT_FALSE(takes_fprop_wide21(4095));
  EXPECT_TRUE(takes_fprop_wide21(4096));
  EXPECT_TRUE(takes_small_swap(1024));
  EXPECT_TRUE(takes_small_swap(2048));
  EXPECT_FALSE(takes_small_swap(1280));  // 256 columns past n: more than n / 8
  EXPECT_TRUE(takes_fp8_fast_coop256(256 * 4, 4));
  EXPECT_FALSE(takes_fp8_fast_coop256(255 * 4, 4));
  EXPECT_TRUE(takes_group_k_wide(2048 * 4, 4));
  EXPECT_FALSE(takes_group_k_wide(2047 * 4, 4));
  int asked = 0;
  const auto below = [&] { return ++asked, true; };
  const auto not_below = [&] { return ++asked, false; };
  EXPECT_FALSE(takes_group_k_own(1024 * 4, 4, below));
  EXPECT_TRUE(takes_group_k_own(512 * 4, 4, not_below));
  EXPECT_EQ(asked, 0);  // the grid is asked about only for groups of one K block
  EXPECT_TRUE(takes_group_k_own(64 * 4, 4, below));
  EXPECT_FALSE(takes_group_k_own(64 * 4, 4, not_below));
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(group_k_auto_order(131, 132), kSmallGroupOrder);
  EXPECT_EQ(group_k_auto_order(132, 132), kSnakeOrder);
  const std::vector<int64_t> equal(64, 64), skewed{1, 127, 64, 64, 64, 64, 64, 64};
  EXPECT_NE(declines_for_cublas(&equal, 64, 64 * 64), "");
  EXPECT_EQ(declines_for_cublas(nullptr, 64, 64 * 64), "");  // device splits: never
  EXPECT_EQ(declines_for_cublas(&skewed, 8, 512), "");
  const std::vector<int64_t> large(8, 2048);
  EXPECT_NE(declines_for_cublas(&large, 8, 8 * 2048), "");
}

}  // namespace
}  // namespace moekit::cuda::sm90
