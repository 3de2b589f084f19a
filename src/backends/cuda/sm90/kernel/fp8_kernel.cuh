// Internal: the CUTLASS 3.x configuration of the FP8 grouped GEMMs with per-group scales
// (device/fp8_gemm_sm90.h: the math and the promises), their graph-safe setup kernels and host
// launchers. Included ONLY by instances/kernels_fp8*.cu (MOEKIT_SM90_FP8_*_INSTANCE, below).
//
// The same machinery as the 16-bit kernels (kernel_common.cuh: GroupedGemm's warp-specialised
// persistent ptr-array kernel, the prebuilt TMA descriptors, the tile orders and stripes, the
// cached Params), with
//   - 8-bit A and B, both K-major (Hopper's FP8 wgmma reads 8-bit operands K-major only): group-M
//     A = the rows' rowwise codes, B = the weight's rowwise copy (fprop) or columnwise copy
//     (dgrad, row stride G·N); group-K A and B = the columnwise copies of dy and x, row stride T,
//     a group's columns [off_g, off_g + m_g) — its K extent m_g in the descriptors, so TMA
//     zero-fills the last K tile and never reads the next group's codes;
//   - per-group scales (fp8-current): the epilogue D = alpha_g · acc (+ bias_g | + beta · C),
//     alpha_g = sa[g] · sb[g] by CUTLASS's scalar broadcast over per-group pointer arrays (two
//     scalars, multiplied in fp32);
//   - block scales (fp8-block, Fp8BlockScales): CUTLASS's FP8 blockwise mainloop, which scales
//     each 128-deep K block's partial sums by its A and B scales as it promotes them to fp32 (a
//     producer warp of its own copies the scales to shared memory beside the TMA loads), and the
//     epilogue D = acc (+ bias_g | + beta · C). The same per-group pointer arrays carry the
//     scales: there each group's first scale, which the mainloop reads in the compact layouts
//     the quantize writes (fp8_gemm_sm90.h).
// The arrays are written by the setup kernel: everything per call reaches the kernel through the
// workspace, so the cached Params (kernel_common.cuh) stay valid.
#pragma once

#include "backends/cuda/sm90/device/fp8_gemm_sm90.h"
#include "backends/cuda/sm90/instances/fp8_instances.h"
#include "backends/cuda/sm90/kernel/kernel_common.cuh"
#include "backends/cuda/sm90/scheduler/blocked_scheduler.cuh"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/float8.h"

