// test_sm90 — the Hopper grouped GEMM backend ("sm90", src/backends/cuda/sm90/) through the public API.
//
// Every case forces the backend (Context::with_backend("sm90")) so that a silent fallback to
// cuBLAS cannot pass for it, and skips with the reason only when this build has no sm90 kernels,
// no GPU, or a GPU that is not sm_90; on an sm_90 GPU a backend that cannot run fails every case. Checks: fp64 reference of the stored inputs (tolerance rule of
// support/reference.h), outputs as views between sentinel-filled guard bands (nothing outside the
// valid rows [0, S) may change: not the tail [S, T), not the guards), zero-row groups, int32 and
// int64 device counts, bf16 and f16, fprop and dgrad, with and without bias, and a CUDA graph that
// captures GroupedLinear::forward once and replays it with new device counts.
//
// The graph case needs a few CUDA runtime calls (stream, capture, launch). This file is built in
// CPU-only builds too, without CUDA headers, so it reaches the runtime that libmoekit already
// loaded (libcudart.so, shared) through dlopen(RTLD_NOLOAD) — the same runtime instance as the
// library's, which graph capture requires.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "moekit/moekit.h"
#include "support/cuda_graph.h"
#include "support/mlp_reference.h"
#include "support/reference.h"
#include "support/test_util.h"

