// Grouped MLP (SPEC §5) and the primitives it is written on: SwiGLU (both GLU layouts, with and
// without routing probs) and the prob-scaled grouped bias.
//
// Every suite is device-parameterised ("cpu" always; "cuda" skips with the reason when no GPU is
// usable). Data is random normal (never zeros), made on the host and moved with to_device; caller
// buffers are sentinel-prefilled and internal allocations NaN-poisoned; results are checked
// against the fp64 reference of support/mlp_reference.h stage by stage, gradients also against
// finite differences, and the fused op against the unfused Sequential bit for bit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "moekit/ops/grouped_mlp.h"
#include "moekit/ops/sequential.h"
#include "moekit/primitives/activation.h"
#include "moekit/primitives/grouped_bias.h"
#include "moekit/primitives/grouped_gemm.h"
#include "support/mlp_reference.h"
#include "support/test_util.h"

namespace moekit::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr DType kDtypes[] = {DType::F32, DType::BF16, DType::F16};
constexpr GluLayout kLayouts[] = {GluLayout::Halves, GluLayout::Interleaved32};

int64_t sum(const std::vector<int64_t>& v) { return sum_of(v); }

std::string label(DType dt, GluLayout layout) {
  return str(name(dt), "/", name(layout));
}

using OnDevice = DeviceTest;

// ============================================================== SwiGLU primitive
using SwiGLUPrimitive = OnDevice;

TEST_P(SwiGLUPrimitive, ForwardMatchesFp64ForBothLayoutsWithAndWithoutProbs) {
  const std::vector<int64_t> counts = {4, 0, 5};  // a zero-row group, S = 9
  const int64_t S = sum(counts), T = S + 4, F = 64;
  const Splits splits = Splits::host(counts);
  const Tensor probs_h = make_mlp_data({.T = T}).probs;
  for (DType dt : kDtypes) {
    for (GluLayout layout : kLayouts) {
      for (bool scaled : {false, true}) {
        SCOPED_TRACE(str(label(dt, layout), scaled ? " scaled" : " plain"));
        const Tensor h_h = random_normal({T, 2 * F}, dt, 11, 2.0);
        const Tensor h = to_device(ctx_, h_h), probs = to_device(ctx_, probs_h);
        const Tensor z = filled(ctx_, {T, F}, dt, kSentinel);
        swiglu_forward(ctx_, h, scaled ? probs : Tensor(), splits, layout, z);
        const std::vector<double> p = scaled ? to_doubles(host(), probs_h) : std::vector<double>{};
        EXPECT_TRUE(
            matches_expected("z", to_doubles(ctx_, z),
                             swiglu_forward_ref(to_doubles(host(), h_h), p, S, F, layout, dt)));
        EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, z), S, T, F, dt));
      }
    }
  }
}

// Widths and views whose rows are not 16-byte aligned (F = 13; and F = 12, aligned for f32 only,
// whose rows sit at an odd-row offset of a larger buffer): the GPU kernels must fall back from
// 16-byte packs to single elements and still match the fp64 reference, tails untouched.
TEST_P(SwiGLUPrimitive, UnalignedWidthsAndViewsMatchFp64) {
  const std::vector<int64_t> counts = {5, 0, 4};
  const int64_t S = sum(counts), T = S + 3;
  const Splits splits = Splits::host(counts);
  const Tensor probs_h = make_mlp_data({.T = T}).probs;
  for (int64_t F : {13, 12}) {
    for (DType dt : kDtypes) {
      SCOPED_TRACE(str(name(dt), " F = ", F));
      const Tensor h_h = random_normal({T, 2 * F}, dt, 31, 2.0);
      const Tensor dz_h = random_normal({T, F}, dt, 32);
      // Views starting one row into a larger buffer: base addresses 2F or F elements in.
      const Tensor h_buf = filled(ctx_, {T + 1, 2 * F}, dt, kSentinel);
      const Tensor dz_buf = filled(ctx_, {T + 1, F}, dt, kSentinel);
      const Tensor h = h_buf.rows(1, T + 1), dz = dz_buf.rows(1, T + 1);
      copy(ctx_, h_h, h);
      copy(ctx_, dz_h, dz);
      const Tensor probs = to_device(ctx_, probs_h);
      const Tensor z_buf = filled(ctx_, {T + 1, F}, dt, kSentinel);
      const Tensor dh_buf = filled(ctx_, {T + 1, 2 * F}, dt, kSentinel);
      const Tensor dprobs = filled(ctx_, {T}, DType::F32, kSentinel);
      swiglu_forward(ctx_, h, probs, splits, GluLayout::Halves, z_buf.rows(1, T + 1));
      swiglu_backward(ctx_, h, probs, dz, splits, GluLayout::Halves, dh_buf.rows(1, T + 1), dprobs,
                      false);
      const std::vector<double> hd = to_doubles(host(), h_h), pd = to_doubles(host(), probs_h);
      EXPECT_TRUE(matches_expected("z", to_doubles(ctx_, z_buf.rows(1, T + 1)),
                                   swiglu_forward_ref(hd, pd, S, F, GluLayout::Halves, dt)));
      const SwigluGradExpected want =
          swiglu_backward_ref(hd, pd, to_doubles(host(), dz_h), S, F, GluLayout::Halves, dt);
      EXPECT_TRUE(matches_expected("dh", to_doubles(ctx_, dh_buf.rows(1, T + 1)), want.dh));
      EXPECT_TRUE(matches_expected("dprobs", to_doubles(ctx_, dprobs), want.dprobs));
      EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, z_buf), 0, 1, F, dt)) << "row before the view";
      EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, z_buf), 1 + S, T + 1, F, dt)) << "z tail";
      EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, dh_buf), 1 + S, T + 1, 2 * F, dt)) << "dh tail";
      EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, dprobs), S, T, 1, DType::F32)) << "dprobs tail";
    }
  }
}

// F: one interleave block; two (the CUDA kernel's whole-line dh stores pair blocks); three (an
// unpaired block: no pairing); 66 blocks (a second pass over the row that only some lanes take).
TEST_P(SwiGLUPrimitive, BackwardMatchesFp64WithProbsGradWrittenOrAccumulated) {
  const std::vector<int64_t> counts = {3, 6, 0};
  const int64_t S = sum(counts), T = S + 3;
  const Splits splits = Splits::host(counts);
  const Tensor probs_h = make_mlp_data({.T = T}).probs;
  const Tensor start_h = random_normal({T}, DType::F32, 5);
  for (const int64_t F : {32, 64, 96, 2112})
  for (DType dt : kDtypes) {
    for (GluLayout layout : kLayouts) {
      for (int mode = 0; mode < 3; ++mode) {  // 0: plain, 1: dprobs written, 2: accumulated
        SCOPED_TRACE(str(label(dt, layout), " F ", F, " mode ", mode));
        const Tensor h_h = random_normal({T, 2 * F}, dt, 21, 2.0);
        const Tensor dz_h = random_normal({T, F}, dt, 22);
        const Tensor h = to_device(ctx_, h_h), dz = to_device(ctx_, dz_h);
        const Tensor probs = to_device(ctx_, probs_h);
        const Tensor dh = filled(ctx_, {T, 2 * F}, dt, kSentinel);
        Tensor dprobs;
        if (mode == 1) dprobs = filled(ctx_, {T}, DType::F32, kSentinel);
        if (mode == 2) {
          dprobs = to_device(ctx_, start_h);
          copy(ctx_, host_filled({T - S}, DType::F32, kSentinel), dprobs.rows(S, T));
        }
        swiglu_backward(ctx_, h, mode ? probs : Tensor(), dz, splits, layout, dh, dprobs,
                        mode == 2);
        const std::vector<double> p = mode ? to_doubles(host(), probs_h) : std::vector<double>{};
        const std::vector<double> start =
            mode == 2 ? to_doubles(host(), start_h) : std::vector<double>{};
        const SwigluGradExpected want = swiglu_backward_ref(
            to_doubles(host(), h_h), p, to_doubles(host(), dz_h), S, F, layout, dt, start);
        EXPECT_TRUE(matches_expected("dh", to_doubles(ctx_, dh), want.dh));
        EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, dh), S, T, 2 * F, dt));
        if (mode) {
          EXPECT_TRUE(matches_expected("dprobs", to_doubles(ctx_, dprobs), want.dprobs));
          EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, dprobs), S, T, 1, DType::F32));
        }
      }
    }
  }
}