namespace moekit::cuda::sm90 {

// ---- tile configurations (128x128x128: 128 bytes of K per stage, as the 16-bit kernels' 64) ----
// fprop: ping-pong, cluster 1x2, the tensor cores' own accumulation (TE's forward: no split
// accumulator) — each consumer warpgroup holds a whole 128x128 tile's fp32 accumulators (128
// registers a thread).
struct ConfigFp8Fast {
  using Schedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8FastAccum;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
  using Tile = cute::Shape<cute::_128, cute::_128, cute::_128>;
  using Cluster = cute::Shape<cute::_1, cute::_2, cute::_1>;
};
// fprop of groups of >= 256 rows on average (heuristics.h, takes_fp8_fast_coop256): CUTLASS
// example 57's cooperative 256x128x128, cluster 1x2 — each consumer warpgroup 128x128 of the tile,
// the B tile read once for 256 rows.
struct ConfigFp8FastCoop256 {
  using Schedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
  using Tile = cute::Shape<cute::_256, cute::_128, cute::_128>;
  using Cluster = cute::Shape<cute::_1, cute::_2, cute::_1>;
};
// dgrad and wgrad: the accumulators promoted to fp32 every four MMA k-blocks (CUTLASS's FP8
// mainloop under the plain schedule: TE's split accumulator), which doubles them — cooperative,
// each consumer warpgroup 64x128 of the tile (64 + 64 registers a thread). Ping-pong's 128 + 128
// spilled to local memory (ctest sm90.kernel_sass).
struct ConfigFp8 {
  using Schedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
  using Tile = cute::Shape<cute::_128, cute::_128, cute::_128>;
  using Cluster = cute::Shape<cute::_1, cute::_2, cute::_1>;
};

// fp8-block: CUTLASS's blockwise mainloop (every 128-deep K block promoted with its own scales),
// cooperative 128x128x128, cluster 1x2 — CUTLASS example 68's tile. The mainloop waits for each
// K block's MMAs before scaling them, so a warpgroup's MMAs do not overlap across K blocks.
struct ConfigFp8Block {
  using Schedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
  using Tile = cute::Shape<cute::_128, cute::_128, cute::_128>;
  using Cluster = cute::Shape<cute::_1, cute::_2, cute::_1>;
};

// The scales of a GEMM: per group (fp8-current: alpha in the epilogue), or blocks of kGranM rows
// of A / kGranN rows of B by 128 of K, each operand's scales K-major or MN-major (the layouts of
// fp8_gemm_sm90.h: fprop 1 / 128, K / K; dgrad 1 / 128, K / MN; wgrad 1 / 1, MN / MN).
struct Fp8PerGroupScales {
  static constexpr bool kBlock = false;
  using LayoutSFA = void;
  using LayoutSFB = void;
};
template <int kGranM, int kGranN, bool kSfaKMajor, bool kSfbKMajor>
struct Fp8BlockScales {
  static constexpr bool kBlock = true;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<
      kGranM, kGranN, 128, kSfaKMajor ? cute::GMMA::Major::K : cute::GMMA::Major::MN,
      kSfbKMajor ? cute::GMMA::Major::K : cute::GMMA::Major::MN>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
};
using Fp8FpropBlockScales = Fp8BlockScales<1, 128, true, true>;
using Fp8DgradBlockScales = Fp8BlockScales<1, 128, true, false>;
using Fp8WgradBlockScales = Fp8BlockScales<1, 1, false, false>;

template <Fp8Code kCode> struct Fp8Element;
template <> struct Fp8Element<Fp8Code::E4M3> { using type = cutlass::float_e4m3_t; };
template <> struct Fp8Element<Fp8Code::E5M2> { using type = cutlass::float_e5m2_t; };

// alpha_g = sa[g] · sb[g]: two per-group pointer arrays, their scalars multiplied (fp32).
using Fp8AlphaLoad =
    cutlass::epilogue::fusion::Sm90ScalarBroadcastPtrArray<float, cute::Stride<cute::_0, cute::_0, int64_t>, 2>;

template <class Arrays>
typename Fp8AlphaLoad::Arguments fp8_alpha_arguments(const Arrays& arr) {
  typename Fp8AlphaLoad::Arguments alpha{};
  alpha.scalar_ptr_arrays[0] = arr.ptr_sa;
  alpha.scalar_ptr_arrays[1] = arr.ptr_sb;
  alpha.dScalar[0] = alpha.dScalar[1] = {cute::_0{}, cute::_0{}, int64_t{1}};
  return alpha;
}

// ---- group-M: out = alpha_g · (A_g · B_gᵀ) + bias_g, bf16 or f16 (block scales: no alpha) ----
template <Fp8Code kA, Fp8Code kB, DType kOut, class Config_, class Scales = Fp8PerGroupScales>
struct Fp8GroupMParts {
  using Config = Config_;
  static constexpr bool kBlockScaled = Scales::kBlock;
  using ProblemShape = BlockedGroupProblemShape<cute::Shape<int, int, int>>;
  using Tile = typename Config::Tile;
  using ElementA = typename Fp8Element<kA>::type;
  using ElementB = typename Fp8Element<kB>::type;
  using Element = ElementA;
  using ElementD = typename CutlassElement<kOut>::type;
  static_assert(kOut == DType::BF16 || kOut == DType::F16, "group-M writes the layer's 16-bit dtype");
  static constexpr bool kSwapAB = false;
  using LayoutA = cutlass::layout::RowMajor;     // [m_g, K], K-major
  using LayoutB = cutlass::layout::ColumnMajor;  // [N, K] with row stride ldb: K-major
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlign = 16;  // 8-bit elements per 16 bytes (TMA)
  static constexpr int kAlignD = 8;
  // Block scales: the builder's layout tags pair each operand with its scales' layout.
  using MainloopLayoutA = std::conditional_t<kBlockScaled, cute::tuple<LayoutA*, typename Scales::LayoutSFA*>, LayoutA*>;
  using MainloopLayoutB = std::conditional_t<kBlockScaled, cute::tuple<LayoutB*, typename Scales::LayoutSFB*>, LayoutB*>;
  using BiasLoad = cutlass::epilogue::fusion::Sm90RowBroadcast<
      0, Tile, ElementD*, float, cute::Stride<cute::_0, cute::_1, cute::_0>, kAlignD>;
  using EpilogueOp = std::conditional_t<
      kBlockScaled,
      cutlass::epilogue::fusion::Sm90EVT<
          cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, ElementD, float,
                                                 cutlass::FloatRoundStyle::round_to_nearest>,
          cutlass::epilogue::fusion::Sm90AccFetch, BiasLoad>,
      cutlass::epilogue::fusion::Sm90EVT<
          cutlass::epilogue::fusion::Sm90Compute<cutlass::homogeneous_multiply_add, ElementD, float,
                                                 cutlass::FloatRoundStyle::round_to_nearest>,
          Fp8AlphaLoad, cutlass::epilogue::fusion::Sm90AccFetch, BiasLoad>>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, typename Config::Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlignD,
      ElementD, LayoutD*, kAlignD, typename Config::EpilogueSchedule, EpilogueOp>::CollectiveOp;
};
template <Fp8Code kA, Fp8Code kB, DType kOut, class Config, class Scales>
using Fp8GroupMGemm = GroupedGemm<Fp8GroupMParts<kA, kB, kOut, Config, Scales>>;

template <class G>
struct Fp8GroupMArrays {
  typename G::Shape3* shapes;
  const typename G::ElementA** ptr_a;
  const typename G::ElementB** ptr_b;
  typename G::ElementD** ptr_d;
  const typename G::ElementD** ptr_bias;
  const float** ptr_sa;
  const float** ptr_sb;
  typename G::StrideA* stride_a;
  typename G::StrideB* stride_b;
  typename G::StrideD* stride_d;
  uint32_t* unit_starts;  // [groups + 1]
  uint32_t* stripes;      // [groups]
  cute::TmaDescriptor* tensormaps;

