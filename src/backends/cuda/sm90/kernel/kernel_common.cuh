// Internal: what the sm90 grouped GEMM kernels (group_m_kernel.cuh, group_k_kernel.cuh) share —
// CUTLASS includes, tile configurations, element types, the workspace carver, the block scan the
// setup kernels use, the per-device hardware query and the cache of initialised kernel Params.
// Included only by the kernel headers (and through them by the instance translation units).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <utility>

#include "backends/cuda/sm90/device/grouped_gemm_sm90.h"
#include "backends/cuda/sm90/collective/blockwise_consumer.cuh"
#include "backends/cuda/sm90/collective/k_order.cuh"
#include "backends/cuda/sm90/device/launch.cuh"
#include "backends/cuda/sm90/collective/prebuilt_tensormaps.cuh"
#include "backends/cuda/sm90/heuristics.h"  // choose_stripe
#include "backends/cuda/sm90/scheduler/tile_units.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "backends/cuda/check.h"
#include "backends/cuda/device_counts.cuh"
#include "moekit/core/dtype.h"
#include "moekit/core/error.h"

#if !defined(CUTLASS_ARCH_MMA_MODIFIABLE_TMA_SM90_SUPPORTED)
#error "the sm90 grouped GEMM needs CUDA >= 12.3 (modifiable TMA descriptors)"
#endif

