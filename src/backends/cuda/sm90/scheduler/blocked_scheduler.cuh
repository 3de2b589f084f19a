// Internal: a tile order for grouped GEMMs whose groups have fewer tiles than the persistent grid
// has CTAs (design/PERFORMANCE.md, small_E64). CUTLASS's group scheduler hands a CTA every
// grid-th tile; with fewer tiles per group than CTAs, nearly every tile a CTA takes lies in
// another group than its last, and the ptr-array kernels rewrite and fence their TMA descriptors
// (A and B in the producer, D in the epilogue) before each such tile. In the blocked order each
// cluster takes one contiguous range of the tile sequence instead (the same sequence: groups in
// order, a group's tiles as CUTLASS's AlongM raster orders them), so a CTA changes group about
// once per range. Ranges are balanced to ±1 cluster unit.
// It helps group-K with one K block per tile and loses on group-M, whose CTAs in flight then
// work far apart in the sequence and stop sharing operand tiles in L2; the chunked orders (below)
// are the middle way. Which call takes which order: heuristics.h (tile orders).
//
// How it plugs in (CUTLASS 4.2): the ptr-array kernels run their scheduler warp only for the
// `GroupScheduler` tag and pick the scheduler class through `TileSchedulerSelector<GroupScheduler,
// Sm90, Tile, Cluster, Stages, ProblemShape>`. The kernels built with `BlockedGroupProblemShape`
// (a GroupProblemShape with one more field) get `BlockedGroupScheduler` from the specialisation
// below; `order = 0` leaves every decision to CUTLASS's scheduler (its base class).
// The other orders and the stripes need the AlongM raster and no CUTLASS swizzle (set_raster; the
// device falls back to the base order otherwise); clusters of any shape (tile_units.h: a unit is
// one cluster's tiles).
#pragma once

#include <cstdint>

#include "backends/cuda/sm90/device/launch.cuh"  // wait_for_prior_grid
#include "backends/cuda/sm90/heuristics.h"  // group_k_auto_order
#include "backends/cuda/sm90/scheduler/tile_units.h"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"  // the schedulers with what they need (pipelines)

