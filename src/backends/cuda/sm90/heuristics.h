// Internal: every automatic choice of the sm90 kernels — which compiled configuration a call takes,
// its tile order and stripes, and when the automatic backend choice leaves a call to cuBLAS — each
// rule with its reason in a line and the design/PERFORMANCE.md section that holds the measurement
// (the numbers themselves: design/PERFORMANCE-LOG.md). The rules are plain functions of the call's
// sizes, CUTLASS- and CUDA-free (the setup kernels evaluate the stripe rule on the device; the CPU
// tests check them: tests/test_tile_units.cpp). heuristics.cpp maps each answer onto a compiled
// instance (instances/) and applies the study override (bench/studies/sm90_study_settings.h).
//
// Chosen at compile time instead, beside the kernel they shape (each says why there):
//   the group-K epilogue subtile (kernel/group_k_kernel.cuh, default_epilogue_tile),
//   the 128x64 epilogue subtile of the cooperative 128x256 bf16 instances (kernel/kernel_common.cuh,
//   ConfigWideEpi64), the own group-K kernel's D buffers (instances/kernels_group_k_own.cu).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/sm90/scheduler/tile_units.h"  // StripeProblem, stripe_reads, kSnakeOrder
#include "moekit/core/error.h"  // str

namespace moekit::cuda::sm90 {

// ---- group-M (fprop, dgrad): the configuration ----

// Groups of fewer than kSmallMRows rows on average take kSmallM (ping-pong 64x128, 1x1): the GEMM
// streams weights, and 64-row tiles waste less past m_g while a deep pipeline keeps loads in
// flight; the mean is all the host knows (PERFORMANCE.md, "What holds each target": small_E64).
inline constexpr int64_t kSmallMRows = 128;
constexpr bool takes_small_m(int64_t rows, int64_t groups) { return rows < kSmallMRows * groups; }

// On kLarge, bf16 fprop of K >= kWide21FpropK takes cooperative 128x256 with a 2x1 cluster (the
// weights multicast): fewer DRAM reads on deep K; at K 2048 it lost (PERFORMANCE.md, "The step
// runs clock-limited").
inline constexpr int64_t kWide21FpropK = 4096;
constexpr bool takes_fprop_wide21(int64_t k) { return k >= kWide21FpropK; }

// On kSmallM, plain bf16 calls whose output columns fill kSwapSlice-column slices (the last
// slice's columns past n at most n / 8) take A and B swapped on a 512x64 cluster tile, cuBLAS's
// small_E64 shape (PERFORMANCE.md, "What holds each target": small_E64). The fused SwiGLU
// epilogues have no swapped form.
inline constexpr int64_t kSwapSlice = 512;
constexpr bool takes_small_swap(int64_t n) {
  return 8 * ((n + kSwapSlice - 1) / kSwapSlice * kSwapSlice - n) <= n;
}

// ---- FP8 group-M (fp8-current's forward, fast accumulation): the configuration ----

// Groups of >= kFp8Coop256Rows rows on average take cooperative 256x128 (CUTLASS example 57's
// tile: B read once for 256 rows); smaller ones ping-pong 128x128, cluster 1x2. On an H100 the
// 256-row tile was 7-14% faster on 5 of the suite's 7 shapes, 4.5% slower at dsv3_fc2 (K 2048,
// 4096 rows a group) and 21% at small_E64 (64 rows) (PERFORMANCE.md, "FP8": fp8-current's fprop).
inline constexpr int64_t kFp8Coop256Rows = 256;
constexpr bool takes_fp8_fast_coop256(int64_t rows, int64_t groups) { return rows >= kFp8Coop256Rows * groups; }

// ---- group-K (wgrad): the configuration ----

// bf16 groups of >= kWideGroupKRows rows on average take cooperative 128x256 with a 2x1 cluster:
// faster on the large shapes, slower at 1024 rows (PERFORMANCE.md, "The step runs clock-limited").
// f16 stays on ping-pong 128x128 (not timed).
inline constexpr int64_t kWideGroupKRows = 2048;
constexpr bool takes_group_k_wide(int64_t rows, int64_t groups) { return rows >= kWideGroupKRows * groups; }

// bf16 -> bf16 groups below kOwnGroupKRows rows on average take the own ping-pong kernel
// (kernel/group_k_own.cuh: the warpgroups' epilogues side by side), except groups of one K block
// (<= kOneKBlockRows rows) with as many tiles as the grid has CTAs or more, where CUTLASS's kernel
// was faster (PERFORMANCE.md, "What holds each target": small_E64 wgrad).
// (`below_grid()`: whether the groups have fewer tiles than the grid has CTAs; asked only when needed.)
inline constexpr int64_t kOwnGroupKRows = 1024, kOneKBlockRows = 64;
template <class BelowGrid>
bool takes_group_k_own(int64_t rows, int64_t groups, BelowGrid below_grid) {
  if (rows >= kOwnGroupKRows * groups) return false;
  return rows > kOneKBlockRows * groups || below_grid();
}

// Whether a group of `tiles` tiles is small for a persistent grid of `ctas` CTAs: every wave then
// spans several groups (the chunked order's case, and the own group-K kernel's).
constexpr bool groups_below_grid(int64_t tiles, int ctas) { return tiles < ctas; }

// ---- tile orders (scheduler/blocked_scheduler.cuh) ----

// group-M keeps CUTLASS's order: the blocked and chunked orders lost on every group-M problem, the
// CTAs in flight no longer sharing operand tiles in L2 (PERFORMANCE.md, "What holds each target").
inline constexpr int kGroupMOrder = 0;
// group-K of groups below the grid: chunks of kSmallGroupOrder units (a CTA changes group once per
// chunk, its neighbours still share tiles); larger groups: the balanced order (kSnakeOrder over
// the groups laid out largest first, evening out skewed groups' costs) (PERFORMANCE.md, "The large
// shapes' skewed wgrad: the balanced order").
inline constexpr int kSmallGroupOrder = 4;
constexpr int group_k_auto_order(int64_t tiles_per_group, int ctas) {
  return groups_below_grid(tiles_per_group, ctas) ? kSmallGroupOrder : kSnakeOrder;
}

// Stripes (scheduler/tile_units.h, unit_tile): per group the width — 1 (M fastest), 4, 8 or 16 —
// with the fewest estimated DRAM reads (stripe_reads), the narrower on ties: skewed groups want
// widths of their own (PERFORMANCE.md, "What holds each target").
MOEKIT_UNITS_FN int choose_stripe(const StripeProblem& p) {
  if (p.rows <= 0 || p.k <= 0 || p.n <= 0 || p.clusters <= 0) return 1;
  // A and B fit in the L2 with a sweep's output: read once with M fastest, which no width beats;
  // skips the four estimates (fp64 divisions the GEMM waits for in the setup kernel).
  const StripeBytes s = stripe_bytes(p);
  if (s.a + s.b + double(s.blocks_m) * s.d_unit <= p.l2_bytes) return 1;
  int best = 1;
  double fewest = stripe_reads(p, 1);
  for (int stripe = 4; stripe <= 16; stripe *= 2) {
    const double reads = stripe_reads(p, stripe);
    if (reads < fewest * (1.0 - 1e-9)) best = stripe, fewest = reads;  // strictly fewer
  }
  return best;
}

// ---- launch settings ----
// Programmatic dependent launch of the GEMM after its setup kernel: the launch overlaps the setup.
inline constexpr bool kPdl = true;
// The setup kernels build every group's TMA descriptors (collective/prebuilt_tensormaps.cuh):
// CUTLASS's per-SM rewrite on each group change cost the small-group calls.
inline constexpr bool kPrebuiltTensormaps = true;
// A CTA's tiles walk K forward (collective/k_order.cuh: alternating was no faster).
inline constexpr int kKOrder = 0;

// ---- the automatic backend choice (sm90_entries.cpp, the declines) ----

// With host splits only (cuBLAS needs the counts on the host; with device splits it would
// synchronise), the automatic choice leaves to cuBLAS
//  - groups of >= kCublasLargeGroupRows rows on average: under the power cap cuBLAS's kernels run
//    at a higher clock (PERFORMANCE.md, "The step runs clock-limited");
//  - >= kCublasMinGroups equal groups of fewer than kCublasSmallGroupRows rows: its strided-batched
//    GEMMs were faster (PERFORMANCE.md, "What holds each target": small_E64).
// "" when sm90 keeps the call, else the reason. `host_counts` null: device splits.
inline constexpr int64_t kCublasMinGroups = 8, kCublasSmallGroupRows = 128, kCublasLargeGroupRows = 2048;
inline std::string declines_for_cublas(const std::vector<int64_t>* host_counts, int64_t groups, int64_t rows) {
  if (host_counts == nullptr || groups <= 0) return "";
  const std::vector<int64_t>& counts = *host_counts;
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  if (total >= kCublasLargeGroupRows * groups) {
    return str(groups, " groups of ", total / groups, " rows on average (>= ", kCublasLargeGroupRows,
               "), host splits: cuBLAS per group is faster under the power cap");
  }
  if (groups < kCublasMinGroups) return "";
  const int64_t m = counts.front();
  if (m <= 0 || m >= kCublasSmallGroupRows || m * groups > rows) return "";
  for (int64_t c : counts) {
    if (c != m) return "";
  }
  return str(groups, " groups of ", m, " rows each, host splits: cuBLAS strided-batched is faster");
}

// fc1 + SwiGLU in one kernel: the automatic choice takes it (FUSED_EPILOGUE.md).
inline constexpr bool kFuseForward = true;
// fc2 dgrad + SwiGLU backward in one kernel: declined — the plain dgrad and the SwiGLU backward
// kernel were faster in whole MLP steps (PERFORMANCE.md, "What holds each target": fusion). A
// forced "sm90" backend runs it.
inline constexpr bool kFuseBackward = false;
/// The automatic choice's fused epilogues, after the study override: "" to take the fused kernel,
/// else why not.
std::string declines_fused_forward();
std::string declines_fused_backward();

// ---- applied (heuristics.cpp) ----
struct GroupMProblem;
struct GroupKProblem;
struct GroupMInstance;
struct GroupKInstance;
/// A problem's automatic settings (-1: tile order, PDL, K order, raster) resolved, the study
/// override first; an automatic swizzle stays -1 (the kernel estimates each group's stripes).
void resolve_settings(GroupMProblem& p);
void resolve_settings(GroupKProblem& p);
/// The compiled instance that runs `p` (device/grouped_gemm_sm90.cpp: run, workspace_bytes).
const GroupMInstance& choose_instance(const GroupMProblem& p);
const GroupKInstance& choose_instance(const GroupKProblem& p);

}  // namespace moekit::cuda::sm90
