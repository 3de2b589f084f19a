// Internal: the CUTLASS 3.x configuration of the sm90 group-M grouped GEMM, its graph-safe setup
// kernel and its host launcher. Included ONLY by the instance translation units group_m_bf16.cu
// and group_m_f16.cu (MOEKIT_SM90_GROUP_M_INSTANCE, below) and bench/sm90_explore.cu.
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
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "cuda/check.h"
#include "cuda/sm90/group_m_instances.h"
#include "moekit/core/error.h"

#if !defined(CUTLASS_ARCH_MMA_MODIFIABLE_TMA_SM90_SUPPORTED)
#error "the sm90 grouped GEMM needs CUDA >= 12.3 (modifiable TMA descriptors)"
#endif

namespace moekit::cuda::sm90 {

// ---- tile configurations (index = GroupMProblem::config) ----
// kLarge: ping-pong — two consumer warpgroups on two 128x128 tiles, one's epilogue overlapping
// the other's mainloop; a 1x2 cluster multicasts each A tile to the CTAs of two N tiles.
// Against the cooperative 256x128x64 tile (cluster 1x2, the kLarge up to b73d54f), in turns in one
// process (bench/results/2026-11-29-nvidia-h200-bb650c6-backends.md): fprop +2% to +13% on the six
// large tile-study problems, dgrad +5% to +12% on four of them but -6% (qwen3_fc2, N-major B with
// n = 1536) and -11% (mixtral skewed, k = 28672). Same compile cost per TU (~145 s of CPU).
struct ConfigLarge {
  using Schedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
  using Tile = cute::Shape<cute::_128, cute::_128, cute::_64>;
  using Cluster = cute::Shape<cute::_1, cute::_2, cute::_1>;
};
struct ConfigSmallM {  // kSmallM: 64-row tiles for groups of few rows (weight-bandwidth bound)
  using Schedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
  using Tile = cute::Shape<cute::_64, cute::_128, cute::_64>;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
};

template <DType kDType> struct CutlassElement;
template <> struct CutlassElement<DType::BF16> { using type = cutlass::bfloat16_t; };
template <> struct CutlassElement<DType::F16> { using type = cutlass::half_t; };

template <DType kDType, bool kBKMajor, class Config>
struct GroupMGemm {
  using Element = typename CutlassElement<kDType>::type;
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;  // (m_g, N, K)
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = std::conditional_t<kBKMajor, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlign = 8;  // elements per 16 bytes (TMA)

