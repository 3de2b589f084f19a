// Internal: moekit's own kernel for the group-K grouped GEMM into a 16-bit dw (no C), built from
// CUTLASS's collectives — the TMA / wgmma mainloop and the group tile scheduler, as the CUTLASS
// kernel it replaces uses them — with an epilogue of its own, in the ping-pong schedule
// (ConfigLargeOwn: two consumer warpgroups on alternate 128 x 128 tiles). (A cooperative schedule,
// both warpgroups on every 128 x 256 tile, was no faster and left with the study tiles: design/
// PERFORMANCE-LOG.md.) Included by the instance files whose configurations name it
// (instances/kernels_group_k_own.cu).
//
// Why (design/PERFORMANCE.md, "What holds small_E64 wgrad"): in CUTLASS's kernels the consumer
// warpgroups' epilogues share one set of D staging buffers — in ping-pong they take turns and each
// drains its TMA stores before handing over. A group-K tile of a small group has one K block, so its epilogue is most of its time. Here each
// consumer warpgroup
//   - runs its epilogue without waiting for the other's (it takes every other tile; the scheduler
//     warp publishes the tiles, each warpgroup reads all of them and skips the other's);
//   - stages its tile in its own subtile buffers (the epilogue collective's shared
//     memory layout and 64-row subtile, so the setup kernel's prebuilt D descriptors fit; a ring of
//     kDBuffers of them), two named barriers of its own per subtile (ids past CUTLASS's reserved
//     ones), one thread issuing the TMA stores;
//   - waits for a store to finish reading only before its buffer is written again.
// The MMAs still take turns (MmaTurns: the mainloop pipeline's phases need it).
// The producer warp runs the mainloop collective's loads (descriptors prebuilt: the setup
// kernel's), another warp of the producer warpgroup the scheduler.
//
// The kernel takes CUTLASS's GemmUniversal kernel type as its base for everything host-side
// (arguments, params, grid, workspace), so the adapter and the call plumbing (GroupedCall) stay
// as they are; it replaces the shared-memory plan and the device code (of the epilogue collective
// only its types, parameters and D descriptors are used, never its store).
#pragma once

#include <cstdint>
#include <type_traits>

#include "backends/cuda/sm90/kernel/kernel_common.cuh"  // GroupKOwnStaging
#include "backends/cuda/sm90/collective/prebuilt_tensormaps.cuh"
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/gemm/collective/collective_builder.hpp"  // sm90_smem_capacity_bytes
#include "cutlass/numeric_conversion.h"
#include "cutlass/pipeline/pipeline.hpp"

namespace moekit::cuda::sm90 {

template <class CutlassKernel, class Config>
struct GroupKOwnKernel : CutlassKernel {
  static constexpr int kDBuffers = Config::kDBuffers;
  using Base = CutlassKernel;
  using typename Base::Params;
  using typename Base::TileScheduler;
  using typename Base::TiledMma;
  using typename Base::TileShape;
  using ClusterShape = typename Base::ClusterShape;
  using Mainloop = typename Base::CollectiveMainloop;
  using Epilogue = typename Base::CollectiveEpilogue;
  using ElementD = typename Epilogue::ElementD;
  using EpilogueTile = typename Epilogue::EpilogueTile;
  static_assert(std::is_void_v<typename Epilogue::ElementC>, "an epilogue without a source (C) only");
  static_assert(sizeof(ElementD) == 2, "a 16-bit dw only");
  using Staging = GroupKOwnStaging<Epilogue, kDBuffers>;
  static constexpr int kBuffers = Staging::kBuffers;
  using SmemLayoutD = typename Staging::SmemLayoutD;
  static constexpr int kDElements = Staging::kDElements;
  static_assert(!std::is_base_of_v<cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
                                   typename Mainloop::DispatchPolicy::Schedule>,
                "the ping-pong schedule only");
  // A consumer warpgroup's part of the CTA tile: the whole tile; one warpgroup's MMA over it
  // partitions the epilogue.
  using PartShape = cute::Shape<cute::Int<cute::size<0>(TileShape{})>, cute::Int<cute::size<1>(TileShape{})>>;
  using WarpGroupMma = decltype(cute::make_tiled_mma(typename TiledMma::Atom{}));

