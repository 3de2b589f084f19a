// Tile-study instance (built with -DMOEKIT_SM90_TILE_STUDY=ON only; chosen at run time with
// MOEKIT_SM90_TILE=ppdefer): the bf16 -> bf16 group-K of < 2048 rows per group (small_E64, qwen3)
// on kLarge's ping-pong 128x128 tile and 64x128 epilogue subtile, with each warpgroup's TMA-store
// drain deferred to its next epilogue.
//
// The question. small_E64's wgrad has one K block per tile and lives in its epilogue (93.9 µs
// writing 242 MB at 59% of DRAM peak against cuBLAS's 85.0 at 66%: bench/results/
// 2026-12-01-nvidia-h200-3cefaa3-lrc-coalescing.md). CUTLASS 4.2's ping-pong kernel stages both
// warpgroups' epilogues in the same D buffers, so each warpgroup waits for its TMA stores to finish
// reading them (`store_tail`: cp.async.bulk.wait_group.read 0) before it hands the epilogue to the
// other warpgroup: on a write-bound tile the stores' drain is serialised with the other
// warpgroup's whole epilogue. Here:
//   - the D staging has 2 x (subtiles per tile) stages, so the warpgroups' buffers are disjoint
//     (the kernel advances each warpgroup's store state past the other's tile);
//   - store_tail waits for nothing; each epilogue starts by waiting for its own warpgroup's
//     earlier stores (the only bulk groups of its issuing thread) and a warpgroup barrier, so no
//     thread writes a buffer an earlier store still reads — by then the other warpgroup's whole
//     epilogue has run;
//   - the collective's destructor, at kernel exit, waits for the last stores.
// The rest is CUTLASS's collective. Needs the prebuilt descriptors (prebuilt_tensormaps.cuh: the
// D descriptor CUTLASS's own path rewrites on a group change could still be in use by a store).
// Prediction: small_E64 wgrad closer to cuBLAS's 85 µs than the default's 93.9 (ncu).
#define MOEKIT_SM90_TILE_STUDY 1
#include "cuda/sm90/group_k_kernel.cuh"
#include "moekit/core/error.h"

namespace moekit::cuda::sm90 {
namespace {

// A ptr-array TMA epilogue collective with `kStagesD` D stages (its fusion callbacks rebound to
// the same dispatch policy).
template <class Callbacks, class Policy>
struct RebindCallbacks;
template <class Old, class Op, class Tile, class EpiTile, class... Rest, class Policy>
struct RebindCallbacks<cutlass::epilogue::fusion::FusionCallbacks<Old, Op, Tile, EpiTile, Rest...>,
                       Policy> {
  using type = cutlass::epilogue::fusion::FusionCallbacks<Policy, Op, Tile, EpiTile, Rest...>;
};
template <class Epilogue, int kStagesD>
struct WithStagesD;
template <int kC, int kD, int kFragment, bool kReuse, bool kDelay, int kWarpGroups, class Tile,
          class EpiTile, class EC, class SC, class ED, class SD, class Callbacks, class... Rest,
          int kStagesD>
struct WithStagesD<cutlass::epilogue::collective::CollectiveEpilogue<
                       cutlass::epilogue::Sm90PtrArrayTmaWarpSpecialized<kC, kD, kFragment, kReuse,
                                                                         kDelay, kWarpGroups>,
                       Tile, EpiTile, EC, SC, ED, SD, Callbacks, Rest...>,
                   kStagesD> {
  static_assert(!kReuse, "with a C source the D buffers' release follows C's loads: not here");
  using Policy = cutlass::epilogue::Sm90PtrArrayTmaWarpSpecialized<kC, kStagesD, kFragment, kReuse,
                                                                   kDelay, kWarpGroups>;
  using type = cutlass::epilogue::collective::CollectiveEpilogue<
      Policy, Tile, EpiTile, EC, SC, ED, SD, typename RebindCallbacks<Callbacks, Policy>::type,
      Rest...>;
};

// The drain moved from the end of each epilogue to the start of the warpgroup's next one (above).
template <class Base>
struct DeferredStoreDrain : Base {
  using Base::Base;

  template <class... Args>
  CUTLASS_DEVICE auto store(Args&&... args) {
    cute::tma_store_wait<0>();  // this thread's earlier stores have read their buffers
    cutlass::arch::NamedBarrier::sync(cutlass::NumThreadsPerWarpGroup,
                                      cutlass::arch::ReservedNamedBarriers::EpilogueBarrier);
    return Base::store(std::forward<Args>(args)...);
  }
  template <class LoadPipeline, class LoadState, class StorePipeline, class StoreState>
  CUTLASS_DEVICE auto store_tail(LoadPipeline, LoadState load_state, StorePipeline,
                                 StoreState store_state) {
    return cute::make_tuple(load_state, store_state);
  }
  CUTLASS_DEVICE ~DeferredStoreDrain() { cute::tma_store_wait<0>(); }
};

using PpDeferBase = GroupKParts<DType::BF16, DType::BF16, ConfigLarge>;
static_assert(std::is_same_v<ConfigLarge::EpilogueSchedule,
                             cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>,
              "the deferred drain relies on the ping-pong kernel's per-warpgroup store states");
constexpr int kPpDeferSubtiles = decltype(cute::size(cute::shape_div(
    cute::take<0, 2>(ConfigLarge::Tile{}), typename PpDeferBase::EpilogueTile{})))::value;
struct PpDeferParts : PpDeferBase {
  using CollectiveEpilogue = DeferredStoreDrain<
      typename WithStagesD<typename PpDeferBase::CollectiveEpilogue, 2 * kPpDeferSubtiles>::type>;
};
using PpDeferGemm = GroupedGemm<PpDeferParts>;

size_t ppdefer_ws(const GroupKProblem& p) {
  return group_k_workspace_bytes<PpDeferGemm>(p);
}
void ppdefer_run(const GroupKProblem& p, void* ws, cudaStream_t s) {
  if (!prebuilt_tensormaps_setting()) {
    throw_error(ErrorKind::Unsupported,
                "MOEKIT_SM90_TILE=ppdefer needs the prebuilt descriptors "
                "(MOEKIT_SM90_PREBUILT_TENSORMAPS=0 set)");
  }
  group_k_launch<PpDeferGemm>(
      p, ws, s, "bf16 -> bf16 ping-pong 128x128x64 cluster 1x2, store drain deferred (study)");
}

}  // namespace

const GroupKInstance group_k_bf16_bf16_ppdefer{
    "bf16 -> bf16 ping-pong 128x128x64 cluster 1x2, store drain deferred (study)", ppdefer_ws,
    ppdefer_run};

}  // namespace moekit::cuda::sm90
