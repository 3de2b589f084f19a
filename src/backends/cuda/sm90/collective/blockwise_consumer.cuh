// Internal: moekit's consumer loop for CUTLASS's block-scaled FP8 mainloop (fp8-block:
// MainloopSm90ArrayTmaGmmaWarpSpecializedBlockwise), replacing the collective's mma() and
// mma_tail(), and the pipeline its stages go back to the producer through; the producer (load)
// and everything else stay CUTLASS's.
//
// Why the pipeline (design/ARCHITECTURE.md, "racecheck and the block-scaled GEMMs"): every
// consumer thread reads a stage's scale factors from shared memory (LDS), which the producer
// warp's cp.async refills once the stage is released. CUTLASS's PipelineTmaAsync releases a stage
// by one thread per warpgroup and destination CTA, after the warpgroup's wgmma wait: nothing
// orders the other threads' reads before that arrive (a .sync.aligned wgmma wait is no barrier
// between warps). A warpgroup bar.sync before the arrive orders them, but compute-sanitizer's
// racecheck does not carry a bar.sync into the mbarrier hand-off and reports every refill as a
// WAR hazard (bench/studies/racecheck_cpasync_probe.cu, mode split_bar). Here every consumer
// thread arrives on its own CTA's empty barrier after its own reads (probe mode split_all: 0
// hazards, 2026-12-06, H100): the barrier counts the CTA's consumer threads, plus one signal per
// warpgroup of each peer CTA whose producer multicasts into this one (CUTLASS's spread of those
// signals, the own CTA's dropped). The peers read only their own scales.
//
// The loop (one K tile = one 128-deep scale block, ScalePromotionInterval 4: the finest
// granularity, the only one moekit instantiates) keeps two partial accumulators: K tile k+1's
// wgmma batch is issued into one while K tile k's partial, in the other, is promoted —
// accumulators += partial · scales, the scales read from shared memory then — so the promotion's
// FMULs and FFMAs run under the tensor cores' next batch; then tile k's stage is released (its
// batch done, its scales read). The arithmetic is CUTLASS's loop's (the same MMAs, the same
// FFMA promotion per tile); the accumulators are cleared before the first tile instead of being
// read uninitialised (0 + p·s = p·s). With two partial sets of ~64 registers beside the
// accumulators the scales are not held across the next batch.
#pragma once

#include <cute/tensor.hpp>

#include "cutlass/arch/barrier.h"
#include "cutlass/gemm/collective/collective_mma.hpp"
#include "cutlass/gemm/collective/fp8_accumulation.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"

namespace moekit::cuda::sm90 {

// CUTLASS's PipelineTmaAsync (`Base`) with a stage released by every consumer thread that read it
// (see above): the same barriers, shared storage and producer side.
template <class Base>
struct ReleaseByEveryReader : Base {
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::SharedStorage;

  template <class ClusterShape>
  CUTLASS_DEVICE ReleaseByEveryReader(SharedStorage& storage, Params params, ClusterShape cluster)
      : Base(storage, params, cluster, cute::false_type{}),  // the barriers initialised here
        empty_(&storage.empty_barrier_[0]) {
    using namespace cute;
    const int cluster_size = size(cluster);
    const uint32_t warpgroups =
        ceil_div(params.num_consumers, static_cast<uint32_t>(cutlass::NumThreadsPerWarpGroup));
    const uint32_t peers = cluster_size > 1 ? size<0>(cluster) + size<1>(cluster) - 2 : 0;
    if (cutlass::canonical_warp_idx_sync() == params.initializing_warp) {
      cutlass::arch::detail::initialize_barrier_array_pair_aligned<
          decltype(storage.full_barrier_), decltype(storage.empty_barrier_), Base::Stages>(
          storage.full_barrier_, storage.empty_barrier_, params.num_producers,
          params.num_consumers + peers * warpgroups);
    }
    cutlass::arch::fence_barrier_init();
    if (cluster_size > 1) {
      const auto [signals, peer] = cutlass::detail::spread_arrivals_to_warpgroup(
          threadIdx.x % cutlass::NumThreadsPerWarpGroup, cutlass::canonical_warp_idx_sync());
      const dim3 block = block_id_in_cluster();
      const uint32_t own = block.x + block.y * size<0>(cluster);
      signals_peer_ = signals && peer < static_cast<uint32_t>(cluster_size) && peer != own &&
                      this->is_same_row_or_col(peer, block, cluster);
      peer_ = peer;
    }
  }

