// Internal: the order in which a CTA's tiles walk K — forward always, or alternating (a CTA's
// odd-numbered tiles walk K backwards).
//
// Why (design/PERFORMANCE.md, "The K walk"): the persistent kernels run in waves — a CTA's i-th
// tile runs while the other CTAs run theirs — and the wave after shares operand rows with the
// wave before (the stripes put a wave's successor in the same columns). Walking K forward in
// every wave, each wave starts on the K blocks the wave before read first, which the L2 (an LRU
// of ~25 MB effective) evicted long ago, and evicts what it could have used as it goes; walking it
// backwards in every other wave, a wave starts on what the wave before read last, still in the L2.
// Off by default (heuristics.h, kKOrder: it was no faster); the study override turns it on.
//
// Bits: the fp32 accumulation order of a tile follows its walk, so the result depends on the
// wave a tile falls in (the persistent grid: the device's SM count and the configuration), as it
// already depends on the configuration. The same call on the same device gives the same bits.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

namespace moekit::cuda::sm90 {

// The K-tile coordinates of a backward walk: from `last` down (what CUTLASS's coordinate
// iterator gives the mainloop's load forward: a dereference and a pre-increment).
struct BackwardKTiles {
  int k;
  CUTLASS_DEVICE int operator*() const { return k; }
  CUTLASS_DEVICE BackwardKTiles& operator++() {
    --k;
    return *this;
  }
};

// The mainloop collective `Base` (CUTLASS's ptr-array MainloopSm90ArrayTmaGmmaWarpSpecialized,
// or a collective derived from it) with the walk chosen per call: Params::alternate_k, from the
// problem shape (BlockedGroupProblemShape::alternate_k). Only the producer's loads change; the
// consumers take the stages in the order they arrive. The CTAs of a cluster take the same tiles,
// so they walk the same way (the multicast loads stay paired).
template <class Base>
struct KOrderMainloop : Base {
  struct Params : Base::Params {
    bool alternate_k = false;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shapes,
                                        typename Base::Arguments const& args, void* workspace) {
    Params p;
    static_cast<typename Base::Params&>(p) =
        Base::to_underlying_arguments(problem_shapes, args, workspace);
    p.alternate_k = problem_shapes.alternate_k;
    return p;
  }

  // The kernel's producer warp calls this once per tile it takes, in order.
  template <class Pipeline, class PipelineState, class LoadInputs, class TensorMaps,
            class BlockCoord, class KTileIterator, class TensorStorage>
  CUTLASS_DEVICE void load(Params const& params, Pipeline pipeline, PipelineState state,
                           LoadInputs const& inputs, TensorMaps const& tensormaps,
                           BlockCoord const& blk_coord, KTileIterator k_tile_iter, int k_tile_count,
                           int thread_idx, uint32_t block_rank_in_cluster, TensorStorage& storage) {
    const bool backward = params.alternate_k && (tiles_taken_ & 1u) != 0;
    ++tiles_taken_;
    if (backward && k_tile_count > 0) {
      const BackwardKTiles last{static_cast<int>(*k_tile_iter) + k_tile_count - 1};
      Base::load(params, pipeline, state, inputs, tensormaps, blk_coord, last, k_tile_count,
                 thread_idx, block_rank_in_cluster, storage);
    } else {
      Base::load(params, pipeline, state, inputs, tensormaps, blk_coord, k_tile_iter, k_tile_count,
                 thread_idx, block_rank_in_cluster, storage);
    }
  }

 private:
  uint32_t tiles_taken_ = 0;  // by this thread's CTA so far (a per-thread local of the kernel)
};

}  // namespace moekit::cuda::sm90
