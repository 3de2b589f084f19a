// Internal: the CUTLASS 3.x configuration of the sm90 group-K grouped GEMM (the weight gradient),
// its setup kernel (which also zeroes the empty groups) and its host launcher. Included ONLY by
// the instance translation units (instances/kernels_*.cu, MOEKIT_SM90_GROUP_K_INSTANCE, below).
//
// Mapping onto CUTLASS (D[M,N] = A[M,K]·B[N,K]ᵀ per group g; groups are the ptr-array "batch"):
//   M = n (rows of dw[g]), N = k (its columns), K = m_g (the group's rows, from device counts).
//   A(i, r) = dy[off_g + r, i]: M-major ("ColumnMajor"), leading dimension n, pointer dy + off_g·n.
//   B(j, r) = x[off_g + r, j]:  N-major ("RowMajor" B), leading dimension k, pointer x + off_g·k.
//      wgmma reads both 16-bit MN-major operands from shared memory natively (transpose bits);
//      the TMA descriptors carry m_g as the K extent, so the last K tile of a group is zero-filled
//      by TMA, never read from the next group's rows.
//   D = dw[g] [n, k] row-major; C = D with beta = 1 when accumulating (fp32 main_grad), else
//      beta = 0 and C is not read (CUTLASS skips the source load for a zero scalar beta).
// A group with m_g = 0 gets M = 0 (no tiles: the mainloop would leave its accumulators
// uninitialised with zero K tiles); the setup kernel's blocks after the first write its exact
// zeros instead (group_k_setup).
#pragma once

#include "backends/cuda/sm90/scheduler/blocked_scheduler.cuh"
#include "backends/cuda/sm90/instances/group_k_instances.h"
#include "backends/cuda/sm90/kernel/kernel_common.cuh"
#include "cutlass/epilogue/thread/activation.h"

namespace moekit::cuda::sm90 {

// The epilogue side of group-K; GroupKGemm (below) adds the mainloop and kernel (GroupedGemm).
template <DType kDType, DType kOut, class Config_>
struct GroupKParts {
  using Config = Config_;
  // Few tiles per group (small experts): each cluster takes chunks of 4 consecutive tiles; many:
  // the balanced order (blocked_scheduler.cuh, tile_order), decided per call in make_arguments.
  using ProblemShape = BlockedGroupProblemShape<cute::Shape<int, int, int>>;
  using Element = typename CutlassElement<kDType>::type;
  using ElementD = typename CutlassElement<kOut>::type;
  // C (the accumulate source) exists only for an fp32 dw: main_grad.
  using ElementC = std::conditional_t<kOut == DType::F32, float, void>;
  // Problem shape per group: (n, k, m_g).
  using LayoutA = cutlass::layout::ColumnMajor;
  using LayoutB = cutlass::layout::RowMajor;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlign = 8;                           // 16-bit elements per 16 bytes
  static constexpr int kAlignD = 16 / sizeof(ElementD);      // TMA: 16 bytes