// The interleaved layout, checked independently of the column formula the reference shares with
// the library: permuting the columns by hand must give bit-identical results.
TEST_P(SwiGLUPrimitive, InterleavedLayoutIsHalvesWithColumnsPermutedIn32Blocks) {
  const std::vector<int64_t> counts = {5, 4};
  const int64_t S = sum(counts), T = S + 2, F = 96;  // 2F = 192: three 64-column block pairs
  const Splits splits = Splits::host(counts);
  const DType dt = DType::BF16;
  const Tensor halves = random_normal({T, 2 * F}, dt, 31, 2.0);
  Tensor inter = Tensor::empty({T, 2 * F}, dt, host());
  const auto* src = halves.data_as<const uint16_t>();
  auto* dst = inter.data_as<uint16_t>();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < F / 32; ++c) {
      for (int64_t o = 0; o < 32; ++o) {
        dst[t * 2 * F + 64 * c + o] = src[t * 2 * F + 32 * c + o];           // gate block c
        dst[t * 2 * F + 64 * c + 32 + o] = src[t * 2 * F + F + 32 * c + o];  // linear block c
      }
    }
  }
  const Tensor probs = to_device(ctx_, make_mlp_data({.T = T}).probs);
  const Tensor dz = to_device(ctx_, random_normal({T, F}, dt, 32));
  Tensor z[2], dh[2], dp[2];
  const Tensor h[2] = {to_device(ctx_, halves), to_device(ctx_, inter)};
  for (int i = 0; i < 2; ++i) {
    const GluLayout layout = i ? GluLayout::Interleaved32 : GluLayout::Halves;
    z[i] = filled(ctx_, {T, F}, dt, kSentinel);
    dh[i] = filled(ctx_, {T, 2 * F}, dt, kSentinel);
    dp[i] = filled(ctx_, {T}, DType::F32, kSentinel);
    swiglu_forward(ctx_, h[i], probs, splits, layout, z[i]);
    swiglu_backward(ctx_, h[i], probs, dz, splits, layout, dh[i], dp[i], false);
  }
  EXPECT_TRUE(bit_identical(bytes_of(ctx_, z[1]), bytes_of(ctx_, z[0]), dt));
  EXPECT_TRUE(bit_identical(bytes_of(ctx_, dp[1]), bytes_of(ctx_, dp[0]), DType::F32));
  const std::vector<uint8_t> dh_h = bytes_of(ctx_, dh[0]), dh_i = bytes_of(ctx_, dh[1]);
  const auto* a = reinterpret_cast<const uint16_t*>(dh_h.data());
  const auto* b = reinterpret_cast<const uint16_t*>(dh_i.data());
  int64_t differ = 0;
  for (int64_t t = 0; t < S; ++t) {
    for (int64_t c = 0; c < F / 32; ++c) {
      for (int64_t o = 0; o < 32; ++o) {
        differ += b[t * 2 * F + 64 * c + o] != a[t * 2 * F + 32 * c + o];
        differ += b[t * 2 * F + 64 * c + 32 + o] != a[t * 2 * F + F + 32 * c + o];
      }
    }
  }
  EXPECT_EQ(differ, 0) << "dh of the interleaved layout is not dh of halves, permuted";
}

TEST_P(SwiGLUPrimitive, RejectsBadArgumentsBeforeWritingNaming) {
  const Splits splits = Splits::host({4});
  const Tensor h96 = to_device(ctx_, random_normal({4, 96}, DType::F32, 41));
  const Tensor z48 = filled(ctx_, {4, 48}, DType::F32, kSentinel);
  auto e =
      caught([&] { swiglu_forward(ctx_, h96, Tensor(), splits, GluLayout::Interleaved32, z48); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'h'"));
  EXPECT_THAT(e->what(), HasSubstr("multiple of 64 for the interleaved GLU layout"));
  EXPECT_THAT(e->what(), HasSubstr("2F = 96"));
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, z48), 0, 4, 48, DType::F32));

  const Tensor h7 = to_device(ctx_, random_normal({4, 7}, DType::F32, 42));
  e = caught([&] { swiglu_forward(ctx_, h7, Tensor(), splits, GluLayout::Halves, z48); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("even column count 2F"));

  const Tensor dz = to_device(ctx_, random_normal({4, 48}, DType::F32, 43));
  const Tensor dh = filled(ctx_, {4, 96}, DType::F32, kSentinel);
  const Tensor dp = filled(ctx_, {4}, DType::F32, kSentinel);
  e = caught(
      [&] { swiglu_backward(ctx_, h96, Tensor(), dz, splits, GluLayout::Halves, dh, dp, false); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'dprobs'"));
  EXPECT_THAT(e->what(), HasSubstr("plain SwiGLU has no probs"));

  // z overlapping its input h.
  const Tensor z_over = Tensor::wrap(h96.data(), {4, 48}, DType::F32, ctx_.device());
  e = caught([&] { swiglu_forward(ctx_, h96, Tensor(), splits, GluLayout::Halves, z_over); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("overlapping input 'h'"));

  // S > T.
  e = caught(
      [&] { swiglu_forward(ctx_, h96, Tensor(), Splits::host({5}), GluLayout::Halves, z48); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'splits'"));
}

INSTANTIATE_TEST_SUITE_P(Devices, SwiGLUPrimitive, ::testing::ValuesIn(device_names()),
                         test::device_name);

// ============================================================== fc1 + SwiGLU primitive
using GemmSwiGluPrimitive = OnDevice;

// grouped_gemm_swiglu equals grouped_gemm_group_m followed by swiglu_forward bit for bit, for every
// dtype, both layouts, with and without bias and probs, zero-row groups and a tail (on CUDA with
// the Interleaved32 layout this is the GEMM with SwiGLU in its epilogue where the sm90 kernels
// run; test_sm90 checks that path with sm90 forced), and leaves the tails untouched.
TEST_P(GemmSwiGluPrimitive, EqualsGemmThenSwiGluBitForBit) {
  for (DType dt : kDtypes) {
    for (GluLayout layout : kLayouts) {
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(str(label(dt, layout), with_bias ? " bias+probs" : " plain"));
        const MlpData d = make_mlp_data({.G = 3, .H = 64, .F = 64, .T = 300,
                                         .counts = {0, 170, 120}, .dtype = dt,
                                         .layout = layout, .b1 = with_bias, .seed = 5});
        const int64_t T = d.c.T, F = d.c.F, S = sum(d.c.counts);
        const Tensor x = to_device(ctx_, d.x), w = to_device(ctx_, d.w1);
        const Tensor bias = with_bias ? to_device(ctx_, d.b1) : Tensor();
        const Tensor probs = with_bias ? to_device(ctx_, d.probs) : Tensor();
        const Splits splits = Splits::host(d.c.counts);
        const Tensor h = filled(ctx_, {T, 2 * F}, dt, kSentinel), z = filled(ctx_, {T, F}, dt, kSentinel);
        const Tensor h2 = filled(ctx_, {T, 2 * F}, dt, kSentinel), z2 = filled(ctx_, {T, F}, dt, kSentinel);
        grouped_gemm_swiglu(ctx_, x, w, splits, bias, probs, layout, h, z);
        grouped_gemm_group_m(ctx_, x, w, BOp::Transposed, splits, h2, bias);
        swiglu_forward(ctx_, h2, probs, splits, layout, z2);
        EXPECT_TRUE(bit_identical(bytes_of(ctx_, h), bytes_of(ctx_, h2), dt)) << "h";
        EXPECT_TRUE(bit_identical(bytes_of(ctx_, z), bytes_of(ctx_, z2), dt)) << "z";
        EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, h), S, T, 2 * F, dt));
        EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, z), S, T, F, dt));
        const std::vector<double> hv = to_doubles(ctx_, h);
        EXPECT_TRUE(matches_expected(
            "z", to_doubles(ctx_, z),
            swiglu_forward_ref(hv, with_bias ? to_doubles(host(), d.probs) : std::vector<double>{},
                               S, F, layout, dt)));
      }
    }
  }
}