  static Fp8GroupMArrays carve(WorkspaceCarver& w, const Fp8GroupMProblem& p) {
    const int64_t groups = p.counts.groups;
    Fp8GroupMArrays r;
    r.shapes = w.take<typename G::Shape3>(groups);
    r.ptr_a = w.take<const typename G::ElementA*>(groups);
    r.ptr_b = w.take<const typename G::ElementB*>(groups);
    r.ptr_d = w.take<typename G::ElementD*>(groups);
    r.ptr_bias = w.take<const typename G::ElementD*>(groups);
    r.ptr_sa = w.take<const float*>(groups);
    r.ptr_sb = w.take<const float*>(groups);
    r.stride_a = w.take<typename G::StrideA>(groups);
    r.stride_b = w.take<typename G::StrideB>(groups);
    r.stride_d = w.take<typename G::StrideD>(groups);
    r.unit_starts = w.take<uint32_t>(groups + 1);
    r.stripes = w.take<uint32_t>(groups);
    r.tensormaps = w.take<cute::TmaDescriptor>(groups * kGroupTensormaps);
    return r;
  }
};

struct Fp8GroupMSetupInputs {
  DeviceCounts counts;
  int64_t k, n, b_group_stride, ldb;
  const void* a;
  const void* b;
  const void* bias;
  void* out;
  const float* sa;
  const float* sb;
  // Group g's scales: sa + off_g · sa_row_stride (block scales: ⌈k/128⌉ a row) or sa + g (0:
  // per group); sb + g · sb_group_stride.
  int64_t sa_row_stride, sb_group_stride;
  StripeInputs stripe;
};

template <class G>
__global__ void __launch_bounds__(kSetupThreads)
    fp8_group_m_setup(Fp8GroupMSetupInputs in, Fp8GroupMArrays<G> out,
                      const __grid_constant__ TensormapTemplates<G> templates) {
  allow_dependent_launch();
  wait_for_prior_grid();  // launched with PDL: the counts, codes and scales are the prior kernels'
  const int k = static_cast<int>(in.k), n = static_cast<int>(in.n);
  const auto units_of = [&](int64_t m) { return units_per_group<typename G::Config>(m, in.n); };
  const int64_t units = scan_groups(in.counts, units_of, [&](int64_t g, const GroupPlace& at, bool) {
    out.shapes[g] = typename G::Shape3(static_cast<int>(at.m), n, k);
    out.ptr_a[g] = static_cast<const typename G::ElementA*>(in.a) + at.off * in.k;
    out.ptr_b[g] = static_cast<const typename G::ElementB*>(in.b) + g * in.b_group_stride;
    out.ptr_d[g] = static_cast<typename G::ElementD*>(in.out) + at.off * in.n;
    if (in.bias) out.ptr_bias[g] = static_cast<const typename G::ElementD*>(in.bias) + g * in.n;
    out.ptr_sa[g] = in.sa + (in.sa_row_stride > 0 ? at.off * in.sa_row_stride : g);
    out.ptr_sb[g] = in.sb + g * in.sb_group_stride;
    // Row strides: A k, B ldb, D n (the extents' first entry 1: strides do not depend on m_g).
    out.stride_a[g] = cutlass::make_cute_packed_stride(typename G::StrideA{}, cute::make_shape(1, k, 1));
    out.stride_b[g] = cutlass::make_cute_packed_stride(typename G::StrideB{},
                                                       cute::make_shape(1, static_cast<int>(in.ldb), 1));
    out.stride_d[g] = cutlass::make_cute_packed_stride(typename G::StrideD{}, cute::make_shape(1, n, 1));
    out.stripes[g] = group_stripe<typename G::Config>(in.stripe, at.m, in.k, in.n, kOutElementBytes<G>);
    out.unit_starts[g] = static_cast<uint32_t>(at.unit);
  });
  if (threadIdx.x == 0) out.unit_starts[in.counts.groups] = static_cast<uint32_t>(units);
  build_tensormaps<G>(templates, in.counts.groups, out.shapes);
}

inline int fp8_group_m_order(const Fp8GroupMProblem& p) {
  return p.order > 0 && p.raster == 0 ? p.order : kGroupMOrder;
}

template <class G>
typename G::Gemm::Arguments make_arguments(const Fp8GroupMProblem& p, const Fp8GroupMArrays<G>& arr,
                                           const cutlass::KernelHardwareInfo& hw) {
  typename G::Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape.num_groups = static_cast<int>(p.counts.groups);
  args.problem_shape.problem_shapes = arr.shapes;
  args.problem_shape.host_problem_shapes = nullptr;
  args.problem_shape.order = fp8_group_m_order(p);
  args.problem_shape.unit_starts = arr.unit_starts;
  args.problem_shape.tensormaps = tensormap_slots(arr.tensormaps);
  typename G::BiasLoad::Arguments bias{p.bias ? arr.ptr_bias : nullptr, typename G::ElementD(0), {}};
  typename G::EpilogueOp::Arguments fusion{};
  if constexpr (G::kBlockScaled) {
    // The blockwise mainloop's scale loads walk K forward only: no alternating K order.
    args.problem_shape.alternate_k = false;
    args.mainloop = {arr.ptr_a, arr.stride_a, arr.ptr_b, arr.stride_b, arr.ptr_sa, nullptr, arr.ptr_sb, nullptr};
    fusion = {{}, bias, {}};  // {acc, bias (null array: 0), plus}
  } else {
    args.problem_shape.alternate_k = p.k_order == 1;
    args.mainloop = {arr.ptr_a, arr.stride_a, arr.ptr_b, arr.stride_b};
    fusion = {fp8_alpha_arguments(arr), {}, bias, {}};  // {alpha, acc, bias, multiply-add}
  }
  args.epilogue = {fusion, nullptr, arr.stride_d, arr.ptr_d, arr.stride_d};
  args.hw_info = hw;
  set_raster(args, p.raster, p.swizzle, arr.stripes);
  return args;
}

template <class G>
using Fp8GroupMCall = GroupedCall<G, Fp8GroupMArrays<G>, Fp8GroupMProblem>;

template <class G>
size_t fp8_group_m_workspace_bytes(const Fp8GroupMProblem& p) {
  return Fp8GroupMCall<G>(p, nullptr).bytes;
}

template <class G>
void fp8_group_m_launch(const Fp8GroupMProblem& p, void* workspace, cudaStream_t stream, const char* name) {
  const Fp8GroupMCall<G> call(p, workspace);
  const bool block = G::kBlockScaled;
  const Fp8GroupMSetupInputs in{p.counts, p.k, p.n, p.b_group_stride, p.ldb, p.a, p.b, p.bias, p.out,
                                p.scale_a, p.scale_b,
                                block ? (p.k + kScaleBlockRows - 1) / kScaleBlockRows : 0,
                                block ? p.b_scale_group_stride : 1,
                                stripe_inputs<typename G::Config>(p.raster, p.swizzle, call.hw)};
  const int variant = (p.bias != nullptr ? 1 : 0) | (fp8_group_m_order(p) << 3);
  auto params = call.gemm_params(p, workspace, stream, name, variant, p.raster, p.swizzle);
  launch_kernel(fp8_group_m_setup<G>,
                {.block = dim3(kSetupThreads), .programmatic = p.pdl == 1, .name = "setup"}, stream, in,
                call.arrays, templates_of<G>(params));
  call.run_gemm(params, p, stream, name);
}

// ---- group-K: dw[g] = alpha_g · (dyᵀ_g · x_g) (+ beta · dw[g]) ----
template <Fp8Code kA, Fp8Code kB, DType kOut, class Config_, class Scales = Fp8PerGroupScales>
struct Fp8GroupKParts {
  using Config = Config_;
  static constexpr bool kBlockScaled = Scales::kBlock;
  using ProblemShape = BlockedGroupProblemShape<cute::Shape<int, int, int>>;
  using Tile = typename Config::Tile;
  using ElementA = typename Fp8Element<kA>::type;
  using ElementB = typename Fp8Element<kB>::type;
  using Element = ElementA;
  using ElementD = typename CutlassElement<kOut>::type;
  // C (the accumulate source) exists only for an fp32 dw: main_grad.
  using ElementC = std::conditional_t<kOut == DType::F32, float, void>;
  using LayoutA = cutlass::layout::RowMajor;     // dy's columnwise copy: [n, T], K (rows) contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // x's columnwise copy: [k, T], K-major
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlign = 16;
  static constexpr int kAlignD = 16 / sizeof(ElementD);
  using MainloopLayoutA = std::conditional_t<kBlockScaled, cute::tuple<LayoutA*, typename Scales::LayoutSFA*>, LayoutA*>;
  using MainloopLayoutB = std::conditional_t<kBlockScaled, cute::tuple<LayoutB*, typename Scales::LayoutSFB*>, LayoutB*>;
  using ScaledOut = std::conditional_t<std::is_void_v<ElementC>, ElementD, float>;
  // alpha · acc, or (block scales: scaled in the mainloop) acc.
  using AlphaAcc = std::conditional_t<
      kBlockScaled,
      cutlass::epilogue::fusion::Sm90EVT<
          cutlass::epilogue::fusion::Sm90Compute<cutlass::epilogue::thread::Identity, ScaledOut, float,
                                                 cutlass::FloatRoundStyle::round_to_nearest>,
          cutlass::epilogue::fusion::Sm90AccFetch>,
      cutlass::epilogue::fusion::Sm90EVT<
          cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, ScaledOut, float,
                                                 cutlass::FloatRoundStyle::round_to_nearest>,
          Fp8AlphaLoad, cutlass::epilogue::fusion::Sm90AccFetch>>;
  // An f32 dw: beta · C + alpha · acc, CUTLASS's linear-combination node (C not loaded when
  // beta is 0: not accumulating); a bf16 dw: alpha · acc.
  using FusionOp = std::conditional_t<
      std::is_void_v<ElementC>, AlphaAcc,
      cutlass::epilogue::fusion::Sm90EVT<
          cutlass::epilogue::fusion::Sm90Compute<cutlass::homogeneous_multiply_add, ElementD, float,
                                                 cutlass::FloatRoundStyle::round_to_nearest>,
          cutlass::epilogue::fusion::Sm90ScalarBroadcast<float>,
          cutlass::epilogue::fusion::Sm90SrcFetch<float>, AlphaAcc>>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, typename Config::Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, LayoutD*, kAlignD,
      ElementD, LayoutD*, kAlignD, typename Config::EpilogueSchedule, FusionOp>::CollectiveOp;
};
template <Fp8Code kA, Fp8Code kB, DType kOut, class Config, class Scales>
using Fp8GroupKGemm = GroupedGemm<Fp8GroupKParts<kA, kB, kOut, Config, Scales>>;

template <class G>
struct Fp8GroupKArrays {
  typename G::Shape3* shapes;  // (n, k, m_g), or (0, k, 0) for an empty group
  const typename G::ElementA** ptr_a;
  const typename G::ElementB** ptr_b;
  typename G::ElementD** ptr_d;
  const float** ptr_sa;
  const float** ptr_sb;
  typename G::StrideA* stride_a;
  typename G::StrideB* stride_b;
  typename G::StrideD* stride_d;
  uint32_t* unit_starts;
  uint32_t* stripes;
  cute::TmaDescriptor* tensormaps;