namespace moekit::cuda::sm90 {

// The tile order of a call (the resolved GroupMProblem::order / GroupKProblem::order): 0
// CUTLASS's, 1 blocked, c >= 2 chunks of c (UnitCursor, tile_units.h, says which units a cluster
// takes in each). In the chunked orders a CTA changes group about once per c units, while the
// clusters in flight still work on neighbouring tiles (the L2 sharing that the blocked order
// loses on group-M problems).
// unit_starts [groups + 1] (device, written by the call's setup kernel: scan_groups): the
// first unit of each group in the sequence, and the total last. The scheduler's own path (an
// order other than CUTLASS's, or stripes) reads it: the total in one load, and a unit's group by
// binary search, where walking the groups' shapes cost every thread O(groups) dependent loads at
// the start of the kernel.
// stripes [groups] (device, written by the setup kernel: group_stripe, kernel_common.cuh): a
// group's units in stripes of its width in cluster units across N, N fastest inside a stripe (1:
// M fastest over the whole group, CUTLASS's AlongM). This is the swizzle CUTLASS's group
// scheduler means by max_swizzle_size, which it cannot apply: without host problem shapes it
// sizes the swizzle from its grid (sm_count x 1 blocks), so 4 and 8 fall back to 1 or 2. The
// stripes cut the operand rows each wave of clusters reads (unit_tile, tile_units.h).
template <class Underlying>
struct BlockedGroupProblemShape : cutlass::gemm::GroupProblemShape<Underlying> {
  int32_t order = 0;
  const uint32_t* stripes = nullptr;  // [groups] each group's width (setup kernel); null: all 1
  const uint32_t* unit_starts = nullptr;
  // [groups] the group at each place of the unit sequence (the group-K setup kernel lays the groups
  // out largest first with the snake order: heavy_first); null: places are groups (group order).
  // unit_starts is then indexed by place.
  const uint32_t* slot_groups = nullptr;
  // [groups x kGroupTensormaps] every group's TMA descriptors, built by the setup kernel
  // (prebuilt_tensormaps.cuh); the collectives' Params take it from here.
  const cute::TmaDescriptor* tensormaps = nullptr;
  // A CTA's odd-numbered tiles walk K backwards (k_order.cuh; GroupMProblem::k_order).
  bool alternate_k = false;
};

// Cluster units (cluster_m x cluster_n blocks of tiles) of an m x n output (host and setup kernels).
template <class Config>
CUTLASS_HOST_DEVICE int64_t units_per_group(int64_t m, int64_t n) {
  constexpr int64_t kTileM = decltype(cute::size<0>(typename Config::Tile{}))::value;
  constexpr int64_t kTileN = decltype(cute::size<1>(typename Config::Tile{}))::value;
  constexpr int64_t kClusterM = decltype(cute::size<0>(typename Config::Cluster{}))::value;
  constexpr int64_t kClusterN = decltype(cute::size<1>(typename Config::Cluster{}))::value;
  return units_of((m + kTileM - 1) / kTileM, kClusterM) *
         units_of((n + kTileN - 1) / kTileN, kClusterN);
}
template <class Config>
int64_t tiles_per_group(int64_t m, int64_t n) {
  return units_per_group<Config>(m, n) * decltype(cute::size(typename Config::Cluster{}))::value;
}
// Host: the order a call takes: `order` >= 0 or kSnakeOrder as forced (the study override), -1
// the automatic one (heuristics.h, group_k_auto_order); orders other than CUTLASS's need the AlongM
// raster around them (`default_raster`; stripes combine with any order).
inline int tile_order(int order, bool default_raster, int64_t tiles, int sm_count) {
  if (!default_raster) return 0;
  if (order >= 0 || order == kSnakeOrder) return order;
  return group_k_auto_order(tiles, sm_count);
}

// Host: a call's raster (0: AlongM, 1: AlongN) and swizzle into its GEMM arguments. With AlongM and
// a swizzle other than 1 (-1: automatic, or 2, 4, 8) the groups' widths the setup kernel wrote
// (`stripes`) go to this scheduler, CUTLASS's own swizzle off; with AlongN, CUTLASS's swizzle
// (which its grid caps at 2: see `stripes` above).
template <class Arguments>
void set_raster(Arguments& args, int raster, int swizzle, const uint32_t* stripes) {
  using Order = decltype(args.scheduler.raster_order);
  args.scheduler.raster_order = raster == 1 ? Order::AlongN : Order::AlongM;
  args.scheduler.max_swizzle_size = raster == 1 && swizzle > 1 ? swizzle : 1;
  args.problem_shape.stripes = raster == 1 || swizzle == 1 ? nullptr : stripes;
}

// The first thing every thread of the grouped kernels does is construct the tile scheduler
// (CUTLASS 4.2, sm90_gemm_array_tma_warpspecialized_{pingpong,cooperative}.hpp), and CUTLASS's
// group scheduler reads the per-group shapes the setup kernel wrote. A base class constructed
// before it waits for the grid this one depends on (griddepcontrol.wait: a no-op unless the
// kernel was launched with programmatic dependent launch, run_gemm), so the setup kernel's
// writes are visible before anything reads them. (The ptr-array kernels of CUTLASS 4.2 do not
// wait themselves.)
struct GridDependencyWait {
  CUTLASS_HOST_DEVICE GridDependencyWait() { wait_for_prior_grid(); }
};

template <class Shape, int kStages>
class BlockedGroupScheduler
    : private GridDependencyWait,  // first: before the base reads the group shapes
      public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<Shape, kStages> {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<Shape, kStages>;

 public:
  using typename Base::Params;
  using typename Base::SchedulerResponse;
  using typename Base::WorkTileInfo;

  BlockedGroupScheduler() = default;

  CUTLASS_DEVICE BlockedGroupScheduler(Params const& params, SchedulerResponse* response)
      : Base(params, response) {
#if defined(__CUDA_ARCH__)
    const int32_t order = params.problem_shapes_.order;
    stripes_ = params.problem_shapes_.stripes;
    blocked_ = (order != 0 || stripes_ != nullptr) && params.log_swizzle_size_ == 0 &&
               params.raster_order_ == Base::RasterOrder::AlongM;
    if (!blocked_) return;
    cluster_m_ = static_cast<uint32_t>(params.cluster_shape_.m());
    cluster_n_ = static_cast<uint32_t>(params.cluster_shape_.n());
    // This CTA's cluster and its place in it (AlongM: grid (clusters x cluster_m, cluster_n)).
    place_ = cta_place(blockIdx.x, blockIdx.y, cluster_m_);
    const uint64_t clusters = uint64_t(gridDim.x) / cluster_m_;
    starts_ = params.problem_shapes_.unit_starts;
    slot_groups_ = params.problem_shapes_.slot_groups;
    groups_ = params.problem_shapes_.groups();
    units_ = UnitCursor(order, place_.cluster, clusters, starts_[groups_]);
    group_ = -1;  // none yet: work_for_unit searches
#endif
  }

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape cluster_shape) {
    if (!blocked_) return Base::initial_work_tile_info(cluster_shape);
    return work_for_unit();
  }