TEST_P(GemmSwiGluPrimitive, RejectsBadArgumentsBeforeWritingNaming) {
  const int64_t T = 8, K = 16, G = 2;
  const Tensor x = to_device(ctx_, random_normal({T, K}, DType::F32, 61));
  const Tensor w96 = to_device(ctx_, random_normal({G, 96, K}, DType::F32, 62));
  const Tensor h96 = filled(ctx_, {T, 96}, DType::F32, kSentinel);
  const Tensor z48 = filled(ctx_, {T, 48}, DType::F32, kSentinel);
  const Splits splits = Splits::host({3, 5});
  // 2F = 96 is no multiple of 64: the interleaved layout's rule, named on h.
  auto e = caught([&] {
    grouped_gemm_swiglu(ctx_, x, w96, splits, Tensor(), Tensor(), GluLayout::Interleaved32, h96,
                        z48);
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'h'"));
  EXPECT_THAT(e->what(), HasSubstr("2F = 96"));
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, h96), 0, T, 96, DType::F32));
  // z of the wrong width.
  const Tensor z40 = filled(ctx_, {T, 40}, DType::F32, kSentinel);
  e = caught([&] {
    grouped_gemm_swiglu(ctx_, x, w96, splits, Tensor(), Tensor(), GluLayout::Halves, h96, z40);
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'z'"));
  // z overlapping h.
  const Tensor z_over = Tensor::wrap(h96.data(), {T, 48}, DType::F32, ctx_.device());
  e = caught([&] {
    grouped_gemm_swiglu(ctx_, x, w96, splits, Tensor(), Tensor(), GluLayout::Halves, h96, z_over);
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("overlapping input 'h'"));
  // Weight rows (2F) that do not match h's width.
  const Tensor w64 = to_device(ctx_, random_normal({G, 64, K}, DType::F32, 63));
  e = caught([&] {
    grouped_gemm_swiglu(ctx_, x, w64, splits, Tensor(), Tensor(), GluLayout::Halves, h96, z48);
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'h'"));
  // Probs of the wrong length; splits with S > T.
  const Tensor p7 = to_device(ctx_, random_normal({7}, DType::F32, 64));
  e = caught([&] {
    grouped_gemm_swiglu(ctx_, x, w96, splits, Tensor(), p7, GluLayout::Halves, h96, z48);
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'probs'"));
  e = caught([&] {
    grouped_gemm_swiglu(ctx_, x, w96, Splits::host({3, 6}), Tensor(), Tensor(), GluLayout::Halves,
                        h96, z48);
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'splits'"));
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, h96), 0, T, 96, DType::F32));
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, z48), 0, T, 48, DType::F32));
}

INSTANTIATE_TEST_SUITE_P(Devices, GemmSwiGluPrimitive, ::testing::ValuesIn(device_names()),
                         test::device_name);

// ============================================================== fc2 dgrad + SwiGLU backward primitive
using GemmDSwiGluPrimitive = OnDevice;

// grouped_gemm_dswiglu equals grouped_gemm_group_m (Plain) followed by swiglu_backward: dh bit
// for bit, dprobs (written and accumulated) bit for bit on the CPU and to fp32 summation order on
// CUDA (the sm90 epilogue's order; test_sm90 checks that path with sm90 forced), tails untouched;
// dh and dprobs also against the fp64 reference from h and the two-call dz.
TEST_P(GemmDSwiGluPrimitive, EqualsGemmThenSwiGluBackward) {
  for (DType dt : kDtypes) {
    for (GluLayout layout : kLayouts) {
      for (int dp_mode : {0, 1, 2}) {  // no dprobs, dprobs written, dprobs accumulated
        SCOPED_TRACE(str(label(dt, layout), " dprobs mode ", dp_mode));
        const MlpData d = make_mlp_data({.G = 3, .H = 64, .F = 64, .T = 300,
                                         .counts = {0, 170, 120}, .dtype = dt,
                                         .layout = layout, .seed = 6});
        const int64_t T = d.c.T, F = d.c.F, S = sum(d.c.counts);
        const Tensor dy = to_device(ctx_, d.dy), w = to_device(ctx_, d.w2);
        const Tensor h_h = random_normal({T, 2 * F}, dt, 71, 2.0);
        const Tensor h = to_device(ctx_, h_h), probs = to_device(ctx_, d.probs);
        const Tensor dp_start = random_normal({T}, DType::F32, 72);
        const Splits splits = Splits::host(d.c.counts);
        const Tensor dz = filled(ctx_, {T, F}, dt, kSentinel);
        Tensor dh[2], dp[2];  // [fused?]
        for (int fused = 0; fused < 2; ++fused) {
          dh[fused] = filled(ctx_, {T, 2 * F}, dt, kSentinel);
          dp[fused] = dp_mode == 0 ? Tensor() : to_device(ctx_, dp_start);
          if (fused) {
            grouped_gemm_dswiglu(ctx_, dy, w, splits, h, probs, layout, dh[1], dp[1], dp_mode == 2);
          } else {
            grouped_gemm_group_m(ctx_, dy, w, BOp::Plain, splits, dz);
            swiglu_backward(ctx_, h, probs, dz, splits, layout, dh[0], dp[0], dp_mode == 2);
          }
        }
        EXPECT_TRUE(bit_identical(bytes_of(ctx_, dh[1]), bytes_of(ctx_, dh[0]), dt)) << "dh";
        EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, dh[1]), S, T, 2 * F, dt));
        const SwigluGradExpected want = swiglu_backward_ref(
            to_doubles(host(), h_h), to_doubles(host(), d.probs), to_doubles(ctx_, dz), S, F,
            layout, dt, dp_mode == 2 ? to_doubles(host(), dp_start) : std::vector<double>{});
        EXPECT_TRUE(matches_expected("dh", to_doubles(ctx_, dh[1]), want.dh));
        if (dp_mode == 0) continue;
        const std::vector<double> got = to_doubles(ctx_, dp[1]), two = to_doubles(ctx_, dp[0]);
        const std::vector<double> start = to_doubles(host(), dp_start);
        EXPECT_TRUE(matches_expected("dprobs", got, want.dprobs));
        for (int64_t t = 0; t < T; ++t) {
          const auto i = static_cast<size_t>(t);
          if (t >= S) {
            EXPECT_EQ(got[i], start[i]) << "dprobs tail row " << t;
          } else if (ctx_.device().is_cpu()) {
            EXPECT_EQ(got[i], two[i]) << "dprobs row " << t;
          } else {
            EXPECT_LE(std::abs(got[i] - two[i]), 1e-5 * (1.0 + std::abs(two[i])))
                << "dprobs row " << t;
          }
        }
      }
    }
  }
}

TEST_P(GemmDSwiGluPrimitive, RejectsBadArgumentsBeforeWritingNaming) {
  const int64_t T = 8, H = 16, G = 2, F = 32;
  const Tensor dy = to_device(ctx_, random_normal({T, H}, DType::F32, 81));
  const Tensor w = to_device(ctx_, random_normal({G, H, F}, DType::F32, 82));
  const Tensor h = to_device(ctx_, random_normal({T, 2 * F}, DType::F32, 83));
  const Tensor probs = to_device(ctx_, random_normal({T}, DType::F32, 84));
  const Tensor dh = filled(ctx_, {T, 2 * F}, DType::F32, kSentinel);
  const Tensor dp = filled(ctx_, {T}, DType::F32, kSentinel);
  const Splits splits = Splits::host({3, 5});
  // h of the wrong width for fc2's F.
  const Tensor h48 = to_device(ctx_, random_normal({T, 48}, DType::F32, 85));
  auto e = caught([&] {
    grouped_gemm_dswiglu(ctx_, dy, w, splits, h48, probs, GluLayout::Halves, dh, dp, false);
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'h'"));
  // dprobs without probs.
  e = caught([&] {
    grouped_gemm_dswiglu(ctx_, dy, w, splits, h, Tensor(), GluLayout::Halves, dh, dp, false);
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'dprobs'"));
  // dh overlapping h; dh of the wrong shape.
  const Tensor dh_over = Tensor::wrap(h.data(), {T, 2 * F}, DType::F32, ctx_.device());
  e = caught([&] {
    grouped_gemm_dswiglu(ctx_, dy, w, splits, h, probs, GluLayout::Halves, dh_over, dp, false);
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("overlapping input 'h'"));
  const Tensor dh_small = Tensor::wrap(dh.data(), {T / 2, 2 * F}, DType::F32, ctx_.device());
  e = caught([&] {
    grouped_gemm_dswiglu(ctx_, dy, w, splits, h, probs, GluLayout::Halves, dh_small, dp, false);
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'dh'"));
  // Splits with S > T.
  e = caught([&] {
    grouped_gemm_dswiglu(ctx_, dy, w, Splits::host({3, 6}), h, probs, GluLayout::Halves, dh, dp,
                         false);
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'splits'"));
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, dh), 0, T, 2 * F, DType::F32));
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, dp), 0, T, 1, DType::F32));
}

INSTANTIATE_TEST_SUITE_P(Devices, GemmDSwiGluPrimitive, ::testing::ValuesIn(device_names()),
                         test::device_name);

// ============================================================== grouped bias primitive
using GroupedBiasPrimitive = OnDevice;

TEST_P(GroupedBiasPrimitive, AddMatchesFp64ScaledOrPlainInPlaceOrNot) {
  const std::vector<int64_t> counts = {3, 0, 4, 2};
  const int64_t S = sum(counts), T = S + 3, N = 24, G = 4;
  const Splits splits = Splits::host(counts);
  const Tensor probs_h = make_mlp_data({.T = T}).probs;
  for (DType dt : kDtypes) {
    for (bool scaled : {false, true}) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(str(name(dt), scaled ? " scaled" : " plain", in_place ? " in place" : ""));
        const Tensor x_h = random_normal({T, N}, dt, 51), b_h = random_normal({G, N}, dt, 52);
        const Tensor x = to_device(ctx_, x_h), bias = to_device(ctx_, b_h);
        const Tensor out = in_place ? x : filled(ctx_, {T, N}, dt, kSentinel);
        const std::vector<uint8_t> tail_before = bytes_of(ctx_, out.rows(S, T));
        grouped_bias_add(ctx_, x, bias, scaled ? to_device(ctx_, probs_h) : Tensor(), splits, out);
        const std::vector<double> p = scaled ? to_doubles(host(), probs_h) : std::vector<double>{};
        EXPECT_TRUE(matches_expected(
            "out", to_doubles(ctx_, out),
            bias_add_ref(to_doubles(host(), x_h), to_doubles(host(), b_h), p, counts, N, dt)));
        EXPECT_TRUE(bit_identical(bytes_of(ctx_, out.rows(S, T)), tail_before, dt));
      }
    }
  }
}

TEST_P(GroupedBiasPrimitive, ScaledGradMatchesFp64WithZeroRowGroups) {
  const std::vector<int64_t> counts = {0, 5, 3, 0};
  const int64_t S = sum(counts), T = S + 2, N = 20, G = 4;
  const Splits splits = Splits::host(counts);
  const Tensor probs_h = make_mlp_data({.T = T}).probs;
  const Tensor start_h = random_normal({T}, DType::F32, 61);
  for (DType dt : kDtypes) {
    for (DType db_dt : {dt, DType::F32}) {
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(str(name(dt), " db ", name(db_dt), accumulate ? " accumulate" : ""));
        const Tensor dy_h = random_normal({T, N}, dt, 62), b_h = random_normal({G, N}, dt, 63);
        const Tensor db = filled(ctx_, {G, N}, db_dt, kSentinel);
        const Tensor dp =
            accumulate ? to_device(ctx_, start_h) : filled(ctx_, {T}, DType::F32, kSentinel);
        const std::vector<uint8_t> dp_tail = bytes_of(ctx_, dp.rows(S, T));
        grouped_scaled_bias_grad(ctx_, to_device(ctx_, dy_h), to_device(ctx_, probs_h),
                                 to_device(ctx_, b_h), splits, db, dp, accumulate);
        const ScaledBiasGradExpected want = scaled_bias_grad_ref(
            to_doubles(host(), dy_h), to_doubles(host(), probs_h), to_doubles(host(), b_h), counts,
            N, db_dt, accumulate ? to_doubles(host(), start_h) : std::vector<double>{});
        EXPECT_TRUE(matches_expected("db", to_doubles(ctx_, db), want.db));  // zero-row: exactly 0
        EXPECT_TRUE(matches_expected("dprobs", to_doubles(ctx_, dp), want.dprobs));
        EXPECT_TRUE(bit_identical(bytes_of(ctx_, dp.rows(S, T)), dp_tail, DType::F32));
      }
    }
  }
}