namespace moekit::cuda::sm90 {

// ---- tile configurations: which call takes which is heuristics.h's (applied in heuristics.cpp);
// the measurements behind each: design/PERFORMANCE.md, "What holds each target" ----

// kLarge's fprop and wgrad: ping-pong — two consumer warpgroups on two 128x128 tiles, one's
// epilogue overlapping the other's mainloop; a 1x2 cluster multicasts each A tile to two N tiles.
struct ConfigLarge {
  using Schedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
  using Tile = cute::Shape<cute::_128, cute::_128, cute::_64>;
  using Cluster = cute::Shape<cute::_1, cute::_2, cute::_1>;
};
struct ConfigSmallM {  // kSmallM: 64-row tiles for groups of few rows (weight-bandwidth bound)
  using Schedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
  using Tile = cute::Shape<cute::_64, cute::_128, cute::_64>;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
};

// kLarge's dgrad (plain and with the SwiGLU backward): the cooperative 128x256x64 tile, each
// consumer warpgroup 64x256, cluster 1x2 — what cuBLAS picks for these shapes; faster than
// ConfigLarge on dgrad, a tie on fprop and wgrad (which stay there). The f16 instances follow
// (tested, not timed).
struct ConfigWide {
  using Schedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
  using Tile = cute::Shape<cute::_128, cute::_256, cute::_64>;
  using Cluster = cute::Shape<cute::_1, cute::_2, cute::_1>;
};

// kLarge's bf16 fprop of deep K and the bf16 group-K of large groups (heuristics.h): ConfigWide
// with a 2x1 cluster — a cluster's two CTAs take neighbouring M tiles of one N tile, so B (the
// weights, for fprop) is multicast instead of A. torch._grouped_mm's configuration on sm_90 for
// groups of more than 128 rows (PyTorch's GroupMM.cu), the suite's peer.
struct ConfigWide21 : ConfigWide {
  using Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
};

// kSmallM's plain bf16 fprop and dgrad when the output's columns fill 512-column slices
// (heuristics.h, takes_small_swap): A and B swapped (GroupMParts::kSwapAB: the weights as the
// GEMM's M, a group's rows its N, D column-major) on the cooperative 256x64 tile with a 2x1
// cluster — the two CTAs take neighbouring 256-column slices of one group's output and share its
// 64 rows (B, multicast): a 512x64 cluster tile, the shape of cuBLAS's small_E64 kernel.
struct ConfigSmallSwap {
  using Schedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
  using Tile = cute::Shape<cute::_256, cute::_64, cute::_64>;
  using Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
  static constexpr bool kSwapAB = true;
};

// The plain bf16 instances of the cooperative 128x256 tile — kLarge's dgrad (ConfigWideEpi64), the
// fprop of deep K and the bf16 -> bf16 group-K of large groups (ConfigWide21Epi64) — on a 128x64
// epilogue subtile instead of CUTLASS's automatic 128x32: four passes per tile instead of eight.
// On a cooperative tile no mainloop overlaps the epilogue, so each pass (a named barrier, a fence,
// a TMA store issue) is time the tensor cores idle. The 128x64 D staging keeps the mainloop's 4
// stages (kMinStages, checked at compile time in GroupedGemm). bf16 outputs only: an f32 dw's
// staging at 128x64 would take a mainloop stage, and the fused SwiGLU epilogues keep their own.
struct ConfigWideEpi64 : ConfigWide {
  using EpilogueTile = cute::Shape<cute::_128, cute::_64>;
  static constexpr int kMinStages = 4;
};
struct ConfigWide21Epi64 : ConfigWide21 {
  using EpilogueTile = cute::Shape<cute::_128, cute::_64>;
  static constexpr int kMinStages = 4;
};

// A configuration with kOwnKernel (ConfigLargeOwn, instances/kernels_group_k_own.cu) runs on
// moekit's own kernel class (group_k_own.cuh, included by
// those files alone: a change to it rebuilds them alone). Its D staging is here: GroupedGemm
// sizes the mainloop from it.
template <class CutlassKernel, class Config>
struct GroupKOwnKernel;

// The kernel's D staging, from the epilogue collective and the buffer count alone (GroupedGemm
// sizes the mainloop's stages from it before the kernel type exists): kDBuffers subtile buffers
// (the epilogue subtile each) per consumer warpgroup, a ring: with fewer buffers than subtiles a
// subtile waits for the store of the one kDBuffers before it to finish reading its buffer; the
// shared memory saved goes to the mainloop's stages.
template <class Epilogue, int kDBuffers>
struct GroupKOwnStaging {
  using ElementD = typename Epilogue::ElementD;
  using EpilogueTile = typename Epilogue::EpilogueTile;
  static constexpr int kBuffers = kDBuffers;
  static_assert(kBuffers >= 1);
  using SmemLayoutD = decltype(cute::tile_to_shape(
      typename Epilogue::SmemLayoutAtomD{},
      cute::make_shape(cute::size<0>(EpilogueTile{}), cute::size<1>(EpilogueTile{}), cute::Int<kBuffers>{}),
      cute::Step<cute::_1, cute::_2, cute::_3>{}));  // D row-major, as the collective lays it out
  static constexpr int kDElements = cute::cosize_v<SmemLayoutD>;
  // What the mainloop's stage count leaves room for (GroupedGemm's carveout): both warpgroups'
  // buffers and ~1 KB of barriers, scheduler responses and descriptors.
  static constexpr int kSmemBytes = 2 * kDElements * int(sizeof(ElementD)) + 1024;
};

// The epilogue subtile a configuration names (Config::EpilogueTile: ConfigWideEpi64,
// ConfigWide21Epi64), else `fallback` — each form's own choice (group_m_kernel.cuh, group_k_kernel.cuh).
template <class Config, class Fallback>
constexpr auto epilogue_tile_or(Fallback fallback) {
  if constexpr (requires { typename Config::EpilogueTile; }) {
    return typename Config::EpilogueTile{};
  } else {
    return fallback;
  }
}

// A grouped GEMM's CUTLASS types from its epilogue-side part P (group_m_kernel.cuh,
// group_k_kernel.cuh): P gives Element, LayoutA, LayoutB, kAlign (of A and B), Config, its
// CollectiveEpilogue and its ProblemShape; this
// adds what both kernels build the same way around them — the warp-specialised mainloop (its
// stages take what the epilogue leaves of shared memory), the kernel, and the per-group shape and
// stride types the setup kernels fill.
// Both collectives take every group's TMA descriptors from the setup kernel
// (prebuilt_tensormaps.cuh) instead of rewriting a per-SM copy on each group change; the mainloop
// walks K as the call says (k_order.cuh).
// A configuration with kOwnKernel runs on GroupKOwnKernel, its mainloop stages sized beside
// that kernel's D staging (GroupKOwnStaging).
template <class P>
struct GroupedGemm : P {
  static constexpr bool kOwnKernel = [] {
    if constexpr (requires { P::Config::kOwnKernel; }) {
      return P::Config::kOwnKernel;
    } else {
      return false;
    }
  }();
  using ProblemShape = typename P::ProblemShape;  // a GroupProblemShape (blocked_scheduler.cuh)
  static constexpr int kEpilogueSmemBytes = [] {
    if constexpr (kOwnKernel) {
      return GroupKOwnStaging<typename P::CollectiveEpilogue, P::Config::kDBuffers>::kSmemBytes;
    } else {
      return static_cast<int>(sizeof(typename P::CollectiveEpilogue::SharedStorage));
    }
  }();
  // A's and B's element types: P::Element for both, unless P names its own (the FP8 kernels:
  // an e5m2 gradient times an e4m3 operand).
  using ElementA = typename decltype([] {
    if constexpr (requires { typename P::ElementA; }) return std::type_identity<typename P::ElementA>{};
    else return std::type_identity<typename P::Element>{};
  }())::type;
  using ElementB = typename decltype([] {
    if constexpr (requires { typename P::ElementB; }) return std::type_identity<typename P::ElementB>{};
    else return std::type_identity<typename P::Element>{};
  }())::type;
  // The mainloop builder's layout tags: P::LayoutA* and P::LayoutB*, unless P names its own (the
  // block-scaled FP8 kernels: each paired with its scales' layout, CUTLASS's blockwise builder).
  using MainloopLayoutA = typename decltype([] {
    if constexpr (requires { typename P::MainloopLayoutA; }) return std::type_identity<typename P::MainloopLayoutA>{};
    else return std::type_identity<typename P::LayoutA*>{};
  }())::type;
  using MainloopLayoutB = typename decltype([] {
    if constexpr (requires { typename P::MainloopLayoutB; }) return std::type_identity<typename P::MainloopLayoutB>{};
    else return std::type_identity<typename P::LayoutB*>{};
  }())::type;
  using CutlassMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA,
      MainloopLayoutA, P::kAlign, ElementB, MainloopLayoutB, P::kAlign, float,
      typename P::Config::Tile, typename P::Config::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<kEpilogueSmemBytes>,
      typename P::Config::Schedule>::CollectiveOp;
  // The block-scaled FP8 mainloop's consumer loop is moekit's (collective/blockwise_consumer.cuh).
  using CollectiveMainloop =
      KOrderMainloop<PrebuiltMainloop<typename WithBlockwiseConsumer<CutlassMainloop>::type>>;
  using CollectiveEpilogue = PrebuiltEpilogue<typename P::CollectiveEpilogue>;
  using CutlassKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Kernel =
      std::conditional_t<kOwnKernel, GroupKOwnKernel<CutlassKernel, typename P::Config>, CutlassKernel>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  using Shape3 = typename ProblemShape::UnderlyingProblemShape;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideC = typename Kernel::InternalStrideC;
  using StrideD = typename Kernel::InternalStrideD;
  static_assert(std::is_same_v<StrideC, StrideD>, "C strides alias the D stride array");
  // A configuration that names kMinStages keeps at least that many mainloop stages beside its
  // epilogue's shared memory (a larger epilogue subtile must not cost a stage).
  static constexpr bool kEnoughStages = [] {
    if constexpr (requires { P::Config::kMinStages; }) {
      return CollectiveMainloop::DispatchPolicy::Stages >= P::Config::kMinStages;
    } else {
      return true;
    }
  }();
  static_assert(kEnoughStages,
                "the epilogue's shared memory leaves fewer mainloop stages than Config::kMinStages");
};

template <DType kDType> struct CutlassElement;
template <> struct CutlassElement<DType::BF16> { using type = cutlass::bfloat16_t; };
template <> struct CutlassElement<DType::F16> { using type = cutlass::half_t; };
template <> struct CutlassElement<DType::F32> { using type = float; };

constexpr size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Carves the workspace: first the CUTLASS kernel's own part, then typed per-group arrays, each
// 256-byte aligned. With a null base it only adds up the bytes (total()).
class WorkspaceCarver {
 public:
  WorkspaceCarver(void* base, size_t cutlass_bytes)
      : base_(static_cast<char*>(base)), at_(align_up(cutlass_bytes, 256)) {}
  template <class T>
  T* take(int64_t count) {
    T* p = base_ ? reinterpret_cast<T*>(base_ + at_) : nullptr;
    at_ = align_up(at_ + sizeof(T) * static_cast<size_t>(count), 256);
    return p;
  }
  size_t total() const { return at_; }

