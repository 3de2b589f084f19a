// Internal: a tile order for grouped GEMMs whose groups have fewer tiles than the persistent grid
// has CTAs (design/PERFORMANCE.md, small_E64). CUTLASS's group scheduler hands a CTA every
// grid-th tile; with fewer tiles per group than CTAs, nearly every tile a CTA takes lies in
// another group than its last, and the ptr-array kernels rewrite and fence their TMA descriptors
// (A and B in the producer, D in the epilogue) before each such tile. In the blocked order each
// cluster takes one contiguous range of the tile sequence instead (the same sequence: groups in
// order, a group's tiles as CUTLASS's AlongM raster orders them), so a CTA changes group about
// once per range. Ranges are balanced to ±1 cluster unit.
// Measured on the H200 (bench/results/2026-11-30-nvidia-h200-d0b4c76-summary.md): group-K with
// one K block per tile (small_E64 wgrad) 168 -> 135.5 µs; but group-M 0.64-0.83x, since the CTAs
// in flight then work far apart in the sequence and stop sharing operand tiles in L2. So it is
// automatic for group-K only (group_k_blocked); group-M takes it only when forced.
//
// How it plugs in (CUTLASS 4.2): the ptr-array kernels run their scheduler warp only for the
// `GroupScheduler` tag and pick the scheduler class through `TileSchedulerSelector<GroupScheduler,
// Sm90, Tile, Cluster, Stages, ProblemShape>`. The kernels built with `BlockedGroupProblemShape`
// (a GroupProblemShape with one more field) get `BlockedGroupScheduler` from the specialisation
// below; `blocked = 0` leaves every decision to CUTLASS's scheduler (its base class).
// Blocked mode needs the AlongM raster, no swizzle and a cluster of 1 along M (checked on the
// host, run_gemm; the device falls back to the base order otherwise).
#pragma once

#include <cstdint>

#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"  // the schedulers with what they need (pipelines)