  // The epilogue's subtile (what one pass of its loop converts, stages in shared memory and
  // stores by TMA). On the ping-pong tile with a 16-bit dw and no C: 64x128, two passes per
  // tile, against eight of CUTLASS's automatic 64x32. The epilogues of the two consumer
  // warpgroups take turns, and a group with few rows (small_E64: K = 64, one K block) spends
  // nearly all its time there: each pass ends in a named barrier and a TMA store issue, so
  // passes, not bytes, set the time. The same number of mainloop stages fit (6: 32 KB of D
  // staging instead of 8 KB). With an f32 dw (main_grad: C loaded and D stored in fp32): 64x64,
  // four passes against eight; its C and D staging takes 64 KB instead of 32, which leaves the
  // mainloop 5 stages instead of 6. Faster than the automatic 64x32 on small groups, a tie on
  // large ones (design/PERFORMANCE.md, "What holds each target": small_E64 wgrad). A
  // configuration may name its own (Config::EpilogueTile).
  static constexpr auto default_epilogue_tile() {
    constexpr bool kPingPong = std::is_same_v<typename Config::EpilogueSchedule,
                                              cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;
    if constexpr (kPingPong && std::is_void_v<ElementC> && sizeof(ElementD) == 2) {
      return cute::Shape<cute::_64, cute::_128>{};
    } else if constexpr (kPingPong && !std::is_void_v<ElementC> && sizeof(ElementD) == 4) {
      return cute::Shape<cute::_64, cute::_64>{};
    } else {
      return cutlass::epilogue::collective::EpilogueTileAuto{};
    }
  }
  using EpilogueTile = decltype(epilogue_tile_or<Config>(default_epilogue_tile()));
  // What the epilogue computes. A dw in the input dtype has no source (beta = 0) and alpha = 1:
  // the accumulator, converted — CUTLASS's LinearCombination would still multiply every element
  // by alpha (one FMUL each: a sixth of the instructions of small_E64's wgrad, whose tiles are
  // nearly all epilogue). An f32 dw
  // (main_grad) keeps alpha·acc + beta·C, beta = 1 when accumulating.
  using FusionOp = std::conditional_t<
      std::is_void_v<ElementC>,
      cutlass::epilogue::fusion::Sm90EVT<
          cutlass::epilogue::fusion::Sm90Compute<cutlass::epilogue::thread::Identity, ElementD, float,
                                                 cutlass::FloatRoundStyle::round_to_nearest>,
          cutlass::epilogue::fusion::Sm90AccFetch>,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, ElementC, float>>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Config::Tile,
      typename Config::Cluster, EpilogueTile, float, float,
      ElementC, LayoutD*, kAlignD, ElementD, LayoutD*, kAlignD,
      typename Config::EpilogueSchedule, FusionOp>::CollectiveOp;

};
template <DType kDType, DType kOut, class Config>
using GroupKGemm = GroupedGemm<GroupKParts<kDType, kOut, Config>>;

// ---- per-group arrays in the device workspace (written by the setup kernel) ----
template <class G>
struct GroupKArrays {
  typename G::Shape3* shapes;            // [groups] (n, k, m_g), or (0, k, 0) for an empty group
  const typename G::Element** ptr_a;     // dy + off_g·n
  const typename G::Element** ptr_b;     // x + off_g·k
  typename G::ElementD** ptr_d;          // dw[g] (also the C pointers when accumulating)
  typename G::StrideA* stride_a;
  typename G::StrideB* stride_b;
  typename G::StrideD* stride_d;
  uint32_t* unit_starts;                 // [groups + 1] (blocked_scheduler.cuh)
  uint32_t* stripes;                     // [groups] each group's stripe width (same)
  uint32_t* slot_groups;                 // [groups] the group at each place (heavy_first)
  cute::TmaDescriptor* tensormaps;       // [groups x kGroupTensormaps] (prebuilt_tensormaps.cuh)