 private:
  char* base_;
  size_t at_;
};

// ---- setup kernels: one block turns the device counts into per-group arrays ----
constexpr int kSetupThreads = 256;

// A group's place in the call (setup kernels): its rows m_g, its first row off_g, and its first
// tile unit (the units of the groups before it; blocked_scheduler.cuh reads them).
// row_block: the groups before it's 128-row blocks, Σ_{j<g} ⌈m_j/128⌉ — where its 1-D block scales
// start (SPEC §6b: a group's row blocks follow its predecessors'; the block-scaled FP8 group-K).
struct GroupPlace {
  int64_t m = 0, off = 0, unit = 0, row_block = 0;
};
inline constexpr int64_t kScaleBlockRows = 128;

// Rows, tile units and 128-row blocks, summed together by one scan.
struct RowsUnits {
  int64_t rows = 0, units = 0, blocks = 0;
};

// Inclusive block-wide prefix sums of one (rows, units) pair per thread (kSetupThreads threads);
// `*total` gets the block's sums. Every thread calls it. Two barriers: a caller that calls it
// again passes the other of two `warp_sums` / `total` buffers (the barriers of the call between
// separate a buffer's reads from its next writes).
__device__ inline RowsUnits block_inclusive_scan(RowsUnits v, RowsUnits* warp_sums, RowsUnits* total) {
  constexpr int kWarps = kSetupThreads / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int d = 1; d < 32; d *= 2) {
    const int64_t rows = __shfl_up_sync(0xffffffffu, v.rows, d);
    const int64_t units = __shfl_up_sync(0xffffffffu, v.units, d);
    const int64_t blocks = __shfl_up_sync(0xffffffffu, v.blocks, d);
    if (lane >= d) v.rows += rows, v.units += units, v.blocks += blocks;
  }
  if (lane == 31) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    RowsUnits w = lane < kWarps ? warp_sums[lane] : RowsUnits{};
    for (int d = 1; d < 32; d *= 2) {
      const int64_t rows = __shfl_up_sync(0xffffffffu, w.rows, d);
      const int64_t units = __shfl_up_sync(0xffffffffu, w.units, d);
      const int64_t blocks = __shfl_up_sync(0xffffffffu, w.blocks, d);
      if (lane >= d) w.rows += rows, w.units += units, w.blocks += blocks;
    }
    if (lane < kWarps) warp_sums[lane] = w;
    if (lane == kWarps - 1) *total = w;
  }
  __syncthreads();
  if (warp > 0) {
    v.rows += warp_sums[warp - 1].rows, v.units += warp_sums[warp - 1].units;
    v.blocks += warp_sums[warp - 1].blocks;
  }
  return v;
}