  // Ping-pong: the consumer warpgroups issue their tiles' MMAs in turns (their epilogues do not).
  // Needed for the mainloop pipeline's phases: a warpgroup waiting for its tile's first stage
  // while the other still waits for the stages of a tile of more K blocks than there are stages
  // could see a later phase of that stage complete (a stage's barrier tells phases apart by parity
  // only). In its turn a warpgroup waits at most one phase ahead.
  using MmaTurns = cutlass::OrderedSequenceBarrier<1, 2>;

  struct SharedStorage {
    struct Tensors {
      typename Mainloop::TensorStorage mainloop;
      alignas(1024) cute::array_aligned<ElementD, kDElements, 1024> d[2];  // [consumer warpgroup]
    } tensors;
    alignas(16) typename TileScheduler::PipelineStorage scheduler;
    alignas(16) typename Mainloop::PipelineStorage mainloop;
    alignas(16) typename MmaTurns::SharedStorage mma_turns;
    alignas(16) typename Base::TileSchedulerResponse responses[Base::TileSchedulerStages];
    alignas(128) typename Mainloop::TensorMapStorage tensormaps;
  };
  static constexpr int SharedStorageSize = sizeof(SharedStorage);
  static_assert(SharedStorageSize <= cutlass::gemm::collective::detail::sm90_smem_capacity_bytes,
                "the mainloop stages and the D buffers exceed shared memory");

  static constexpr uint32_t kConsumerThreads = cutlass::NumThreadsPerWarpGroup;
  static_assert(Base::MaxThreadsPerBlock == 3 * kConsumerThreads, "one producer and two consumer warpgroups");
  static_assert(cute::size(TiledMma{}) == kConsumerThreads, "a tile's MMA on one warpgroup");
  static constexpr uint32_t kFirstBarrier = 0;  // NamedBarrier's user ids (past CUTLASS's reserved)

  CUTLASS_DEVICE void operator()(Params const& params, char* smem_buf) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace cute;
    SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_buf);
    // First in every thread: the scheduler's base waits for the setup kernel (GridDependencyWait).
    TileScheduler scheduler{params.scheduler, smem.responses};
    const int warp_group = cutlass::canonical_warp_group_idx();
    const int warp_in_group = cutlass::canonical_warp_idx_sync() % cutlass::NumWarpsPerWarpGroup;
    const bool producer_group = warp_group == 0;
    constexpr int kLoadWarp = 0, kSchedulerWarp = 1;

    using SchedulerPipeline = typename TileScheduler::Pipeline;
    typename SchedulerPipeline::Params sp;
    sp.role = producer_group && warp_in_group == kSchedulerWarp ? SchedulerPipeline::ThreadCategory::Producer
                                                                 : SchedulerPipeline::ThreadCategory::Consumer;
    sp.producer_arv_count = 1;
    sp.consumer_arv_count = 2 * kConsumerThreads + cutlass::NumThreadsPerWarp;  // both consumers, the load warp
    SchedulerPipeline scheduler_pipeline(smem.scheduler, sp);

    using MainloopPipeline = typename Mainloop::MainloopPipeline;
    typename MainloopPipeline::Params mp;
    if (producer_group && warp_in_group == kLoadWarp) mp.role = MainloopPipeline::ThreadCategory::Producer;
    if (!producer_group) mp.role = MainloopPipeline::ThreadCategory::Consumer;
    mp.is_leader = threadIdx.x % kConsumerThreads == 0;
    mp.num_consumers = kConsumerThreads;  // the warpgroup of the stage's tile
    mp.num_producers = Base::NumProducerThreads;
    mp.transaction_bytes = params.mainloop.tma_transaction_bytes;
    MainloopPipeline mainloop_pipeline(smem.mainloop, mp, ClusterShape{});
    typename MmaTurns::Params tp;
    tp.group_id = producer_group ? 0 : warp_group - 1;
    tp.group_size = kConsumerThreads;
    MmaTurns mma_turns(smem.mma_turns, tp);