TEST_P(GroupedBiasPrimitive, RejectsBadArguments) {
  const Splits splits = Splits::host({2, 2});
  const Tensor x = to_device(ctx_, random_normal({4, 8}, DType::F32, 71));
  const Tensor bias = to_device(ctx_, random_normal({2, 8}, DType::F32, 72));
  const Tensor probs16 = to_device(ctx_, random_normal({4}, DType::F16, 73));
  auto e = caught([&] { grouped_bias_add(ctx_, x, bias, probs16, splits, x); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'probs'"));
  EXPECT_THAT(e->what(), HasSubstr("dtype f32"));
  const Tensor part = x.rows(1, 4);  // overlaps x without being x
  const Tensor out = Tensor::wrap(part.data(), {4, 8}, DType::F32, ctx_.device());
  e = caught([&] { grouped_bias_add(ctx_, x, bias, Tensor(), splits, out); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("overlapping input 'x'"));
  e = caught([&] {
    grouped_scaled_bias_grad(ctx_, x, to_device(ctx_, random_normal({4}, DType::F32, 74)), bias,
                             splits, Tensor(), Tensor(), false);
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("db or dprobs"));
}

INSTANTIATE_TEST_SUITE_P(Devices, GroupedBiasPrimitive, ::testing::ValuesIn(device_names()),
                         test::device_name);

// ============================================================== GroupedMLP
struct MlpRun {
  Tensor y, dx;
  GroupedMLP::Saved saved;
  GroupedMLP::Grads grads;
};

// Forward with a sentinel-filled output buffer, backward with a sentinel-filled grad_input.
MlpRun run_mlp(const Context& ctx, const GroupedMLP& mlp, const MlpData& d, const Splits& splits) {
  MlpRun r;
  const MlpCase& c = d.c;
  const Tensor x = to_device(ctx, d.x), probs = to_device(ctx, d.probs), dy = to_device(ctx, d.dy);
  const Tensor ybuf = filled(ctx, {c.T, c.N}, c.dtype, kSentinel);
  const Tensor dxbuf = filled(ctx, {c.T, c.H}, c.dtype, kSentinel);
  r.y = mlp.forward(x, probs, splits, {.output = ybuf}, &r.saved);
  EXPECT_EQ(r.y.data(), ybuf.data()) << "y does not alias the output buffer";
  r.grads = mlp.backward(r.saved, dy, {.grad_input = dxbuf});
  EXPECT_EQ(r.grads.input.data(), dxbuf.data()) << "dx does not alias the grad_input buffer";
  r.dx = r.grads.input;
  return r;
}

// Checks every result of a run against the stage-wise fp64 reference, and the tails.
void expect_matches_reference(const Context& ctx, const MlpData& d, const MlpRun& r,
                              const std::vector<double>& main_grad1 = {},
                              const std::vector<double>& main_grad2 = {}) {
  const MlpCase& c = d.c;
  const MlpProblem p = d.problem();
  const int64_t S = p.valid_rows();
  const std::vector<double> h = to_doubles(ctx, r.saved.h), z = to_doubles(ctx, r.saved.z);
  const MlpForwardExpected f = mlp_forward_ref(p, h, z);
  EXPECT_TRUE(matches_expected("h", h, f.h));
  EXPECT_TRUE(matches_expected("z", z, f.z));
  EXPECT_TRUE(matches_expected("y", to_doubles(ctx, r.y), f.y));
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx, r.y), S, c.T, c.N, c.dtype)) << "y tail";
  const MlpGradExpected g =
      mlp_backward_ref(p, h, z, to_doubles(host(), d.dy), main_grad1, main_grad2);
  EXPECT_TRUE(matches_expected("dx", to_doubles(ctx, r.dx), g.dx));
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx, r.dx), S, c.T, c.H, c.dtype)) << "dx tail";
  EXPECT_TRUE(matches_expected("dprobs", to_doubles(ctx, r.grads.probs), g.dprobs));
  EXPECT_TRUE(matches_expected("dW1", to_doubles(ctx, r.grads.fc1.weight), g.dw1));
  EXPECT_TRUE(matches_expected("dW2", to_doubles(ctx, r.grads.fc2.weight), g.dw2));
  ASSERT_EQ(r.grads.fc1.bias.defined(), c.b1);
  ASSERT_EQ(r.grads.fc2.bias.defined(), c.b2);
  if (c.b1) {
    EXPECT_TRUE(matches_expected("db1", to_doubles(ctx, r.grads.fc1.bias), g.db1));
  }
  if (c.b2) {
    EXPECT_TRUE(matches_expected("db2", to_doubles(ctx, r.grads.fc2.bias), g.db2));
  }
  if (c.dtype == DType::F32) {  // end to end, no intermediate stored by the op
    const std::vector<double> exact = mlp_forward_exact(p), got = to_doubles(ctx, r.y);
    for (size_t i = 0; i < exact.size(); ++i) {
      ASSERT_NEAR(got[i], exact[i], 1e-4 * (1.0 + std::abs(exact[i]))) << "y end to end at " << i;
    }
  }
}

using MlpParam = std::tuple<std::string, DType, GluLayout>;
class GroupedMLPTest : public ::testing::TestWithParam<MlpParam> {
 protected:
  void SetUp() override {
    std::string why;
    auto c = make_context(std::get<0>(GetParam()), &why);
    if (!c) GTEST_SKIP() << why;
    ctx_ = *c;
  }
  DType dtype() const { return std::get<1>(GetParam()); }
  GluLayout layout() const { return std::get<2>(GetParam()); }
  Context ctx_ = Context::cpu();
};

TEST_P(GroupedMLPTest, ForwardBackwardMatchFp64WithAndWithoutBiases) {
  for (const auto& [b1, b2] :
       {std::pair{true, true}, {false, false}, {true, false}, {false, true}}) {
    SCOPED_TRACE(str("b1 ", b1, " b2 ", b2));
    const Context pc = poisoned(ctx_);  // internal allocations start as NaN
    const MlpData d = make_mlp_data({.G = 4,
                                     .H = 24,
                                     .F = 64,
                                     .counts = {6, 0, 9, 4},
                                     .dtype = dtype(),
                                     .layout = layout(),
                                     .b1 = b1,
                                     .b2 = b2,
                                     .seed = 3});
    const MlpOps ops = make_mlp_ops(pc, d);
    const GroupedMLP mlp(ops.fc1, ops.act, ops.fc2);
    expect_matches_reference(pc, d, run_mlp(pc, mlp, d, Splits::host(d.c.counts)));
  }
}

TEST_P(GroupedMLPTest, FusedEqualsUnfusedSequentialBitForBit) {
  for (bool main_grad : {false, true}) {
    for (const auto& [b1, b2] : {std::pair{true, true}, {false, false}}) {
      SCOPED_TRACE(str("main_grad ", main_grad, " b1 ", b1, " b2 ", b2));
      const MlpData d = make_mlp_data({.G = 3,
                                       .H = 32,
                                       .F = 64,
                                       .counts = {7, 0, 12},
                                       .dtype = dtype(),
                                       .layout = layout(),
                                       .b1 = b1,
                                       .b2 = b2,
                                       .seed = 4});
      const MlpCase& c = d.c;
      const Tensor mg1_h = random_normal({c.G, 2 * c.F, c.H}, DType::F32, 81);
      const Tensor mg2_h = random_normal({c.G, c.N, c.F}, DType::F32, 82);
      struct Result {
        std::string what;
        DType dtype;
        std::vector<uint8_t> bytes;
      };
      std::vector<Result> results[2];
      for (int fused = 0; fused < 2; ++fused) {
        const MlpOps ops = make_mlp_ops(ctx_, d);
        if (main_grad) {
          ops.fc1->linear().set_main_grad(to_device(ctx_, mg1_h));
          ops.fc2->linear().set_main_grad(to_device(ctx_, mg2_h));
        }
        Sequential seq({ops.fc1, ops.act, ops.fc2}, {.fuse = fused == 1});
        ASSERT_EQ(seq.fused(), fused == 1);
        // The fused run writes into caller buffers, the unfused one allocates: also SPEC §3's
        // "bit-identical to the internally allocated result".
        OpArgs args;
        if (fused) {
          args[ops.fc2].output = filled(ctx_, {c.T, c.N}, c.dtype, kSentinel);
          args[0].grad_input = filled(ctx_, {c.T, c.H}, c.dtype, kSentinel);
        }
        const ExtraInputs in{.splits = Splits::host(c.counts), .probs = to_device(ctx_, d.probs)};
        auto [y, tape] = seq.forward(to_device(ctx_, d.x), in, args);
        const SequentialGrads g = seq.backward(tape, to_device(ctx_, d.dy));
        const int64_t S = sum(c.counts);
        const DType wdt = main_grad ? DType::F32 : c.dtype;
        auto& r = results[fused];
        r.push_back({"y", c.dtype, bytes_of(ctx_, y.rows(0, S))});
        r.push_back({"dx", c.dtype, bytes_of(ctx_, g.input.rows(0, S))});
        r.push_back({"dprobs", DType::F32, bytes_of(ctx_, g.probs.rows(0, S))});
        r.push_back({"dW1", wdt, bytes_of(ctx_, g.params[0].weight)});
        r.push_back({"dW2", wdt, bytes_of(ctx_, g.params[2].weight)});
        if (b1) r.push_back({"db1", c.dtype, bytes_of(ctx_, g.params[0].bias)});
        if (b2) r.push_back({"db2", c.dtype, bytes_of(ctx_, g.params[2].bias)});
        if (main_grad) {
          EXPECT_EQ(g.params[0].weight.data(), ops.fc1->linear().main_grad().data());
          EXPECT_EQ(g.params[2].weight.data(), ops.fc2->linear().main_grad().data());
        }
      }
      ASSERT_EQ(results[0].size(), results[1].size());
      // On the GPU with the Interleaved32 layout and a 16-bit dtype, the fused backward may sum
      // dprobs in the sm90 dgrad epilogue (per 128-column tile, then the tiles): the same fp32
      // terms in another order (grouped_gemm_dswiglu), so dprobs is compared to a few fp32 ulps
      // of its terms' scale there; everything else stays bit for bit.
      const bool dp_order_may_differ = !ctx_.device().is_cpu() &&
                                       layout() == GluLayout::Interleaved32 &&
                                       dtype() != DType::F32;
      for (size_t i = 0; i < results[0].size(); ++i) {
        if (dp_order_may_differ && results[0][i].what == "dprobs") {
          const size_t n = results[0][i].bytes.size() / 4;
          for (size_t t = 0; t < n; ++t) {
            const double a = decode(results[1][i].bytes, t, DType::F32);
            const double b = decode(results[0][i].bytes, t, DType::F32);
            EXPECT_LE(std::abs(a - b), 1e-5 * (1.0 + std::abs(b))) << "dprobs row " << t;
          }
          continue;
        }
        EXPECT_TRUE(bit_identical(results[1][i].bytes, results[0][i].bytes, results[0][i].dtype))
            << results[0][i].what;
      }
    }
  }
}

