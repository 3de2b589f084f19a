// Internal: moekit's consumer loop for CUTLASS's block-scaled FP8 mainloop (fp8-block:
// MainloopSm90ArrayTmaGmmaWarpSpecializedBlockwise), replacing the collective's mma() and
// mma_tail(); the producer (load) and everything else stay CUTLASS's.
//
// Why (design/ARCHITECTURE.md, "racecheck and the block-scaled GEMMs"): every consumer thread
// reads a stage's scale factors from shared memory (LDS, into registers), but a stage goes back to
// the producer — whose cp.async refills those scales — by ONE thread per warpgroup's
// mbarrier arrive. Nothing orders the other 127 threads' reads before that arrive (a .sync.aligned
// wgmma wait is no barrier between warps), so compute-sanitizer's racecheck reports each refill as
// a WAR hazard. Here a warpgroup barrier (bar.sync over its 128 threads) precedes every release:
// each thread's reads of the stage come before its arrival at the barrier, the release after.
//
// The loop (one K tile = one 128-deep scale block, ScalePromotionInterval 4: the finest
// granularity, the only one moekit instantiates): wait for the stage; its scales into registers;
// the tile's wgmma batch into zeroed partial accumulators; release the PREVIOUS stage behind the
// warpgroup barrier while this batch runs (its MMAs were waited for last iteration, its scales
// read then); fold the per-tile scale into the per-row ones; wait for the batch; accumulators +=
// partials · scales. mma_tail releases the last stage behind the same barrier. The arithmetic is
// CUTLASS's loop's (the same MMAs, the same FFMA promotion per tile); the accumulators are
// cleared before the first tile instead of being read uninitialised (0 + p·s = p·s).
#pragma once

#include <cute/tensor.hpp>

#include "cutlass/arch/barrier.h"
#include "cutlass/gemm/collective/collective_mma.hpp"
#include "cutlass/gemm/collective/fp8_accumulation.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"

namespace moekit::cuda::sm90 {

template <class Base>
struct BlockwiseConsumer : Base {
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::TensorStorage;
  using typename Base::TiledMma;
  using ElementScale = typename Base::ElementBlockScale;
  static_assert(Base::ScalePromotionInterval == 4,
                "one promotion per K tile: the tile's K extent is the scale block's");

  // NamedBarrier user ids (past CUTLASS's reserved ones): one per consumer warpgroup, past the 0
  // and 1 of GroupKOwnKernel's D staging.
  static constexpr uint32_t kFirstBarrier = 2;

  CUTLASS_DEVICE static void release_after_warpgroup(MainloopPipeline& pipeline,
                                                     PipelineState stage) {
    const uint32_t consumer = static_cast<uint32_t>(cutlass::canonical_warp_group_idx()) - 1u;
    cutlass::arch::NamedBarrier::sync(cutlass::NumThreadsPerWarpGroup, kFirstBarrier + consumer);
    pipeline.consumer_release(stage);
  }

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared,
                          Params const& /*params*/) {
    using namespace cute;
    using SmemLayoutSFA = typename Base::SmemLayoutSFA;
    using SmemLayoutSFB = typename Base::SmemLayoutSFB;
    using TileShape = typename Base::TileShape;
    Tensor sA = make_tensor(make_smem_ptr(shared.smem_A.data()), typename Base::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared.smem_B.data()), typename Base::SmemLayoutB{});
    // A stage's scales as (BLK_M, BLK_N, (scale K, stage)) views: A's broadcast over N, B's over M,
    // so each thread's partition of them lines up with its accumulators.
    Tensor sSFA = make_tensor(
        make_smem_ptr(shared.smem_SFA.data()),
        make_layout(
            make_shape(shape<0>(SmemLayoutSFA{}), get<1>(TileShape{}),
                       make_shape(shape<1>(SmemLayoutSFA{}), shape<2>(SmemLayoutSFA{}))),
            make_stride(stride<0>(SmemLayoutSFA{}), _0{},
                        make_stride(stride<1>(SmemLayoutSFA{}), stride<2>(SmemLayoutSFA{})))));
    Tensor sSFB = make_tensor(
        make_smem_ptr(shared.smem_SFB.data()),
        make_layout(
            make_shape(get<0>(TileShape{}), shape<0>(SmemLayoutSFB{}),
                       make_shape(shape<1>(SmemLayoutSFB{}), shape<2>(SmemLayoutSFB{}))),
            make_stride(_0{}, stride<0>(SmemLayoutSFB{}),
                        make_stride(stride<1>(SmemLayoutSFB{}), stride<2>(SmemLayoutSFB{})))));