  using BiasLoad = cutlass::epilogue::fusion::Sm90RowBroadcast<
      0, typename Config::Tile, Element*, float, cute::Stride<cute::_0, cute::_1, cute::_0>, kAlign>;
  using EpilogueOp = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, Element, float,
                                             cutlass::FloatRoundStyle::round_to_nearest>,
      cutlass::epilogue::fusion::Sm90AccFetch, BiasLoad>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Config::Tile,
      typename Config::Cluster, cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutD*, kAlign,  // no C source
      Element, LayoutD*, kAlign, typename Config::EpilogueSchedule, EpilogueOp>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlign, Element,
      LayoutB*, kAlign, float, typename Config::Tile, typename Config::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Config::Schedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop,
                                                      CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  using Shape3 = typename ProblemShape::UnderlyingProblemShape;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideC = typename Kernel::InternalStrideC;
  using StrideD = typename Kernel::InternalStrideD;
  static_assert(std::is_same_v<StrideC, StrideD>, "C strides alias the D stride array");
};

// ---- per-group arrays in the device workspace (written by the setup kernel) ----
template <class G>
struct GroupArrays {
  typename G::Shape3* shapes;                // [groups] (m_g, N, K)
  const typename G::Element** ptr_a;         // [groups]
  const typename G::Element** ptr_b;         // [groups]
  typename G::Element** ptr_d;               // [groups]
  const typename G::Element** ptr_bias;      // [groups] (unused when there is no bias)
  typename G::StrideA* stride_a;             // [groups]
  typename G::StrideB* stride_b;             // [groups]
  typename G::StrideD* stride_d;             // [groups]
};

struct SetupInputs {
  const void* counts;
  bool counts_i64;
  int64_t groups, rows, k, n;
  const void* a;
  const void* b;
  const void* bias;
  void* out;
  int* error_flag;
};

constexpr size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Byte layout of the workspace: [CUTLASS workspace | shapes | ptr_a | ptr_b | ptr_d | ptr_bias |
// stride_a | stride_b | stride_d], each part 256-byte aligned.
template <class G>
struct WorkspaceLayout {
  size_t cutlass_bytes = 0, offsets[8] = {}, total = 0;
  WorkspaceLayout(size_t cutlass_ws, int64_t groups) {
    const size_t g = static_cast<size_t>(groups);
    const size_t sizes[8] = {sizeof(typename G::Shape3) * g, sizeof(void*) * g, sizeof(void*) * g,
                             sizeof(void*) * g, sizeof(void*) * g,
                             sizeof(typename G::StrideA) * g, sizeof(typename G::StrideB) * g,
                             sizeof(typename G::StrideD) * g};
    cutlass_bytes = cutlass_ws;
    size_t at = align_up(cutlass_ws, 256);
    for (int i = 0; i < 8; ++i) {
      offsets[i] = at;
      at = align_up(at + sizes[i], 256);
    }
    total = at;
  }
  GroupArrays<G> arrays(void* ws) const {
    char* base = static_cast<char*>(ws);
    return {reinterpret_cast<typename G::Shape3*>(base + offsets[0]),
            reinterpret_cast<const typename G::Element**>(base + offsets[1]),
            reinterpret_cast<const typename G::Element**>(base + offsets[2]),
            reinterpret_cast<typename G::Element**>(base + offsets[3]),
            reinterpret_cast<const typename G::Element**>(base + offsets[4]),
            reinterpret_cast<typename G::StrideA*>(base + offsets[5]),
            reinterpret_cast<typename G::StrideB*>(base + offsets[6]),
            reinterpret_cast<typename G::StrideD*>(base + offsets[7])};
  }
};

// ---- the setup kernel: device counts → per-group shapes, pointers, strides ----
// One block. Pass 1 validates (every count >= 0, S <= rows); pass 2 scans the counts into row
// offsets and writes group g's arrays. Invalid counts: every group gets m_g = 0 (nothing is read
// or written by the GEMM) and the reason is ORed into *error_flag.
constexpr int kSetupThreads = 256;

__device__ inline int64_t load_count(const SetupInputs& in, int64_t g) {
  return in.counts_i64 ? static_cast<const int64_t*>(in.counts)[g]
                       : static_cast<int64_t>(static_cast<const int32_t*>(in.counts)[g]);
}

// Inclusive block-wide prefix sum of one value per thread (kSetupThreads threads).
__device__ inline int64_t block_inclusive_scan(int64_t v, int64_t* warp_sums, int64_t* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int d = 1; d < 32; d *= 2) {
    const int64_t n = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += n;
  }
  if (lane == 31) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int64_t w = lane < kSetupThreads / 32 ? warp_sums[lane] : 0;
    for (int d = 1; d < 32; d *= 2) {
      const int64_t n = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d) w += n;
    }
    if (lane < kSetupThreads / 32) warp_sums[lane] = w;
    if (lane == kSetupThreads / 32 - 1) *total = w;
  }
  __syncthreads();
  const int64_t result = v + (warp > 0 ? warp_sums[warp - 1] : 0);
  __syncthreads();  // warp_sums is reused by the next call
  return result;
}