std::string mlp_name(const ::testing::TestParamInfo<MlpParam>& info) {
  return str(std::get<0>(info.param), "_", name(std::get<1>(info.param)), "_",
             name(std::get<2>(info.param)));
}
INSTANTIATE_TEST_SUITE_P(DevicesDtypesLayouts, GroupedMLPTest,
                         ::testing::Combine(::testing::ValuesIn(device_names()),
                                            ::testing::ValuesIn(kDtypes),
                                            ::testing::ValuesIn(kLayouts)),
                         mlp_name);

// -------------------------------------------------------------- device-only cases
using GroupedMLPDevice = OnDevice;

double loss_of(const Context& ctx, const Tensor& y, const std::vector<double>& dy, int64_t S,
               int64_t N) {
  const std::vector<double> v = to_doubles(ctx, y);
  double l = 0.0;
  for (int64_t i = 0; i < S * N; ++i) l += v[static_cast<size_t>(i)] * dy[static_cast<size_t>(i)];
  return l;
}

// Every gradient of the MLP — dx, dprobs, dW1, db1, dW2, db2 — against central finite differences
// of L = Σ_{t<S} dy_t · y_t evaluated by the op itself (f32). Tail rows of x and probs have zero
// gradient: the finite differences check that they influence nothing.
TEST_P(GroupedMLPDevice, EveryGradientMatchesFiniteDifferences) {
  for (GluLayout layout : kLayouts) {
    SCOPED_TRACE(name(layout));
    const MlpData d = make_mlp_data({.G = 3,
                                     .H = 8,
                                     .F = layout == GluLayout::Halves ? 8 : 32,
                                     .T = 10,
                                     .counts = {3, 0, 4},
                                     .layout = layout,
                                     .seed = 5});
    const MlpCase& c = d.c;
    const int64_t S = sum(c.counts);
    const MlpOps ops = make_mlp_ops(ctx_, d);
    const GroupedMLP mlp(ops.fc1, ops.act, ops.fc2);
    const Splits splits = Splits::host(c.counts);
    Tensor x = to_device(ctx_, d.x), probs = to_device(ctx_, d.probs);
    const std::vector<double> dy = to_doubles(host(), d.dy);
    GroupedMLP::Saved saved;
    mlp.forward(x, probs, splits, {}, &saved);
    const GroupedMLP::Grads g = mlp.backward(saved, to_device(ctx_, d.dy));
    auto valid_rows_only = [&](const Tensor& t, int64_t cols) {
      std::vector<double> v = to_doubles(ctx_, t);
      std::fill(v.begin() + S * cols, v.end(), 0.0);
      return v;
    };
    auto host_copy = [&](const Tensor& t) { return to_host(ctx_, t); };
    std::vector<FdSlot> slots = {
        {"x", x, host_copy(x), valid_rows_only(g.input, c.H)},
        {"probs", probs, host_copy(probs), valid_rows_only(g.probs, 1)},
        {"W1", ops.fc1->linear().weight(), host_copy(ops.fc1->linear().weight()),
         to_doubles(ctx_, g.fc1.weight)},
        {"b1", ops.fc1->bias(), host_copy(ops.fc1->bias()), to_doubles(ctx_, g.fc1.bias)},
        {"W2", ops.fc2->linear().weight(), host_copy(ops.fc2->linear().weight()),
         to_doubles(ctx_, g.fc2.weight)},
        {"b2", ops.fc2->bias(), host_copy(ops.fc2->bias()), to_doubles(ctx_, g.fc2.bias)},
    };
    EXPECT_TRUE(matches_finite_differences(
        ctx_, slots, [&] { return loss_of(ctx_, mlp.forward(x, probs, splits), dy, S, c.N); }));
  }
}

// SPEC §3 through the fused MLP: y and dx are written straight into the caller buffers — no
// temporary of their size is allocated (shapes chosen so y and dx are the largest tensors; the
// weight grads go to main_grad) — and tail rows keep the sentinel.
TEST_P(GroupedMLPDevice, CallerBuffersAreWrittenInPlaceWithoutATemporary) {
  const MlpData d =
      make_mlp_data({.G = 3, .H = 64, .F = 8, .counts = {20, 0, 25}, .dtype = DType::BF16});
  const MlpCase& c = d.c;
  const Context pc = poisoned(ctx_);
  const MlpOps ops = make_mlp_ops(pc, d);
  ops.fc1->linear().set_main_grad(filled(pc, {c.G, 2 * c.F, c.H}, DType::F32, 0.0));
  ops.fc2->linear().set_main_grad(filled(pc, {c.G, c.N, c.F}, DType::F32, 0.0));
  const GroupedMLP mlp(ops.fc1, ops.act, ops.fc2);
  const Tensor x = to_device(pc, d.x), probs = to_device(pc, d.probs), dy = to_device(pc, d.dy);
  const Tensor ybuf = filled(pc, {c.T, c.N}, c.dtype, kSentinel);
  const Tensor dxbuf = filled(pc, {c.T, c.H}, c.dtype, kSentinel);
  const auto y_bytes = static_cast<int64_t>(ybuf.nbytes()),
             dx_bytes = static_cast<int64_t>(dxbuf.nbytes());
  const int64_t S = sum(c.counts);

  // The same call with internal allocation and with the caller buffer: the allocated bytes must
  // differ by exactly the output's size (a temporary + copy would allocate it in both calls).
  // Backends may use workspaces, so the difference — not the largest allocation — is the proof.
  const Splits splits = Splits::host(c.counts);
  pc.allocator().reset_stats();
  GroupedMLP::Saved internal_saved;
  (void)mlp.forward(x, probs, splits, {}, &internal_saved);
  const int64_t fwd_internal = pc.allocator().stats().bytes;
  pc.allocator().reset_stats();
  GroupedMLP::Saved saved;
  const Tensor y = mlp.forward(x, probs, splits, {.output = ybuf}, &saved);
  const int64_t fwd_buffered = pc.allocator().stats().bytes;
  EXPECT_EQ(y.data(), ybuf.data());
  EXPECT_EQ(y.shape(), ybuf.shape());
  EXPECT_EQ(fwd_internal - fwd_buffered, y_bytes) << "forward allocated a y-sized temporary";
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(pc, ybuf), S, c.T, c.N, c.dtype));

  pc.allocator().reset_stats();
  (void)mlp.backward(saved, dy, {.retain_saved = true});
  const int64_t bwd_internal = pc.allocator().stats().bytes;
  pc.allocator().reset_stats();
  const GroupedMLP::Grads g = mlp.backward(saved, dy, {.grad_input = dxbuf});
  const int64_t bwd_buffered = pc.allocator().stats().bytes;
  EXPECT_EQ(g.input.data(), dxbuf.data());
  EXPECT_EQ(g.input.shape(), dxbuf.shape());
  EXPECT_EQ(bwd_internal - bwd_buffered, dx_bytes) << "backward allocated a dx-sized temporary";
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(pc, dxbuf), S, c.T, c.H, c.dtype));
}

TEST_P(GroupedMLPDevice, MainGradAccumulatesOnFc1AndFc2) {
  for (DType dt : kDtypes) {
    SCOPED_TRACE(name(dt));
    const MlpData d =
        make_mlp_data({.G = 3, .H = 16, .F = 32, .counts = {5, 0, 6}, .dtype = dt, .seed = 6});
    const MlpCase& c = d.c;
    const MlpOps ops = make_mlp_ops(ctx_, d);
    const Tensor mg1_h = random_normal({c.G, 2 * c.F, c.H}, DType::F32, 91);
    const Tensor mg2_h = random_normal({c.G, c.N, c.F}, DType::F32, 92);
    ops.fc1->linear().set_main_grad(to_device(ctx_, mg1_h));
    ops.fc2->linear().set_main_grad(to_device(ctx_, mg2_h));
    const GroupedMLP mlp(ops.fc1, ops.act, ops.fc2);
    const MlpRun r = run_mlp(ctx_, mlp, d, Splits::host(c.counts));
    EXPECT_EQ(r.grads.fc1.weight.data(), ops.fc1->linear().main_grad().data());
    EXPECT_EQ(r.grads.fc2.weight.data(), ops.fc2->linear().main_grad().data());
    // Zero-row group 1: main_grad unchanged bit for bit (the reference's tolerance there is 0).
    expect_matches_reference(ctx_, d, r, to_doubles(host(), mg1_h), to_doubles(host(), mg2_h));
  }
}