// Every group's place from the device counts, each read once, by the threads of one block in
// chunks of kSetupThreads groups (group g on thread g mod kSetupThreads): visit(g, place, true) for
// every group; `units_of(m)` gives a group's tile units (called for m > 0 only). Valid counts
// (SPEC §1): returns the units of all groups. Invalid ones: the reason goes to the error word (as
// block_valid_rows reports it), every group is visited again, on the same thread, with an empty
// place and false — what the GEMM after it then reads has no rows and no tiles — and it returns 0.
// (Validity needs the sum of all chunks, hence the second visit rather than a first pass.)
// `row_multiple` > 1: a count not a multiple of it is invalid too (kDeviceCountsMisaligned; the
// FP8 group-K kernels, whose groups' first rows are TMA addresses of 8-bit elements).
template <class UnitsOf, class Visit>
__device__ inline int64_t scan_groups(const DeviceCounts& c, UnitsOf units_of, Visit visit,
                                      int64_t row_multiple = 1) {
  __shared__ RowsUnits warp_sums[2][kSetupThreads / 32];
  __shared__ RowsUnits chunk_total[2];
  __shared__ uint32_t bad;
  if (threadIdx.x == 0) bad = 0;  // before any atomicOr below: the scans' barriers come between
  RowsUnits carry;
  uint32_t my_bad = 0;
  for (int64_t base = 0, chunk = 0; base < c.groups; base += kSetupThreads, chunk ^= 1) {
    const int64_t g = base + threadIdx.x;
    int64_t m = g < c.groups ? count_at(c, g) : 0;
    const uint32_t why = count_error(m, c.rows, row_multiple);
    my_bad |= why;
    if (why) m = 0;  // takes no rows: the offsets stay in range until the call is declared invalid
    const RowsUnits mine{m, m > 0 ? static_cast<int64_t>(units_of(m)) : 0,
                         (m + kScaleBlockRows - 1) / kScaleBlockRows};
    const RowsUnits upto = block_inclusive_scan(mine, warp_sums[chunk], &chunk_total[chunk]);
    if (g < c.groups) {
      visit(g,
            GroupPlace{m, carry.rows + upto.rows - mine.rows, carry.units + upto.units - mine.units,
                       carry.blocks + upto.blocks - mine.blocks},
            true);
    }
    carry.rows += chunk_total[chunk].rows;
    carry.units += chunk_total[chunk].units;
    carry.blocks += chunk_total[chunk].blocks;
  }
  if (my_bad) atomicOr(&bad, my_bad);
  __syncthreads();
  uint32_t reason = bad;
  if (reason == 0 && carry.rows > c.rows) reason = kDeviceCountsExceedRows;
  if (reason == 0) return carry.units;
  report_count_error(c, reason);
  for (int64_t g = threadIdx.x; g < c.groups; g += kSetupThreads) visit(g, GroupPlace{}, false);
  return 0;
}