template <class G>
__global__ void __launch_bounds__(kSetupThreads) group_m_setup(SetupInputs in, GroupArrays<G> out) {
  using E = typename G::Element;
  __shared__ int64_t warp_sums[kSetupThreads / 32];
  __shared__ int64_t chunk_total;
  __shared__ int error;
  if (threadIdx.x == 0) error = 0;
  __syncthreads();

  // Pass 1: validity. A count above `rows` is caught here too, so the sums cannot overflow.
  int64_t sum = 0;
  for (int64_t g = threadIdx.x; g < in.groups; g += kSetupThreads) {
    const int64_t c = load_count(in, g);
    if (c < 0) atomicOr(&error, kCountNegative);
    else if (c > in.rows) atomicOr(&error, kCountsExceedRows);
    else sum += c;
  }
  (void)block_inclusive_scan(sum, warp_sums, &chunk_total);
  const int64_t total_rows = chunk_total;
  if (threadIdx.x == 0 && error == 0 && total_rows > in.rows) error = kCountsExceedRows;
  __syncthreads();
  const bool valid = error == 0;
  if (threadIdx.x == 0 && !valid && in.error_flag) atomicOr(in.error_flag, error);

  // Pass 2: offsets and per-group arrays.
  int64_t carry = 0;
  for (int64_t base = 0; base < in.groups; base += kSetupThreads) {
    const int64_t g = base + threadIdx.x;
    const int64_t m = (valid && g < in.groups) ? load_count(in, g) : 0;
    const int64_t inclusive = block_inclusive_scan(m, warp_sums, &chunk_total);
    const int64_t off = carry + inclusive - m;
    carry += chunk_total;
    if (g >= in.groups) continue;
    out.shapes[g] = typename G::Shape3(static_cast<int>(m), static_cast<int>(in.n), static_cast<int>(in.k));
    out.ptr_a[g] = static_cast<const E*>(in.a) + off * in.k;
    out.ptr_b[g] = static_cast<const E*>(in.b) + g * in.n * in.k;
    out.ptr_d[g] = static_cast<E*>(in.out) + off * in.n;
    if (in.bias) out.ptr_bias[g] = static_cast<const E*>(in.bias) + g * in.n;
    // Packed strides; they do not depend on m_g (leading dimensions K, K or N, and N).
    out.stride_a[g] = cutlass::make_cute_packed_stride(typename G::StrideA{}, cute::make_shape(1, static_cast<int>(in.k), 1));
    out.stride_b[g] = cutlass::make_cute_packed_stride(typename G::StrideB{}, cute::make_shape(static_cast<int>(in.n), static_cast<int>(in.k), 1));
    out.stride_d[g] = cutlass::make_cute_packed_stride(typename G::StrideD{}, cute::make_shape(1, static_cast<int>(in.n), 1));
  }
}

// ---- host side ----
template <class G>
typename G::Gemm::Arguments make_arguments(const GroupMProblem& p, const GroupArrays<G>& arr,
                                           const cutlass::KernelHardwareInfo& hw) {
  typename G::Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  // Host problem shapes: none (nullptr) — the counts live on the device only.
  args.problem_shape = {static_cast<int>(p.groups), arr.shapes, nullptr};
  args.mainloop = {arr.ptr_a, arr.stride_a, arr.ptr_b, arr.stride_b};
  // EVT arguments: {children..., op}: {acc fetch, bias row broadcast, plus}.
  typename G::EpilogueOp::Arguments fusion{
      {}, {p.bias ? arr.ptr_bias : nullptr, typename G::Element(0), {}}, {}};
  args.epilogue = {fusion, nullptr, arr.stride_d, arr.ptr_d, arr.stride_d};
  args.hw_info = hw;
  args.scheduler.raster_order = p.raster == 1 ? decltype(args.scheduler.raster_order)::AlongN
                                              : decltype(args.scheduler.raster_order)::AlongM;
  args.scheduler.max_swizzle_size = p.swizzle;
  return args;
}