  // This thread's reads of the stage are done: its own arrival, and its signal to a peer CTA.
  CUTLASS_DEVICE void consumer_release(PipelineState stage) {
    empty_[stage.index()].arrive();
    if (signals_peer_) empty_[stage.index()].arrive(peer_, 1u);
  }

 private:
  typename Base::EmptyBarrier* empty_;
  bool signals_peer_ = false;
  uint32_t peer_ = 0;
};

template <class Base>
struct BlockwiseConsumer : Base {
  using MainloopPipeline = ReleaseByEveryReader<typename Base::MainloopPipeline>;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::TensorStorage;
  using typename Base::TiledMma;
  using ElementScale = typename Base::ElementBlockScale;
  static_assert(Base::ScalePromotionInterval == 4,
                "one promotion per K tile: the tile's K extent is the scale block's");

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

    // Two partial accumulators (see above).
    auto P0 = make_fragment_like(accum);
    auto P1 = make_fragment_like(accum);
    clear(accum);
    constexpr bool kRowsA = Base::ScaleMsPerTile > 1, kColsB = Base::ScaleNsPerTile > 1;
    constexpr int kBatch = size<2>(tCrA);
    auto issue = [&](int stage, auto& P) {
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;  // a tile's partial sums start at zero
      warpgroup_fence_operand(P);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < kBatch; ++kb) {
        cute::gemm(tiled_mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), P);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(P);
    };
    auto promote = [&](int stage, auto& P) {
      warpgroup_fence_operand(P);
      copy(tCsSFA(_, _, _, make_coord(_0{}, stage)), rSFA);
      copy(tCsSFB(_, _, _, make_coord(_0{}, stage)), rSFB);
      if constexpr (!kRowsA && !kColsB) {
        const ElementScale s = rSFA(_0{}) * rSFB(_0{});
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); ++i) accum(i) += P(i) * s;
      } else if constexpr (kRowsA && !kColsB) {
        const ElementScale sb = rSFB(_0{});
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); ++i) accum(i) += P(i) * (rSFA(i) * sb);
      } else if constexpr (!kRowsA && kColsB) {
        const ElementScale sa = rSFA(_0{});
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); ++i) accum(i) += P(i) * (rSFB(i) * sa);
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); ++i) accum(i) += P(i) * rSFA(i) * rSFB(i);
      }
    };
    if (k_tile_count <= 0) return;
    auto token = pipeline.consumer_try_wait(read);
    pipeline.consumer_wait(read, token);
    issue(read.index(), P0);
    // K tile k (in `mine`) while k + 1's batch goes into `next`: no branch around a wgmma in the
    // steady state (ptxas serialises wgmma it cannot prove in flight, C7510).
    auto step = [&](auto& mine, auto& next) {
      PipelineState current = read;
      ++read;
      token = pipeline.consumer_try_wait(read);
      pipeline.consumer_wait(read, token);
      issue(read.index(), next);
      warpgroup_wait<1>();
      promote(current.index(), mine);
      pipeline.consumer_release(current);
    };
    auto last = [&](auto& mine) {
      warpgroup_wait<0>();
      promote(read.index(), mine);
      pipeline.consumer_release(read);
    };
    int k = 0;
    for (; k + 2 < k_tile_count; k += 2) {
      step(P0, P1);
      step(P1, P0);
    }
    if (k + 1 < k_tile_count) {  // two left: k in P0, k + 1 in P1
      step(P0, P1);
      last(P1);
    } else {  // one left, in P0
      last(P0);
    }
    warpgroup_fence_operand(accum);
  }

  // Every stage was released by the loop.
  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}
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