    TiledMma tiled_mma;
    constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    const int warp_group = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    auto wg_mma = tiled_mma.get_slice(
        make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{})(warp_group));
    Tensor tCrA = wg_mma.make_fragment_A(wg_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE)
    Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, PIPE)
    Tensor tCsSFA = tiled_mma.get_slice(thread_idx).partition_C(sSFA);
    Tensor tCsSFB = tiled_mma.get_slice(thread_idx).partition_C(sSFB);
    Tensor rSFA = make_tensor_like<ElementScale>(tCsSFA(_, _, _, _0{}));  // (MMA, MMA_M, MMA_N)
    Tensor rSFB = make_tensor_like<ElementScale>(tCsSFB(_, _, _, _0{}));

    cutlass::gemm::collective::GmmaFP8Accumulation partial(accum, Base::ScalePromotionInterval,
                                                           size<2>(tCrA));
    clear(accum);
    constexpr bool kRowsA = Base::ScaleMsPerTile > 1, kColsB = Base::ScaleNsPerTile > 1;
    PipelineState previous = read;
    auto token = pipeline.consumer_try_wait(read);
    for (int k = 0; k < k_tile_count; ++k) {
      pipeline.consumer_wait(read, token);
      const int stage = read.index();
      copy(tCsSFA(_, _, _, make_coord(_0{}, stage)), rSFA);
      copy(tCsSFB(_, _, _, make_coord(_0{}, stage)), rSFB);
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;  // a tile's partial sums start at zero
      warpgroup_fence_operand(partial());
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        cute::gemm(tiled_mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), partial());
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(partial());
      if (k > 0) {  // the previous stage: its MMAs done and its scales read, by every thread
        release_after_warpgroup(pipeline, previous);
        ++previous;
      }
      // One scale per tile on a side folds into the other side's (or both, when both are).
      if constexpr (!kRowsA && !kColsB) {
        rSFA(_0{}) = rSFA(_0{}) * rSFB(_0{});
      } else if constexpr (kRowsA && !kColsB) {
        const ElementScale sb = rSFB(_0{});
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(filter_zeros(rSFA)); ++i)
          filter_zeros(rSFA)(i) = filter_zeros(rSFA)(i) * sb;
      } else if constexpr (!kRowsA && kColsB) {
        const ElementScale sa = rSFA(_0{});
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(filter_zeros(rSFB)); ++i)
          filter_zeros(rSFB)(i) = filter_zeros(rSFB)(i) * sa;
      }
      warpgroup_wait<0>();
      ++read;
      token = pipeline.consumer_try_wait(read);
      if constexpr (!kRowsA && !kColsB) {
        partial.scale(rSFA(_0{}));
      } else if constexpr (kRowsA && !kColsB) {
        partial.scale(rSFA);
      } else if constexpr (!kRowsA && kColsB) {
        partial.scale(rSFB);
      } else {
        partial.scale(rSFA, rSFB);
      }
    }
    warpgroup_fence_operand(accum);
  }

  // The last stage (the loop released every earlier one), behind the same warpgroup barrier.
  CUTLASS_DEVICE void mma_tail(MainloopPipeline pipeline, PipelineState read, int k_tile_count) {
    if (k_tile_count > 0) {
      read.advance(k_tile_count - 1);
      release_after_warpgroup(pipeline, read);
    }
  }
};

// The consumer above for CUTLASS's blockwise mainloop; any other collective as it is.
template <class Collective>
struct WithBlockwiseConsumer {
  using type = Collective;
};
template <int Stages, class ClusterShape, class KernelSchedule, class... Rest>
struct WithBlockwiseConsumer<cutlass::gemm::collective::CollectiveMma<
    cutlass::gemm::MainloopSm90ArrayTmaGmmaWarpSpecializedBlockwise<Stages, ClusterShape,
                                                                    KernelSchedule>,
    Rest...>> {
  using type = BlockwiseConsumer<cutlass::gemm::collective::CollectiveMma<
      cutlass::gemm::MainloopSm90ArrayTmaGmmaWarpSpecializedBlockwise<Stages, ClusterShape,
                                                                      KernelSchedule>,
      Rest...>>;
};

}  // namespace moekit::cuda::sm90