  template <class Pipeline, class PipelineState>
  CUTLASS_DEVICE auto advance_to_next_work(Pipeline& pipeline, PipelineState state,
                                           uint32_t advance_count = 1) {
    if (!blocked_) return Base::advance_to_next_work(pipeline, state, advance_count);
    for (uint32_t i = 0; i < advance_count; ++i) units_.advance();
    const WorkTileInfo work = work_for_unit();
    // As CUTLASS's scheduler: one lane publishes the tile to the consumers' pipeline.
    pipeline.producer_acquire(state);
    if (cute::elect_one_sync()) {
      this->response_ptr_[state.index()] = work;
      cutlass::arch::fence_view_async_shared();
      pipeline.producer_commit(state);
    }
    return cute::make_tuple(work, true);
  }

 private:
  // Makes group_ the place of the current unit (< the total) in the sequence: the next place when
  // the unit lies there (the blocked order's common step), else a binary search over the places
  // after the current one (units only grow): the last p with starts_[p] <= the unit, which never
  // holds an empty group. Then its group (slot_groups_, or the place itself) and the group's M
  // units and N units, from its shape. (32-bit: the scheduler warp runs in the producer
  // warpgroup's 40 registers.)
  CUTLASS_DEVICE void find_group() {
    const uint32_t unit = units_.unit;
    int lo = group_ + 1, hi = groups_ - 1;
    if (lo < hi && starts_[lo + 1] > unit) hi = lo;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (starts_[mid] <= unit) lo = mid; else hi = mid - 1;
    }
    group_ = lo;
    group_id_ = slot_groups_ != nullptr ? static_cast<int>(slot_groups_[lo]) : lo;
    group_start_ = starts_[lo];
    group_end_ = starts_[lo + 1];
    const auto m = static_cast<uint32_t>(
        cute::get<0>(this->scheduler_params.problem_shapes_.get_problem_shape(group_id_)));
    const auto tm = static_cast<uint32_t>(this->scheduler_params.cta_shape_.m());
    group_units_m_ = units_of<uint32_t>((m + tm - 1) / tm, cluster_m_);
    group_units_n_ = (group_end_ - group_start_) / group_units_m_;
    stripe_ = stripes_ != nullptr ? stripes_[group_id_] : 1u;
  }

  // This CTA's tile of the current unit (invalid past this cluster's units).
  CUTLASS_DEVICE WorkTileInfo work_for_unit() {
    if (!units_.valid()) return WorkTileInfo::invalid_work_tile();
    if (group_ < 0 || units_.unit >= group_end_) find_group();
    const UnitTile u = unit_tile(units_.unit - group_start_, group_units_m_, group_units_n_, stripe_);
    const UnitTile t = cta_tile(u, place_, cluster_m_, cluster_n_);
    return {static_cast<int32_t>(t.m), static_cast<int32_t>(t.n), group_id_, 1};
  }

  bool blocked_ = false;  // an order other than CUTLASS's
  uint32_t cluster_m_ = 1, cluster_n_ = 1;
  CtaPlace place_;                    // this CTA's cluster and offsets in it
  UnitCursor units_;                  // this cluster's units (tile_units.h)
  const uint32_t* starts_ = nullptr;  // BlockedGroupProblemShape::unit_starts
  int groups_ = 0;
  const uint32_t* slot_groups_ = nullptr;  // BlockedGroupProblemShape::slot_groups
  int group_ = -1;                    // the place of the last unit looked up (-1: none yet)
  int group_id_ = -1;                 // the group at that place
  uint32_t group_start_ = 0, group_end_ = 0;  // its units in the sequence
  uint32_t group_units_m_ = 1, group_units_n_ = 1;  // its M and N units (cluster_m_, cluster_n_ blocks)
  const uint32_t* stripes_ = nullptr;  // BlockedGroupProblemShape::stripes
  uint32_t stripe_ = 1;                 // the group's width
};

}  // namespace moekit::cuda::sm90

namespace cutlass::gemm::kernel::detail {

// Kernels whose problem shape is a BlockedGroupProblemShape get the blocked scheduler.
template <class TileShape, class ClusterShape, uint32_t kStages, class Underlying>
struct TileSchedulerSelector<GroupScheduler, arch::Sm90, TileShape, ClusterShape, kStages,
                             ::moekit::cuda::sm90::BlockedGroupProblemShape<Underlying>> {
  using Scheduler =
      ::moekit::cuda::sm90::BlockedGroupScheduler<::moekit::cuda::sm90::BlockedGroupProblemShape<Underlying>,
                                                  static_cast<int>(kStages)>;
};

}  // namespace cutlass::gemm::kernel::detail
