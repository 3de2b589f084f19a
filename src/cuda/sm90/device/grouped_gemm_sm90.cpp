// Host side of the sm90 grouped GEMMs (grouped_gemm_sm90.h): the checks that decide whether the
// kernels can run a call, and the choice of compiled instance. No CUTLASS here: the kernels live
// in kernels_bf16.cu and kernels_f16.cu.
#include "cuda/sm90/device/grouped_gemm_sm90.h"

#include <cuda_runtime_api.h>

#include <climits>
#include <cstdlib>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda/check.h"
#include "cuda/sm90/scheduler/tile_units.h"
#include "cuda/sm90/instances/group_k_instances.h"
#include "cuda/sm90/instances/group_m_instances.h"
#include "core/env.h"
#include "moekit/core/error.h"

namespace moekit::cuda::sm90 {
namespace {

// The group-M instances of one tile configuration, one per kind of problem.
struct GroupMSet {
  const GroupMInstance* kmajor;   // fprop (b transposed)
  const GroupMInstance* nmajor;   // dgrad
  const GroupMInstance* swiglu;   // fprop with SwiGLU in the epilogue (glu_z)
  const GroupMInstance* dswiglu;  // dgrad with the SwiGLU backward in the epilogue (dglu_dh)
  const GroupMInstance& pick(const GroupMProblem& p) const {
    if (p.glu_z) return *swiglu;
    if (p.dglu_dh) return *dswiglu;
    return p.b_transposed ? *kmajor : *nmajor;
  }
};

// [dtype: 0 bf16, 1 f16][config]. The fused instances share their plain instances' mainloop, so
// h and dz have the bits of the plain instance.
const GroupMSet kSets[2][kConfigCount] = {
    {{&group_m_bf16_kmajor_large, &group_m_bf16_nmajor_large, &group_m_bf16_swiglu_large,
      &group_m_bf16_dswiglu_large},
     {&group_m_bf16_kmajor_small, &group_m_bf16_nmajor_small, &group_m_bf16_swiglu_small,
      &group_m_bf16_dswiglu_small}},
    {{&group_m_f16_kmajor_large, &group_m_f16_nmajor_large, &group_m_f16_swiglu_large,
      &group_m_f16_dswiglu_large},
     {&group_m_f16_kmajor_small, &group_m_f16_nmajor_small, &group_m_f16_swiglu_small,
      &group_m_f16_dswiglu_small}},
};

// MOEKIT_SM90_CONFIG=large|small (unset: the rule below) forces the group-M configuration of
// every problem that does not name one, for A/B runs — e.g. a skewed split of small groups on
// kLarge's taller tiles (bench/results/2026-12-01-nvidia-h200-96f3761-small-e64-dgrad-profile.md).
int config_setting() {
  static const int config = detail::env_choice("MOEKIT_SM90_CONFIG", {"large", "small"});
  return config < 0 ? -1 : (config == 0 ? kLarge : kSmallM);
}

int choose_config(const GroupMProblem& p) {
  if (p.config >= 0 && p.config < kConfigCount) return p.config;
  if (config_setting() >= 0) return config_setting();
  // Few rows per group: the GEMM streams weights (memory bound); 64-row tiles waste less of the
  // tensor cores on rows past m_g than 256-row tiles, and a deep pipeline keeps loads in flight.
  // The mean is all the host knows (the counts are on the device).
  return p.counts.rows < 128 * p.counts.groups ? kSmallM : kLarge;
}

// Tile studies (MOEKIT_SM90_TILE), each on its study instances (kernels_study*.cu):
//   coop      cooperative 256x128 for bf16 problems that would take kLarge, and bf16 group-K
//   wide      cooperative 128x256 likewise
//   pingpong  kLarge's bf16 dgrad (plain and fused) on ping-pong 128x128, as before 3074b1d
//   epi32     the bf16 group-K (both dw dtypes) on CUTLASS's automatic 64x32 epilogue subtile
//   small256  kSmallM's plain bf16 fprop and dgrad on ping-pong 64x256
//   wide21    cooperative 128x256 with a 2x1 cluster for bf16 problems that would take kLarge,
//             and bf16 group-K
//   pp64w21   ping-pong 64x256 with a 2x1 cluster likewise
// Any other value is an error, and so is any of them in a build without the study instances.
// MOEKIT_SM90_TILE_PASS=fprop|dgrad|wgrad|dswiglu (unset: every pass) puts the study tile on that
// one pass (fprop: plain and with the SwiGLU epilogue; dgrad: plain and with the SwiGLU backward;
// wgrad: group-K; dswiglu: the dgrad with the SwiGLU backward only, e.g. the fused backward on
// ping-pong 128x128 with MOEKIT_SM90_TILE=pingpong while the plain dgrad keeps its tile), the others
// on their default tiles, for per-pass A/B runs of whole steps.
enum class StudyTile {  // env order
  None = -1, Coop, Wide, PingPong, Epi32, Small256, Wide21, PingPong64W21
};
enum class Pass { Fprop, Dgrad, Wgrad, DSwiGlu };  // env order
bool study_pass(Pass pass) {
  static const int only = detail::env_choice("MOEKIT_SM90_TILE_PASS", {"fprop", "dgrad", "wgrad", "dswiglu"});
  return only < 0 || only == static_cast<int>(pass) ||
         (only == static_cast<int>(Pass::Dgrad) && pass == Pass::DSwiGlu);
}
StudyTile study_tile(Pass pass) {
  static const int tile = detail::env_choice(
      "MOEKIT_SM90_TILE",
      {"coop", "wide", "pingpong", "epi32", "small256", "wide21", "pp64w21"});
  if (tile < 0) return StudyTile::None;
#ifdef MOEKIT_SM90_TILE_STUDY
  return study_pass(pass) ? static_cast<StudyTile>(tile) : StudyTile::None;
#else
  (void)pass;
  throw_error(ErrorKind::Unsupported,
              str("MOEKIT_SM90_TILE=", std::getenv("MOEKIT_SM90_TILE"),
                  " needs a build with -DMOEKIT_SM90_TILE_STUDY=ON"));
#endif
}

// MOEKIT_SM90_TILE_ORDER=auto|cutlass|blocked|chunk2|chunk4|chunk8|balanced (unset: auto) for
// A/B runs of the tile order (group-M and group-K; blocked_scheduler.cuh); a problem that names its
// order keeps it. balanced (group-K only; group-M keeps CUTLASS's): the snake walk (tile_units.h)
// over the groups laid out largest first (group_k_kernel.cuh, heavy_first).
int tile_order_setting() {
  static const int order = detail::env_choice(
      "MOEKIT_SM90_TILE_ORDER", {"cutlass", "blocked", "auto", "chunk2", "chunk4", "chunk8", "balanced"});
  constexpr int kOrder[] = {0, 1, -1, 2, 4, 8, kSnakeOrder};  // GroupMProblem::order of each value
  return order < 0 ? -1 : kOrder[order];
}

// MOEKIT_SM90_PDL=0|1 (unset: 1): launch the GEMM with programmatic dependent launch after its
// setup kernel, for A/B runs of the per-call latency; a problem that names it keeps it.
int pdl_setting() {
  static const int pdl = detail::env_choice("MOEKIT_SM90_PDL", {"0", "1"});
  return pdl == 0 ? 0 : 1;
}

// MOEKIT_SM90_K_ORDER=forward|alternate (unset: forward): how a CTA's tiles walk K, for A/B runs;
// a problem that names it keeps it.
int k_order_setting() {
  static const int k_order = detail::env_choice("MOEKIT_SM90_K_ORDER", {"forward", "alternate"});
  return k_order < 0 ? 0 : k_order;
}

// MOEKIT_SM90_RASTER=m|n and MOEKIT_SM90_SWIZZLE=1|2|4|8|16 (unset: m, and each kernel's estimate): the tile
// raster and swizzle of both forms for studies (GroupMProblem::raster, swizzle; GroupKProblem's);
// a problem that names them keeps them.
int raster_setting() {
  static const int raster = detail::env_choice("MOEKIT_SM90_RASTER", {"m", "n"});
  return raster < 0 ? 0 : raster;
}
// (m4, m8, m16: those stripes with M fastest inside each, kStripeMFirst in tile_units.h.)
int swizzle_setting() {  // -1: unset (each kernel's estimate: with_stripes in its header)
  static const int swizzle =
      detail::env_choice("MOEKIT_SM90_SWIZZLE", {"1", "2", "4", "8", "16", "m4", "m8", "m16"});
  constexpr int kM = static_cast<int>(kStripeMFirst);
  constexpr int kSwizzle[] = {1, 2, 4, 8, 16, 4 | kM, 8 | kM, 16 | kM};
  return swizzle < 0 ? -1 : kSwizzle[swizzle];
}

// A problem's automatic settings (-1) resolved: what the kernels and their cached Params see.
// Both forms have a tile order, PDL, a raster and a swizzle; an automatic swizzle stays -1 here
// and the kernel header resolves it on its tile (with_stripes).
template <class Problem>
Problem resolved(Problem q) {
  if (q.order < 0) q.order = tile_order_setting();
  if (q.pdl < 0) q.pdl = pdl_setting();
  if (q.k_order < 0) q.k_order = k_order_setting();
  if (q.raster < 0) q.raster = raster_setting();
  if (q.swizzle < 0) q.swizzle = swizzle_setting();  // still -1: the kernel's estimate
  return q;
}

// The raster, swizzle and K order a problem names: -1 (automatic) or a value the kernels take.
template <class Problem>
std::string rejects_schedule(const Problem& p) {
  if (p.raster < -1 || p.raster > 1) return str("raster -1, 0 or 1, got ", p.raster);
  if (p.k_order < -1 || p.k_order > 1) return str("k_order -1, 0 or 1, got ", p.k_order);
  const int m_first = static_cast<int>(kStripeMFirst);
  const int width = p.swizzle > 0 ? p.swizzle & ~m_first : p.swizzle;
  if (width != -1 && width != 1 && width != 2 && width != 4 && width != 8 && width != 16) {
    return str("swizzle -1, 1, 2, 4, 8 or 16, got ", p.swizzle);
  }
  if (p.swizzle > 0 && (p.swizzle & m_first) != 0 && (width == 1 || p.raster == 1)) {
    return str("swizzle ", width,
               " with M first inside the stripes needs raster 0 and a width > 1");
  }
  return {};
}

const GroupMInstance& instance(const GroupMProblem& p) {
  const int config = choose_config(p);
  const Pass pass = p.glu_z || (!p.dglu_dh && p.b_transposed) ? Pass::Fprop
                    : p.dglu_dh                                 ? Pass::DSwiGlu
                                                                : Pass::Dgrad;
#ifdef MOEKIT_SM90_TILE_STUDY
  // bf16 problems that would take kLarge, on the study tile (kernels_study*.cu).
  static const GroupMSet kCoop{&group_m_bf16_kmajor_coop, &group_m_bf16_nmajor_coop,
                               &group_m_bf16_swiglu_coop, &group_m_bf16_dswiglu_coop};
  static const GroupMSet kWide{&group_m_bf16_kmajor_wide, &group_m_bf16_nmajor_large,
                               &group_m_bf16_swiglu_wide, &group_m_bf16_dswiglu_large};
  static const GroupMSet kPingPong{&group_m_bf16_kmajor_large, &group_m_bf16_nmajor_pingpong,
                                   &group_m_bf16_swiglu_large, &group_m_bf16_dswiglu_pingpong};
  static const GroupMSet kWide21{&group_m_bf16_kmajor_wide21, &group_m_bf16_nmajor_wide21,
                                 &group_m_bf16_swiglu_wide21, &group_m_bf16_dswiglu_wide21};
  static const GroupMSet kPp64w21{&group_m_bf16_kmajor_pp64w21, &group_m_bf16_nmajor_pp64w21,
                               &group_m_bf16_swiglu_pp64w21, &group_m_bf16_dswiglu_pp64w21};
  if (config == kLarge && p.dtype == DType::BF16) {
    switch (study_tile(pass)) {
      case StudyTile::Coop: return kCoop.pick(p);
      case StudyTile::Wide: return kWide.pick(p);
      case StudyTile::PingPong: return kPingPong.pick(p);
      case StudyTile::Wide21: return kWide21.pick(p);
      case StudyTile::PingPong64W21: return kPp64w21.pick(p);
      case StudyTile::Epi32:  // group-M keeps kLarge
      case StudyTile::Small256:
      case StudyTile::None: break;
    }
  }
  static const GroupMSet kSmall256{&group_m_bf16_kmajor_small256, &group_m_bf16_nmajor_small256,
                                   &group_m_bf16_swiglu_small, &group_m_bf16_dswiglu_small};
  if (config == kSmallM && p.dtype == DType::BF16 && study_tile(pass) == StudyTile::Small256) {
    return kSmall256.pick(p);
  }
#else
  (void)study_tile(pass);  // reports a setting this build cannot honour
#endif
  // bf16 fprop of K >= 4096 (plain and with SwiGLU): the cooperative 128x256 tile with a 2x1
  // cluster (ConfigWide21, kernel_common.cuh, says what it was measured against). Env
  // MOEKIT_SM90_FPROP_WIDE21=0 keeps it on kLarge, for A/B runs of whole steps; unset or 1: the rule.
  constexpr int64_t kWide21FpropK = 4096;
  static const bool fprop_wide21 = detail::env_choice("MOEKIT_SM90_FPROP_WIDE21", {"0", "1"}) != 0;
  if (fprop_wide21 && config == kLarge && pass == Pass::Fprop && p.dtype == DType::BF16 &&
      p.k >= kWide21FpropK) {
    return p.glu_z ? group_m_bf16_swiglu_wide21 : group_m_bf16_kmajor_wide21;
  }
  // kSmallM's plain bf16 problems whose output columns fill 512-column slices (the last slice's
  // columns past n at most n / 8): A and B swapped on a 512x64 cluster tile (ConfigSmallSwap,
  // kernel_common.cuh, says what it was measured against; measured on n = 1024 and 2048 only).
  // The fused SwiGLU instances stay on ConfigSmallM. Env MOEKIT_SM90_SMALL_SWAP=0 keeps every
  // kSmallM problem on ConfigSmallM, for A/B runs; unset or 1: the rule.
  static const bool small_swap = detail::env_choice("MOEKIT_SM90_SMALL_SWAP", {"0", "1"}) != 0;
  constexpr int64_t kSwapSlice = 512;
  if (small_swap && config == kSmallM && p.dtype == DType::BF16 && !p.glu_z && !p.dglu_dh &&
      8 * ((p.n + kSwapSlice - 1) / kSwapSlice * kSwapSlice - p.n) <= p.n) {
    return p.b_transposed ? group_m_bf16_kmajor_small_swap : group_m_bf16_nmajor_small_swap;
  }
  return kSets[p.dtype == DType::F16 ? 1 : 0][config].pick(p);
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// What both forms check: an sm_90 device, 16-bit inputs, K and N multiples of 8 (TMA rows of 16
// bytes), 32-bit extents, counts in device memory, 16-byte aligned pointers.
std::string rejects_common(int device, DType dtype, const DeviceCounts& counts, int64_t k,
                           int64_t n, std::initializer_list<std::pair<const char*, const void*>> ptrs) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return str("cannot query CUDA device ", device);
  }
  if (major != 9 || minor != 0) {
    return str("needs an sm_90 (Hopper) device; cuda:", device, " is sm_", major, minor);
  }
  if (dtype != DType::BF16 && dtype != DType::F16) {
    return str("dtype bf16 or f16 only, got ", name(dtype));
  }
  if (k % 8 != 0) return str("K = ", k, " is not a multiple of 8 (TMA needs 16-byte rows)");
  if (n % 8 != 0) return str("N = ", n, " is not a multiple of 8 (TMA needs 16-byte rows)");
  for (const auto& [label, v] : {std::pair{"T (rows)", counts.rows}, std::pair{"K", k},
                                  std::pair{"N", n}, std::pair{"G (groups)", counts.groups}}) {
    if (v > INT_MAX) return str(label, " = ", v, " exceeds the kernels' 32-bit extents");
  }
  if (!counts.counts) return "the counts must be in device memory (got none)";
  if (reinterpret_cast<uintptr_t>(counts.counts) % (counts.i64 ? 8 : 4) != 0) {
    return "the counts are not aligned to their element size";
  }
  for (const auto& [label, ptr] : ptrs) {
    if (ptr && !aligned16(ptr)) return str(label, " is not 16-byte aligned (TMA)");
  }
  return "";
}

// The group-K instances of one tile configuration and input dtype, one per dw dtype.
struct GroupKPair {
  const GroupKInstance* f32;   // dw in f32 (main_grad)
  const GroupKInstance* same;  // dw in the input dtype
  const GroupKInstance& pick(const GroupKProblem& p) const {
    return p.dw_dtype == DType::F32 ? *f32 : *same;
  }
};
const GroupKPair kGroupK[2] = {{&group_k_bf16_f32, &group_k_bf16_bf16},  // [dtype: 0 bf16, 1 f16]
                               {&group_k_f16_f32, &group_k_f16_f16}};

const GroupKInstance& instance(const GroupKProblem& p) {
  const bool f16 = p.dtype == DType::F16;
  static const GroupKPair kWide{&group_k_bf16_f32_wide, &group_k_bf16_bf16_wide};
  static const GroupKPair kWide21{&group_k_bf16_f32_wide21, &group_k_bf16_bf16_wide21};
#ifdef MOEKIT_SM90_TILE_STUDY
  static const GroupKPair kCoop{&group_k_bf16_f32_coop, &group_k_bf16_bf16_coop};
  static const GroupKPair kEpi32{&group_k_bf16_f32_epi32, &group_k_bf16_bf16_epi32};
  static const GroupKPair kPp64w21{&group_k_bf16_f32_pp64w21, &group_k_bf16_bf16_pp64w21};
  if (!f16) {
    switch (study_tile(Pass::Wgrad)) {
      case StudyTile::Coop: return kCoop.pick(p);
      case StudyTile::Wide: return kWide.pick(p);
      case StudyTile::Epi32: return kEpi32.pick(p);
      case StudyTile::Wide21: return kWide21.pick(p);
      case StudyTile::PingPong64W21: return kPp64w21.pick(p);
      case StudyTile::Small256:  // group-K keeps its tile
      case StudyTile::PingPong:  // group-K stays on kLarge's ping-pong tile
      case StudyTile::None: break;
    }
  }
#else
  (void)study_tile(Pass::Wgrad);  // reports a setting this build cannot honour
#endif
  // bf16 groups of >= 2048 rows on average (the mean is all the host knows): the cooperative
  // 128x256 tile. Tile study at 99bc82c (bench/results/2026-11-30-nvidia-h200-99bc82c-tile-study.md,
  // each tile timed alone): wgrad +4.4% / +4.9% (dsv3_fc1_E8 uniform / skewed), +9.5% / +7.7%
  // (dsv3_fc2_E8), +6.9% / +8.7% (mixtral_fc1_E8, 2048 rows), but -9% on qwen3 (1024 rows,
  // uniform) and slower on small_E64, which keep ping-pong 128x128. (f16 stays on it: not timed.)
  // Env MOEKIT_SM90_GROUP_K_WIDE=0 keeps every group-K on ping-pong, for A/B runs of whole steps
  // (tools/mlp-bench, MLP_BENCH_AB_ENV); unset or 1: the rule. Anything else is an error.
  // Those groups run with a 2x1 cluster (x, the operand indexed by dw's columns, multicast to
  // the two M neighbours; ConfigWide21): at ab69c7f +0.7% to +2.8% on five of the six wgrad rows
  // it takes, ncu -1.4% / -1.5% on dsv3 fc1 / fc2, a tie on mixtral, the dsv3 step 14.28 vs
  // 14.35 ms (bench/results/2026-11-30-nvidia-h200-ab69c7f-group-k-wide21.md). Env
  // MOEKIT_SM90_GROUP_K_WIDE21=0 keeps the 1x2 cluster, for A/B runs.
  constexpr int64_t kWideGroupKRows = 2048;
  static const bool wide = detail::env_choice("MOEKIT_SM90_GROUP_K_WIDE", {"0", "1"}) != 0;
  static const bool wide21 = detail::env_choice("MOEKIT_SM90_GROUP_K_WIDE21", {"0", "1"}) != 0;
  if (wide && !f16 && p.counts.rows >= kWideGroupKRows * p.counts.groups) {
    return (wide21 ? kWide21 : kWide).pick(p);
  }
  // bf16 -> bf16 groups of fewer than 1024 rows on average: kLarge's tile on the own ping-pong
  // kernel (group_k_own.cuh: the consumer warpgroups' epilogues side by side, each on its own
  // D buffer, instead of in turns on shared ones; 6 mainloop stages as CUTLASS's). Against
  // CUTLASS's kernel on the H200: with two D buffers per warpgroup (5 stages) small_E64 (64 rows)
  // under ncu 90.3 against 93.4 µs uniform, 96.4-96.9 against 97.5-97.9 skewed, but 1.00-1.03 at
  // 256-1024 rows (bench/results/2026-12-01-nvidia-h200-0cf88d9-group-k-own.md); with one
  // (bench/results/2026-12-01-nvidia-h200-fde2a1c-group-k-own-stages.md) 92.4 against 95.4
  // uniform, 93.0 against 97.3 skewed, per call 0.99 / 0.94, at 512 rows 1.00 / 0.96; at the wide
  // tile's groups (>= kWideGroupKRows) the wide tile. It takes its D descriptors from the setup
  // kernel, so not with MOEKIT_SM90_PREBUILT_TENSORMAPS=0. Env MOEKIT_SM90_GROUP_K_OWN=0 never
  // takes it, =1 takes it for every bf16 -> bf16 call below the wide tile's groups (A/B runs,
  // ctest variants), =wide21 takes the own cooperative 128x256 2x1 kernel for those calls (study
  // builds only: kernels_study_group_k_own_wide21.cu, each warpgroup storing its half of every
  // tile, x's block multicast — cuBLAS's shape and L2 bytes, not its speed: on the H200 small_E64
  // 1.00-1.04 of the ping-pong kernel's time, 512-row groups 0.94-0.95 uniform but 1.13-1.15
  // skewed); unset: the rule. Not for groups of one K block (<= 64 rows on average) that have as
  // many tiles as the grid has CTAs or more (groups_below_grid false): there CUTLASS's kernel was
  // the faster, per call one 65536 x 2048 dW 0.0869-0.0884 against 0.0913-0.0930 ms, four of
  // 16384 x 2048 0.0935 against 0.0963-0.0971 uniform (a tie to 2% skewed), eight of 8192 x 2048
  // 0.5-2.4% uniform, while small_E64 (128 tiles a group, below the grid) keeps the own kernel's
  // 1-2%, and 512-row groups of 768 tiles (3072 x 4096) tie within their ±2% between turns
  // (bench/results/2026-12-02-nvidia-h200-9d9ba49-chunk-raster.md, two calls).
  constexpr int64_t kOwnGroupKRows = 1024, kOneKBlockRows = 64;
  static const int own = detail::env_choice("MOEKIT_SM90_GROUP_K_OWN", {"0", "1", "wide21"});
  const auto own_kernel_groups = [&] {  // the rule
    if (p.counts.rows >= kOwnGroupKRows * p.counts.groups) return false;
    return p.counts.rows > kOneKBlockRows * p.counts.groups || group_k_bf16_bf16_own.groups_below_grid(p);
  };
  if (!f16 && p.dw_dtype == DType::BF16 && prebuilt_tensormaps_setting() &&
      (own >= 1 || (own < 0 && own_kernel_groups()))) {
    if (own == 2) {
#ifdef MOEKIT_SM90_TILE_STUDY
      return group_k_bf16_bf16_own_wide21;
#else
      throw_error(ErrorKind::Unsupported,
                  "MOEKIT_SM90_GROUP_K_OWN=wide21 needs a build with -DMOEKIT_SM90_TILE_STUDY=ON");
#endif
    }
    return group_k_bf16_bf16_own;
  }
  return kGroupK[f16 ? 1 : 0].pick(p);
}

}  // namespace