// dw[g] = 0 for every group with m_g = 0, when the counts are valid (SPEC §1; invalid ones: nothing
// written — block 0's scan reports why), by blocks 1.. of the setup grid: the same 32 counts in
// every warp (block-uniform loops, no barrier), each empty group filled by all of those blocks
// with 16-byte stores (n·k·sizeof(ElementD) is a multiple of 16: k is a multiple of 8). One wave
// whatever the group count; beside block 0's setup rather than a kernel of its own after it, so
// the GEMM (which waits for the whole setup grid) waits for one grid, not two, and the host
// enqueues one launch fewer.
// `row_multiple` as scan_groups'. The group-K setup kernels' blocks after the first call it.
template <class ElementD>
__device__ void zero_empty_group_outputs(const DeviceCounts& counts, int64_t n, int64_t k, void* dw,
                                  int64_t row_multiple = 1) {
  if (block_valid_rows(counts, row_multiple) < 0) return;  // every thread: the validity is block-wide
  const int64_t vectors = n * k * static_cast<int64_t>(sizeof(ElementD)) / 16;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t first = (blockIdx.x - 1) * int64_t{kSetupThreads} + threadIdx.x;
  const int64_t stride = (int64_t{gridDim.x} - 1) * kSetupThreads;
  for (int64_t base = 0; base < counts.groups; base += 32) {
    const int64_t mine = base + lane;
    unsigned empty = __ballot_sync(0xffffffffu, mine < counts.groups && count_at(counts, mine) == 0);
    for (; empty != 0; empty &= empty - 1) {
      const int64_t g = base + __ffs(empty) - 1;
      uint4* p = reinterpret_cast<uint4*>(static_cast<ElementD*>(dw) + g * n * k);
      for (int64_t i = first; i < vectors; i += stride) p[i] = make_uint4(0, 0, 0, 0);
    }
  }
}