namespace moekit {
namespace {

using test::caught;

// ---------------------------------------------------------------- availability

// Whether the sm90 cases run here. They skip only where they cannot run — a build without the
// sm90 kernels, no CUDA device, a device that is not sm_90 — and say which. On an sm_90 device
// with the kernels built, anything that stops the probe call (a wrong MOEKIT_SM90_STUDY included)
// is a failure of every case, never a skip.
struct Sm90Availability {
  bool skip = false, fail = false;
  std::string why;
};

Sm90Availability sm90_availability() {
#if !MOEKIT_TEST_HAS_SM90
  return {true, false, "this build has no sm90 kernels (CUDA off, no CUTLASS, or -DMOEKIT_WITH_SM90_KERNELS=OFF)"};
#else
  if (!Context::built_with_cuda()) return {false, true, "built with sm90 kernels but without CUDA"};
  if (Context::cuda_device_count() == 0) return {true, false, "no CUDA device"};
  const test::CudaGraphApi& api = test::CudaGraphApi::get();
  if (!api.ok) return {false, true, "libcudart entry points not found through dlopen"};
  constexpr int kMajor = 75, kMinor = 76;  // cudaDevAttrComputeCapabilityMajor, Minor
  int major = 0, minor = 0;
  if (api.device_attribute(&major, kMajor, 0) != 0 || api.device_attribute(&minor, kMinor, 0) != 0) {
    return {false, true, "cannot query cuda:0's compute capability"};
  }
  if (major != 9 || minor != 0) {
    return {true, false, "cuda:0 is sm_" + std::to_string(major) + std::to_string(minor) + ", not sm_90"};
  }
  const Context ctx = Context::cuda(0).with_backend("sm90");
  // A tiny legal call: on an sm_90 device the backend must run it.
  auto e = caught([&] {
    Tensor a = Tensor::empty({8, 8}, DType::BF16, ctx);
    Tensor b = Tensor::empty({1, 8, 8}, DType::BF16, ctx);
    Tensor out = Tensor::empty({8, 8}, DType::BF16, ctx);
    fill(ctx, a, 1.0);
    fill(ctx, b, 1.0);
    grouped_gemm_group_m(ctx, a, b, BOp::Transposed, Splits::host({8}), out);
    ctx.synchronize();
  });
  if (e) return {false, true, std::string("the sm90 backend fails on an sm_90 device: ") + e->what()};
  return {};
#endif
}

#define MOEKIT_REQUIRE_SM90()                                                \
  do {                                                                       \
    static const Sm90Availability sm90_here = sm90_availability();           \
    if (sm90_here.fail) FAIL() << sm90_here.why;                             \
    if (sm90_here.skip) GTEST_SKIP() << sm90_here.why;                       \
  } while (0)

// Every byte of dw[g] (group_bytes each, in `bytes`) is 0: the exact +0 an empty group's weight
// gradient gets when not accumulating.
bool group_is_exact_zero(const std::vector<uint8_t>& bytes, int64_t g, size_t group_bytes) {
  const auto at = bytes.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(g) * group_bytes);
  return std::all_of(at, at + static_cast<std::ptrdiff_t>(group_bytes), [](uint8_t b) { return b == 0; });
}

// What a test that captures CUDA graphs needs first: an sm90 device, libcudart's graph entry
// points (`api`, test::CudaGraphApi) and a non-blocking stream of the test's own (`stream`, owned
// by `owned`); skips or fails the test where one is missing.
#define MOEKIT_REQUIRE_GRAPH_STREAM()                                                    \
  MOEKIT_REQUIRE_SM90();                                                                 \
  const test::CudaGraphApi& api = test::CudaGraphApi::get();                             \
  ASSERT_TRUE(api.ok) << "libcudart entry points not found through dlopen";             \
  const test::OwnedStream owned(api);                                                    \
  void* const stream = owned.get();                                                      \
  ASSERT_NE(stream, nullptr)

const Context& sm90() {
  static const Context ctx = Context::cuda(0).with_backend("sm90");
  return ctx;
}

std::vector<double> doubles_of(const Tensor& host_tensor) {
  std::vector<double> v(static_cast<size_t>(host_tensor.numel()));
  to_f64(host_tensor.data(), host_tensor.dtype(), v.data(), v.size());
  return v;
}

using test::sum_of;

// A guarded [rows, cols] view on ctx's device (see test::GuardedBuffer).
struct Guarded : test::GuardedBuffer {
  Guarded(const Context& ctx, int64_t rows, int64_t cols, DType dt)
      : GuardedBuffer(ctx, {rows, cols}, dt) {}
};

// ---------------------------------------------------------------- cases

struct Sm90Case {
  const char* name;
  DType dtype;
  bool dgrad;
  bool bias;
  DType counts_dtype;
  int64_t T, K, N;  // layer sizes: x [T, K], W [G, N, K]
  std::vector<int64_t> counts;
};

std::string case_name(const ::testing::TestParamInfo<Sm90Case>& info) { return info.param.name; }
// Readable parameter in ctest's listing (instead of gtest's byte dump).
void PrintTo(const Sm90Case& c, std::ostream* os) { *os << c.name; }

// G groups of 0-12 rows (about a quarter empty, seeded): more groups than the setup kernels'
// block has threads (256: scan_groups' chunks) and than one pass of their descriptor build
// covers (64 groups: prebuilt_tensormaps.cuh), as 256-expert layers have.
std::vector<int64_t> many_small_groups(int64_t G, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> counts(static_cast<size_t>(G));
  for (auto& m : counts) m = rng() % 4 == 0 ? 0 : static_cast<int64_t>(1 + rng() % 12);
  return counts;
}

const Sm90Case kCases[] = {
    // name, dtype, dgrad, bias, counts dtype, T, K, N, counts (zero-row groups and tails)
    {"Bf16FpropBiasI32ZeroGroupsTail", DType::BF16, false, true, DType::I32, 1100, 256, 136,
     {0, 300, 0, 1, 512, 0, 17, 0}},
    {"Bf16FpropI64OneGroup", DType::BF16, false, false, DType::I64, 777, 512, 64, {777}},
    {"Bf16DgradI32Skewed", DType::BF16, true, false, DType::I32, 2048, 200, 264,
     {1500, 0, 3, 400, 0, 100, 45, 0}},
    {"F16FpropBiasI64ManyGroups", DType::F16, false, true, DType::I64, 640, 128, 1024,
     {9, 0, 0, 40, 1, 1, 1, 200, 7, 0, 63, 64, 65, 0, 100, 3, 30, 0, 0, 50}},
    {"F16DgradI64Tail", DType::F16, true, false, DType::I64, 3000, 1024, 72, {1024, 0, 1000, 3}},
    {"Bf16FpropSmallGroupsManyExperts", DType::BF16, false, false, DType::I32, 4096, 512, 256,
     std::vector<int64_t>(64, 60)},
    // K >= 4096: the cooperative 128x256 tile with a 2x1 cluster (groups of 4 and 5 M tiles: the
    // cluster's second CTA past the rows; N = 264: one partial N tile)
    {"Bf16FpropLargeKWide21BiasZeroGroupsTail", DType::BF16, false, true, DType::I32, 1300, 4096,
     264, {0, 500, 1, 0, 640, 3, 0}},
    // < 128 rows per group, output columns filling 512-column slices: bf16 fprop and dgrad with A
    // and B swapped on the 512x64 cluster tile (ConfigSmallSwap; N = 1000: the last slice 24
    // columns short, the cluster's second CTA partly past them)
    {"Bf16FpropBiasSmallGroupsSwappedZeroGroupsTail", DType::BF16, false, true, DType::I32, 700, 256,
     1000, {0, 70, 1, 0, 129, 64, 65, 0, 3, 100, 0, 0, 50, 33, 2, 0}},
    {"Bf16DgradSmallGroupsSwappedI64", DType::BF16, true, false, DType::I64, 1200, 1536, 392,
     {90, 0, 0, 200, 1, 127, 64, 0, 300, 17, 0, 5}},
    // Two to three tiles per CTA of the persistent grid, four K blocks each: the second
    // wave walks K backwards under MOEKIT_SM90_STUDY=k_order=alternate (ctest sm90_study_paths;
    // k_order.cuh). fprop on ping-pong 128x128 (17 x 16 tiles), dgrad on cooperative 128x256.
    {"Bf16FpropBiasSeveralWaves", DType::BF16, false, true, DType::I32, 2100, 256, 2048,
     {1024, 0, 1000, 24}},
    {"Bf16DgradSeveralWavesTail", DType::BF16, true, false, DType::I64, 2100, 4096, 256,
     {1024, 0, 1000, 24}},
    // 300 groups (T: their rows and a tail of 9)
    {"Bf16FpropBiasI32ThreeHundredGroups", DType::BF16, false, true, DType::I32,
     sum_of(many_small_groups(300, 7)) + 9, 64, 136, many_small_groups(300, 7)},
    {"F16DgradI64ThreeHundredGroups", DType::F16, true, false, DType::I64,
     sum_of(many_small_groups(300, 8)) + 9, 72, 128, many_small_groups(300, 8)},
};

class CudaSm90Gemm : public ::testing::TestWithParam<Sm90Case> {};

// grouped_gemm_group_m through the sm90 backend with device counts, against the fp64 reference.
TEST_P(CudaSm90Gemm, MatchesFp64ReferenceAndWritesOnlyValidRows) {
  MOEKIT_REQUIRE_SM90();
  const Sm90Case& c = GetParam();
  const Context& ctx = sm90();
  const int64_t G = static_cast<int64_t>(c.counts.size()), S = sum_of(c.counts);
  // fprop: out [T, N] = x · W_gᵀ (+ b_g);  dgrad: out [T, K] = dy [T, N] · W_g.
  const int64_t in_cols = c.dgrad ? c.N : c.K, out_cols = c.dgrad ? c.K : c.N;
  Tensor a_h = test::random_normal({c.T, in_cols}, c.dtype, 11);
  Tensor w_h = test::random_normal({G, c.N, c.K}, c.dtype, 12, 1.0 / std::sqrt(double(in_cols)));
  Tensor b_h = c.bias ? test::random_normal({G, c.N}, c.dtype, 13) : Tensor();
  Tensor a = to_device(ctx, a_h), w = to_device(ctx, w_h);
  Tensor bias = c.bias ? to_device(ctx, b_h) : Tensor();
  Tensor counts = to_device(ctx, test::counts_tensor(c.counts, c.counts_dtype));
  Guarded out(ctx, c.T, out_cols, c.dtype);

  grouped_gemm_group_m(ctx, a, w, c.dgrad ? BOp::Plain : BOp::Transposed, Splits::device(counts),
                       out.view, bias);

  const test::Reference ref =
      c.dgrad ? test::reference_dgrad(doubles_of(a_h), doubles_of(w_h), c.counts, c.K, c.N)
              : test::reference_forward(doubles_of(a_h), doubles_of(w_h),
                                        c.bias ? doubles_of(b_h) : std::vector<double>{}, c.counts,
                                        c.K, c.N);
  EXPECT_TRUE(test::matches_reference(c.name, out.values(), ref, c.dtype));
  EXPECT_TRUE(out.untouched_outside(S));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaSm90Gemm, ::testing::ValuesIn(kCases), case_name);

TEST(CudaSm90, HostAndDeviceCountsGiveIdenticalBitsRunToRun) {
  MOEKIT_REQUIRE_SM90();
  const Context& ctx = sm90();
  const std::vector<int64_t> counts{120, 0, 333, 1, 0, 600};
  const int64_t T = 1200, K = 384, N = 200, G = 6;
  Tensor x = to_device(ctx, test::random_normal({T, K}, DType::BF16, 21));
  Tensor w = to_device(ctx, test::random_normal({G, N, K}, DType::BF16, 22, 0.05));
  Tensor d = to_device(ctx, test::counts_tensor(counts, DType::I32));
  std::vector<std::vector<uint8_t>> images;
  for (int run = 0; run < 3; ++run) {
    Guarded out(ctx, T, N, DType::BF16);
    grouped_gemm_group_m(ctx, x, w, BOp::Transposed,
                         run == 0 ? Splits::host(counts) : Splits::device(d), out.view);
    images.push_back(test::bytes_of(ctx, out.buffer));
  }
  EXPECT_TRUE(test::bit_identical(images[1], images[0], DType::BF16)) << "device vs host counts";
  EXPECT_TRUE(test::bit_identical(images[2], images[1], DType::BF16)) << "run to run";
}

TEST(CudaSm90, RejectsWhatTmaCannotAddressAndNamesTheReason) {
  MOEKIT_REQUIRE_SM90();
  const Context& ctx = sm90();
  Tensor a = Tensor::empty({16, 12}, DType::BF16, ctx);  // K = 12: not a multiple of 8
  Tensor w = Tensor::empty({2, 16, 12}, DType::BF16, ctx);
  Tensor out = Tensor::empty({16, 16}, DType::BF16, ctx);
  auto e = caught([&] { grouped_gemm_group_m(ctx, a, w, BOp::Transposed, Splits::host({8, 8}), out); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind(), ErrorKind::Unsupported);
  EXPECT_THAT(e->what(), ::testing::HasSubstr("K = 12 is not a multiple of 8"));
  // f32 is not a dtype of these kernels (without forcing, cuBLAS takes such calls).
  Tensor a32 = Tensor::empty({16, 16}, DType::F32, ctx);
  Tensor w32 = Tensor::empty({2, 16, 16}, DType::F32, ctx);
  Tensor o32 = Tensor::empty({16, 16}, DType::F32, ctx);
  e = caught([&] { grouped_gemm_group_m(ctx, a32, w32, BOp::Transposed, Splits::host({8, 8}), o32); });
  ASSERT_TRUE(e.has_value());
  EXPECT_THAT(e->what(), ::testing::HasSubstr("dtype bf16 or f16 only, got f32"));
}

// The automatic choice declines sm90 for two measured cases of host splits (sm90_entries.cpp,
// declines_for_cublas) and keeps it otherwise. Observed through the allocator: the sm90 entries
// take their workspace (and the device copy of host counts) from it, cuBLAS's calls take nothing.
// Forcing "sm90" ignores the preference.
struct ChoiceRun {
  const char* what;
  Context ctx;
  Splits splits;
  bool sm90;  // expected to take workspace from the allocator
};
void expect_choices(const Context& ctx, int64_t G, int64_t T, int64_t K, int64_t N,
                    const std::vector<ChoiceRun>& runs) {
  Tensor x = to_device(ctx, test::random_normal({T, K}, DType::BF16, 61));
  Tensor w = to_device(ctx, test::random_normal({G, N, K}, DType::BF16, 62, 1.0 / std::sqrt(double(K))));
  Tensor dy = to_device(ctx, test::random_normal({T, N}, DType::BF16, 63));
  Tensor y = Tensor::empty({T, N}, DType::BF16, ctx);
  Tensor dw = Tensor::empty({G, N, K}, DType::BF16, ctx);
  ctx.synchronize();
  for (const ChoiceRun& r : runs) {
    for (bool wgrad : {false, true}) {
      SCOPED_TRACE(std::string(r.what) + (wgrad ? ", group-K" : ", group-M"));
      r.ctx.synchronize();
      r.ctx.allocator().reset_stats();
      if (wgrad) grouped_gemm_group_k(r.ctx, dy, x, r.splits, dw, false);
      else grouped_gemm_group_m(r.ctx, x, w, BOp::Transposed, r.splits, y);
      r.ctx.synchronize();
      if (r.sm90) EXPECT_GT(r.ctx.allocator().stats().bytes, 0) << "sm90 did not run";
      else EXPECT_EQ(r.ctx.allocator().stats().bytes, 0) << "sm90 ran instead of cuBLAS";
    }
  }
}

// 1. Uniform host splits of many small groups: cuBLAS's strided-batched GEMMs are faster.
TEST(CudaSm90, AutomaticChoiceLeavesUniformSmallHostSplitsToCublasBatches) {
  MOEKIT_REQUIRE_SM90();
  const Context automatic = Context::cuda(0);
  const int64_t G = 16;
  std::vector<int64_t> skewed(G, 64);
  skewed[0] = 100;
  skewed[1] = 28;
  expect_choices(automatic, G, G * 64, 256, 128, {
      {"uniform 16 x 64 host splits, automatic", automatic, Splits::host(std::vector<int64_t>(G, 64)), false},
      {"skewed host splits, automatic", automatic, Splits::host(skewed), true},
      {"uniform host splits, sm90 forced", automatic.with_backend("sm90"),
       Splits::host(std::vector<int64_t>(G, 64)), true},
  });
}

// 2. Host splits of large groups (a mean of 2048 rows or more): cuBLAS per group, which the power
// limit lets run at a higher clock. Device splits stay on sm90 (cuBLAS would need the counts on
// the host), and so do host splits half a row short of the mean.
TEST(CudaSm90, AutomaticChoiceLeavesLargeHostSplitGroupsToCublas) {
  MOEKIT_REQUIRE_SM90();
  const Context automatic = Context::cuda(0);
  const std::vector<int64_t> uniform{2048, 2048}, skewed{3000, 1096}, short_by_one{2048, 2047};
  const Tensor device_counts = to_device(automatic, test::counts_tensor(uniform, DType::I64));
  expect_choices(automatic, 2, 4096, 64, 64, {
      {"uniform 2 x 2048 host splits, automatic", automatic, Splits::host(uniform), false},
      {"skewed host splits of mean 2048, automatic", automatic, Splits::host(skewed), false},
      {"host splits of mean 2047.5, automatic", automatic, Splits::host(short_by_one), true},
      {"uniform 2 x 2048 device splits, automatic", automatic, Splits::device(device_counts), true},
      {"uniform 2 x 2048 host splits, sm90 forced", automatic.with_backend("sm90"),
       Splits::host(uniform), true},
  });
}

// ---------------------------------------------------------------- group-K (weight gradient)

struct Sm90WgradCase {
  const char* name;
  DType dtype;       // of dy and x
  DType dw_dtype;    // f32 or dtype
  bool accumulate;   // dw += (onto random start values)
  DType counts_dtype;
  int64_t T, K, N;   // dy [T, N], x [T, K], dw [G, N, K]
  std::vector<int64_t> counts;
};
void PrintTo(const Sm90WgradCase& c, std::ostream* os) { *os << c.name; }
std::string wgrad_case_name(const ::testing::TestParamInfo<Sm90WgradCase>& info) {
  return info.param.name;
}

const Sm90WgradCase kWgradCases[] = {
    // Group sizes straddle the 64-row K tile (1, 17, 63, 64, 65, 300): the last tile of a group
    // must stop at its own rows. Zero-row groups between and at both ends; a tail S < T.
    {"Bf16ToF32I32ZeroGroupsTail", DType::BF16, DType::F32, false, DType::I32, 700, 136, 256,
     {0, 300, 0, 1, 64, 0, 17, 63, 65, 0}},
    {"Bf16ToBf16I64Skewed", DType::BF16, DType::BF16, false, DType::I64, 2100, 264, 200,
     {1500, 0, 3, 400, 0, 100, 45, 0}},
    {"F16ToF32AccumulateI64", DType::F16, DType::F32, true, DType::I64, 1000, 128, 320,
     {9, 0, 0, 40, 1, 1, 1, 200, 7, 0, 63, 64, 65, 0, 100, 3, 30, 0, 0, 50}},
    {"F16ToF16OneGroup", DType::F16, DType::F16, false, DType::I32, 777, 512, 64, {777}},
    {"Bf16ToF32Accumulate64Experts", DType::BF16, DType::F32, true, DType::I32, 4096, 256, 128,
     std::vector<int64_t>(64, 60)},
    // Every case above has fewer tiles per group than an H200 has SMs, so the automatic tile
    // order runs them in chunks of 4 (kSmallGroupOrder, blocked_scheduler.cuh); this one has
    // 12 x 12 = 144 tiles per group: the balanced order (groups laid out largest first).
    {"Bf16ToBf16ManyTilesPerGroup", DType::BF16, DType::BF16, false, DType::I32, 330, 1536, 1536,
     {0, 150, 1, 149}},
    // T >= 2048 rows per group: bf16 takes the cooperative 128x256 tile (edge tiles in both
    // output dims, a zero-row group, a tail).
    {"Bf16ToF32AccumulateLargeGroupsWideTile", DType::BF16, DType::F32, true, DType::I64, 4400, 200,
     264, {0, 4000}},
    {"Bf16ToBf16LargeGroupsWideTile", DType::BF16, DType::BF16, false, DType::I32, 6200, 136, 320,
     {2100, 2047, 1990}},
    // 300 groups (many_small_groups; T: their rows and a tail of 9); accumulating: C's descriptors
    {"Bf16ToF32AccumulateThreeHundredGroups", DType::BF16, DType::F32, true, DType::I32,
     sum_of(many_small_groups(300, 9)) + 9, 64, 136, many_small_groups(300, 9)},
    {"Bf16ToBf16I64ThreeHundredGroups", DType::BF16, DType::BF16, false, DType::I64,
     sum_of(many_small_groups(300, 10)) + 9, 136, 64, many_small_groups(300, 10)},
};

class CudaSm90Wgrad : public ::testing::TestWithParam<Sm90WgradCase> {};

// grouped_gemm_group_k through the sm90 backend with device counts. The rows of dy and x past S
// hold NaN: a group whose K range ran past its rows (or into the tail) would turn NaN. dw starts
// as NaN when overwritten (beta = 0 must not read it), as random values when accumulating (empty
// groups must keep them bit for bit).
void check_wgrad_case(const Sm90WgradCase& c, int sm_margin = 0) {
  const Context ctx = sm90().with_sm_margin(sm_margin);
  const int64_t G = static_cast<int64_t>(c.counts.size()), S = sum_of(c.counts);
  Tensor dy_h = test::random_normal({c.T, c.N}, c.dtype, 41);
  Tensor x_h = test::random_normal({c.T, c.K}, c.dtype, 42);
  Tensor dy = to_device(ctx, dy_h), x = to_device(ctx, x_h);
  if (S < c.T) {
    fill(ctx, dy.rows(S, c.T), std::nan(""));
    fill(ctx, x.rows(S, c.T), std::nan(""));
  }
  Tensor start_h = test::random_normal({G, c.N, c.K}, DType::F32, 43);
  Tensor dw = Tensor::empty({G, c.N, c.K}, c.dw_dtype, ctx);
  if (c.accumulate) copy(ctx, start_h, dw);
  else fill(ctx, dw, std::nan(""));
  const std::vector<uint8_t> before = test::bytes_of(ctx, dw);
  Tensor counts = to_device(ctx, test::counts_tensor(c.counts, c.counts_dtype));

  grouped_gemm_group_k(ctx, dy, x, Splits::device(counts), dw, c.accumulate);

  const test::Reference ref =
      test::reference_wgrad(doubles_of(dy_h), doubles_of(x_h), c.counts, c.K, c.N,
                            c.accumulate ? doubles_of(start_h) : std::vector<double>{});
  const std::vector<double> got = test::to_doubles(ctx, dw);
  EXPECT_TRUE(test::matches_reference(c.name, got, ref, c.dw_dtype));
  const std::vector<uint8_t> after = test::bytes_of(ctx, dw);
  const size_t group_bytes = static_cast<size_t>(c.N * c.K) * size_of(c.dw_dtype);
  for (int64_t g = 0; g < G; ++g) {
    if (c.counts[static_cast<size_t>(g)] != 0) continue;
    const size_t at = static_cast<size_t>(g) * group_bytes;
    if (c.accumulate) {
      EXPECT_TRUE(std::equal(after.begin() + at, after.begin() + at + group_bytes, before.begin() + at))
          << "empty group " << g << " changed while accumulating";
    } else {
      EXPECT_TRUE(group_is_exact_zero(after, g, group_bytes)) << "empty group " << g << " is not exactly +0";
    }
  }
}

TEST_P(CudaSm90Wgrad, MatchesFp64ReferenceEmptyGroupsExact) {
  MOEKIT_REQUIRE_SM90();
  check_wgrad_case(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaSm90Wgrad, ::testing::ValuesIn(kWgradCases), wgrad_case_name);

// Fuzzed wgrad shapes: G in [1, 40], N and K multiples of 8 in [8, 264] (edge tiles in both output
// dims, 8-column tails), mostly small groups with zero-row groups (now and then one large group,
// or all empty), a tail of NaN rows, bf16 / f16 into the input dtype or f32 (accumulating or not),
// i32 / i64 counts.
// The SM margin (Context::with_sm_margin) of a fuzzed case, from its own generator (the shapes'
// draws stay as they were): none for half the cases, else 1 to all but one of the device's SMs,
// so the persistent grids run from one cluster to nearly every SM.
class FuzzedSmMargin {
 public:
  explicit FuzzedSmMargin(uint64_t seed) : rng_(seed) {
    const test::CudaGraphApi& api = test::CudaGraphApi::get();
    sms_ = api.ok ? api.sm_count(0) : 0;
  }
  int next() {
    if (sms_ < 2 || rng_() % 2 == 0) return 0;
    return 1 + static_cast<int>(rng_() % static_cast<uint64_t>(sms_ - 1));
  }

 private:
  std::mt19937_64 rng_;
  int sms_ = 0;
};

TEST(CudaSm90, WgradFuzzedShapesMatchFp64Reference) {
  MOEKIT_REQUIRE_SM90();
  std::mt19937_64 rng(1201);
  FuzzedSmMargin margins(1202);
  auto uniform = [&](int64_t lo, int64_t hi) {  // [lo, hi]
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  for (int it = 0; it < 14; ++it) {
    const int64_t G = uniform(1, 40);
    std::vector<int64_t> counts(static_cast<size_t>(G), 0);
    const int kind = static_cast<int>(uniform(0, 6));
    for (auto& m : counts) m = kind == 0 ? 0 : (uniform(0, 3) == 0 ? 0 : uniform(1, 150));
    if (kind == 1) counts[static_cast<size_t>(uniform(0, G - 1))] = uniform(300, 900);
    const DType dt = uniform(0, 3) == 0 ? DType::F16 : DType::BF16;
    const int out = static_cast<int>(uniform(0, 2));  // 0, 1: the input dtype; 2: f32
    const bool accumulate = out == 2 && uniform(0, 1) == 1;
    const std::string case_name = str("fuzz", it);
    const Sm90WgradCase c{case_name.c_str(), dt, out == 2 ? DType::F32 : dt, accumulate,
                          uniform(0, 1) ? DType::I32 : DType::I64, sum_of(counts) + uniform(1, 30),
                          8 * uniform(1, 33), 8 * uniform(1, 33), counts};
    const int margin = margins.next();
    SCOPED_TRACE(str("case ", it, ": G ", G, " T ", c.T, " K ", c.K, " N ", c.N, " ", name(dt),
                     " -> ", name(c.dw_dtype), accumulate ? " accumulate" : "", " counts ",
                     ::testing::PrintToString(counts), " SM margin ", margin));
    check_wgrad_case(c, margin);
  }
}

// Invalid device counts: dw keeps every byte (no empty group zeroed, no GEMM), the error word says why.
TEST(CudaSm90, WgradWithInvalidDeviceCountsWritesNothingAndSetsTheErrorBit) {
  MOEKIT_REQUIRE_SM90();
  const Context ctx = Context::cuda(0).with_backend("sm90");  // an error word of its own
  const int64_t T = 256, K = 64, N = 96, G = 4;
  Tensor dy = to_device(ctx, test::random_normal({T, N}, DType::BF16, 51));
  Tensor x = to_device(ctx, test::random_normal({T, K}, DType::BF16, 52));
  Tensor dw = Tensor::empty({G, N, K}, DType::F32, ctx);
  const std::pair<std::vector<int64_t>, uint32_t> bad[] = {
      {{10, -1, 0, 20}, Context::kNegativeCount}, {{200, 0, 0, 100}, Context::kCountsExceedRows}};
  for (const auto& [cnt, bit] : bad) {
    for (bool accumulate : {false, true}) {
      fill(ctx, dw, test::kSentinel);
      const std::vector<uint8_t> before = test::bytes_of(ctx, dw);
      Tensor counts = to_device(ctx, test::counts_tensor(cnt, DType::I64));
      grouped_gemm_group_k(ctx, dy, x, Splits::device(counts), dw, accumulate);
      EXPECT_EQ(ctx.device_error_bits(), bit) << ::testing::PrintToString(cnt);
      EXPECT_TRUE(test::bit_identical(test::bytes_of(ctx, dw), before, DType::F32))
          << ::testing::PrintToString(cnt) << (accumulate ? " accumulate" : "");
    }
  }
}

// Invalid device counts in the second 256-group chunk of the setup kernels' scan (scan_groups):
// the first chunk's groups are visited before the call is known to be invalid, then every group
// again with no rows. Group-M (fprop, its output guarded) and group-K (dw, accumulating or not:
// the setup blocks that zero empty groups check every count first) write nothing; the error
// word says why.
TEST(CudaSm90, InvalidCountsInALaterScanChunkWriteNothing) {
  MOEKIT_REQUIRE_SM90();
  const Context ctx = Context::cuda(0).with_backend("sm90");  // an error word of its own
  const std::vector<int64_t> good = many_small_groups(300, 12);
  const int64_t G = 300, T = sum_of(good) + 9, K = 64, N = 72;
  ASSERT_GT(std::count(good.begin(), good.begin() + 256, int64_t{0}), 0) << "no empty group to flag";
  std::vector<int64_t> negative = good, too_many = good;
  negative[280] = -1;
  too_many[290] += 10;  // S = T + 1: each count is within T, only the total is over it
  const std::pair<std::vector<int64_t>, uint32_t> bad[] = {{negative, Context::kNegativeCount},
                                                           {too_many, Context::kCountsExceedRows}};
  const Tensor x = to_device(ctx, test::random_normal({T, K}, DType::BF16, 71));
  const Tensor w = to_device(ctx, test::random_normal({G, N, K}, DType::BF16, 72, 0.125));
  const Tensor dy = to_device(ctx, test::random_normal({T, N}, DType::BF16, 73));
  Guarded y(ctx, T, N, DType::BF16);
  Tensor dw = Tensor::empty({G, N, K}, DType::BF16, ctx);
  Tensor dw32 = Tensor::empty({G, N, K}, DType::F32, ctx);
  for (const auto& [cnt, bit] : bad) {
    SCOPED_TRACE(bit == Context::kNegativeCount ? "negative count" : "sum above T");
    ASSERT_EQ(sum_of(too_many), T + 1);
    const Tensor counts = to_device(ctx, test::counts_tensor(cnt, DType::I64));
    grouped_gemm_group_m(ctx, x, w, BOp::Transposed, Splits::device(counts), y.view, Tensor());
    EXPECT_EQ(ctx.device_error_bits(), bit) << "group-M";
    EXPECT_TRUE(y.untouched_outside(0)) << "group-M";
    for (Tensor* out : {&dw, &dw32}) {
      const bool accumulate = out->dtype() == DType::F32;
      fill(ctx, *out, test::kSentinel);
      const std::vector<uint8_t> before = test::bytes_of(ctx, *out);
      grouped_gemm_group_k(ctx, dy, x, Splits::device(counts), *out, accumulate);
      EXPECT_EQ(ctx.device_error_bits(), bit) << "group-K";
      EXPECT_TRUE(test::bit_identical(test::bytes_of(ctx, *out), before, out->dtype()))
          << "group-K" << (accumulate ? ", accumulating" : "");
    }
  }
}

// The fused MLP kernels (fc1 + SwiGLU, fc2 dgrad + SwiGLU backward: the production path) with
// invalid device counts: h, z, dh and dprobs keep every byte (accumulating or not) and the
// context's error word gets the bit (SPEC §1).
TEST(CudaSm90, FusedSwiGluKernelsWithInvalidDeviceCountsWriteNothingAndSetTheErrorBit) {
  MOEKIT_REQUIRE_SM90();
  const Context ctx = Context::cuda(0).with_backend("sm90");  // an error word of its own
  const int64_t T = 256, H = 64, F = 64, G = 4;
  const GluLayout layout = GluLayout::Interleaved32;
  const Tensor x = to_device(ctx, test::random_normal({T, H}, DType::BF16, 61));
  const Tensor w1 = to_device(ctx, test::random_normal({G, 2 * F, H}, DType::BF16, 62, 0.125));
  const Tensor w2 = to_device(ctx, test::random_normal({G, H, F}, DType::BF16, 63, 0.125));
  const Tensor dy = to_device(ctx, test::random_normal({T, H}, DType::BF16, 64));
  const Tensor probs = to_device(ctx, test::random_normal({T}, DType::F32, 66));
  const Tensor h_in = to_device(ctx, test::random_normal({T, 2 * F}, DType::BF16, 65));
  const Tensor h = test::filled(ctx, {T, 2 * F}, DType::BF16, test::kSentinel);
  const Tensor z = test::filled(ctx, {T, F}, DType::BF16, test::kSentinel);
  const Tensor dh = test::filled(ctx, {T, 2 * F}, DType::BF16, test::kSentinel);
  const Tensor dp = test::filled(ctx, {T}, DType::F32, test::kSentinel);
  const std::vector<uint8_t> h0 = test::bytes_of(ctx, h), z0 = test::bytes_of(ctx, z),
                             dh0 = test::bytes_of(ctx, dh), dp0 = test::bytes_of(ctx, dp);
  const std::pair<std::vector<int64_t>, uint32_t> bad[] = {
      {{10, -1, 0, 20}, Context::kNegativeCount}, {{200, 0, 0, 100}, Context::kCountsExceedRows}};
  for (const auto& [cnt, bit] : bad) {
    SCOPED_TRACE(::testing::PrintToString(cnt));
    const Tensor counts = to_device(ctx, test::counts_tensor(cnt, DType::I32));
    grouped_gemm_swiglu(ctx, x, w1, Splits::device(counts), Tensor(), probs, layout, h, z);
    EXPECT_EQ(ctx.device_error_bits(), bit) << "forward";
    EXPECT_TRUE(test::bit_identical(test::bytes_of(ctx, h), h0, DType::BF16)) << "h";
    EXPECT_TRUE(test::bit_identical(test::bytes_of(ctx, z), z0, DType::BF16)) << "z";
    for (bool accumulate : {false, true}) {
      grouped_gemm_dswiglu(ctx, dy, w2, Splits::device(counts), h_in, probs, layout, dh, dp,
                           accumulate);
      EXPECT_EQ(ctx.device_error_bits(), bit) << "backward" << (accumulate ? ", accumulate" : "");
      EXPECT_TRUE(test::bit_identical(test::bytes_of(ctx, dh), dh0, DType::BF16)) << "dh";
      EXPECT_TRUE(test::bit_identical(test::bytes_of(ctx, dp), dp0, DType::F32)) << "dprobs";
    }
  }
}

// ---------------------------------------------------------------- graph capture

// What the two forward-capture tests share: an sm90 context on the test's stream, a
// GroupedLinear with bias and random weights, x, a guarded caller output, and the fp64 reference
// for any counts. seed, seed + 1, seed + 2: w, b, x.
struct CapturedLinear {
  static constexpr int64_t G = 8, T = 2048, K = 256, N = 192;
  Context ctx;
  GroupedLinear fc;
  Tensor w_h, b_h, x_h, x;
  Guarded y;
  CapturedLinear(void* stream, uint64_t seed)
      : ctx(Context::cuda(0, stream).with_backend("sm90")),
        fc({.groups = G, .in = K, .out = N, .dtype = DType::BF16, .bias = true}, ctx),
        w_h(test::random_normal({G, N, K}, DType::BF16, seed, 1.0 / 16)),
        b_h(test::random_normal({G, N}, DType::BF16, seed + 1)),
        x_h(test::random_normal({T, K}, DType::BF16, seed + 2)),
        x(to_device(ctx, x_h)),
        y(ctx, T, N, DType::BF16) {
    copy(ctx, w_h, fc.weight());
    copy(ctx, b_h, fc.bias());
  }
  test::Reference reference(const std::vector<int64_t>& counts) const {
    return test::reference_forward(doubles_of(x_h), doubles_of(w_h), doubles_of(b_h), counts, K, N);
  }
};

// GroupedLinear::forward with device splits and a caller output buffer is captured once; the
// graph is replayed after the counts tensor (and nothing else) changes: uniform, zero-row groups
// with a tail, everything in one group, nothing at all. Each replay matches the fp64 reference
// of ITS counts and leaves the tail and guard bands untouched.
TEST(CudaSm90, GraphCapturedForwardReplaysWithNewDeviceCounts) {
  MOEKIT_REQUIRE_GRAPH_STREAM();
  {
    CapturedLinear s(stream, 31);
    constexpr int64_t G = CapturedLinear::G, T = CapturedLinear::T;
    const Context& ctx = s.ctx;
    Tensor counts = to_device(ctx, test::counts_tensor(std::vector<int64_t>(G, T / G), DType::I64));
    ctx.synchronize();

    void* graph = nullptr;
    void* exec = nullptr;
    Tensor result;
    ASSERT_EQ(api.capture(stream, [&] {
      result = s.fc.forward(s.x, Splits::device(counts), {.output = s.y.view, .input_requires_grad = false});
    }, &graph), "");
    EXPECT_EQ(result.data(), s.y.view.data()) << "the output is the caller's buffer";
    size_t nodes = 0;
    ASSERT_EQ(api.get_nodes(graph, nullptr, &nodes), 0);
    EXPECT_GE(nodes, 2u) << "setup kernel + grouped GEMM";
    ASSERT_EQ(api.instantiate(&exec, graph, 0), 0);

    const std::vector<std::vector<int64_t>> scenarios = {
        {256, 256, 256, 256, 256, 256, 256, 256},
        {0, 700, 0, 1, 1000, 0, 33, 7},
        {0, 0, 0, 0, 0, 0, 0, 2000},
        {0, 0, 0, 0, 0, 0, 0, 0},
    };
    for (const auto& cnt : scenarios) {
      copy(ctx, test::counts_tensor(cnt, DType::I64), counts);
      s.y.refill();
      ASSERT_EQ(api.launch(exec, stream), 0);
      ASSERT_EQ(api.stream_sync(stream), 0);
      EXPECT_TRUE(test::matches_reference("graph replay", s.y.values(), s.reference(cnt), DType::BF16))
          << "counts " << ::testing::PrintToString(cnt);
      EXPECT_TRUE(s.y.untouched_outside(sum_of(cnt))) << "counts " << ::testing::PrintToString(cnt);
    }
    api.exec_destroy(exec);
    api.graph_destroy(graph);
    ctx.synchronize();
  }
}

// Host counts reach the sm90 kernels through kernel parameters (no copy from pageable memory),
// so a forward with host counts is capturable too; a replay computes with the counts of the
// capture, whatever happened to the caller's vector since. Each replay refills the guarded
// output and must rewrite exactly the first S rows.
TEST(CudaSm90, GraphCapturedForwardWithHostCountsReplaysTheCapturedCounts) {
  MOEKIT_REQUIRE_GRAPH_STREAM();
  {
    CapturedLinear s(stream, 34);
    constexpr int64_t G = CapturedLinear::G, T = CapturedLinear::T;
    const Context& ctx = s.ctx;
    ctx.synchronize();

    const std::vector<int64_t> captured = {0, 700, 0, 1, 1000, 0, 33, 7};  // a tail of 307 rows
    std::vector<int64_t> host = captured;
    void* graph = nullptr;
    void* exec = nullptr;
    ASSERT_EQ(api.capture(stream, [&] {
      s.fc.forward(s.x, Splits::host(host), {.output = s.y.view, .input_requires_grad = false});
    }, &graph), "");
    ASSERT_EQ(api.instantiate(&exec, graph, 0), 0);
    host.assign(G, T / G);  // the caller's vector changes; the graph keeps what it captured

    const test::Reference ref = s.reference(captured);
    for (int replay = 0; replay < 2; ++replay) {
      SCOPED_TRACE("replay " + std::to_string(replay));
      s.y.refill();
      ASSERT_EQ(api.launch(exec, stream), 0);
      ASSERT_EQ(api.stream_sync(stream), 0);
      EXPECT_TRUE(test::matches_reference("graph replay, host counts", s.y.values(), ref, DType::BF16));
      EXPECT_TRUE(s.y.untouched_outside(sum_of(captured)));
    }
    api.exec_destroy(exec);
    api.graph_destroy(graph);
    ctx.synchronize();
  }
}

// The whole grouped MLP — forward (fc1 with bias, ScaledSwiGLU, fc2 with its prob-scaled bias)
// and backward (fc2 dgrad + wgrad into main_grad, SwiGLU backward with dprobs, the bias grads,
// fc1 dgrad + wgrad into main_grad) — is captured ONCE with device counts, caller buffers for y,
// dx and dprobs and fp32 main_grads; intermediates are allocated and freed inside the capture.
// The graph is replayed after only the counts tensor changed (zero-row groups with a tail, every
// row in one group, uniform, nothing at all). Each replay must equal, bit for bit, an eager run
// with the same counts (deterministic kernels), and that run matches the stage-wise fp64
// reference; the tails of y, dx and dprobs keep their sentinels. In bf16 and f16 on the fused
// kernels (Interleaved32) and in bf16 on the GEMMs with the SwiGLU kernels (Halves). The first
// configuration is captured on a fresh context, which makes no side stream during a capture (the
// weight gradients then run on the context's stream: src/core/side_stream.h); the others after
// an eager step made it, so their graphs hold the weight gradients' fork and join.
TEST(CudaSm90, GraphCapturedMlpForwardAndBackwardReplaysWithNewDeviceCounts) {
  MOEKIT_REQUIRE_GRAPH_STREAM();
  // The fused kernels (bf16 and f16, Interleaved32) and the GEMM + SwiGLU-kernel path (Halves).
  // The last three configurations defer the weight gradients (BackwardOptions::defer_weight_grads):
  // the graph then holds the fork after fc1's dgrad and the join of the handle's wait(). One on a
  // context with an SM margin (Context::with_sm_margin): every GEMM of the step, the side
  // stream's deferred ones included, on a grid of at most the SMs it leaves; the last with the
  // margin on the deferred GEMMs only (deferred_sm_margin): the two weight gradients' grids.
  struct Config {
    DType dt;
    GluLayout layout;
    bool defer;
    int margin, deferred_margin;
  };
  const Config configs[] = {{DType::BF16, GluLayout::Interleaved32, false, 0, 0},
                            {DType::F16, GluLayout::Interleaved32, false, 0, 0},
                            {DType::BF16, GluLayout::Halves, false, 0, 0},
                            {DType::BF16, GluLayout::Interleaved32, true, 0, 0},
                            {DType::BF16, GluLayout::Interleaved32, true, 16, 0},
                            {DType::BF16, GluLayout::Interleaved32, true, 0, 16}};
  const int sms = api.sm_count(0);
  for (const auto& [dt, layout, defer, margin, deferred_margin] : configs) {
    const bool eager_first = &dt != &configs[0].dt;
    const bool side_stream = eager_first && test::side_stream_enabled();
    SCOPED_TRACE(str(name(dt), layout == GluLayout::Halves ? ", halves" : ", interleaved32",
                     eager_first ? ", captured after an eager step" : ", captured first",
                     defer ? ", weight gradients deferred" : "", margin ? ", SM margin" : "",
                     deferred_margin ? ", SM margin of the deferred GEMMs" : ""));
    const Context ctx = Context::cuda(0, stream).with_backend("sm90").with_sm_margin(margin);
    const int64_t G = 4, H = 128, F = 128, T = 640;
    const test::MlpData d = test::make_mlp_data({.G = G, .H = H, .F = F, .T = T,
                                                 .counts = {160, 160, 160, 160},
                                                 .dtype = dt, .layout = layout, .seed = 17});
    const test::MlpOps ops = test::make_mlp_ops(ctx, d);
    const GroupedMLP mlp(ops.fc1, ops.act, ops.fc2);
    const Tensor mg1_h = test::random_normal({G, 2 * F, H}, DType::F32, 71);
    const Tensor mg2_h = test::random_normal({G, H, F}, DType::F32, 72);
    const Tensor dp_h = test::random_normal({T}, DType::F32, 73);
    const Tensor mg1 = to_device(ctx, mg1_h), mg2 = to_device(ctx, mg2_h);
    ops.fc1->linear().set_main_grad(mg1);
    ops.fc2->linear().set_main_grad(mg2);
    const Tensor x = to_device(ctx, d.x), probs = to_device(ctx, d.probs), dy = to_device(ctx, d.dy);
    Tensor counts = to_device(ctx, test::counts_tensor(d.c.counts, DType::I64));
    const test::GuardedBuffer y(ctx, {T, H}, dt), dx(ctx, {T, H}, dt);
    const Tensor dp = Tensor::empty({T}, DType::F32, ctx);
    // Inputs of one step: main_grads and the dprobs accumulator back to their start values.
    auto reset = [&] {
      copy(ctx, mg1_h, mg1);
      copy(ctx, mg2_h, mg2);
      copy(ctx, dp_h, dp);
      y.refill();
      dx.refill();
    };
    auto step = [&](GroupedMLP::Saved* keep) {
      GroupedMLP::Saved local;
      GroupedMLP::Saved& saved = keep ? *keep : local;
      const Tensor out = mlp.forward(x, probs, Splits::device(counts), {.output = y.view}, &saved);
      GroupedMLP::Grads g = mlp.backward(saved, dy,
                                         {.grad_input = dx.view,
                                          .grad_probs = dp,
                                          .defer_weight_grads = defer,
                                          .deferred_sm_margin = deferred_margin});
      EXPECT_EQ(g.weight_grads.pending(), defer && side_stream);
      g.weight_grads.wait();
      EXPECT_FALSE(g.weight_grads.pending());
      EXPECT_EQ(out.data(), y.view.data());
      EXPECT_EQ(g.input.data(), dx.view.data());
      EXPECT_EQ(g.probs.data(), dp.data());
      EXPECT_EQ(g.fc1.weight.data(), mg1.data());
      EXPECT_EQ(g.fc2.weight.data(), mg2.data());
    };
    auto images = [&] {
      return std::vector<std::vector<uint8_t>>{y.all(), dx.all(), test::bytes_of(ctx, dp),
                                               test::bytes_of(ctx, mg1), test::bytes_of(ctx, mg2)};
    };
    if (eager_first) step(nullptr);
    reset();
    ctx.synchronize();

    void* graph = nullptr;
    void* exec = nullptr;
    ASSERT_EQ(api.capture(stream, [&] { step(nullptr); }, &graph), "");
    ASSERT_EQ(api.instantiate(&exec, graph, 0), 0);
    if (margin > 0 || deferred_margin > 0) {
      // The step's six GEMMs (test::is_gemm_launch), each on a grid of every SM (these problems'
      // sizes are on the device: CUTLASS's grid does not shrink to them) or of at most the SMs
      // the margin leaves.
      const unsigned most =
          static_cast<unsigned>(std::max(sms - std::max(margin, deferred_margin), 2));
      int gemms = 0, narrow = 0;
      for (const auto& k : api.kernels(graph)) {
        if (!test::is_gemm_launch(k)) continue;
        ++gemms;
        narrow += k.grid[0] * k.grid[1] * k.grid[2] <= most ? 1 : 0;
      }
      EXPECT_EQ(gemms, 6);
      EXPECT_EQ(narrow, margin > 0 ? 6 : 2) << "GEMMs on at most " << most << " SMs";
    }

    const std::vector<std::vector<int64_t>> scenarios = {
        {0, 300, 1, 200}, {0, 0, 640, 0}, {160, 160, 160, 160}, {0, 0, 0, 0}};
    const char* names[] = {"y", "dx", "dprobs", "main_grad1", "main_grad2"};
    for (const auto& cnt : scenarios) {
      SCOPED_TRACE("counts " + ::testing::PrintToString(cnt));
      copy(ctx, test::counts_tensor(cnt, DType::I64), counts);
      reset();
      ASSERT_EQ(api.launch(exec, stream), 0);
      ASSERT_EQ(api.stream_sync(stream), 0);
      const auto replayed = images();
      const int64_t S = sum_of(cnt);
      EXPECT_TRUE(y.untouched_outside(S));
      EXPECT_TRUE(dx.untouched_outside(S));

      reset();
      GroupedMLP::Saved saved;
      step(&saved);
      const auto eager = images();
      for (size_t i = 0; i < eager.size(); ++i) {
        EXPECT_TRUE(test::bit_identical(replayed[i], eager[i], i < 2 ? dt : DType::F32))
            << names[i] << ": graph replay vs eager run";
      }
      test::MlpProblem p = d.problem();
      p.counts = cnt;
      const std::vector<double> h = test::to_doubles(ctx, saved.h), z = test::to_doubles(ctx, saved.z);
      const test::MlpForwardExpected f = test::mlp_forward_ref(p, h, z);
      EXPECT_TRUE(test::matches_expected("y", y.values(), f.y));
      const test::MlpGradExpected g = test::mlp_backward_ref(
          p, h, z, doubles_of(d.dy), doubles_of(mg1_h), doubles_of(mg2_h));
      EXPECT_TRUE(test::matches_expected("dx", dx.values(), g.dx));
      EXPECT_TRUE(test::matches_expected("dW1 (main_grad)", test::to_doubles(ctx, mg1), g.dw1));
      EXPECT_TRUE(test::matches_expected("dW2 (main_grad)", test::to_doubles(ctx, mg2), g.dw2));
      // dprobs was accumulated onto dp_h on rows [0, S); the rest keeps dp_h.
      std::vector<double> dp_got = test::to_doubles(ctx, dp);
      const std::vector<double> dp_start = doubles_of(dp_h);
      for (size_t t = 0; t < dp_got.size(); ++t) dp_got[t] -= dp_start[t];
      EXPECT_TRUE(test::matches_expected("dprobs - start", dp_got, g.dprobs));
      for (size_t t = static_cast<size_t>(S); t < dp_got.size(); ++t) {
        ASSERT_EQ(dp_got[t], 0.0) << "dprobs tail row " << t << " changed";
      }
    }
    EXPECT_EQ(ctx.device_error_bits(), 0u);
    api.exec_destroy(exec);
    api.graph_destroy(graph);
    ctx.synchronize();
  }
}

// ---------------------------------------------------------------- fused fc1 + SwiGLU

struct FusedCase {
  const char* name;
  DType dtype;
  bool bias, probs;
  DType counts_dtype;  // I32 / I64 device counts, or U8: host splits
  int64_t G, T, K, F;
  std::vector<int64_t> counts;
};
std::string fused_case_name(const ::testing::TestParamInfo<FusedCase>& info) {
  return info.param.name;
}
void PrintTo(const FusedCase& c, std::ostream* os) { *os << c.name; }

const FusedCase kFusedCases[] = {
    // rows per group >= 128 on average: the 128x128 (kLarge) instance
    {"Bf16LargeTilesBiasProbsZeroGroupsTail", DType::BF16, true, true, DType::I64, 4, 1100, 256,
     192, {0, 600, 3, 400}},
    // < 128 rows per group: the 64x128 (kSmallM) instance
    {"Bf16SmallTilesProbsI32", DType::BF16, false, true, DType::I32, 16, 700, 128, 64,
     {0, 70, 1, 0, 129, 64, 65, 0, 3, 100, 0, 0, 50, 33, 2, 0}},
    // < 128 rows per group, F = 512: the fused instances on 64x128, their plain twins (the two
    // calls: fc1 of 2F = 1024 columns, fc2's dgrad of F) swapped on the 512x64 cluster tile
    // (ConfigSmallSwap)
    {"Bf16SmallTilesPlainTwinSwappedBiasProbs", DType::BF16, true, true, DType::I32, 8, 600, 256, 512,
     {0, 120, 7, 0, 64, 200, 1, 90}},
    {"F16LargeTilesBiasNoProbsOneGroup", DType::F16, true, false, DType::I64, 2, 900, 512, 96,
     {0, 900}},
    {"F16SmallTilesHostSplits", DType::F16, true, true, DType::U8, 8, 500, 64, 32,
     {100, 0, 7, 60, 1, 90, 0, 200}},
    // K >= 4096: fc1 on the cooperative 128x256 tile with a 2x1 cluster (2F = 320: a partial N tile)
    {"Bf16LargeKWide21BiasProbs", DType::BF16, true, true, DType::I32, 4, 900, 4096, 160,
     {0, 450, 3, 300}},
};

class CudaSm90FusedSwiGlu : public ::testing::TestWithParam<FusedCase> {};

// grouped_gemm_swiglu with SwiGLU in the sm90 GEMM's epilogue: h and z equal, bit for bit, the two
// separate calls (sm90 group-M, then the SwiGLU kernel) — guard bands and tails included — and
// match the fp64 references (h from x, z from the stored h).
TEST_P(CudaSm90FusedSwiGlu, EqualsGemmThenSwiGluBitForBit) {
  MOEKIT_REQUIRE_SM90();
  const FusedCase& c = GetParam();
  const Context& ctx = sm90();
  const test::MlpData d = test::make_mlp_data({.G = c.G, .H = c.K, .F = c.F, .T = c.T,
                                               .counts = c.counts, .dtype = c.dtype,
                                               .layout = GluLayout::Interleaved32, .b1 = c.bias,
                                               .seed = 41});
  const Tensor x = to_device(ctx, d.x), w = to_device(ctx, d.w1);
  const Tensor bias = c.bias ? to_device(ctx, d.b1) : Tensor();
  const Tensor probs = c.probs ? to_device(ctx, d.probs) : Tensor();
  const Tensor counts = c.counts_dtype == DType::U8
                            ? Tensor()
                            : to_device(ctx, test::counts_tensor(c.counts, c.counts_dtype));
  const Splits splits = counts.defined() ? Splits::device(counts) : Splits::host(c.counts);
  const int64_t S = sum_of(c.counts);
  const test::GuardedBuffer h(ctx, {c.T, 2 * c.F}, c.dtype), z(ctx, {c.T, c.F}, c.dtype);
  const test::GuardedBuffer h2(ctx, {c.T, 2 * c.F}, c.dtype), z2(ctx, {c.T, c.F}, c.dtype);

  grouped_gemm_swiglu(ctx, x, w, splits, bias, probs, GluLayout::Interleaved32, h.view, z.view);
  grouped_gemm_group_m(ctx, x, w, BOp::Transposed, splits, h2.view, bias);
  swiglu_forward(ctx, h2.view, probs, splits, GluLayout::Interleaved32, z2.view);
  ctx.synchronize();

  EXPECT_TRUE(test::bit_identical(h.all(), h2.all(), c.dtype)) << "h: fused vs two calls";
  EXPECT_TRUE(test::bit_identical(z.all(), z2.all(), c.dtype)) << "z: fused vs two calls";
  EXPECT_TRUE(h.untouched_outside(S));
  EXPECT_TRUE(z.untouched_outside(S));
  const std::vector<double> hv = h.values();
  const test::Reference h_ref = test::reference_forward(
      doubles_of(d.x), doubles_of(d.w1), c.bias ? doubles_of(d.b1) : std::vector<double>{},
      c.counts, c.K, 2 * c.F);
  EXPECT_TRUE(test::matches_reference("h", hv, h_ref, c.dtype));
  const test::Expected z_ref = test::swiglu_forward_ref(
      hv, c.probs ? doubles_of(d.probs) : std::vector<double>{}, S, c.F,
      GluLayout::Interleaved32, c.dtype);
  EXPECT_TRUE(test::matches_expected("z", z.values(), z_ref));
  EXPECT_EQ(ctx.device_error_bits(), 0u);
}
INSTANTIATE_TEST_SUITE_P(Shapes, CudaSm90FusedSwiGlu, ::testing::ValuesIn(kFusedCases),
                         fused_case_name);

// ---------------------------------------------------------------- fused fc2 dgrad + SwiGLU backward

class CudaSm90FusedDSwiGlu : public ::testing::TestWithParam<FusedCase> {};

// grouped_gemm_dswiglu with the SwiGLU backward in the sm90 dgrad GEMM's epilogue (the FusedCase
// fields read: K = H, F; bias = accumulate dprobs; probs = with probs and dprobs): dh equals, bit
// for bit, the two separate calls (guard bands included); dprobs equals them to fp32 summation
// order and matches the fp64 reference, its tail untouched; dh matches its reference.
void expect_fused_dswiglu_equals_two_calls(const FusedCase& c) {
  const Context& ctx = sm90();
  const bool with_dp = c.probs, accumulate = c.bias;
  const Tensor dy_h = test::random_normal({c.T, c.K}, c.dtype, 91);
  const Tensor w_h = test::random_normal({c.G, c.K, c.F}, c.dtype, 92, 1.0 / std::sqrt(double(c.K)));
  const Tensor h_h = test::random_normal({c.T, 2 * c.F}, c.dtype, 93, 2.0);
  const Tensor p_h = test::random_normal({c.T}, DType::F32, 94);
  const Tensor dp0_h = test::random_normal({c.T}, DType::F32, 95);
  const Tensor dy = to_device(ctx, dy_h), w = to_device(ctx, w_h), h = to_device(ctx, h_h);
  const Tensor probs = with_dp ? to_device(ctx, p_h) : Tensor();
  const Tensor counts = c.counts_dtype == DType::U8
                            ? Tensor()
                            : to_device(ctx, test::counts_tensor(c.counts, c.counts_dtype));
  const Splits splits = counts.defined() ? Splits::device(counts) : Splits::host(c.counts);
  const int64_t S = sum_of(c.counts);
  const test::GuardedBuffer dh(ctx, {c.T, 2 * c.F}, c.dtype), dh2(ctx, {c.T, 2 * c.F}, c.dtype);
  const Tensor dz2 = Tensor::empty({c.T, c.F}, c.dtype, ctx);
  const Tensor dp = with_dp ? to_device(ctx, dp0_h) : Tensor();
  const Tensor dp2 = with_dp ? to_device(ctx, dp0_h) : Tensor();

  // The fused epilogue takes 16-byte aligned h and dh only (else the two calls run, and this test
  // would compare them with themselves): the guard rows keep the view aligned (2F % 64 == 0).
  ASSERT_EQ(reinterpret_cast<uintptr_t>(dh.view.data()) % 16, 0u);
  ASSERT_EQ(reinterpret_cast<uintptr_t>(h.data()) % 16, 0u);
  grouped_gemm_dswiglu(ctx, dy, w, splits, h, probs, GluLayout::Interleaved32, dh.view, dp,
                       accumulate);
  grouped_gemm_group_m(ctx, dy, w, BOp::Plain, splits, dz2);
  swiglu_backward(ctx, h, probs, dz2, splits, GluLayout::Interleaved32, dh2.view, dp2, accumulate);
  ctx.synchronize();

  EXPECT_TRUE(test::bit_identical(dh.all(), dh2.all(), c.dtype)) << "dh: fused vs two calls";
  EXPECT_TRUE(dh.untouched_outside(S));
  // The reference of dh from the two-call dz (dz itself never leaves the fused kernel), after
  // checking that dz against the fp64 GEMM.
  const std::vector<double> dzv = test::to_doubles(ctx, dz2.rows(0, S));
  const test::Reference dz_ref =
      test::reference_dgrad(doubles_of(dy_h), doubles_of(w_h), c.counts, c.F, c.K);
  EXPECT_TRUE(test::matches_reference("dz (two calls)", dzv, dz_ref, c.dtype));
  const test::SwigluGradExpected want = test::swiglu_backward_ref(
      doubles_of(h_h), with_dp ? doubles_of(p_h) : std::vector<double>{}, dzv, S, c.F,
      GluLayout::Interleaved32, c.dtype,
      with_dp && accumulate ? doubles_of(dp0_h) : std::vector<double>{});
  EXPECT_TRUE(test::matches_expected("dh", dh.values(), want.dh));
  if (with_dp) {
    const std::vector<double> got = test::to_doubles(ctx, dp), two = test::to_doubles(ctx, dp2);
    const std::vector<double> start = doubles_of(dp0_h);
    EXPECT_TRUE(test::matches_expected("dprobs", got, want.dprobs));
    for (int64_t t = 0; t < c.T; ++t) {
      const auto i = static_cast<size_t>(t);
      if (t >= S) {
        ASSERT_EQ(got[i], start[i]) << "dprobs tail row " << t << " changed";
      } else {
        EXPECT_LE(std::abs(got[i] - two[i]), 1e-5 * (1.0 + std::abs(two[i]))) << "dprobs row " << t;
      }
    }
  }
  EXPECT_EQ(ctx.device_error_bits(), 0u);
}
TEST_P(CudaSm90FusedDSwiGlu, EqualsGemmThenSwiGluBackward) {
  MOEKIT_REQUIRE_SM90();
  expect_fused_dswiglu_equals_two_calls(GetParam());
}
INSTANTIATE_TEST_SUITE_P(Shapes, CudaSm90FusedDSwiGlu, ::testing::ValuesIn(kFusedCases),
                         fused_case_name);

// The kernels' Params are cached per (groups, n, k, workspace, ...), not per row count, so every
// per-group array they point to must sit at an offset the rows do not move; the dprobs partials
// ([rows, n tiles]) are carved after them (group_m_kernel.cuh, GroupArrays::carve). Two fused
// backward calls with dprobs, same G, K, F, other rows, one context (whose pool tends to hand
// back the same workspace): each equals its two-call path.
TEST(CudaSm90, FusedDSwiGluCallsOfOtherRowCountsBackToBack) {
  MOEKIT_REQUIRE_SM90();
  FusedCase c = kFusedCases[0];  // bf16, kLarge, with probs and dprobs
  for (const auto& [T, counts] : std::vector<std::pair<int64_t, std::vector<int64_t>>>{
           {1100, {0, 600, 3, 400}}, {640, {0, 300, 3, 300}}, {1100, {0, 600, 3, 400}}}) {
    SCOPED_TRACE("T = " + std::to_string(T));
    c.T = T;
    c.counts = counts;
    expect_fused_dswiglu_equals_two_calls(c);
  }
}

// The operands of one small fc1 + SwiGLU / fc2 dgrad + SwiGLU backward pair with device counts
// (a zero-row group, rows [450, 512) a tail), random normal from seeds seed..seed+4; h and z are
// the forward's outputs.
struct SmallGluCalls {
  static constexpr int64_t G = 4, T = 512, H = 128, F = 64, rows = 450;
  Tensor x, w1, dy, w2, probs, counts, h, z;
  Splits splits;
  SmallGluCalls(const Context& ctx, uint64_t seed)
      : x(dev(ctx, {T, H}, DType::BF16, seed)),
        w1(dev(ctx, {G, 2 * F, H}, DType::BF16, seed + 1, 0.1)),
        dy(dev(ctx, {T, H}, DType::BF16, seed + 2)),
        w2(dev(ctx, {G, H, F}, DType::BF16, seed + 3, 0.1)),
        probs(dev(ctx, {T}, DType::F32, seed + 4)),
        counts(to_device(ctx, test::counts_tensor({100, 0, 300, 50}, DType::I32))),
        h(Tensor::empty({T, 2 * F}, DType::BF16, ctx)),
        z(Tensor::empty({T, F}, DType::BF16, ctx)),
        splits(Splits::device(counts)) {}
  static Tensor dev(const Context& ctx, const Shape& shape, DType dt, uint64_t seed, double sd = 1.0) {
    return to_device(ctx, test::random_normal(shape, dt, seed, sd));
  }
};

// The weight gradient is two kernels, accumulating or not: the setup kernel (whose blocks after the
// first zero the empty groups) and the GEMM — no zero-fill kernel between them. Captured once with
// device counts, the graph replayed with other counts writes exact zeros into the groups that are
// empty in that replay (dw refilled with NaN before each), the fp64 reference elsewhere.
TEST(CudaSm90, WgradIsTwoKernelsAndItsGraphZeroesTheGroupsEmptyInEachReplay) {
  MOEKIT_REQUIRE_GRAPH_STREAM();
  {
    const Context ctx = Context::cuda(0, stream).with_backend("sm90");
    const int64_t T = 300, K = 72, N = 136, G = 5;
    const Tensor dy_h = test::random_normal({T, N}, DType::BF16, 81);
    const Tensor x_h = test::random_normal({T, K}, DType::BF16, 82);
    const Tensor dy = to_device(ctx, dy_h), x = to_device(ctx, x_h);
    Tensor counts = to_device(ctx, test::counts_tensor({60, 0, 100, 40, 0}, DType::I64));
    Tensor dw = Tensor::empty({G, N, K}, DType::BF16, ctx);
    Tensor dw32 = Tensor::empty({G, N, K}, DType::F32, ctx);
    ctx.synchronize();
    for (bool accumulate : {false, true}) {
      void* graph = nullptr;
      ASSERT_EQ(api.capture(stream, [&] {
        grouped_gemm_group_k(ctx, dy, x, Splits::device(counts), accumulate ? dw32 : dw, accumulate);
      }, &graph), "");
      EXPECT_EQ(api.kernel_nodes(graph), 2) << (accumulate ? "accumulating" : "bf16 dw");
      if (accumulate) {
        api.graph_destroy(graph);
        continue;
      }
      void* exec = nullptr;
      ASSERT_EQ(api.instantiate(&exec, graph, 0), 0);
      for (const std::vector<int64_t>& cnt : {std::vector<int64_t>{0, 120, 0, 0, 180},
                                              std::vector<int64_t>{0, 0, 0, 0, 0},
                                              std::vector<int64_t>{7, 0, 256, 0, 1}}) {
        SCOPED_TRACE(::testing::PrintToString(cnt));
        copy(ctx, test::counts_tensor(cnt, DType::I64), counts);
        fill(ctx, dw, std::nan(""));
        ASSERT_EQ(api.launch(exec, stream), 0);
        ASSERT_EQ(api.stream_sync(stream), 0);
        const test::Reference ref = test::reference_wgrad(doubles_of(dy_h), doubles_of(x_h), cnt, K, N, {});
        EXPECT_TRUE(test::matches_reference("wgrad replay", test::to_doubles(ctx, dw), ref, DType::BF16));
        const std::vector<uint8_t> got = test::bytes_of(ctx, dw);
        const size_t group_bytes = static_cast<size_t>(N * K) * size_of(DType::BF16);
        for (int64_t g = 0; g < G; ++g) {
          if (cnt[static_cast<size_t>(g)] != 0) continue;
          EXPECT_TRUE(group_is_exact_zero(got, g, group_bytes)) << "empty group " << g << " is not exactly +0";
        }
      }
      api.exec_destroy(exec);
      api.graph_destroy(graph);
    }
    EXPECT_EQ(ctx.device_error_bits(), 0u);
  }
}

// Context::with_sm_margin: the persistent GEMM grids of group-M and group-K take at most the
// device's SMs less the margin, in whole clusters (seen in the captured launches:
// test::is_gemm_launch), and write the same bits as with every SM — a tile's work
// does not depend on which CTA takes it — inside the guard bands, zero-row groups exact.
TEST(CudaSm90, SmMarginShrinksThePersistentGridsAndWritesTheSameBits) {
  MOEKIT_REQUIRE_GRAPH_STREAM();
  {
    const Context base = Context::cuda(0, stream).with_backend("sm90");
    const int sms = api.sm_count(0);
    ASSERT_GT(sms, 20);
    // 128x128 output tiles: fprop 20 x 16 over the groups' rows, wgrad 16 x 2 per group (x 3):
    // more tiles than SMs either way.
    const int64_t T = 2500, K = 256, N = 2048;
    const std::vector<int64_t> cnt{1200, 0, 1000, 290};  // a zero-row group, a tail of 10
    const int64_t G = static_cast<int64_t>(cnt.size()), S = sum_of(cnt);
    const Tensor x_h = test::random_normal({T, K}, DType::BF16, 91);
    const Tensor w_h = test::random_normal({G, N, K}, DType::BF16, 92, 1.0 / 16);
    const Tensor dy_h = test::random_normal({T, N}, DType::BF16, 93);
    const Tensor x = to_device(base, x_h), w = to_device(base, w_h), dy = to_device(base, dy_h);
    const Tensor counts = to_device(base, test::counts_tensor(cnt, DType::I32));
    struct Run {
      std::vector<uint8_t> y, dw;
      std::vector<double> y_values, dw_values;
      unsigned grid_m = 0, grid_k = 0;
    };
    auto gemm_grid = [&](void* graph) {
      unsigned grid = 0;
      for (const auto& k : api.kernels(graph)) {
        if (test::is_gemm_launch(k)) grid = k.grid[0] * k.grid[1] * k.grid[2];
      }
      return grid;
    };
    auto run = [&](int margin) {
      SCOPED_TRACE(str("margin ", margin));
      const Context ctx = base.with_sm_margin(margin);
      Run r;
      Guarded y(ctx, T, N, DType::BF16);
      Tensor dw = Tensor::empty({G, N, K}, DType::BF16, ctx);
      fill(ctx, dw, std::nan(""));
      ctx.synchronize();
      for (bool wgrad : {false, true}) {
        const auto gemm = [&] {
          if (wgrad) {
            grouped_gemm_group_k(ctx, dy, x, Splits::device(counts), dw, false);
          } else {
            grouped_gemm_group_m(ctx, x, w, BOp::Transposed, Splits::device(counts), y.view);
          }
        };
        void* graph = nullptr;
        EXPECT_EQ(api.capture(stream, gemm, &graph), "");
        (wgrad ? r.grid_k : r.grid_m) = gemm_grid(graph);
        void* exec = nullptr;
        EXPECT_EQ(api.instantiate(&exec, graph, 0), 0);
        EXPECT_EQ(api.launch(exec, stream), 0);
        EXPECT_EQ(api.stream_sync(stream), 0);
        api.exec_destroy(exec);
        api.graph_destroy(graph);
      }
      EXPECT_TRUE(y.untouched_outside(S));
      r.y = test::bytes_of(ctx, y.view);
      r.dw = test::bytes_of(ctx, dw);
      r.y_values = y.values();
      r.dw_values = test::to_doubles(ctx, dw);
      return r;
    };
    const Run all = run(0);
    EXPECT_TRUE(test::matches_reference(
        "y", all.y_values, test::reference_forward(doubles_of(x_h), doubles_of(w_h), {}, cnt, K, N),
        DType::BF16));
    EXPECT_GT(all.grid_m, 0u);
    EXPECT_LE(all.grid_m, static_cast<unsigned>(sms));
    EXPECT_LE(all.grid_k, static_cast<unsigned>(sms));
    for (int margin : {16, 17, sms - 1}) {
      SCOPED_TRACE(str("margin ", margin));
      const Run r = run(margin);
      const unsigned most = static_cast<unsigned>(std::max(sms - margin, 2));  // clusters of <= 2
      for (const auto& [what, grid, grid_all] : {std::tuple{"group-M", r.grid_m, all.grid_m},
                                                 std::tuple{"group-K", r.grid_k, all.grid_k}}) {
        EXPECT_LE(grid, most) << what;
        EXPECT_GE(grid + 3, std::min(grid_all, most)) << what;  // whole clusters of <= 4
        EXPECT_GT(grid, 0u) << what;
      }
      EXPECT_TRUE(r.y == all.y) << "y differs from the run on every SM";
      EXPECT_TRUE(r.dw == all.dw) << "dw differs from the run on every SM";
    }
    const size_t group_bytes = static_cast<size_t>(N * K) * size_of(DType::BF16);
    EXPECT_TRUE(group_is_exact_zero(all.dw, 1, group_bytes));
    EXPECT_TRUE(test::matches_reference(
        "dw", all.dw_values,
        test::reference_wgrad(doubles_of(dy_h), doubles_of(x_h), cnt, K, N, {}), DType::BF16));
    EXPECT_EQ(base.device_error_bits(), 0u);
    // The margin must leave an SM.
    auto e = caught([&] { base.with_sm_margin(sms); });
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), ::testing::AllOf(::testing::HasSubstr("'sms'"),
                                            ::testing::HasSubstr(str(sms, " SMs")),
                                            ::testing::HasSubstr(str("got ", sms))));
  }
}

// What "fused" means, observably: captured with device counts and "sm90" forced, fc1 + SwiGLU is
// two kernels (the setup kernel and the GEMM with SwiGLU in its epilogue) and fc2 dgrad + SwiGLU
// backward (no dprobs) two as well, for the Interleaved32 layout; for Halves, which the epilogues
// cannot pair, each is three (setup, GEMM, the SwiGLU kernel).
TEST(CudaSm90, FusedSwiGluForwardAndBackwardAreOneGemmLaunchEach) {
  MOEKIT_REQUIRE_GRAPH_STREAM();
  {
    const Context ctx = Context::cuda(0, stream).with_backend("sm90");
    const SmallGluCalls m(ctx, 51);
    const Tensor dh = Tensor::empty({m.T, 2 * m.F}, DType::BF16, ctx);
    const Tensor &x = m.x, &w1 = m.w1, &dy = m.dy, &w2 = m.w2, &probs = m.probs, &h = m.h, &z = m.z;
    const Splits& splits = m.splits;
    ctx.synchronize();
    for (GluLayout layout : {GluLayout::Interleaved32, GluLayout::Halves}) {
      const std::pair<const char*, std::function<void()>> calls[] = {
          {"forward", [&] { grouped_gemm_swiglu(ctx, x, w1, splits, Tensor(), probs, layout, h, z); }},
          {"backward", [&] {
             grouped_gemm_dswiglu(ctx, dy, w2, splits, h, probs, layout, dh, Tensor(), false);
           }}};
      for (const auto& [what, call] : calls) {
        SCOPED_TRACE(std::string(name(layout)) + " " + what);
        void* graph = nullptr;
        ASSERT_EQ(api.capture(stream, call, &graph), "");
        EXPECT_EQ(api.kernel_nodes(graph), layout == GluLayout::Interleaved32 ? 2 : 3);
        api.graph_destroy(graph);
      }
    }
    ctx.synchronize();
  }
}

// The automatic choice (no backend forced) fuses SwiGLU into fc1's epilogue but runs the backward
// as the plain dgrad and the SwiGLU backward kernel (three kernels), since the fused backward
// loses in whole steps (src/backends/cuda/sm90/heuristics.h, kFuseBackward); the study override
// MOEKIT_SM90_STUDY=fused_backward=1 puts the fused kernel back (two), fused_forward=0 declines the
// fused forward (three). Both backward paths give dh bit for bit the same.
TEST(CudaSm90, AutomaticChoiceRunsTheFusedBackwardOnlyWhenAskedFor) {
  const char* const forced = std::getenv("MOEKIT_BACKEND");
  if (forced && *forced) GTEST_SKIP() << "MOEKIT_BACKEND=" << forced << " forces a backend";
  MOEKIT_REQUIRE_GRAPH_STREAM();
  const char* const env = std::getenv("MOEKIT_SM90_STUDY");
  const std::string study = std::string(",") + (env ? env : "") + ",";
  const bool fused_backward = study.find(",fused_backward=1,") != std::string::npos;
  const bool fused_forward = study.find(",fused_forward=0,") == std::string::npos;
  {
    const Context ctx = Context::cuda(0, stream);
    const SmallGluCalls m(ctx, 61);
    const test::GuardedBuffer dh(ctx, {m.T, 2 * m.F}, DType::BF16);
    const test::GuardedBuffer dh_fused(ctx, {m.T, 2 * m.F}, DType::BF16);
    const Tensor &x = m.x, &w1 = m.w1, &dy = m.dy, &w2 = m.w2, &probs = m.probs, &h = m.h, &z = m.z;
    const Splits& splits = m.splits;
    const GluLayout layout = GluLayout::Interleaved32;
    auto forward = [&] { grouped_gemm_swiglu(ctx, x, w1, splits, Tensor(), probs, layout, h, z); };
    auto backward = [&] {
      grouped_gemm_dswiglu(ctx, dy, w2, splits, h, probs, layout, dh.view, Tensor(), false);
    };
    ctx.synchronize();
    for (const auto& [what, call, kernels] :
         {std::tuple<const char*, std::function<void()>, int>{"forward", forward, fused_forward ? 2 : 3},
          {"backward", backward, fused_backward ? 2 : 3}}) {
      void* graph = nullptr;
      ASSERT_EQ(api.capture(stream, call, &graph), "") << what;
      EXPECT_EQ(api.kernel_nodes(graph), kernels) << what;
      api.graph_destroy(graph);
    }
    forward();
    backward();
    grouped_gemm_dswiglu(ctx.with_backend("sm90"), dy, w2, splits, h, probs, layout, dh_fused.view,
                         Tensor(), false);
    ctx.synchronize();
    EXPECT_TRUE(test::bit_identical(dh.all(), dh_fused.all(), DType::BF16))
        << "dh: automatic choice vs the fused kernel";
    EXPECT_TRUE(dh.untouched_outside(m.rows));
    EXPECT_EQ(ctx.device_error_bits(), 0u);
  }
}

// One case of both fused SwiGLU epilogues against the two calls each replaces: forward h and z
// and backward dh bit-identical; backward dprobs to fp32 summation order; tails untouched.
struct FuzzCase {
  std::vector<int64_t> counts;
  int64_t F = 32, K = 8, T = 1;
  DType dt = DType::BF16;
  bool bias = false, probs = false, accumulate = false;
  int counts_kind = 0;  // 0 host, 1 i32, 2 i64
  uint64_t seed = 0;
};

void check_fuzz_case(const Context& ctx, const FuzzCase& fc) {
  const int64_t G = static_cast<int64_t>(fc.counts.size()), F = fc.F, K = fc.K, T = fc.T;
  const int64_t S = sum_of(fc.counts);
  const DType dt = fc.dt;
  SCOPED_TRACE(str("G ", G, " F ", F, " K ", K, " T ", T, " S ", S, " ", name(dt),
                   fc.bias ? " bias" : "", fc.probs ? " probs" : "",
                   fc.accumulate ? " accumulate" : "", " counts ",
                   ::testing::PrintToString(fc.counts), " kind ", fc.counts_kind));
  auto dev = [&](const Shape& shp, DType d, uint64_t sd, double stddev = 1.0) {
    return to_device(ctx, test::random_normal(shp, d, sd, stddev));
  };
  const uint64_t seed = fc.seed;
  const Tensor x = dev({T, K}, dt, seed), w1 = dev({G, 2 * F, K}, dt, seed + 1, 0.2);
  const Tensor b1 = fc.bias ? dev({G, 2 * F}, dt, seed + 2) : Tensor();
  const Tensor probs = fc.probs ? dev({T}, DType::F32, seed + 3) : Tensor();
  const Tensor dy = dev({T, K}, dt, seed + 4), w2 = dev({G, K, F}, dt, seed + 5, 0.2);
  const Tensor counts_d =
      fc.counts_kind == 0
          ? Tensor()
          : to_device(ctx, test::counts_tensor(fc.counts, fc.counts_kind == 1 ? DType::I32
                                                                               : DType::I64));
  const Splits splits = counts_d.defined() ? Splits::device(counts_d) : Splits::host(fc.counts);
  // forward
  const test::GuardedBuffer h(ctx, {T, 2 * F}, dt), z(ctx, {T, F}, dt);
  const test::GuardedBuffer h2(ctx, {T, 2 * F}, dt), z2(ctx, {T, F}, dt);
  grouped_gemm_swiglu(ctx, x, w1, splits, b1, probs, GluLayout::Interleaved32, h.view, z.view);
  grouped_gemm_group_m(ctx, x, w1, BOp::Transposed, splits, h2.view, b1);
  swiglu_forward(ctx, h2.view, probs, splits, GluLayout::Interleaved32, z2.view);
  // backward from the forward's h
  const test::GuardedBuffer dh(ctx, {T, 2 * F}, dt), dh2(ctx, {T, 2 * F}, dt);
  const Tensor dz2 = Tensor::empty({T, F}, dt, ctx);
  const Tensor dp0 = dev({T}, DType::F32, seed + 6);
  const Tensor dp = fc.probs ? Tensor::empty({T}, DType::F32, ctx) : Tensor();
  const Tensor dp2 = fc.probs ? Tensor::empty({T}, DType::F32, ctx) : Tensor();
  if (fc.probs) {
    copy(ctx, dp0, dp);
    copy(ctx, dp0, dp2);
  }
  ASSERT_EQ(reinterpret_cast<uintptr_t>(dh.view.data()) % 16, 0u);  // the fused path's condition
  ASSERT_EQ(reinterpret_cast<uintptr_t>(h.view.data()) % 16, 0u);
  grouped_gemm_dswiglu(ctx, dy, w2, splits, h.view, probs, GluLayout::Interleaved32, dh.view, dp,
                       fc.accumulate);
  grouped_gemm_group_m(ctx, dy, w2, BOp::Plain, splits, dz2);
  swiglu_backward(ctx, h.view, probs, dz2, splits, GluLayout::Interleaved32, dh2.view, dp2,
                  fc.accumulate);
  ctx.synchronize();
  EXPECT_TRUE(test::bit_identical(h.all(), h2.all(), dt)) << "h";
  EXPECT_TRUE(test::bit_identical(z.all(), z2.all(), dt)) << "z";
  EXPECT_TRUE(test::bit_identical(dh.all(), dh2.all(), dt)) << "dh";
  EXPECT_TRUE(h.untouched_outside(S));
  EXPECT_TRUE(z.untouched_outside(S));
  EXPECT_TRUE(dh.untouched_outside(S));
  if (fc.probs) {
    const std::vector<double> a = test::to_doubles(ctx, dp), b = test::to_doubles(ctx, dp2);
    const std::vector<double> start = test::to_doubles(ctx, dp0);
    // The two sums of dp_t = sum_j dz·silu(a)·b differ only in the order of their F fp32
    // additions: each is within (F - 1)·u·sum_j |term| of the exact sum (u = 2^-24), so they are
    // within twice that of each other. A term missing or counted twice is far outside it.
    const std::vector<double> hv = h.values(), dz = test::to_doubles(ctx, dz2);
    auto bound = [&](int64_t t) {
      double abs_sum = 0.0;
      for (int64_t j = 0; j < F; ++j) {
        const int64_t gate = (j / 32) * 64 + j % 32;
        const double av = hv[static_cast<size_t>(t * 2 * F + gate)];
        const double bv = hv[static_cast<size_t>(t * 2 * F + gate + 32)];
        abs_sum += std::abs(dz[static_cast<size_t>(t * F + j)] * av / (1.0 + std::exp(-av)) * bv);
      }
      return 2.0 * static_cast<double>(F) * std::ldexp(1.0, -24) * abs_sum +
             std::ldexp(std::abs(start[static_cast<size_t>(t)]) + std::abs(b[static_cast<size_t>(t)]),
                        -23);  // + the accumulate's rounding
    };
    int64_t off = 0;
    for (int64_t t = 0; t < T; ++t) {
      const auto i = static_cast<size_t>(t);
      const bool ok = t >= S ? a[i] == start[i] : std::abs(a[i] - b[i]) <= bound(t);
      if (!ok && off++ < 5) {
        ADD_FAILURE() << "dprobs row " << t << (t >= S ? " (tail, must keep its start value)" : "")
                      << ": got " << a[i] << ", expected " << (t >= S ? start[i] : b[i])
                      << (t >= S ? "" : str(" ± ", bound(t)));
      }
    }
    EXPECT_EQ(off, 0) << "dprobs rows off";
  }
  EXPECT_EQ(ctx.device_error_bits(), 0u);
}

// Fuzzed shapes for both fused epilogues: G in [1, 12], F a multiple of 32 in [32, 320] (so N
// tiles of fc1 and fc2 may be half full, and fc2's dgrad may have an odd number of N tiles, which
// the 1x2 cluster pads with a tile wholly past N), K = H a multiple of 8 in [8, 520] (K tails of
// 8..56), T with a tail, random counts with zero-row groups (now and then all rows in one group or
// none), bf16 / f16, with and without bias and probs, device (i32 / i64) or host counts.
TEST(CudaSm90, FusedSwiGluFuzzedShapesEqualTwoCalls) {
  MOEKIT_REQUIRE_SM90();
  std::mt19937_64 rng(2026);
  FuzzedSmMargin margins(2027);
  auto uniform = [&](int64_t lo, int64_t hi) {  // [lo, hi]
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  for (int it = 0; it < 16; ++it) {
    FuzzCase fc;
    const int64_t G = uniform(1, 12);
    fc.F = 32 * uniform(1, 10);
    fc.K = 8 * uniform(1, 65);
    fc.counts.assign(static_cast<size_t>(G), 0);
    const int shape = static_cast<int>(uniform(0, 5));
    for (auto& m : fc.counts) m = shape == 0 ? 0 : (uniform(0, 3) == 0 ? 0 : uniform(1, 300));
    if (shape == 1) fc.counts[static_cast<size_t>(uniform(0, G - 1))] = uniform(200, 900);
    fc.T = sum_of(fc.counts) + uniform(1, 40);
    fc.dt = uniform(0, 1) ? DType::BF16 : DType::F16;
    fc.bias = uniform(0, 1);
    fc.probs = uniform(0, 3) != 0;
    fc.accumulate = uniform(0, 1);
    fc.counts_kind = static_cast<int>(uniform(0, 2));
    fc.seed = 300 + 10 * static_cast<uint64_t>(it);
    const int margin = margins.next();
    SCOPED_TRACE(str("case ", it, ", SM margin ", margin));
    check_fuzz_case(sm90().with_sm_margin(margin), fc);
  }
}

// Back-to-back fused calls that differ only in F (same groups, rows and K, so the same workspace
// size and likely the same workspace address): the kernels' cached parameters must follow F
// (z's and h's leading dimensions, the number of N tiles).
TEST(CudaSm90, FusedSwiGluCallsOfOtherWidthsBackToBack) {
  MOEKIT_REQUIRE_SM90();
  const Context& ctx = sm90();
  const std::vector<int64_t> counts = {130, 0, 7, 64};
  uint64_t seed = 900;
  for (int64_t F : {64, 32, 160, 64, 256}) {
    FuzzCase fc;
    fc.counts = counts;
    fc.F = F;
    fc.K = 96;
    fc.T = sum_of(counts) + 5;
    fc.probs = true;
    fc.counts_kind = 1;
    fc.seed = seed += 10;
    check_fuzz_case(ctx, fc);
  }
}

}  // namespace
}  // namespace moekit