TEST_P(GroupedMLPDevice, GradientsNobodyNeedsAreNotComputed) {
  const MlpData d = make_mlp_data({.seed = 7});
  const MlpCase& c = d.c;
  const MlpOps ops = make_mlp_ops(ctx_, d);
  ops.fc1->linear().set_weight_requires_grad(false);
  ops.fc2->linear().set_weight_requires_grad(false);
  const GroupedMLP mlp(ops.fc1, ops.act, ops.fc2);
  const Splits splits = Splits::host(c.counts);
  GroupedMLP::Saved saved;
  mlp.forward(to_device(ctx_, d.x), to_device(ctx_, d.probs), splits,
              {.input_requires_grad = false, .probs_requires_grad = false}, &saved);
  const GroupedMLP::Grads g = mlp.backward(saved, to_device(ctx_, d.dy), {.retain_saved = true});
  EXPECT_FALSE(g.input.defined());
  EXPECT_FALSE(g.probs.defined());
  EXPECT_FALSE(g.fc1.weight.defined());
  EXPECT_FALSE(g.fc1.bias.defined());
  EXPECT_FALSE(g.fc2.weight.defined());
  EXPECT_FALSE(g.fc2.bias.defined());
  const Tensor dxbuf = filled(ctx_, {c.T, c.H}, c.dtype, kSentinel);
  auto e = caught([&] { mlp.backward(saved, to_device(ctx_, d.dy), {.grad_input = dxbuf}); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'grad_input'"));
  EXPECT_THAT(e->what(), HasSubstr("does not require grad"));
}

// SPEC §5: frozen weights of fc1 or fc2 alone are honoured — the frozen layer gets no weight
// gradient and its main_grad keeps its bits; everything else equals the run with both layers
// training bit for bit (dx, dprobs rows [0, S), the other main_grad). Likewise probs that need no
// grad: no dprobs, the rest unchanged.
TEST_P(GroupedMLPDevice, FreezingOneLayerOrTheProbsChangesNothingElse) {
  const MlpData d = make_mlp_data({.dtype = DType::BF16, .seed = 17});
  const MlpCase& c = d.c;
  const Tensor mg1_h = random_normal({c.G, 2 * c.F, c.H}, DType::F32, 31);
  const Tensor mg2_h = random_normal({c.G, c.N, c.F}, DType::F32, 32);
  const Splits splits = Splits::host(c.counts);
  const int64_t S = sum_of(c.counts);
  struct Run {
    GroupedMLP::Grads g;
    std::vector<uint8_t> mg1, mg2;
  };
  auto run = [&](bool fc1_trains, bool fc2_trains, bool probs_grad) {
    const MlpOps ops = make_mlp_ops(ctx_, d);
    const Tensor mg1 = to_device(ctx_, mg1_h), mg2 = to_device(ctx_, mg2_h);
    ops.fc1->linear().set_main_grad(mg1);
    ops.fc2->linear().set_main_grad(mg2);
    ops.fc1->linear().set_weight_requires_grad(fc1_trains);
    ops.fc2->linear().set_weight_requires_grad(fc2_trains);
    const GroupedMLP mlp(ops.fc1, ops.act, ops.fc2);
    GroupedMLP::Saved saved;
    mlp.forward(to_device(ctx_, d.x), to_device(ctx_, d.probs), splits,
                {.probs_requires_grad = probs_grad}, &saved);
    Run r;
    r.g = mlp.backward(saved, to_device(ctx_, d.dy));
    r.mg1 = bytes_of(ctx_, mg1);
    r.mg2 = bytes_of(ctx_, mg2);
    return r;
  };
  const Run all = run(true, true, true);
  const std::vector<uint8_t> mg1_start = bytes_of(host(), mg1_h), mg2_start = bytes_of(host(), mg2_h);
  auto same = [&](const Tensor& got, const Tensor& want, int64_t rows) {
    return bit_identical(bytes_of(ctx_, got.rows(0, rows)), bytes_of(ctx_, want.rows(0, rows)),
                         got.dtype());
  };
  struct Case {
    const char* what;
    bool fc1_trains, fc2_trains, probs_grad;
  };
  for (const Case& k : {Case{"fc1 frozen", false, true, true}, Case{"fc2 frozen", true, false, true},
                        Case{"probs need no grad", true, true, false}}) {
    SCOPED_TRACE(k.what);
    const Run r = run(k.fc1_trains, k.fc2_trains, k.probs_grad);
    EXPECT_EQ(r.g.fc1.weight.defined(), k.fc1_trains);
    EXPECT_EQ(r.g.fc2.weight.defined(), k.fc2_trains);
    EXPECT_TRUE(bit_identical(r.mg1, k.fc1_trains ? all.mg1 : mg1_start, DType::F32)) << "fc1's";
    EXPECT_TRUE(bit_identical(r.mg2, k.fc2_trains ? all.mg2 : mg2_start, DType::F32)) << "fc2's";
    EXPECT_TRUE(same(r.g.input, all.g.input, S)) << "dx";
    ASSERT_EQ(r.g.probs.defined(), k.probs_grad);
    if (k.probs_grad) {
      EXPECT_TRUE(same(r.g.probs, all.g.probs, S)) << "dprobs";
    }
  }
}

// GroupedMLP(config, ctx) (SPEC §5) builds the same three ops as fusing existing ones: its
// configuration shows in them, and with the same parameters it gives the same bits (y, dx, dprobs,
// every parameter gradient) in both GLU layouts, biases on and off.
TEST_P(GroupedMLPDevice, ConstructedFromAConfigEqualsTheFusedOps) {
  for (GluLayout layout : {GluLayout::Halves, GluLayout::Interleaved32}) {
    for (bool biases : {false, true}) {
      SCOPED_TRACE(str(layout == GluLayout::Halves ? "halves" : "interleaved32",
                       biases ? ", biases" : ", no biases"));
      const MlpData d = make_mlp_data({.G = 3, .H = 16, .F = 32, .dtype = DType::BF16,
                                       .layout = layout, .b1 = biases, .b2 = biases, .seed = 23});
      const MlpCase& c = d.c;
      const GroupedMLP built({.groups = c.G, .hidden = c.H, .ffn = c.F, .dtype = c.dtype,
                              .fc1_bias = biases, .fc2_bias = biases, .layout = layout},
                             ctx_);
      ASSERT_EQ(built.groups(), c.G);
      ASSERT_EQ(built.in_features(), c.H);
      ASSERT_EQ(built.ffn(), c.F);
      ASSERT_EQ(built.out_features(), c.H);
      ASSERT_EQ(built.layout(), layout);
      ASSERT_EQ(built.fc1()->bias().defined(), biases);
      ASSERT_EQ(built.fc2()->bias().defined(), biases);
      EXPECT_EQ(built.fc2()->scale_bias(), biases);
      copy(ctx_, d.w1, built.fc1()->linear().weight());
      copy(ctx_, d.w2, built.fc2()->linear().weight());
      if (biases) {
        copy(ctx_, d.b1, built.fc1()->bias());
        copy(ctx_, d.b2, built.fc2()->bias());
      }
      const MlpOps ops = make_mlp_ops(ctx_, d);
      const GroupedMLP fused(ops.fc1, ops.act, ops.fc2);
      const Splits splits = Splits::host(c.counts);
      const MlpRun a = run_mlp(ctx_, built, d, splits), b = run_mlp(ctx_, fused, d, splits);
      const int64_t S = sum_of(c.counts);
      auto same = [&](const Tensor& x, const Tensor& y, int64_t rows) {
        return bit_identical(bytes_of(ctx_, rows < 0 ? x : x.rows(0, rows)),
                             bytes_of(ctx_, rows < 0 ? y : y.rows(0, rows)), x.dtype());
      };
      EXPECT_TRUE(same(a.y, b.y, S)) << "y";
      EXPECT_TRUE(same(a.dx, b.dx, S)) << "dx";
      EXPECT_TRUE(same(a.grads.probs, b.grads.probs, S)) << "dprobs";
      EXPECT_TRUE(same(a.grads.fc1.weight, b.grads.fc1.weight, -1)) << "dW1";
      EXPECT_TRUE(same(a.grads.fc2.weight, b.grads.fc2.weight, -1)) << "dW2";
      if (biases) {
        EXPECT_TRUE(same(a.grads.fc1.bias, b.grads.fc1.bias, -1)) << "db1";
        EXPECT_TRUE(same(a.grads.fc2.bias, b.grads.fc2.bias, -1)) << "db2";
      }
    }
  }
}

// grad_probs (SPEC §1, §5): dp is added to the caller's buffer on rows [0, S), which is returned
// as the probs gradient (aliased); rows [S, T) keep their sentinel. The sum equals start + the dp
// of a run without the buffer to fp32 rounding (the same additions, the start first).
TEST_P(GroupedMLPDevice, GradProbsBufferAccumulatesOnValidRowsOnly) {
  const MlpData d = make_mlp_data({.dtype = DType::BF16, .seed = 19});
  const MlpCase& c = d.c;
  const int64_t S = sum_of(c.counts);
  const MlpOps ops = make_mlp_ops(ctx_, d);
  const GroupedMLP mlp(ops.fc1, ops.act, ops.fc2);
  const Splits splits = Splits::host(c.counts);
  GroupedMLP::Saved saved;
  mlp.forward(to_device(ctx_, d.x), to_device(ctx_, d.probs), splits, {}, &saved);
  const Tensor dy = to_device(ctx_, d.dy);
  const std::vector<double> plain =
      to_doubles(ctx_, mlp.backward(saved, dy, {.retain_saved = true}).probs);

  const Tensor dp_h = random_normal({c.T}, DType::F32, 41);  // start values on rows [0, S)
  const std::vector<double> start = to_doubles(host(), dp_h);
  const Tensor dp = to_device(ctx_, dp_h);
  copy(ctx_, host_filled({c.T - S}, DType::F32, kSentinel), dp.rows(S, c.T));
  const GroupedMLP::Grads g = mlp.backward(saved, dy, {.grad_probs = dp});
  EXPECT_EQ(g.probs.data(), dp.data()) << "the probs gradient is not the caller's buffer";
  const std::vector<double> got = to_doubles(ctx_, dp);
  for (int64_t t = 0; t < S; ++t) {
    const double want = start[static_cast<size_t>(t)] + plain[static_cast<size_t>(t)];
    ASSERT_NEAR(got[static_cast<size_t>(t)], want, 1e-6 * (1 + std::abs(want))) << "row " << t;
  }
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, dp), S, c.T, 1, DType::F32));
}