bool prebuilt_tensormaps_setting() {
  static const bool on = detail::env_choice("MOEKIT_SM90_PREBUILT_TENSORMAPS", {"0", "1"}) != 0;
  return on;
}

std::string rejects(const GroupMProblem& p, int device) {
  if (p.k <= 0) return str("K = ", p.k, ": the product is empty (K must be > 0)");
  if (std::string why = rejects_schedule(p); !why.empty()) return why;
  if (p.glu_z) {
    if (!p.b_transposed) return "the SwiGLU epilogue is built for fprop (b transposed) only";
    if (p.n % 64 != 0) {
      return str("N = 2F = ", p.n, " is not a multiple of 64 (the SwiGLU epilogue's pairs)");
    }
    if (reinterpret_cast<uintptr_t>(p.glu_z) % 4 != 0) return "z is not 4-byte aligned";
  }
  if (p.dglu_dh) {
    if (p.glu_z) return "SwiGLU forward and backward epilogues cannot be combined";
    if (p.out) return "the SwiGLU backward epilogue stores no product (out must be null)";
    if (p.b_transposed) return "the SwiGLU backward epilogue is built for dgrad (b plain) only";
    if (p.n % 32 != 0) return str("N = F = ", p.n, " is not a multiple of 32 (Interleaved32)");
    for (const void* ptr : {p.dglu_h, static_cast<const void*>(p.dglu_dh)}) {
      if (!aligned16(ptr)) return "h or dh is not 16-byte aligned (the epilogue's 16-byte accesses)";
    }
  }
  return rejects_common(device, p.dtype, p.counts, p.k, p.n,
                        {{"a", p.a}, {"b", p.b}, {"out", p.out}, {"bias", p.bias}});
}