// ---- host side ----
// Per device: the L2 cache size (queried once; stripe_inputs, below).
inline int64_t l2_cache_bytes(int device) {
  static std::mutex mutex;
  static std::array<int64_t, 64> cache{};
  std::lock_guard<std::mutex> lock(mutex);
  int64_t& bytes = device_slot(cache, device);
  if (bytes == 0) {
    int b = 0;
    MOEKIT_CUDA_CHECK(cudaDeviceGetAttribute(&b, cudaDevAttrL2CacheSize, device));
    bytes = b;
  }
  return bytes;
}

// The stripes (blocked_scheduler.cuh) of a call, for its setup kernel: the call's width (> 0: every
// group), or -1: each group's own, the fewest estimated DRAM reads for its rows on configuration
// Config (choose_stripe, heuristics.h) with this device's clusters in flight and half its L2, the
// effective size fit to the H200's ncu DRAM reads (its L2 is two partitions; tile_units.h). 1 with
// AlongN (CUTLASS's order: the stripes need the scheduler's own path).
struct StripeInputs {
  int width = 1;  // > 0: every group's; -1: each group's estimate
  int64_t clusters = 0;
  double l2_bytes = 0;
};
template <class Config>
StripeInputs stripe_inputs(int raster, int swizzle, const cutlass::KernelHardwareInfo& hw) {
  constexpr int64_t kClusterM = decltype(cute::size<0>(typename Config::Cluster{}))::value;
  constexpr int64_t kClusterN = decltype(cute::size<1>(typename Config::Cluster{}))::value;
  if (raster == 1) return {1, 0, 0.0};
  return {swizzle > 0 ? swizzle : -1, hw.sm_count / (kClusterM * kClusterN),
          double(l2_cache_bytes(hw.device_id)) / 2.0};
}
// The bytes the epilogue of GroupedGemm G writes per output element (a fusion that stores through
// its own outputs, ElementD void: taken as one element of the inputs' type).
template <class G>
inline constexpr int64_t kOutElementBytes = [] {
  if constexpr (std::is_void_v<typename G::ElementD>) return int64_t{sizeof(typename G::Element)};
  else return int64_t{sizeof(typename G::ElementD)};
}();
// Device (setup kernels): the width of a group of `rows` x `n` output of `out_bytes` per element
// (kOutElementBytes), K deep.
template <class Config>
__device__ uint32_t group_stripe(const StripeInputs& in, int64_t rows, int64_t k, int64_t n, int64_t out_bytes) {
  if (in.width > 0) return static_cast<uint32_t>(in.width);
  StripeProblem p;
  p.rows = rows;
  p.k = k;
  p.n = n;
  p.out_bytes = out_bytes;
  p.tile_m = decltype(cute::size<0>(typename Config::Tile{}))::value;
  p.tile_n = decltype(cute::size<1>(typename Config::Tile{}))::value;
  p.cluster_m = decltype(cute::size<0>(typename Config::Cluster{}))::value;
  p.cluster_n = decltype(cute::size<1>(typename Config::Cluster{}))::value;
  p.clusters = in.clusters;
  p.l2_bytes = in.l2_bytes;
  return static_cast<uint32_t>(choose_stripe(p));
}