// S = 0: nothing is written into the buffers, weight and bias grads are exactly 0, main_grad
// is unchanged.
TEST_P(GroupedMLPDevice, AllGroupsEmptyWritesNoRow) {
  const MlpData d =
      make_mlp_data({.G = 3, .H = 16, .F = 32, .T = 6, .counts = {0, 0, 0}, .dtype = DType::BF16});
  const MlpCase& c = d.c;
  const MlpOps ops = make_mlp_ops(ctx_, d);
  const Tensor mg2_h = random_normal({c.G, c.N, c.F}, DType::F32, 93);
  ops.fc2->linear().set_main_grad(to_device(ctx_, mg2_h));
  const GroupedMLP mlp(ops.fc1, ops.act, ops.fc2);
  const MlpRun r = run_mlp(ctx_, mlp, d, Splits::host(c.counts));
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, r.y), 0, c.T, c.N, c.dtype));
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, r.dx), 0, c.T, c.H, c.dtype));
  for (double v : to_doubles(ctx_, r.grads.fc1.weight)) ASSERT_EQ(v, 0.0);
  for (double v : to_doubles(ctx_, r.grads.fc1.bias)) ASSERT_EQ(v, 0.0);
  for (double v : to_doubles(ctx_, r.grads.fc2.bias)) ASSERT_EQ(v, 0.0);
  EXPECT_TRUE(
      bit_identical(bytes_of(ctx_, r.grads.fc2.weight), bytes_of(host(), mg2_h), DType::F32));
}

TEST_P(GroupedMLPDevice, DeviceSplitsGiveTheSameBitsAsHostSplits) {
  const MlpData d =
      make_mlp_data({.G = 4, .counts = {3, 0, 7, 2}, .dtype = DType::BF16, .seed = 8});
  const MlpOps ops = make_mlp_ops(ctx_, d);
  const GroupedMLP mlp(ops.fc1, ops.act, ops.fc2);
  const MlpRun a = run_mlp(ctx_, mlp, d, Splits::host(d.c.counts));
  for (DType it : {DType::I32, DType::I64}) {
    const MlpRun b =
        run_mlp(ctx_, mlp, d, Splits::device(to_device(ctx_, counts_tensor(d.c.counts, it))));
    EXPECT_TRUE(bit_identical(bytes_of(ctx_, b.y), bytes_of(ctx_, a.y), d.c.dtype));
    EXPECT_TRUE(bit_identical(bytes_of(ctx_, b.dx), bytes_of(ctx_, a.dx), d.c.dtype));
    const int64_t S = sum(d.c.counts);
    EXPECT_TRUE(bit_identical(bytes_of(ctx_, b.grads.probs.rows(0, S)),
                              bytes_of(ctx_, a.grads.probs.rows(0, S)), DType::F32));
    EXPECT_TRUE(bit_identical(bytes_of(ctx_, b.grads.fc1.weight),
                              bytes_of(ctx_, a.grads.fc1.weight), d.c.dtype));
    EXPECT_TRUE(bit_identical(bytes_of(ctx_, b.grads.fc2.bias), bytes_of(ctx_, a.grads.fc2.bias),
                              d.c.dtype));
  }
}

// Random shapes, splits (with zero-row groups and tails), dtypes, layouts and biases: the fp64
// reference and fused == unfused on each.
TEST_P(GroupedMLPDevice, FuzzedShapesAndSplits) {
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    std::mt19937_64 rng(seed * 7919);
    auto pick = [&](int64_t lo, int64_t hi) {
      return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
    };
    MlpCase c;
    c.G = pick(1, 5);
    c.H = pick(1, 40);
    c.N = pick(0, 1) ? c.H : pick(1, 24);  // fc2 out_features may differ from H
    c.layout = pick(0, 1) ? GluLayout::Interleaved32 : GluLayout::Halves;
    c.F = c.layout == GluLayout::Halves ? pick(1, 40) : 32 * pick(1, 2);
    c.dtype = kDtypes[pick(0, 2)];
    c.b1 = pick(0, 1);
    c.b2 = pick(0, 1);
    c.seed = seed;
    c.counts.resize(static_cast<size_t>(c.G));
    for (int64_t& m : c.counts) m = pick(0, 2) == 0 ? 0 : pick(1, 12);
    c.T = sum(c.counts) + pick(0, 4);
    if (c.T == 0) c.T = 1;
    SCOPED_TRACE(str("seed ", seed, ": G ", c.G, " H ", c.H, " F ", c.F, " N ", c.N, " ",
                     label(c.dtype, c.layout), " b1 ", c.b1, " b2 ", c.b2, " T ", c.T));
    const MlpData d = make_mlp_data(c);
    const Context pc = poisoned(ctx_);
    const MlpOps ops = make_mlp_ops(pc, d);
    const GroupedMLP mlp(ops.fc1, ops.act, ops.fc2);
    const MlpRun r = run_mlp(pc, mlp, d, Splits::host(c.counts));
    expect_matches_reference(pc, d, r);
    // The same ops unfused.
    Sequential seq({ops.fc1, ops.act, ops.fc2}, {.fuse = false});
    auto [y, tape] = seq.forward(
        to_device(pc, d.x), {.splits = Splits::host(c.counts), .probs = to_device(pc, d.probs)});
    const SequentialGrads g = seq.backward(tape, to_device(pc, d.dy));
    const int64_t S = sum(c.counts);
    EXPECT_TRUE(bit_identical(bytes_of(pc, y.rows(0, S)), bytes_of(pc, r.y.rows(0, S)), c.dtype));
    EXPECT_TRUE(
        bit_identical(bytes_of(pc, g.input.rows(0, S)), bytes_of(pc, r.dx.rows(0, S)), c.dtype));
    EXPECT_TRUE(bit_identical(bytes_of(pc, g.probs.rows(0, S)),
                              bytes_of(pc, r.grads.probs.rows(0, S)), DType::F32));
    EXPECT_TRUE(
        bit_identical(bytes_of(pc, g.params[0].weight), bytes_of(pc, r.grads.fc1.weight), c.dtype));
    EXPECT_TRUE(
        bit_identical(bytes_of(pc, g.params[2].weight), bytes_of(pc, r.grads.fc2.weight), c.dtype));
  }
}

