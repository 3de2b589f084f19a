// Internal: the CUTLASS 3.x configuration of the sm90 group-M grouped GEMM, its graph-safe setup
// kernel and its host launcher. Included ONLY by the instance translation units
// (instances/kernels_*.cu, MOEKIT_SM90_GROUP_M_INSTANCE, below); kernel_common.cuh holds what it
// shares with the group-K kernel.
//
// Mapping onto CUTLASS (its GEMM is D[M,N] = A[M,K]·B[N,K]ᵀ, per group g):
//   M = m_g (from device counts), N = n, K = k, L = 1 (groups are the ptr-array "batch").
//   A = a rows [off_g, off_g+m_g): [m_g, K] row-major (K-major), pointer a + off_g·K.
//   B, fprop (b_transposed): weight [N, K] row-major = K-major B ("ColumnMajor" in CUTLASS tags).
//      dgrad (plain):       b[g] [K, N] row-major = N-major B ("RowMajor"); wgmma reads 16-bit
//      MN-major operands from shared memory natively (transpose bit), TMA loads either layout.
//   D = out rows [off_g, off_g+m_g): [m_g, N] row-major, pointer out + off_g·N; TMA store tensor
//      maps carry m_g rows, so rows past the group (other groups', the tail [S, T)) are clipped.
//   Epilogue (EVT): D = round(acc + bias_g[n]) with a per-group row-broadcast bias whose pointer
//      array may be null (then the bias reads as 0): one kernel serves bias and no bias.
//   kSwiGlu (fc1 of the grouped MLP): the tree gets a root node that also writes
//      z = p·silu(a)·b of D (swiglu_epilogue.cuh), with the probs as a per-group column broadcast
//      (null array: p = 1), on a 64x64 epilogue subtile. The mainloop is the plain kernel's.
#pragma once

#include "backends/cuda/sm90/instances/group_m_instances.h"
#include "backends/cuda/sm90/scheduler/blocked_scheduler.cuh"
#include "backends/cuda/sm90/kernel/kernel_common.cuh"
#include "backends/cuda/sm90/collective/swiglu_epilogue.cuh"

namespace moekit::cuda::sm90 {

// What the epilogue fuses: nothing (bias only), SwiGLU forward (fc1), SwiGLU backward (fc2 dgrad).
enum class Fusion { None, SwiGlu, DSwiGlu };

// The epilogue side of group-M; GroupMGemm (below) adds the mainloop and kernel (GroupedGemm).
template <DType kDType, bool kBKMajor, class Config_, Fusion kFusion>
struct GroupMParts {
  using Config = Config_;
  // The tile-order problem shape (blocked_scheduler.cuh): CUTLASS's order unless the study
  // override forces another (GroupMProblem::order).
  using ProblemShape = BlockedGroupProblemShape<cute::Shape<int, int, int>>;
  static_assert(kFusion != Fusion::SwiGlu || kBKMajor, "SwiGLU forward fuses into fprop (K-major B)");
  static_assert(kFusion != Fusion::DSwiGlu || !kBKMajor, "SwiGLU backward fuses into dgrad (N-major B)");
  // A and B swapped (a configuration with kSwapAB: ConfigSmallSwap): the GEMM's M is the
  // output's columns (the weights' rows) and its N the group's rows, D column-major — cuBLAS's
  // shape for few rows per group (its small_E64 kernel: 512 columns x 64 rows per tile). Problem
  // shape per group (N, m_g, K); plain epilogues only.
  static constexpr bool kSwapAB = requires { Config::kSwapAB; };
  static_assert(!kSwapAB || kFusion == Fusion::None, "the swapped operands take no fused epilogue");
  static constexpr bool kFusedSwiGlu = kFusion == Fusion::SwiGlu;
  static constexpr bool kFusedDSwiGlu = kFusion == Fusion::DSwiGlu;
  using Tile = typename Config::Tile;
  using Element = typename CutlassElement<kDType>::type;
  // The SwiGLU backward stores dh itself and dz is not needed afterwards: no D (no smem D, no TMA
  // store; CUTLASS names the node's ElementAux where it needs an element type).
  using ElementD = std::conditional_t<kFusion == Fusion::DSwiGlu, void, Element>;
  // Problem shape per group: (m_g, N, K).
  // Swapped: A = the weights (K-major for fprop, M-major for dgrad), B = the rows (K-major), D =
  // the output rows seen as columns.
  using LayoutA = std::conditional_t<kSwapAB && !kBKMajor, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using LayoutB = std::conditional_t<kBKMajor || kSwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using LayoutD = std::conditional_t<kSwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlign = 8;  // elements per 16 bytes (TMA)