    // The pipelines' initialisation visible to every CTA of the cluster before anyone uses them.
    if constexpr (size(ClusterShape{}) > 1) {
      cute::cluster_arrive_relaxed();
      cute::cluster_wait();
    } else {
      __syncthreads();
    }

    auto work = scheduler.initial_work_tile_info(ClusterShape{});
    if (!work.is_valid()) return;  // the same for every thread of the CTA

    typename TileScheduler::Pipeline::PipelineState scheduler_read;
    const auto next_work = [&] {
      auto [next, advance] = scheduler.fetch_next_work(work, scheduler_pipeline, scheduler_read);
      if (advance) ++scheduler_read;
      work = next;
    };
    const auto shape_of = [&](int32_t group) {
      return append<4>(params.problem_shape.get_problem_shape(group), 1);
    };
    const auto k_tiles = [&](auto const& problem) {
      return static_cast<int>(TileScheduler::get_work_k_tile_count(work, problem, TileShape{}));
    };

    if (producer_group) {
      cutlass::arch::warpgroup_reg_dealloc<Base::LoadRegisterRequirement>();
      if (warp_in_group == kSchedulerWarp) {
        auto write = cutlass::make_producer_start_state<SchedulerPipeline>();
        do {
          auto [next, advance] = scheduler.advance_to_next_work(scheduler_pipeline, write);
          if (advance) ++write;
          work = next;
        } while (work.is_valid());
        scheduler_pipeline.producer_tail(write);
      } else if (warp_in_group == kLoadWarp) {
        load(params, smem, mainloop_pipeline, work, next_work, shape_of, k_tiles);
      }
      return;
    }