TEST_P(GroupedMLPDevice, RejectsBadCallsBeforeWritingAnything) {
  const MlpData d = make_mlp_data({.seed = 9});
  const MlpCase& c = d.c;
  const MlpOps ops = make_mlp_ops(ctx_, d);
  const GroupedMLP mlp(ops.fc1, ops.act, ops.fc2);
  const Splits splits = Splits::host(c.counts);
  const Tensor x = to_device(ctx_, d.x), probs = to_device(ctx_, d.probs);
  const Tensor ybuf = filled(ctx_, {c.T, c.N}, c.dtype, kSentinel);

  auto e = caught([&] {
    mlp.forward(x, probs, splits, {.output = filled(ctx_, {c.T - 1, c.N}, c.dtype, 0)});
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'output'"));
  EXPECT_THAT(e->what(), HasSubstr(str("expected shape [", c.T, ", ", c.N, "]")));

  e = caught([&] {
    mlp.forward(x, probs, splits,
                {.output = Tensor::wrap(x.data(), {c.T, c.N}, c.dtype, ctx_.device())});
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("overlapping input 'input'"));

  // A bad probs tensor: the valid output buffer stays untouched.
  e = caught([&] {
    mlp.forward(x, to_device(ctx_, random_normal({c.T}, DType::BF16, 1)), splits, {.output = ybuf});
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'probs'"));
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, ybuf), 0, c.T, c.N, c.dtype));

  GroupedMLP::Saved saved;
  mlp.forward(x, probs, splits, {}, &saved);
  e = caught([&] {
    mlp.backward(saved, to_device(ctx_, d.dy),
                 {.grad_input = filled(ctx_, {c.T, c.H}, DType::F16, 0)});
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'grad_input'"));
  EXPECT_THAT(e->what(), HasSubstr("expected dtype f32"));

  // A non-fusible triple cannot make a GroupedMLP; the message says why.
  auto fc2_plain_bias = std::make_shared<GroupedLinearOp>(
      GroupedLinearConfig{.groups = c.G, .in = c.F, .out = c.N, .dtype = c.dtype, .bias = true},
      ctx_);
  e = caught([&] { GroupedMLP(ops.fc1, ops.act, fc2_plain_bias); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("fc2 has a plain bias"));
}

// SPEC §3 for the fused MLP's caller buffers, output at forward and grad_input at backward:
// dtype, contiguity, and overlap with each input of the call and each tensor of the layers
// (weights, biases, main_grads), the buffer overlapping the input's last element in one arena.
// Each is an error naming the buffer and what was wrong; the arena keeps its bytes.
TEST_P(GroupedMLPDevice, CallerBuffersAreCheckedAgainstEveryInputAndParameter) {
  const MlpData d = make_mlp_data({.dtype = DType::BF16, .seed = 13});
  const MlpCase& c = d.c;
  const Tensor counts_h = counts_tensor(c.counts, DType::I64);
  const Tensor mg1_h = random_normal({c.G, 2 * c.F, c.H}, DType::F32, 24);
  const Tensor mg2_h = random_normal({c.G, c.N, c.F}, DType::F32, 25);
  struct Case {
    const char* buffer;  // "output" or "grad_input"
    const char* input;   // its name in the error
    Tensor host;         // the input's data, placed in the arena
  };
  const Case cases[] = {
      {"output", "input", d.x},        {"output", "probs", d.probs},
      {"output", "splits", counts_h},  {"output", "fc1 weight", d.w1},
      {"output", "fc2 bias", d.b2},    {"output", "fc1 main_grad", mg1_h},
      {"output", "fc2 main_grad", mg2_h},
      {"grad_input", "grad_output", d.dy}, {"grad_input", "probs", d.probs},
      {"grad_input", "fc2 weight", d.w2},  {"grad_input", "fc1 main_grad", mg1_h},
  };
  for (const Case& k : cases) {
    const std::string buf(k.buffer), in(k.input);
    SCOPED_TRACE(buf + " over " + in);
    const MlpOps ops = make_mlp_ops(ctx_, d);
    const Shape shape = buf == "output" ? Shape{c.T, c.N} : Shape{c.T, c.H};
    Overlapping o(ctx_, k.host, shape, c.dtype, /*overlap_elems=*/1);
    auto placed = [&](const char* name, const Tensor& host_value) {
      return in == name ? o.data : to_device(ctx_, host_value);
    };
    ops.fc1->linear().set_main_grad(placed("fc1 main_grad", mg1_h));
    ops.fc2->linear().set_main_grad(placed("fc2 main_grad", mg2_h));
    if (in == "fc1 weight") ops.fc1->linear().set_weight(o.data);
    if (in == "fc2 weight") ops.fc2->linear().set_weight(o.data);
    if (in == "fc2 bias") ops.fc2->set_bias(o.data);
    const GroupedMLP mlp(ops.fc1, ops.act, ops.fc2);
    const Tensor x = placed("input", d.x), probs = placed("probs", d.probs);
    const Splits splits = Splits::device(placed("splits", counts_h));
    std::optional<Error> e;
    o.snapshot(ctx_);
    if (buf == "output") {
      e = caught([&] { mlp.forward(x, probs, splits, {.output = o.buffer}); });
    } else {
      GroupedMLP::Saved saved;
      mlp.forward(x, probs, splits, {}, &saved);
      o.snapshot(ctx_);
      e = caught([&] { mlp.backward(saved, placed("grad_output", d.dy), {.grad_input = o.buffer}); });
    }
    ASSERT_TRUE(e);
    EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
    EXPECT_THAT(e->what(), HasSubstr("'" + buf + "'"));
    EXPECT_THAT(e->what(), HasSubstr("overlapping input '" + in + "'"));
    EXPECT_TRUE(o.unchanged(ctx_));
  }
  // dtype and contiguity (before overlap, SPEC §3's order; nothing else to overlap here)
  const MlpOps ops = make_mlp_ops(ctx_, d);
  const GroupedMLP mlp(ops.fc1, ops.act, ops.fc2);
  const Tensor x = to_device(ctx_, d.x), probs = to_device(ctx_, d.probs);
  const Splits splits = Splits::host(c.counts);
  const Tensor f16 = filled(ctx_, {c.T, c.N}, DType::F16, kSentinel);
  auto e = caught([&] { mlp.forward(x, probs, splits, {.output = f16}); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'output'"), HasSubstr("expected dtype bf16")));
  const Tensor wide = filled(ctx_, {c.T, 2 * c.N}, c.dtype, kSentinel);
  const Tensor strided = Tensor::wrap(wide.data(), {c.T, c.N}, {2 * c.N, 1}, c.dtype, ctx_.device());
  e = caught([&] { mlp.forward(x, probs, splits, {.output = strided}); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'output'"), HasSubstr("contiguous")));
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, wide), 0, c.T, 2 * c.N, c.dtype));
}

// SPEC §3 for the fused MLP's backward: each buffer it writes (grad_input, grad_probs, each
// main_grad) may overlap nothing it reads nor another buffer it writes. One case per pair the
// checks once missed (device counts, probs, biases, weights, the other main_grad), the buffer
// overlapping the input's last element in one arena (Overlapping). Each is an error naming both,
// and the arena and both main_grads are unchanged afterwards. Also: grad_probs for probs that do
// not require grad is an error (the buffer would never be written), as grad_input is.
TEST_P(GroupedMLPDevice, BackwardBuffersOverlappingWhatTheCallReadsOrWritesAreErrors) {
  const MlpData d = make_mlp_data({.dtype = DType::BF16, .seed = 9});
  const MlpCase& c = d.c;
  const Tensor counts_h = counts_tensor(c.counts, DType::I32);
  const Tensor mg1_h = random_normal({c.G, 2 * c.F, c.H}, DType::F32, 21);
  const Tensor mg2_h = random_normal({c.G, c.N, c.F}, DType::F32, 22);
  enum class In { Splits, Probs, W1, B2, Mg1, Mg2 };
  struct Case {
    const char* buffer;  // what the call writes
    const char* input;   // what it overlaps
    In in;
  };
  const Case cases[] = {
      {"grad_input", "splits", In::Splits},        {"grad_probs", "splits", In::Splits},
      {"grad_probs", "fc1 weight", In::W1},        {"grad_probs", "fc2 main_grad", In::Mg2},
      {"fc1 main_grad", "probs", In::Probs},       {"fc1 main_grad", "splits", In::Splits},
      {"fc2 main_grad", "fc2 bias", In::B2},       {"fc1 main_grad", "fc2 main_grad", In::Mg2},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(str(k.buffer, " over ", k.input));
    const MlpOps ops = make_mlp_ops(ctx_, d);
    const Tensor input_h = k.in == In::Splits ? counts_h
                           : k.in == In::Probs ? d.probs
                           : k.in == In::W1    ? d.w1
                           : k.in == In::B2    ? d.b2
                           : k.in == In::Mg1   ? mg1_h
                                               : mg2_h;
    const std::string buf(k.buffer);
    const Shape buf_shape = buf == "grad_input"      ? Shape{c.T, c.H}
                            : buf == "grad_probs"    ? Shape{c.T}
                            : buf == "fc1 main_grad" ? mg1_h.shape()
                                                     : mg2_h.shape();
    const DType buf_dtype = buf == "grad_input" ? c.dtype : DType::F32;
    Overlapping o(ctx_, input_h, buf_shape, buf_dtype, /*overlap_elems=*/1);
    Tensor mg1 = k.in == In::Mg1 ? o.data : to_device(ctx_, mg1_h);
    Tensor mg2 = k.in == In::Mg2 ? o.data : to_device(ctx_, mg2_h);
    if (buf == "fc1 main_grad") mg1 = o.buffer;
    if (buf == "fc2 main_grad") mg2 = o.buffer;
    ops.fc1->linear().set_main_grad(mg1);
    ops.fc2->linear().set_main_grad(mg2);
    if (k.in == In::W1) ops.fc1->linear().set_weight(o.data);
    if (k.in == In::B2) ops.fc2->set_bias(o.data);
    const GroupedMLP mlp(ops.fc1, ops.act, ops.fc2);
    const Tensor counts = k.in == In::Splits ? o.data : to_device(ctx_, counts_h);
    const Tensor probs = k.in == In::Probs ? o.data : to_device(ctx_, d.probs);
    GroupedMLP::Saved saved;
    mlp.forward(to_device(ctx_, d.x), probs, Splits::device(counts), {}, &saved);
    o.snapshot(ctx_);
    const std::vector<uint8_t> mg1_before = bytes_of(ctx_, mg1), mg2_before = bytes_of(ctx_, mg2);
    GroupedMLP::BackwardOptions options;
    if (buf == "grad_input") options.grad_input = o.buffer;
    if (buf == "grad_probs") options.grad_probs = o.buffer;
    const auto e = caught([&] { mlp.backward(saved, to_device(ctx_, d.dy), options); });
    ASSERT_TRUE(e);
    EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
    EXPECT_THAT(e->what(), HasSubstr(str("'", k.buffer, "'")));
    EXPECT_THAT(e->what(), HasSubstr(str("overlapping input '", k.input, "'")));
    EXPECT_TRUE(o.unchanged(ctx_));
    EXPECT_TRUE(bit_identical(bytes_of(ctx_, mg1), mg1_before, DType::F32)) << "fc1 main_grad";
    EXPECT_TRUE(bit_identical(bytes_of(ctx_, mg2), mg2_before, DType::F32)) << "fc2 main_grad";
  }

  // grad_probs when the probs do not require grad
  const MlpOps ops = make_mlp_ops(ctx_, d);
  const GroupedMLP mlp(ops.fc1, ops.act, ops.fc2);
  GroupedMLP::Saved saved;
  mlp.forward(to_device(ctx_, d.x), to_device(ctx_, d.probs), Splits::host(c.counts),
              {.probs_requires_grad = false}, &saved);
  const Tensor dp = filled(ctx_, {c.T}, DType::F32, kSentinel);
  const auto e = caught([&] { mlp.backward(saved, to_device(ctx_, d.dy), {.grad_probs = dp}); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'grad_probs': expected no buffer (the probs do not require grad)"));
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, dp), 0, c.T, 1, DType::F32));
}

INSTANTIATE_TEST_SUITE_P(Devices, GroupedMLPDevice, ::testing::ValuesIn(device_names()),
                         test::device_name);

}  // namespace
}  // namespace moekit::test