  static GroupKArrays carve(WorkspaceCarver& w, const GroupKProblem& p) {
    const int64_t groups = p.counts.groups;
    GroupKArrays r;
    r.shapes = w.take<typename G::Shape3>(groups);
    r.ptr_a = w.take<const typename G::Element*>(groups);
    r.ptr_b = w.take<const typename G::Element*>(groups);
    r.ptr_d = w.take<typename G::ElementD*>(groups);
    r.stride_a = w.take<typename G::StrideA>(groups);
    r.stride_b = w.take<typename G::StrideB>(groups);
    r.stride_d = w.take<typename G::StrideD>(groups);
    r.unit_starts = w.take<uint32_t>(groups + 1);
    r.stripes = w.take<uint32_t>(groups);
    r.slot_groups = w.take<uint32_t>(groups);
    r.tensormaps = w.take<cute::TmaDescriptor>(groups * kGroupTensormaps);
    return r;
  }
};

struct GroupKSetupInputs {
  DeviceCounts counts;
  int64_t k, n;
  const void* dy;
  const void* x;
  void* dw;
  bool accumulate;
  StripeInputs stripe;  // the groups' stripe widths (kernel_common.cuh)
  bool heavy_first;     // lay the groups out largest first (kHeavyFirstMaxGroups at most)
};

// The balanced order (heuristics.h, tile orders; design/PERFORMANCE.md, "The large shapes' skewed
// wgrad: the balanced order"): the snake walk
// (kSnakeOrder, tile_units.h) over the groups laid out largest first, so that each wave's cheap
// units (a unit's cost grows with its group's rows, the GEMM's K) fall to the clusters that took
// the previous wave's costly ones. The setup kernel ranks the groups in shared memory: up to
// kHeavyFirstMaxGroups of them (more keep group order).
inline constexpr int64_t kHeavyFirstMaxGroups = 1024;

// dw[g] = 0 for every group with m_g = 0 (zero_empty_group_outputs, kernel_common.cuh), by blocks 1..
// of the setup grid.
template <class G>
__device__ void zero_empty_groups(const GroupKSetupInputs& in) {
  zero_empty_group_outputs<typename G::ElementD>(in.counts, in.n, in.k, in.dw);
}

// Block 0: every group's shape, pointers, strides, tile units, stripe width and descriptors.
// Blocks 1.. (launched only when not accumulating): the empty groups' zeros (zero_empty_groups).
template <class G>
__global__ void __launch_bounds__(kSetupThreads) group_k_setup(GroupKSetupInputs in, GroupKArrays<G> out,
                                                              const __grid_constant__ TensormapTemplates<G> templates) {
  allow_dependent_launch();
  wait_for_prior_grid();  // launched with PDL (group_*_launch): the counts and the workspace are the prior kernels'
  if (blockIdx.x > 0) {
    zero_empty_groups<G>(in);
    return;
  }
  using E = typename G::Element;
  const int n = static_cast<int>(in.n), k = static_cast<int>(in.k);
  // A non-empty group's tiles: n x k output, whatever its rows.
  const auto units_of = [&](int64_t) { return units_per_group<typename G::Config>(in.n, in.k); };
  __shared__ int64_t rows[kHeavyFirstMaxGroups];  // heavy_first: each group's rows (0: empty or invalid)
  const int64_t units = scan_groups(in.counts, units_of, [&](int64_t g, const GroupPlace& at, bool) {
    const int64_t m = at.m, off = at.off;
    if (in.heavy_first) rows[g] = m;
    out.shapes[g] = m > 0 ? typename G::Shape3(n, k, static_cast<int>(m)) : typename G::Shape3(0, k, 0);
    out.ptr_a[g] = static_cast<const E*>(in.dy) + off * in.n;
    out.ptr_b[g] = static_cast<const E*>(in.x) + off * in.k;
    out.ptr_d[g] = static_cast<typename G::ElementD*>(in.dw) + g * in.n * in.k;
    // Packed strides (make_cute_packed_stride takes the extents (M or N, K, L)): A's K stride n,
    // B's K stride k, D's row stride k. None depends on m_g.
    out.stride_a[g] = cutlass::make_cute_packed_stride(typename G::StrideA{}, cute::make_shape(n, 1, 1));
    out.stride_b[g] = cutlass::make_cute_packed_stride(typename G::StrideB{}, cute::make_shape(k, 1, 1));
    out.stride_d[g] = cutlass::make_cute_packed_stride(typename G::StrideD{}, cute::make_shape(n, k, 1));
    out.unit_starts[g] = static_cast<uint32_t>(at.unit);
    // Output rows n, K a group's rows, columns k.
    out.stripes[g] = group_stripe<typename G::Config>(in.stripe, in.n, m, in.k, kOutElementBytes<G>);
  });
  if (threadIdx.x == 0) out.unit_starts[in.counts.groups] = static_cast<uint32_t>(units);
  if (in.heavy_first) {
    // Place = rank by rows, largest first (ties: group order), empty groups last. Every non-empty
    // group has the same units here, so the place r of a non-empty group starts at r units of
    // them; the empty ones start (and end) at the total.
    __syncthreads();  // every visit's rows[] and unit_starts[] written
    const int64_t groups = in.counts.groups;
    const uint32_t per_group = static_cast<uint32_t>(units_of(1));
    for (int64_t g = threadIdx.x; g < groups; g += kSetupThreads) {
      const int64_t m = rows[g];
      int64_t rank = 0;
      for (int64_t h = 0; h < groups; ++h) rank += rows[h] > m || (rows[h] == m && h < g);
      out.slot_groups[rank] = static_cast<uint32_t>(g);
      out.unit_starts[rank] = m > 0 ? static_cast<uint32_t>(rank) * per_group : static_cast<uint32_t>(units);
    }
  }
  build_tensormaps<G>(templates, in.counts.groups, out.shapes);
}

// ---- host side ----
// The tile order (GroupKProblem::order; tile_order): a non-empty group's tiles are
// ⌈n/tileM⌉·⌈k/tileN⌉ whatever its rows. Orders other than CUTLASS's need the AlongM raster.
template <class G>
int group_k_order(const GroupKProblem& p, const cutlass::KernelHardwareInfo& hw) {
  return tile_order(p.order, p.raster == 0, tiles_per_group<typename G::Config>(p.n, p.k), hw.sm_count);
}

// Whether a call lays its groups out largest first (the balanced order, above).
template <class G>
bool heavy_first(const GroupKProblem& p, const cutlass::KernelHardwareInfo& hw) {
  return group_k_order<G>(p, hw) == kSnakeOrder && p.counts.groups <= kHeavyFirstMaxGroups;
}

template <class G>
typename G::Gemm::Arguments make_arguments(const GroupKProblem& p, const GroupKArrays<G>& arr,
                                           const cutlass::KernelHardwareInfo& hw) {
  typename G::Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape.num_groups = static_cast<int>(p.counts.groups);
  args.problem_shape.problem_shapes = arr.shapes;
  args.problem_shape.host_problem_shapes = nullptr;
  args.problem_shape.order = group_k_order<G>(p, hw);
  args.problem_shape.unit_starts = arr.unit_starts;
  args.problem_shape.slot_groups = heavy_first<G>(p, hw) ? arr.slot_groups : nullptr;
  args.problem_shape.tensormaps = tensormap_slots(arr.tensormaps);
  args.problem_shape.alternate_k = p.k_order == 1;
  args.mainloop = {arr.ptr_a, arr.stride_a, arr.ptr_b, arr.stride_b};
  if constexpr (std::is_void_v<typename G::ElementC>) {
    args.epilogue.ptr_C = nullptr;  // the accumulator converted: no scalars (GroupKParts::FusionOp)
  } else {
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = p.accumulate ? 1.0f : 0.0f;
    args.epilogue.ptr_C = const_cast<const typename G::ElementC**>(arr.ptr_d);
  }
  args.epilogue.dC = arr.stride_d;
  args.epilogue.ptr_D = arr.ptr_d;
  args.epilogue.dD = arr.stride_d;
  args.hw_info = hw;
  set_raster(args, p.raster, p.swizzle, arr.stripes);
  return args;
}

template <class G>
using GroupKCall = GroupedCall<G, GroupKArrays<G>, GroupKProblem>;

template <class G>
size_t group_k_workspace_bytes(const GroupKProblem& p) {
  return GroupKCall<G>(p, nullptr).bytes;
}

// Whether p's groups (n x k of dw each) have fewer tiles on G than its persistent grid has CTAs.
template <class G>
bool group_k_groups_below_grid(const GroupKProblem& p) {
  return groups_below_grid(tiles_per_group<typename G::Config>(p.n, p.k), GroupKCall<G>::hardware(p).sm_count);
}

template <class G>
void group_k_launch(const GroupKProblem& p, void* workspace, cudaStream_t stream, const char* name) {
  const GroupKCall<G> call(p, workspace);
  const GroupKSetupInputs in{p.counts, p.k, p.n, p.dy, p.x, p.dw, p.accumulate,
                             stripe_inputs<typename G::Config>(p.raster, p.swizzle, call.hw),
                             heavy_first<G>(p, call.hw)};
  // The cached Params bake in beta and the tile order.
  auto params = call.gemm_params(p, workspace, stream, name,
                                       (p.accumulate ? 1 : 0) | (group_k_order<G>(p, call.hw) << 1),
                                       p.raster, p.swizzle);
  // With PDL after whatever kernel precedes it on the stream (it waits for that grid before it
  // reads or writes anything: wait_for_prior_grid), so its launch overlaps that kernel's end.
  // Block 0 sets up; unless accumulating, up to two blocks per SM more zero the empty groups.
  const int64_t group_vectors = p.n * p.k * static_cast<int64_t>(sizeof(typename G::ElementD)) / 16;
  const int64_t zero_blocks =
      p.accumulate ? 0
                   : std::min<int64_t>((group_vectors + kSetupThreads - 1) / kSetupThreads,
                                       2 * int64_t{call.hw.sm_count});
  launch_kernel(group_k_setup<G>,
                {.grid = dim3(static_cast<unsigned>(1 + zero_blocks)), .block = dim3(kSetupThreads),
                 .programmatic = p.pdl == 1, .name = "setup"},
                stream, in, call.arrays, templates_of<G>(params));
  call.run_gemm(params, p, stream, name);
}

// Defines the GroupKInstance `symbol` (declared in group_k_instances.h) for one configuration.
#define MOEKIT_SM90_GROUP_K_INSTANCE(symbol, dtype, out_dtype, config, label)               \
  namespace {                                                                             \
  using symbol##_gemm = ::moekit::cuda::sm90::GroupKGemm<dtype, out_dtype, config>;       \
  size_t symbol##_ws(const GroupKProblem& p) {                                            \
    return ::moekit::cuda::sm90::group_k_workspace_bytes<symbol##_gemm>(p);               \
  }                                                                                       \
  void symbol##_run(const GroupKProblem& p, void* ws, cudaStream_t s) {                   \
    ::moekit::cuda::sm90::group_k_launch<symbol##_gemm>(p, ws, s, label);                 \
  }                                                                                       \
  bool symbol##_below(const GroupKProblem& p) {                                           \
    return ::moekit::cuda::sm90::group_k_groups_below_grid<symbol##_gemm>(p);             \
  }                                                                                       \
  }                                                                                       \
  const GroupKInstance symbol{label, symbol##_ws, symbol##_run, symbol##_below};

}  // namespace moekit::cuda::sm90