size_t workspace_bytes(const GroupMProblem& p) {
  if (p.counts.groups <= 0 || p.n == 0) return 0;
  const GroupMProblem q = resolved(p);
  return instance(q).workspace_bytes(q);
}

void run(const GroupMProblem& p, void* workspace, cudaStream_t stream) {
  if (p.counts.groups <= 0 || p.n == 0) return;  // out [T, 0]: nothing to write
  const GroupMProblem q = resolved(p);
  instance(q).run(q, workspace, stream);
}

std::string config_name(const GroupMProblem& p) { return instance(p).name; }

std::string rejects(const GroupKProblem& p, int device) {
  if (p.dw_dtype != DType::F32 && p.dw_dtype != p.dtype) {
    return str("dw dtype f32 or ", name(p.dtype), ", got ", name(p.dw_dtype));
  }
  if (p.accumulate && p.dw_dtype != DType::F32) return "accumulating needs an f32 dw";
  if (std::string why = rejects_schedule(p); !why.empty()) return why;
  return rejects_common(device, p.dtype, p.counts, p.k, p.n,
                        {{"dy", p.dy}, {"x", p.x}, {"dw", p.dw}});
}

size_t workspace_bytes(const GroupKProblem& p) {
  if (p.counts.groups <= 0 || p.n == 0 || p.k == 0) return 0;
  const GroupKProblem q = resolved(p);
  return instance(q).workspace_bytes(q);
}

void run(const GroupKProblem& p, void* workspace, cudaStream_t stream) {
  if (p.counts.groups <= 0 || p.n == 0 || p.k == 0) return;  // dw [G, 0, *] or [G, *, 0]
  const GroupKProblem q = resolved(p);
  instance(q).run(q, workspace, stream);
}

std::string config_name(const GroupKProblem& p) { return instance(p).name; }

}  // namespace moekit::cuda::sm90