  static Fp8GroupKArrays carve(WorkspaceCarver& w, const Fp8GroupKProblem& p) {
    const int64_t groups = p.counts.groups;
    Fp8GroupKArrays r;
    r.shapes = w.take<typename G::Shape3>(groups);
    r.ptr_a = w.take<const typename G::ElementA*>(groups);
    r.ptr_b = w.take<const typename G::ElementB*>(groups);
    r.ptr_d = w.take<typename G::ElementD*>(groups);
    r.ptr_sa = w.take<const float*>(groups);
    r.ptr_sb = w.take<const float*>(groups);
    r.stride_a = w.take<typename G::StrideA>(groups);
    r.stride_b = w.take<typename G::StrideB>(groups);
    r.stride_d = w.take<typename G::StrideD>(groups);
    r.unit_starts = w.take<uint32_t>(groups + 1);
    r.stripes = w.take<uint32_t>(groups);
    r.tensormaps = w.take<cute::TmaDescriptor>(groups * kGroupTensormaps);
    return r;
  }
};

struct Fp8GroupKSetupInputs {
  DeviceCounts counts;
  int64_t k, n, ld;
  const void* dy;
  const void* x;
  void* dw;
  const float* sa;
  const float* sb;
  bool block_scales;  // group g's scales: sa + row_block_g · n, sb + row_block_g · k; else + g
  StripeInputs stripe;
};

// Block 0: every group's shape, pointers, strides, tile units, stripe and descriptors, the counts
// checked to be multiples of kFp8GroupKRowMultiple (else nothing is written: kCountsMisaligned).
// Blocks 1.. (not accumulating): the empty groups' zeros, under the same check.
template <class G>
__global__ void __launch_bounds__(kSetupThreads)
    fp8_group_k_setup(Fp8GroupKSetupInputs in, Fp8GroupKArrays<G> out,
                      const __grid_constant__ TensormapTemplates<G> templates) {
  allow_dependent_launch();
  wait_for_prior_grid();
  if (blockIdx.x > 0) {
    zero_empty_group_outputs<typename G::ElementD>(in.counts, in.n, in.k, in.dw, kFp8GroupKRowMultiple);
    return;
  }
  const int n = static_cast<int>(in.n), k = static_cast<int>(in.k), ld = static_cast<int>(in.ld);
  const auto units_of = [&](int64_t) { return units_per_group<typename G::Config>(in.n, in.k); };
  const int64_t units = scan_groups(
      in.counts, units_of,
      [&](int64_t g, const GroupPlace& at, bool) {
        const int64_t m = at.m;
        out.shapes[g] = m > 0 ? typename G::Shape3(n, k, static_cast<int>(m)) : typename G::Shape3(0, k, 0);
        out.ptr_a[g] = static_cast<const typename G::ElementA*>(in.dy) + at.off;
        out.ptr_b[g] = static_cast<const typename G::ElementB*>(in.x) + at.off;
        out.ptr_d[g] = static_cast<typename G::ElementD*>(in.dw) + g * in.n * in.k;
        out.ptr_sa[g] = in.sa + (in.block_scales ? at.row_block * in.n : g);
        out.ptr_sb[g] = in.sb + (in.block_scales ? at.row_block * in.k : g);
        out.stride_a[g] = cutlass::make_cute_packed_stride(typename G::StrideA{}, cute::make_shape(1, ld, 1));
        out.stride_b[g] = cutlass::make_cute_packed_stride(typename G::StrideB{}, cute::make_shape(1, ld, 1));
        out.stride_d[g] = cutlass::make_cute_packed_stride(typename G::StrideD{}, cute::make_shape(n, k, 1));
        out.unit_starts[g] = static_cast<uint32_t>(at.unit);
        out.stripes[g] = group_stripe<typename G::Config>(in.stripe, in.n, m, in.k, kOutElementBytes<G>);
      },
      kFp8GroupKRowMultiple);
  if (threadIdx.x == 0) out.unit_starts[in.counts.groups] = static_cast<uint32_t>(units);
  build_tensormaps<G>(templates, in.counts.groups, out.shapes);
}

template <class G>
int fp8_group_k_order(const Fp8GroupKProblem& p, const cutlass::KernelHardwareInfo& hw) {
  return tile_order(p.order, p.raster == 0, tiles_per_group<typename G::Config>(p.n, p.k), hw.sm_count);
}

template <class G>
typename G::Gemm::Arguments make_arguments(const Fp8GroupKProblem& p, const Fp8GroupKArrays<G>& arr,
                                           const cutlass::KernelHardwareInfo& hw) {
  typename G::Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape.num_groups = static_cast<int>(p.counts.groups);
  args.problem_shape.problem_shapes = arr.shapes;
  args.problem_shape.host_problem_shapes = nullptr;
  args.problem_shape.order = fp8_group_k_order<G>(p, hw);
  args.problem_shape.unit_starts = arr.unit_starts;
  args.problem_shape.slot_groups = nullptr;  // group order
  args.problem_shape.tensormaps = tensormap_slots(arr.tensormaps);
  typename G::AlphaAcc::Arguments alpha_acc{};
  if constexpr (G::kBlockScaled) {
    args.problem_shape.alternate_k = false;  // as group-M's
    args.mainloop = {arr.ptr_a, arr.stride_a, arr.ptr_b, arr.stride_b, arr.ptr_sa, nullptr, arr.ptr_sb, nullptr};
    alpha_acc = {{}, {}};  // {acc, identity}
  } else {
    args.problem_shape.alternate_k = p.k_order == 1;
    args.mainloop = {arr.ptr_a, arr.stride_a, arr.ptr_b, arr.stride_b};
    alpha_acc = {fp8_alpha_arguments(arr), {}, {}};  // {alpha, acc, multiplies}
  }
  if constexpr (std::is_void_v<typename G::ElementC>) {
    args.epilogue.thread = alpha_acc;
    args.epilogue.ptr_C = nullptr;
  } else {
    typename cutlass::epilogue::fusion::Sm90ScalarBroadcast<float>::Arguments beta{};
    beta.scalars[0] = p.accumulate ? 1.0f : 0.0f;
    args.epilogue.thread = {beta, {}, alpha_acc, {}};
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
using Fp8GroupKCall = GroupedCall<G, Fp8GroupKArrays<G>, Fp8GroupKProblem>;

template <class G>
size_t fp8_group_k_workspace_bytes(const Fp8GroupKProblem& p) {
  return Fp8GroupKCall<G>(p, nullptr).bytes;
}

template <class G>
void fp8_group_k_launch(const Fp8GroupKProblem& p, void* workspace, cudaStream_t stream, const char* name) {
  const Fp8GroupKCall<G> call(p, workspace);
  const Fp8GroupKSetupInputs in{p.counts, p.k, p.n, p.ld, p.dy, p.x, p.dw, p.scale_dy, p.scale_x,
                                G::kBlockScaled,
                                stripe_inputs<typename G::Config>(p.raster, p.swizzle, call.hw)};
  auto params = call.gemm_params(p, workspace, stream, name,
                                 (p.accumulate ? 1 : 0) | (fp8_group_k_order<G>(p, call.hw) << 1),
                                 p.raster, p.swizzle);
  const int64_t group_vectors = p.n * p.k * static_cast<int64_t>(sizeof(typename G::ElementD)) / 16;
  const int64_t zero_blocks =
      p.accumulate ? 0
                   : std::min<int64_t>((group_vectors + kSetupThreads - 1) / kSetupThreads,
                                       2 * int64_t{call.hw.sm_count});
  launch_kernel(fp8_group_k_setup<G>,
                {.grid = dim3(static_cast<unsigned>(1 + zero_blocks)), .block = dim3(kSetupThreads),
                 .programmatic = p.pdl == 1, .name = "setup"},
                stream, in, call.arrays, templates_of<G>(params));
  call.run_gemm(params, p, stream, name);
}

// Defines the instances declared in instances/fp8_instances.h.
// `scales`: Fp8PerGroupScales or one of the Fp8*BlockScales (with ConfigFp8Block).
#define MOEKIT_SM90_FP8_GROUP_M_INSTANCE(symbol, a_code, b_code, out_dtype, config, scales, label) \
  namespace {                                                                                   \
  using symbol##_gemm = ::moekit::cuda::sm90::Fp8GroupMGemm<::moekit::cuda::sm90::Fp8Code::a_code, \
                                                            ::moekit::cuda::sm90::Fp8Code::b_code, \
                                                            out_dtype, config, scales>;         \
  size_t symbol##_ws(const Fp8GroupMProblem& p) {                                               \
    return ::moekit::cuda::sm90::fp8_group_m_workspace_bytes<symbol##_gemm>(p);                 \
  }                                                                                             \
  void symbol##_run(const Fp8GroupMProblem& p, void* ws, cudaStream_t s) {                      \
    ::moekit::cuda::sm90::fp8_group_m_launch<symbol##_gemm>(p, ws, s, label);                   \
  }                                                                                             \
  }                                                                                             \
  const Fp8GroupMInstance symbol{label, symbol##_ws, symbol##_run};

#define MOEKIT_SM90_FP8_GROUP_K_INSTANCE(symbol, a_code, b_code, out_dtype, config, scales, label) \
  namespace {                                                                                   \
  using symbol##_gemm = ::moekit::cuda::sm90::Fp8GroupKGemm<::moekit::cuda::sm90::Fp8Code::a_code, \
                                                            ::moekit::cuda::sm90::Fp8Code::b_code, \
                                                            out_dtype, config, scales>;         \
  size_t symbol##_ws(const Fp8GroupKProblem& p) {                                               \
    return ::moekit::cuda::sm90::fp8_group_k_workspace_bytes<symbol##_gemm>(p);                 \
  }                                                                                             \
  void symbol##_run(const Fp8GroupKProblem& p, void* ws, cudaStream_t s) {                      \
    ::moekit::cuda::sm90::fp8_group_k_launch<symbol##_gemm>(p, ws, s, label);                   \
  }                                                                                             \
  }                                                                                             \
  const Fp8GroupKInstance symbol{label, symbol##_ws, symbol##_run};

}  // namespace moekit::cuda::sm90