namespace moekit::cuda::sm90 {

template <class Underlying>
struct BlockedGroupProblemShape : cutlass::gemm::GroupProblemShape<Underlying> {
  int32_t blocked = 0;  // 1: each cluster takes a contiguous range of the tile sequence
};

// Host: the tiles CUTLASS counts for one group of an m x n output on configuration Config (N
// tiles rounded up to the cluster), and whether a call takes the blocked order: `order` 1 / 0
// forces it / CUTLASS's (GroupMProblem::order, GroupKProblem::order), -1 chooses it when a group
// has fewer tiles than the persistent grid has CTAs. The blocked order needs CUTLASS's default
// tile order around it (AlongM raster, no swizzle: `default_raster`).
template <class Config>
int64_t tiles_per_group(int64_t m, int64_t n) {
  constexpr int64_t kTileM = decltype(cute::size<0>(typename Config::Tile{}))::value;
  constexpr int64_t kTileN = decltype(cute::size<1>(typename Config::Tile{}))::value;
  constexpr int64_t kClusterN = decltype(cute::size<1>(typename Config::Cluster{}))::value;
  return (m + kTileM - 1) / kTileM * (((n + kTileN - 1) / kTileN + kClusterN - 1) / kClusterN * kClusterN);
}
inline bool blocked_order(int order, bool default_raster, int64_t tiles, int sm_count) {
  if (!default_raster) return false;
  return order >= 0 ? order == 1 : tiles < sm_count;
}

template <class Shape, int kStages>
class BlockedGroupScheduler
    : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<Shape, kStages> {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<Shape, kStages>;

 public:
  using typename Base::Params;
  using typename Base::SchedulerResponse;
  using typename Base::WorkTileInfo;

  BlockedGroupScheduler() = default;

  CUTLASS_DEVICE BlockedGroupScheduler(Params const& params, SchedulerResponse* response)
      : Base(params, response) {
#if defined(__CUDA_ARCH__)
    blocked_ = params.problem_shapes_.blocked != 0 && params.log_swizzle_size_ == 0 &&
               params.raster_order_ == Base::RasterOrder::AlongM && params.cluster_shape_.m() == 1;
    if (!blocked_) return;
    cluster_n_ = static_cast<uint32_t>(params.cluster_shape_.n());
    // This CTA's cluster and its place in it (AlongM: the cluster's CTAs are consecutive in y).
    const uint32_t linear = blockIdx.x * gridDim.y + blockIdx.y;
    const uint64_t clusters = uint64_t(gridDim.x) * gridDim.y * gridDim.z / cluster_n_;
    const uint64_t cluster = linear / cluster_n_;
    n_offset_ = linear % cluster_n_;
    const uint64_t total = total_units();
    unit_ = static_cast<uint32_t>(cluster * total / clusters);
    end_ = static_cast<uint32_t>((cluster + 1) * total / clusters);
    group_units(0, group_size_, group_blocks_m_);
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
    unit_ += advance_count;
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
  // Cluster units (a 1 x cluster_n block of tiles) of group g: its tiles as CUTLASS counts them,
  // the N tiles rounded up to the cluster.
  // (32-bit: a group's tiles are < 2^31, and the scheduler warp runs in the producer warpgroup's
  // 40 registers.)
  CUTLASS_DEVICE void group_units(int g, uint32_t& units, uint32_t& blocks_m) const {
    const auto shape = this->scheduler_params.problem_shapes_.get_problem_shape(g);
    const auto m = static_cast<uint32_t>(cute::get<0>(shape));
    const auto n = static_cast<uint32_t>(cute::get<1>(shape));
    const auto tm = static_cast<uint32_t>(this->scheduler_params.cta_shape_.m());
    const auto tn = static_cast<uint32_t>(this->scheduler_params.cta_shape_.n());
    blocks_m = (m + tm - 1) / tm;
    const uint32_t blocks_n = (n + tn - 1) / tn;
    units = blocks_m * ((blocks_n + cluster_n_ - 1) / cluster_n_);
  }

  // Σ over groups of their units (every thread, once: the groups' shapes are read from global
  // memory by each thread of the CTA; G is the number of experts on the rank).
  CUTLASS_DEVICE uint64_t total_units() const {
    uint64_t total = 0;
    uint32_t units = 0, blocks_m = 0;
    const int groups = this->scheduler_params.problem_shapes_.groups();
    for (int g = 0; g < groups; ++g) {
      group_units(g, units, blocks_m);
      total += units;
    }
    return total;
  }

  // The tile of unit_ (invalid past this cluster's range): walk the groups forward from the
  // current one (units only grow, so each group is visited once per thread).
  CUTLASS_DEVICE WorkTileInfo work_for_unit() {
    if (unit_ >= end_) return WorkTileInfo::invalid_work_tile();
    const int groups = this->scheduler_params.problem_shapes_.groups();
    // group_size_ and group_blocks_m_ are group_'s (loaded in the constructor, then here).
    while (unit_ >= group_start_ + group_size_) {
      group_start_ += group_size_;
      if (++group_ >= groups) return WorkTileInfo::invalid_work_tile();
      group_units(group_, group_size_, group_blocks_m_);
    }
    // AlongM inside the group, as CUTLASS: M fastest, then the cluster's N block.
    const uint32_t v = unit_ - group_start_;
    const auto m = static_cast<int32_t>(v % group_blocks_m_);
    const auto n = static_cast<int32_t>((v / group_blocks_m_) * cluster_n_ + n_offset_);
    return {m, n, group_, 1};
  }

  bool blocked_ = false;
  uint32_t cluster_n_ = 1, n_offset_ = 0;
  uint32_t unit_ = 0, end_ = 0;                                // this cluster's range of units
  int group_ = 0;                                              // the group of unit_ (or before it)
  uint32_t group_start_ = 0, group_size_ = 0, group_blocks_m_ = 1;
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