// Per device: SM count and how many clusters of this kernel fit at once (queried once; the
// kernel's shared-memory attribute is raised first, which the occupancy query needs).
template <class G>
cutlass::KernelHardwareInfo hardware_info(int device) {
  static std::mutex mutex;
  static std::array<cutlass::KernelHardwareInfo, 64> cache{};
  std::lock_guard<std::mutex> lock(mutex);
  auto& hw = device_slot(cache, device);
  if (hw.sm_count == 0) {
    const int sms = device_sm_count(device);
    const int smem = G::Kernel::SharedStorageSize;
    MOEKIT_CUDA_CHECK(cudaFuncSetAttribute(cutlass::device_kernel<typename G::Kernel>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    hw.device_id = device;
    hw.max_active_clusters =
        cutlass::KernelHardwareInfo::query_device_max_active_clusters<typename G::Kernel>();
    hw.sm_count = sms;
  }
  return hw;
}

// hw limited to `sms` SMs (GroupMProblem::sms; 0: all): whole clusters of `cluster` CTAs, at
// least one, and no more clusters at once than before. CUTLASS's persistent schedulers size the
// grid from these two (tile_scheduler_params.h, get_grid_shape).
inline cutlass::KernelHardwareInfo limit_sms(cutlass::KernelHardwareInfo hw, int sms, int cluster) {
  if (sms <= 0 || sms >= hw.sm_count) return hw;
  hw.sm_count = std::max(cluster, sms / cluster * cluster);
  if (hw.max_active_clusters > 0) hw.max_active_clusters = std::min(hw.max_active_clusters, hw.sm_count / cluster);
  return hw;
}

inline void check_status(cutlass::Status s, const char* what, const char* config) {
  if (s != cutlass::Status::kSuccess) {
    throw_error(ErrorKind::Runtime, str("sm90 grouped GEMM (", config, "): ", what, " failed: ",
                                        cutlassGetStatusString(s)));
  }
}


// A kernel's Params depend only on the key below: everything per call — counts, data pointers —
// reaches the kernel through the arrays the setup kernel writes into the workspace. A
// stream-ordered allocator usually hands back the same workspace, so the Params (with their
// host-encoded TMA descriptors) are cached: a repeated call costs the kernel launches, not a
// CUTLASS initialize(). `variant` holds what else the Params bake in (bias or not, beta).
struct ParamsKey {
  int device = -1;
  int64_t groups = 0;
  int64_t n = 0, k = 0;  // the fused epilogues' arguments depend on n (leading dimensions, tiles)
  void* workspace = nullptr;
  int variant = 0;
  int raster = 0, swizzle = 0;
  int k_order = 0;
  int sm_count = 0;  // the grid's SMs (limit_sms)
  bool operator==(const ParamsKey&) const = default;
};

template <class Gemm>
typename Gemm::Params cached_params(const ParamsKey& key, const typename Gemm::Arguments& args,
                                    void* workspace, cudaStream_t stream, const char* name) {
  static std::mutex mutex;
  static std::array<std::pair<ParamsKey, typename Gemm::Params>, 4> cache{};
  static size_t next = 0;
  std::lock_guard<std::mutex> lock(mutex);
  auto hit = std::find_if(cache.begin(), cache.end(), [&](const auto& e) { return e.first == key; });
  if (hit != cache.end()) return hit->second;
  Gemm gemm;
  check_status(gemm.can_implement(args), "can_implement", name);
  // initialize() encodes the TMA descriptors and sets the kernel's shared-memory attribute; the
  // CUTLASS part of the workspace needs no clearing for these kernels (no split-K).
  check_status(gemm.initialize(args, workspace, stream), "initialize", name);
  cache[next++ % cache.size()] = {key, gemm.params()};
  return gemm.params();
}

// The host side of one grouped-kernel call, shared by group-M and group-K: the device, its
// hardware info, and the workspace carved into [CUTLASS's part | the kernel's per-group Arrays]
// (a null workspace only sizes it: bytes). make_arguments<G>(problem, arrays, hw) is the kernel
// header's (found by argument-dependent lookup on Problem).
template <class G, class Arrays, class Problem>
struct GroupedCall {
  int device = 0;
  cutlass::KernelHardwareInfo hw;
  Arrays arrays{};
  size_t bytes = 0;

  // The persistent grid's hardware for p on the current device (SMs less p.sms's margin).
  static cutlass::KernelHardwareInfo hardware(const Problem& p, int* device_out = nullptr) {
    int device = 0;
    MOEKIT_CUDA_CHECK(cudaGetDevice(&device));
    if (device_out != nullptr) *device_out = device;
    using Cluster = typename G::Config::Cluster;
    return limit_sms(hardware_info<G>(device), p.sms,
                     cute::size<0>(Cluster{}) * cute::size<1>(Cluster{}) * cute::size<2>(Cluster{}));
  }

  GroupedCall(const Problem& p, void* workspace) {
    hw = hardware(p, &device);
    WorkspaceCarver w(workspace, G::Gemm::get_workspace_size(make_arguments<G>(p, Arrays{}, hw)));
    arrays = Arrays::carve(w, p);
    bytes = w.total();
  }

  // The grouped GEMM's Params, cached under `variant` (what else they bake in: bias or not, beta)
  // and the tile order. Before the setup kernel: it builds the groups' TMA descriptors from the
  // templates in them (templates_of).
  typename G::Gemm::Params gemm_params(const Problem& p, void* workspace, cudaStream_t stream,
                                       const char* name, int variant, int raster = 0, int swizzle = 1) const {
    const ParamsKey key{device,  p.counts.groups, p.n,     p.k,       workspace,
                        variant, raster,          swizzle, p.k_order, hw.sm_count};
    return cached_params<typename G::Gemm>(key, make_arguments<G>(p, arrays, hw), workspace, stream, name);
  }
  // Launches it, after the setup kernel filled `arrays`: what GemmUniversalAdapter::run does
  // (its grid, block, shared memory and cluster), through launch_kernel.
  void run_gemm(const typename G::Gemm::Params& params, const Problem& p, cudaStream_t stream,
                const char* name) const {
    using Cluster = typename G::Config::Cluster;
    LaunchShape shape;
    shape.name = name;
    shape.grid = G::Gemm::get_grid_shape(params);
    shape.block = G::Kernel::get_block_shape();
    shape.smem = static_cast<size_t>(G::Kernel::SharedStorageSize);
    shape.cluster = dim3(cute::size<0>(Cluster{}), cute::size<1>(Cluster{}), cute::size<2>(Cluster{}));
    // Programmatic dependent launch (p.pdl == 1): the GEMM's CTAs may be scheduled while the
    // setup kernel still runs; every thread waits for it to complete,
    // its writes visible, before the first read (GridDependencyWait, blocked_scheduler.cuh).
    shape.programmatic = p.pdl == 1;
    launch_kernel(cutlass::device_kernel<typename G::Kernel>, shape, stream, params);
  }
};

// make_arguments passes the slots for the setup kernel's descriptors, or null for CUTLASS's path
// (prebuilt_tensormaps_setting, device/grouped_gemm_sm90.h).
inline const cute::TmaDescriptor* tensormap_slots(cute::TmaDescriptor* slots) {
  return prebuilt_tensormaps_setting() ? slots : nullptr;
}

// What a setup kernel needs of the Params to build the groups' descriptors
// (build_group_tensormaps, prebuilt_tensormaps.cuh): the collectives' templates and arrays.
template <class G>
struct TensormapTemplates {
  typename G::Kernel::CollectiveMainloop::Params mainloop;
  typename G::Kernel::CollectiveEpilogue::Params epilogue;
};
template <class G>
TensormapTemplates<G> templates_of(const typename G::Gemm::Params& params) {
  return {params.mainloop, params.epilogue};
}
// In a setup kernel, after its per-group arrays are written (one block, kSetupThreads threads).
template <class G>
__device__ void build_tensormaps(const TensormapTemplates<G>& t, int64_t groups, const typename G::Shape3* shapes) {
  __shared__ alignas(128) cute::TmaDescriptor staging[kSetupThreads];
  __syncthreads();  // the arrays written by other threads of the block
  build_group_tensormaps<typename G::Kernel>(t.mainloop, t.epilogue, groups,
                                             [&](int64_t g) { return shapes[g]; }, staging);
}

}  // namespace moekit::cuda::sm90