// Per device: SM count and how many clusters of this kernel fit at once (queried once; the
// kernel's shared-memory attribute is raised first, which the occupancy query needs).
template <class G>
cutlass::KernelHardwareInfo hardware_info(int device) {
  static std::mutex mutex;
  static std::array<cutlass::KernelHardwareInfo, 64> cache{};
  std::lock_guard<std::mutex> lock(mutex);
  if (device < 0 || device >= static_cast<int>(cache.size())) {
    throw_error(ErrorKind::Unsupported, str("sm90 grouped GEMM: device index ", device, " >= 64"));
  }
  auto& hw = cache[static_cast<size_t>(device)];
  if (hw.sm_count == 0) {
    int sms = 0;
    MOEKIT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const int smem = G::Kernel::SharedStorageSize;
    MOEKIT_CUDA_CHECK(cudaFuncSetAttribute(cutlass::device_kernel<typename G::Kernel>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    hw.device_id = device;
    hw.max_active_clusters =
        cutlass::KernelHardwareInfo::query_device_max_active_clusters<typename G::Kernel>();
    hw.sm_count = sms;
  }
  return hw;
}

template <class G>
size_t workspace_bytes_of(const GroupMProblem& p) {
  int device = 0;
  MOEKIT_CUDA_CHECK(cudaGetDevice(&device));
  const cutlass::KernelHardwareInfo hw = hardware_info<G>(device);
  const GroupArrays<G> none{};
  const size_t cutlass_ws = G::Gemm::get_workspace_size(make_arguments<G>(p, none, hw));
  return WorkspaceLayout<G>(cutlass_ws, p.groups).total;
}

inline void check_status(cutlass::Status s, const char* what, const char* config) {
  if (s != cutlass::Status::kSuccess) {
    throw_error(ErrorKind::Runtime, str("sm90 grouped GEMM (", config, "): ", what, " failed: ",
                                        cutlassGetStatusString(s)));
  }
}

// The kernel's Params depend only on (device, G, workspace address, bias or not, tile order):
// everything per call — counts, data pointers — reaches the kernel through the arrays the setup
// kernel writes into the workspace. A stream-ordered allocator usually hands back the same
// workspace, so the Params (with their host-encoded TMA descriptors) are cached: a repeated call
// costs two kernel launches of host time, not a CUTLASS initialize().
struct ParamsKey {
  int device = -1;
  int64_t groups = 0;
  void* workspace = nullptr;
  bool bias = false;
  int raster = 0, swizzle = 0;
  bool operator==(const ParamsKey&) const = default;
};

template <class G>
void launch(const GroupMProblem& p, void* workspace, cudaStream_t stream, const char* name) {
  int device = 0;
  MOEKIT_CUDA_CHECK(cudaGetDevice(&device));
  const cutlass::KernelHardwareInfo hw = hardware_info<G>(device);
  const GroupArrays<G> none{};
  const size_t cutlass_ws = G::Gemm::get_workspace_size(make_arguments<G>(p, none, hw));
  const WorkspaceLayout<G> layout(cutlass_ws, p.groups);
  const GroupArrays<G> arr = layout.arrays(workspace);

  const SetupInputs in{p.counts, p.counts_i64, p.groups, p.rows, p.k, p.n,
                       p.a,      p.b,          p.bias,   p.out,  p.error_flag};
  group_m_setup<G><<<1, kSetupThreads, 0, stream>>>(in, arr);
  MOEKIT_CUDA_CHECK_LAUNCH();

  using Params = typename G::Gemm::Params;
  static std::mutex mutex;
  static std::array<std::pair<ParamsKey, Params>, 4> cache{};
  static size_t next = 0;
  const ParamsKey key{device, p.groups, workspace, p.bias != nullptr, p.raster, p.swizzle};
  Params params;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto hit = std::find_if(cache.begin(), cache.end(), [&](const auto& e) { return e.first == key; });
    if (hit != cache.end()) {
      params = hit->second;
    } else {
      typename G::Gemm gemm;
      const auto args = make_arguments<G>(p, arr, hw);
      check_status(gemm.can_implement(args), "can_implement", name);
      // initialize() encodes the TMA descriptors and sets the kernel's shared-memory attribute;
      // the CUTLASS part of the workspace needs no clearing for this kernel (no split-K).
      check_status(gemm.initialize(args, workspace, stream), "initialize", name);
      params = gemm.params();
      cache[next++ % cache.size()] = {key, params};
    }
  }
  check_status(G::Gemm::run(params, stream), "launch", name);
  MOEKIT_CUDA_CHECK_LAUNCH();
}

// Defines the GroupMInstance `symbol` (declared in group_m_instances.h) for one configuration.
#define MOEKIT_SM90_GROUP_M_INSTANCE(symbol, dtype, b_k_major, config, label)               \
  namespace {                                                                             \
  using symbol##_gemm = ::moekit::cuda::sm90::GroupMGemm<dtype, b_k_major, config>;       \
  size_t symbol##_ws(const GroupMProblem& p) {                                            \
    return ::moekit::cuda::sm90::workspace_bytes_of<symbol##_gemm>(p);                    \
  }                                                                                       \
  void symbol##_run(const GroupMProblem& p, void* ws, cudaStream_t s) {                   \
    ::moekit::cuda::sm90::launch<symbol##_gemm>(p, ws, s, label);                         \
  }                                                                                       \
  }                                                                                       \
  const GroupMInstance symbol{label, symbol##_ws, symbol##_run};

}  // namespace moekit::cuda::sm90