  // bias_g[n] along the output's columns: the GEMM's N, or its M when swapped.
  using BiasLoad = std::conditional_t<
      kSwapAB,
      cutlass::epilogue::fusion::Sm90ColBroadcast<0, typename Config::Tile, Element*, float,
                                                  cute::Stride<cute::_1, cute::_0, cute::_0>, 1>,
      cutlass::epilogue::fusion::Sm90RowBroadcast<0, typename Config::Tile, Element*, float,
                                                  cute::Stride<cute::_0, cute::_1, cute::_0>, kAlign>>;
  using HNode = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, Element, float,
                                             cutlass::FloatRoundStyle::round_to_nearest>,
      cutlass::epilogue::fusion::Sm90AccFetch, BiasLoad>;
  // p_t for the rows of a tile, per-group pointers (probs + off_g), loaded once per tile.
  using ProbLoad = cutlass::epilogue::fusion::Sm90ColBroadcast<
      0, typename Config::Tile, float*, float, cute::Stride<cute::_1, cute::_0, cute::_0>, 1>;
  // 64-column subtiles put gate and linear columns of a pair in one visit() (swiglu_epilogue.cuh);
  // the backward node relies on the same fragment layout (swiglu_epilogue.cuh). Their rows: one
  // warpgroup's 64 (ping-pong), or both warpgroups' 128 (cooperative: CUTLASS needs the MMA's M).
  static constexpr int kFusedEpiRows =
      std::is_same_v<typename Config::EpilogueSchedule,
                     cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative> ? 128 : 64;
  // The plain epilogue: CUTLASS's automatic subtile, unless the configuration names one
  // (ConfigWideEpi64, ConfigWide21Epi64).
  using EpilogueTile = std::conditional_t<
      kFusion != Fusion::None, cute::Shape<cute::Int<kFusedEpiRows>, cute::_64>,
      decltype(epilogue_tile_or<Config>(cutlass::epilogue::collective::EpilogueTileAuto{}))>;
  using EpilogueOp = std::conditional_t<
      kFusedSwiGlu, cutlass::epilogue::fusion::Sm90EVT<Sm90SwiGluZStore<Element>, HNode, ProbLoad>,
      std::conditional_t<
          kFusedDSwiGlu,
          cutlass::epilogue::fusion::Sm90EVT<
              Sm90DSwiGluStore<Element, decltype(cute::size<0>(typename Config::Tile{}))::value,
                               kFusedEpiRows>,
              cutlass::epilogue::fusion::Sm90AccFetch, ProbLoad>,
          HNode>>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Config::Tile,
      typename Config::Cluster, EpilogueTile, float, float,
      void, LayoutD*, kAlign,  // no C source
      ElementD, LayoutD*, kAlign, typename Config::EpilogueSchedule, EpilogueOp>::CollectiveOp;

};
template <DType kDType, bool kBKMajor, class Config, Fusion kFusion = Fusion::None>
using GroupMGemm = GroupedGemm<GroupMParts<kDType, kBKMajor, Config, kFusion>>;

// N tiles of a dz row: one dp partial each (SwiGLU backward).
template <class G>
int64_t dglu_n_tiles(const GroupMProblem& p) {
  constexpr int64_t kTileN = decltype(cute::size<1>(typename G::Tile{}))::value;
  return (p.n + kTileN - 1) / kTileN;
}

// ---- per-group arrays in the device workspace (written by the setup kernel) ----
template <class G>
struct GroupArrays {
  typename G::Shape3* shapes;                // [groups] (m_g, N, K)
  const typename G::Element** ptr_a;         // [groups]
  const typename G::Element** ptr_b;         // [groups]
  typename G::Element** ptr_d;               // [groups]
  const typename G::Element** ptr_bias;      // [groups] (unused when there is no bias)
  typename G::Element** ptr_z;               // [groups] SwiGLU output (kSwiGlu only)
  const float** ptr_probs;                   // [groups] (kSwiGlu/kDSwiGlu with probs only)
  const typename G::Element** ptr_h;         // [groups] kDSwiGlu: h rows of the group
  typename G::Element** ptr_dh;              // [groups] kDSwiGlu: dh rows of the group
  float** ptr_partial;                       // [groups] kDSwiGlu: rows of `partial`
  float* partial;                            // kDSwiGlu with dprobs: [rows, n_tiles] dp partials
  typename G::StrideA* stride_a;             // [groups]
  typename G::StrideB* stride_b;             // [groups]
  typename G::StrideD* stride_d;             // [groups]
  uint32_t* unit_starts;                     // [groups + 1] (blocked_scheduler.cuh)
  uint32_t* stripes;                         // [groups] each group's stripe width (same)
  cute::TmaDescriptor* tensormaps;           // [groups x kGroupTensormaps] (prebuilt_tensormaps.cuh)