    cutlass::arch::warpgroup_reg_alloc<Base::MmaRegisterRequirement>();
    const int consumer = warp_group - 1;
    const int thread = static_cast<int>(threadIdx.x % kConsumerThreads);
    const bool issuer = warp_in_group == 0 && cute::elect_one_sync();
    typename Mainloop::PipelineState read;
    if (consumer == 1) {  // the second warpgroup starts at the second tile
      read.advance(k_tiles(shape_of(work.L_idx)));
      next_work();
    }
    Mainloop mainloop;
    TiledMma mma;  // the tile's: partitions the accumulators
    int32_t group = -1;
    const cute::TmaDescriptor* d_map = nullptr;
    while (work.is_valid()) {
      const auto problem = shape_of(work.L_idx);
      const int k_count = k_tiles(problem);
      auto accumulators = partition_fragment_C(mma, take<0, 2>(TileShape{}));
      mma_turns.wait();
      mainloop.mma(mainloop_pipeline, read, accumulators, k_count, thread, smem.tensors.mainloop,
                   params.mainloop);
      mma_turns.arrive();
      mainloop.mma_tail(mainloop_pipeline, read, k_count);
      read.advance(k_count);
      if (work.L_idx != group) {
        group = work.L_idx;
        d_map = group_tensormap(params.epilogue.group_tensormaps, group, kSlotD);
        if (issuer) cute::tma_descriptor_fence_acquire(d_map);
      }
      store(params, accumulators, thread, smem.tensors.d[consumer].data(), consumer, work.M_idx,
            work.N_idx, get<0>(problem), get<1>(problem), d_map, issuer);
      next_work();
      if (work.is_valid()) {  // the other warpgroup's tile: skip its stages
        read.advance(k_tiles(shape_of(work.L_idx)));
        next_work();
      }
    }
    if (issuer) tma_store_wait<0>();  // the last stores done reading this CTA's shared memory
#endif
  }

 private:
  // The producer warp: every tile's K blocks into the mainloop's stages, in the scheduler's order
  // (both consumers' tiles), through the mainloop collective (its descriptors per group).
  template <class Pipeline, class Work, class NextWork, class ShapeOf, class KTiles>
  CUTLASS_DEVICE static void load(Params const& params, SharedStorage& smem, Pipeline& pipeline, Work& work,
                                  NextWork const& next_work, ShapeOf const& shape_of, KTiles const& k_tiles) {
    using namespace cute;
    Mainloop mainloop;
    const int32_t sm_idx = static_cast<int32_t>(blockIdx.x + blockIdx.y * gridDim.x);
    auto tensormaps = mainloop.tensormaps_init(params.mainloop, smem.tensormaps, params.hw_info.sm_count, sm_idx);
    int32_t group = work.L_idx;
    auto problem = shape_of(group);
    mainloop.tensormaps_perform_update(smem.tensormaps, params.mainloop, tensormaps, problem, group);
    __syncwarp();
    mainloop.tensormaps_cp_fence_release(smem.tensormaps, tensormaps);
    auto inputs = mainloop.load_init(problem, params.mainloop);
    auto write = cutlass::make_producer_start_state<Pipeline>();
    const int lane = cutlass::canonical_lane_idx();
    const uint32_t rank_in_cluster = cute::block_rank_in_cluster();
    bool changed = true;
    do {
      if (changed) {
        inputs = mainloop.tensors_perform_update(inputs, params.mainloop, problem, group);
        mainloop.tensormaps_fence_acquire(tensormaps);
      }
      const int k_count = k_tiles(problem);
      auto const& gA = get<0>(inputs);  // (BLK_M, BLK_K, m, k, l)
      auto k_iter = make_coord_iterator(
          idx2crd(TileScheduler::get_work_k_tile_start(work), shape<3>(gA)), shape<3>(gA));
      mainloop.load(params.mainloop, pipeline, write, inputs, tensormaps, make_coord(work.M_idx, work.N_idx, _, 0),
                    k_iter, k_count, lane, rank_in_cluster, smem.tensors.mainloop);
      write.advance(k_count);
      next_work();
      changed = work.L_idx != group;
      if (work.is_valid() && changed) {
        group = work.L_idx;
        problem = shape_of(group);
        mainloop.tensormaps_perform_update(smem.tensormaps, params.mainloop, tensormaps, problem, group);
        __syncwarp();
        mainloop.tensormaps_cp_fence_release(smem.tensormaps, tensormaps);
      }
    } while (work.is_valid());
    mainloop.load_tail(pipeline, write);
  }

  // One consumer warpgroup's epilogue of its part of one tile (PartShape, at part coordinates
  // (m_part, n_tile)): the accumulators converted to ElementD subtile by subtile into this
  // warpgroup's kBuffers buffers, a ring, and stored by TMA (one thread) through the group's
  // descriptor. Per subtile two barriers of the warpgroup's own: before the writes, after the
  // issuing thread has seen the buffer's previous store (kBuffers subtiles ago; for a tile's
  // first subtiles the previous tile's, issued one mainloop ago: done, as a rule) finish reading
  // it, and after them, before the store.
  template <class Accumulators>
  CUTLASS_DEVICE static void store(Params const& params, Accumulators const& accumulators, int thread,
                                   ElementD* buffers, int consumer, int32_t m_part, int32_t n_tile, int32_t rows,
                                   int32_t cols, const cute::TmaDescriptor* d_map, bool issuer) {
    using namespace cute;
    // The tile MMA's accumulators of one warpgroup are one warpgroup MMA's over its part.
    using PartFragment = decltype(partition_fragment_C(WarpGroupMma{}, PartShape{}));
    static_assert(std::is_same_v<std::decay_t<decltype(accumulators.layout())>,
                                 std::decay_t<decltype(std::declval<PartFragment>().layout())>>,
                  "a warpgroup's accumulators are its part's");
    Tensor sD = as_position_independent_swizzle_tensor(make_tensor(make_smem_ptr(buffers), SmemLayoutD{}));
    auto r2s = make_tiled_copy_S(Copy_Atom<typename Epilogue::CopyOpR2S, ElementD>{},
                                 make_tiled_copy_C_atom(typename Epilogue::CopyAtomC{}, WarpGroupMma{}));
    auto thr = r2s.get_slice(thread);
    Tensor tAcc = thr.retile_S(accumulators);  // ((R2S, R2S_V), MMA_M, MMA_N)
    Tensor tSD = thr.partition_D(sD);          // (R2S, R2S_M, R2S_N, buffer)
    Tensor rD = make_tensor<ElementD>(make_layout(take<0, 3>(shape(thr.partition_S(sD)))));
    constexpr int kFrag = Epilogue::DispatchPolicy::FragmentSize;
    Tensor tAcc_frg = recast<cutlass::Array<float, kFrag>>(tAcc);
    Tensor rD_frg = recast<cutlass::Array<ElementD, kFrag>>(rD);

    auto const& tma = params.epilogue.tma_store_d;
    Tensor mD = coalesce(tma.get_tma_tensor(make_shape(rows, cols, Int<1>{})), PartShape{});
    Tensor gD = local_tile(mD, PartShape{}, make_coord(m_part, n_tile, Int<0>{}));
    Tensor gD_epi = flat_divide(gD, EpilogueTile{});  // (EPI_M, EPI_N, epi_m, epi_n)
    auto s2g = tma.get_slice(Int<0>{});
    Tensor bS = s2g.partition_S(sD);      // (S2G, S2G_M, S2G_N, buffer)
    Tensor bG = s2g.partition_D(gD_epi);  // (S2G, S2G_M, S2G_N, epi_m, epi_n)

    // Subtile epi_n * EPI_M + epi_m, staged in buffer subtile % kBuffers, is the accumulators of
    // MMA tile (epi_m, epi_n / kSplitN), its fragments from (epi_n % kSplitN) * size(rD_frg) on
    // (a wgmma's accumulators run along N in the thread's registers): the ping-pong 128 x 128
    // tile's subtile is its MMA tile (64 x 128).
    constexpr int kEpiM = decltype(size<2>(gD_epi))::value, kEpiN = decltype(size<3>(gD_epi))::value;
    constexpr int kMmaM = decltype(size<1>(tAcc))::value, kMmaN = decltype(size<2>(tAcc))::value;
    static_assert(kEpiM == kMmaM && kEpiN % kMmaN == 0, "the epilogue subtile divides the MMA tile along N");
    constexpr int kSplitN = kEpiN / kMmaN;
    static_assert(decltype(size<0>(tAcc_frg))::value == kSplitN * decltype(size(rD_frg))::value,
                  "an MMA tile's fragments are its subtiles'");
    constexpr int kSubtiles = kEpiM * kEpiN;
    static_assert(kSubtiles % kBuffers == 0, "every tile's subtiles start at buffer 0");
    cutlass::NumericArrayConverter<ElementD, float, kFrag, cutlass::FloatRoundStyle::round_to_nearest> convert;
    const uint32_t barrier = kFirstBarrier + static_cast<uint32_t>(consumer);
    CUTLASS_PRAGMA_UNROLL
    for (int subtile = 0; subtile < kSubtiles; ++subtile) {  // = epi_n * kEpiM + epi_m
      const int buffer = subtile % kBuffers, epi_m = subtile % kEpiM, epi_n = subtile / kEpiM;
      // The buffer's last store (kBuffers subtiles ago, one store group each) done reading it.
      if (issuer) tma_store_wait<kBuffers - 1>();
      cutlass::arch::NamedBarrier::sync(kConsumerThreads, barrier);
      Tensor acc = tAcc_frg(_, epi_m, epi_n / kSplitN);
      const int first = (epi_n % kSplitN) * static_cast<int>(size(rD_frg));
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(rD_frg); ++i) rD_frg(i) = convert(acc(first + i));
      copy(r2s, rD, tSD(_, _, _, buffer));
      tma_store_fence();  // the writes visible to the TMA unit (async proxy)
      cutlass::arch::NamedBarrier::sync(kConsumerThreads, barrier);
      if (issuer) {
        copy(tma.with(d_map), bS(_, _, _, buffer), bG(_, _, _, epi_m, epi_n));
        tma_store_arrive();
      }
    }
  }
};

}  // namespace moekit::cuda::sm90