  static GroupArrays carve(WorkspaceCarver& w, const GroupMProblem& p) {
    const int64_t groups = p.counts.groups;
    GroupArrays r;
    r.shapes = w.take<typename G::Shape3>(groups);
    r.ptr_a = w.take<const typename G::Element*>(groups);
    r.ptr_b = w.take<const typename G::Element*>(groups);
    r.ptr_d = w.take<typename G::Element*>(groups);
    r.ptr_bias = w.take<const typename G::Element*>(groups);
    const int64_t fused = G::kFusedSwiGlu || G::kFusedDSwiGlu ? groups : 0;
    const int64_t backward = G::kFusedDSwiGlu ? groups : 0;
    r.ptr_z = w.take<typename G::Element*>(G::kFusedSwiGlu ? groups : 0);
    r.ptr_probs = w.take<const float*>(fused);
    r.ptr_h = w.take<const typename G::Element*>(backward);
    r.ptr_dh = w.take<typename G::Element*>(backward);
    r.ptr_partial = w.take<float*>(backward);
    r.stride_a = w.take<typename G::StrideA>(groups);
    r.stride_b = w.take<typename G::StrideB>(groups);
    r.stride_d = w.take<typename G::StrideD>(groups);
    r.unit_starts = w.take<uint32_t>(groups + 1);
    r.stripes = w.take<uint32_t>(groups);
    r.tensormaps = w.take<cute::TmaDescriptor>(groups * kGroupTensormaps);
    // Last: the only array whose size depends on the rows. The cached Params (kernel_common.cuh,
    // ParamsKey: no row count) point into the arrays above, which must not move with the rows.
    r.partial = w.take<float>(G::kFusedDSwiGlu && p.dglu_dprobs ? p.counts.rows * dglu_n_tiles<G>(p) : 0);
    return r;
  }
};

struct GroupMSetupInputs {
  DeviceCounts counts;
  int64_t k, n;
  const void* a;
  const void* b;
  const void* bias;
  void* out;
  void* z;             // SwiGLU output [rows, n/2] or nullptr
  const float* probs;  // [rows] or nullptr
  const void* h;       // SwiGLU backward: h [rows, 2n]
  void* dh;            // SwiGLU backward: dh [rows, 2n]
  bool partials;       // SwiGLU backward: write dp partials (into the arrays' `partial`)
  int64_t n_tiles;
  StripeInputs stripe;  // the groups' stripe widths (kernel_common.cuh)
};

// ---- the setup kernel: device counts → per-group shapes, pointers, strides ----
// One block (scan_groups: the counts read once, validated and scanned into row offsets and tile
// units together).
template <class G>
__global__ void __launch_bounds__(kSetupThreads) group_m_setup(GroupMSetupInputs in, GroupArrays<G> out,
                                                              const __grid_constant__ TensormapTemplates<G> templates) {
  allow_dependent_launch();
  wait_for_prior_grid();  // launched with PDL (group_*_launch): the counts and the workspace are the prior kernels'
  using E = typename G::Element;
  const int k = static_cast<int>(in.k);
  // The GEMM's (M, N) for a group of m rows: (m, N), or (N, m) with A and B swapped (kSwapAB).
  const auto mn_of = [&](int64_t m) {
    return G::kSwapAB ? cute::make_tuple(in.n, m) : cute::make_tuple(m, in.n);
  };
  const auto units_of = [&](int64_t m) {
    return units_per_group<typename G::Config>(cute::get<0>(mn_of(m)), cute::get<1>(mn_of(m)));
  };
  const int64_t units = scan_groups(in.counts, units_of, [&](int64_t g, const GroupPlace& at, bool) {
    const int64_t m = at.m, off = at.off;
    const auto [gemm_m, gemm_n] = mn_of(m);
    out.shapes[g] = typename G::Shape3(static_cast<int>(gemm_m), static_cast<int>(gemm_n), k);
    const E* rows = static_cast<const E*>(in.a) + off * in.k;
    const E* weights = static_cast<const E*>(in.b) + g * in.n * in.k;
    out.ptr_a[g] = G::kSwapAB ? weights : rows;
    out.ptr_b[g] = G::kSwapAB ? rows : weights;
    if (in.out) out.ptr_d[g] = static_cast<E*>(in.out) + off * in.n;
    if (in.bias) out.ptr_bias[g] = static_cast<const E*>(in.bias) + g * in.n;
    if constexpr (G::kFusedSwiGlu) {
      out.ptr_z[g] = static_cast<E*>(in.z) + off * (in.n / 2);
      if (in.probs) out.ptr_probs[g] = in.probs + off;
    }
    if constexpr (G::kFusedDSwiGlu) {
      out.ptr_h[g] = static_cast<const E*>(in.h) + off * 2 * in.n;
      out.ptr_dh[g] = static_cast<E*>(in.dh) + off * 2 * in.n;
      if (in.partials) out.ptr_partial[g] = out.partial + off * in.n_tiles;
      if (in.probs) out.ptr_probs[g] = in.probs + off;
    }
    // Packed strides; they do not depend on m_g (leading dimensions K, K or N, and N), so the
    // rows' extent is given as 1.
    const auto [stride_m, stride_n] = mn_of(1);
    out.stride_a[g] = cutlass::make_cute_packed_stride(typename G::StrideA{}, cute::make_shape(static_cast<int>(stride_m), k, 1));
    out.stride_b[g] = cutlass::make_cute_packed_stride(typename G::StrideB{}, cute::make_shape(static_cast<int>(stride_n), k, 1));
    out.stride_d[g] = cutlass::make_cute_packed_stride(typename G::StrideD{},
                                                       cute::make_shape(static_cast<int>(stride_m), static_cast<int>(stride_n), 1));
    out.stripes[g] = group_stripe<typename G::Config>(in.stripe, gemm_m, in.k, gemm_n, kOutElementBytes<G>);
    out.unit_starts[g] = static_cast<uint32_t>(at.unit);
  });
  if (threadIdx.x == 0) out.unit_starts[in.counts.groups] = static_cast<uint32_t>(units);
  build_tensormaps<G>(templates, in.counts.groups, out.shapes);
}

// ---- SwiGLU backward: dprobs from the epilogue's per-N-tile partials ----
// dp_t = Σ_n partial[t, n] in n order, written or added once to dprobs[t], for t < S.
// (static: this header is included by several instance translation units)
static __global__ void __launch_bounds__(256)
    sum_dp_partials(DeviceCounts counts, const float* __restrict__ partial, int64_t n_tiles,
                    float* __restrict__ dprobs, bool accumulate) {
  const int64_t S = block_valid_rows(counts);  // -1 for invalid counts: nothing is written
  for (int64_t t = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; t < S;
       t += int64_t{gridDim.x} * blockDim.x) {
    float sum = 0.0f;
    for (int64_t n = 0; n < n_tiles; ++n) sum = __fadd_rn(sum, partial[t * n_tiles + n]);
    dprobs[t] = accumulate ? __fadd_rn(dprobs[t], sum) : sum;
  }
}

// ---- host side ----
// The tile order (GroupMProblem::order; blocked_scheduler.cuh). Automatic: kGroupMOrder, CUTLASS's
// (heuristics.h, tile orders). A forced order (the study override) needs the AlongM raster.
inline int group_m_order(const GroupMProblem& p) { return p.order > 0 && p.raster == 0 ? p.order : kGroupMOrder; }

template <class G>
typename G::Gemm::Arguments make_arguments(const GroupMProblem& p, const GroupArrays<G>& arr,
                                           const cutlass::KernelHardwareInfo& hw) {
  typename G::Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  // Host problem shapes: none (nullptr) — the counts live on the device only.
  args.problem_shape.num_groups = static_cast<int>(p.counts.groups);
  args.problem_shape.problem_shapes = arr.shapes;
  args.problem_shape.host_problem_shapes = nullptr;
  args.problem_shape.order = group_m_order(p);
  args.problem_shape.unit_starts = arr.unit_starts;
  args.problem_shape.tensormaps = tensormap_slots(arr.tensormaps);
  args.problem_shape.alternate_k = p.k_order == 1;
  args.mainloop = {arr.ptr_a, arr.stride_a, arr.ptr_b, arr.stride_b};
  // EVT arguments: {children..., op}: {acc fetch, bias row broadcast, plus}.
  typename G::HNode::Arguments h{
      {}, {p.bias ? arr.ptr_bias : nullptr, typename G::Element(0), {}}, {}};
  if constexpr (G::kFusedSwiGlu) {
    // {h, probs column broadcast (null: 1), SwiGLU store}
    typename G::EpilogueOp::Arguments fusion{
        h, {p.glu_probs ? arr.ptr_probs : nullptr, 1.0f, {}}, {arr.ptr_z, p.n / 2}};
    args.epilogue = {fusion, nullptr, arr.stride_d, arr.ptr_d, arr.stride_d};
  } else if constexpr (G::kFusedDSwiGlu) {
    // {acc fetch, probs column broadcast (null: 1), SwiGLU backward store}
    typename G::EpilogueOp::Arguments fusion{
        {},
        {p.glu_probs ? arr.ptr_probs : nullptr, 1.0f, {}},
        {arr.ptr_h, arr.ptr_dh, p.dglu_dprobs ? arr.ptr_partial : nullptr, 2 * p.n,
         static_cast<int>(dglu_n_tiles<G>(p))}};
    args.epilogue = {fusion, nullptr, arr.stride_d, nullptr, arr.stride_d};  // no D
  } else {
    args.epilogue = {h, nullptr, arr.stride_d, arr.ptr_d, arr.stride_d};
  }
  args.hw_info = hw;
  set_raster(args, p.raster, p.swizzle, arr.stripes);
  return args;
}

template <class G>
using GroupMCall = GroupedCall<G, GroupArrays<G>, GroupMProblem>;

template <class G>
size_t workspace_bytes_of(const GroupMProblem& p) {
  return GroupMCall<G>(p, nullptr).bytes;
}

template <class G>
void launch(const GroupMProblem& p, void* workspace, cudaStream_t stream, const char* name) {
  const GroupMCall<G> call(p, workspace);
  const GroupMSetupInputs in{p.counts,     p.k,         p.n,         p.a,
                             p.b,          p.bias,      p.out,       p.glu_z,
                             p.glu_probs,  p.dglu_h,    p.dglu_dh,   p.dglu_dprobs != nullptr,
                             dglu_n_tiles<G>(p),
                             stripe_inputs<typename G::Config>(p.raster, p.swizzle, call.hw)};
  const int variant = (p.bias != nullptr ? 1 : 0) | (p.glu_probs != nullptr ? 2 : 0) |
                      (p.dglu_dprobs != nullptr ? 4 : 0) | (group_m_order(p) << 3);
  auto params = call.gemm_params(p, workspace, stream, name, variant, p.raster, p.swizzle);
  // With PDL after whatever kernel precedes it on the stream (it waits for that grid before it
  // reads or writes anything: wait_for_prior_grid), so its launch overlaps that kernel's end.
  launch_kernel(group_m_setup<G>, {.block = dim3(kSetupThreads), .programmatic = p.pdl == 1, .name = "setup"}, stream, in, call.arrays,
                templates_of<G>(params));
  call.run_gemm(params, p, stream, name);
  if constexpr (G::kFusedDSwiGlu) {
    if (p.dglu_dprobs) {
      constexpr int kThreads = 256;
      const int64_t blocks = std::min<int64_t>((p.counts.rows + kThreads - 1) / kThreads, 4096);
      if (blocks > 0) {
        launch_kernel(sum_dp_partials,
                      {.grid = dim3(static_cast<unsigned>(blocks)), .block = dim3(kThreads), .name = "dprobs sum"},
                      stream, p.counts, static_cast<const float*>(call.arrays.partial), dglu_n_tiles<G>(p),
                      p.dglu_dprobs, p.dglu_accumulate);
      }
    }
  }
}

// Defines the GroupMInstance `symbol` (declared in group_m_instances.h) for one configuration.
// fusion: None, SwiGlu (GroupMProblem::glu_z) or DSwiGlu (GroupMProblem::dglu_dh).
#define MOEKIT_SM90_GROUP_M_INSTANCE(symbol, dtype, b_k_major, config, fusion, label)       \
  namespace {                                                                             \
  using symbol##_gemm = ::moekit::cuda::sm90::GroupMGemm<dtype, b_k_major, config,         \
                                                         ::moekit::cuda::sm90::Fusion::fusion>; \
  size_t symbol##_ws(const GroupMProblem& p) {                                            \
    return ::moekit::cuda::sm90::workspace_bytes_of<symbol##_gemm>(p);                    \
  }                                                                                       \
  void symbol##_run(const GroupMProblem& p, void* ws, cudaStream_t s) {                   \
    ::moekit::cuda::sm90::launch<symbol##_gemm>(p, ws, s, label);                         \
  }                                                                                       \
  }                                                                                       \
  const GroupMInstance symbol{label, symbol##_ws, symbol##_run};

}  // namespace moekit::cuda::sm90
