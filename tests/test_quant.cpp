// test_quant — quantized recipes (SPEC §6): the formats' encodings from their definitions, the
// CPU reference quantize of every recipe against an independent reference written from SPEC §6b
// (bit for bit: codes and scales), the format edges (max, subnormals, zero, NaN, inf, all-zero
// blocks), zero-row groups, rows not a multiple of the block, fuzzed shapes, and the checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <map>
#include <random>
#include <tuple>

#include "backends/contract/quant_math.h"
#include "moekit/moekit.h"
#include "moekit/primitives/quantize.h"
#include "primitives/bind.h"
#include "support/cuda_graph.h"
#include "support/reference.h"
#include "support/test_util.h"

namespace moekit {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace moekit::test;

// ---------------------------------------------------------------- encodings by definition
TEST(QuantFormats, E4M3EncodingsFromTheDefinition) {
  EXPECT_EQ(encode(QuantFormat::E4M3, 448.0f), 0x7E);  // S.1111.110 = 1.75 · 2^8
  EXPECT_EQ(encode(QuantFormat::E4M3, -448.0f), 0xFE);
  EXPECT_EQ(encode(QuantFormat::E4M3, 1.0f), 0x38);      // exponent 7 = bias
  EXPECT_EQ(encode(QuantFormat::E4M3, 500.0f), 0x7E);    // saturates
  EXPECT_EQ(encode(QuantFormat::E4M3, INFINITY), 0x7E);  // saturates, no inf in e4m3fn
  EXPECT_EQ(encode(QuantFormat::E4M3, NAN), 0x7F);
  EXPECT_EQ(encode(QuantFormat::E4M3, std::ldexp(1.0f, -9)), 0x01);   // smallest subnormal
  EXPECT_EQ(encode(QuantFormat::E4M3, std::ldexp(1.0f, -10)), 0x00);  // its half: tie to even 0
  EXPECT_EQ(encode(QuantFormat::E4M3, std::ldexp(3.0f, -10)), 0x02);  // 1.5 · 2^-9: tie to even 2
  EXPECT_EQ(encode(QuantFormat::E4M3, std::ldexp(3.0f, -11)), 0x01);  // 0.75 · 2^-9: nearest 2^-9
  EXPECT_EQ(encode(QuantFormat::E4M3, std::ldexp(1.0f, -6)), 0x08);   // smallest normal
  EXPECT_EQ(decode(QuantFormat::E4M3, 0x7E), 448.0f);
  EXPECT_TRUE(std::isnan(decode(QuantFormat::E4M3, 0xFF)));
  EXPECT_EQ(encode(QuantFormat::E5M2, 57344.0f), 0x7B);  // S.11110.11
  EXPECT_EQ(encode(QuantFormat::E5M2, INFINITY), 0x7B);
  EXPECT_EQ(encode(QuantFormat::E5M2, std::ldexp(1.0f, -16)), 0x01);
  EXPECT_EQ(max_finite(QuantFormat::E4M3), 448.0f);
  EXPECT_EQ(max_finite(QuantFormat::E5M2), 57344.0f);
  EXPECT_EQ(max_finite(QuantFormat::E2M1), 6.0f);
}

TEST(QuantFormats, E2M1EncodingsFromTheDefinition) {
  // Magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 = codes 0..7 (S.EE.M, bias 1); ties go to the even code.
  const std::pair<float, uint8_t> cases[] = {
      {0.0f, 0x0},  {0.5f, 0x1},  {1.0f, 0x2},  {1.5f, 0x3},     {2.0f, 0x4},
      {3.0f, 0x5},  {4.0f, 0x6},  {6.0f, 0x7},  {-6.0f, 0xF},    {-0.5f, 0x9},
      {-0.0f, 0x8}, {0.25f, 0x0},  // tie 0 / 0.5 → 0 (code 0 even)
      {0.75f, 0x2},                // tie 0.5 / 1 → 1 (code 2)
      {1.25f, 0x2}, {1.75f, 0x4}, {2.5f, 0x4},  {3.5f, 0x6},     {5.0f, 0x6},
      {5.01f, 0x7}, {7.0f, 0x7},  {1e30f, 0x7}, {INFINITY, 0x7}, {-INFINITY, 0xF},
      {NAN, 0x7},  // no NaN in e2m1: +6 (satfinite)
      {0.26f, 0x1}, {0.24f, 0x0},
  };
  for (auto [v, code] : cases) EXPECT_EQ(f32_to_e2m1(v), code) << "value " << v;
  for (uint8_t c = 0; c < 16; ++c) {
    if (c == 0x8) continue;  // -0 encodes back to 0x8 too, but compares equal to 0
    EXPECT_EQ(f32_to_e2m1(e2m1_to_f32(c)), c) << "code " << int(c);
  }
  EXPECT_EQ(e2m1_to_f32(0x7), 6.0f);
  EXPECT_EQ(e2m1_to_f32(0xB), -1.5f);
}

TEST(QuantFormats, E8M0ScalesRoundUpWithBias127) {
  EXPECT_EQ(f32_to_e8m0_round_up(1.0f), 127);
  EXPECT_EQ(f32_to_e8m0_round_up(2.0f), 128);
  EXPECT_EQ(f32_to_e8m0_round_up(1.5f), 128);  // not a power of two: up
  EXPECT_EQ(f32_to_e8m0_round_up(0.75f), 127);
  EXPECT_EQ(f32_to_e8m0_round_up(0.0f), 0);
  EXPECT_EQ(f32_to_e8m0_round_up(NAN), 0xFF);
  EXPECT_EQ(f32_to_e8m0_round_up(INFINITY), 0xFE);
  EXPECT_EQ(f32_to_e8m0_round_up(std::ldexp(1.0f, 127)), 254);
  EXPECT_EQ(f32_to_e8m0_round_up(FLT_MAX), 254);  // saturates
  EXPECT_EQ(f32_to_e8m0_round_up(std::ldexp(1.0f, -126)), 1);
  EXPECT_EQ(f32_to_e8m0_round_up(std::ldexp(1.0f, -127)), 0);  // subnormal 2^-127 exactly
  EXPECT_EQ(f32_to_e8m0_round_up(std::ldexp(1.5f, -127)), 1);  // above it: 2^-126
  EXPECT_EQ(f32_to_e8m0_round_up(std::ldexp(1.0f, -149)), 0);
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_to_f32(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
  EXPECT_EQ(e8m0_reciprocal(254), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_reciprocal(0), std::ldexp(1.0f, 127));
  EXPECT_EQ(e8m0_reciprocal(130), 0.125f);
}

TEST(QuantFormats, ScaleFromAmaxEdges) {
  EXPECT_EQ(scale_from_amax(0.0f, 448.0f, false, 0.0f, FLT_MAX), 1.0f);  // all-zero block
  EXPECT_EQ(scale_from_amax(INFINITY, 448.0f, false, 0.0f, FLT_MAX), 1.0f);
  EXPECT_EQ(scale_from_amax(NAN, 448.0f, false, 0.0f, FLT_MAX), 1.0f);
  EXPECT_EQ(scale_from_amax(2.0f, 448.0f, false, 0.0f, FLT_MAX), 224.0f);
  EXPECT_EQ(scale_from_amax(3.0f, 448.0f, false, 0.0f, FLT_MAX), 448.0f / 3.0f);
  EXPECT_EQ(scale_from_amax(3.0f, 448.0f, true, 0.0f, FLT_MAX), 128.0f);        // 149.3 → 2^7
  EXPECT_EQ(scale_from_amax(1e-45f, 448.0f, false, 0.0f, 12345.0f), 12345.0f);  // overflow
  EXPECT_EQ(scale_from_amax(0.0f, 448.0f, false, 0.5f, FLT_MAX), 896.0f);       // epsilon floor
}

TEST(QuantRecipes, NamesDefaultsAndRolesAsTE) {
  const Recipe cur = Recipe::parse("fp8-current");
  EXPECT_EQ(cur.kind, RecipeKind::Fp8CurrentScaling);
  EXPECT_EQ(cur.spec(QuantRole::Input).format, QuantFormat::E4M3);  // HYBRID
  EXPECT_EQ(cur.spec(QuantRole::Weight).format, QuantFormat::E4M3);
  EXPECT_EQ(cur.spec(QuantRole::GradOutput).format, QuantFormat::E5M2);
  EXPECT_EQ(Recipe::fp8_current(Fp8Format::E4M3).spec(QuantRole::GradOutput).format,
            QuantFormat::E4M3);
  const Recipe blk = Recipe::parse("fp8-block");
  EXPECT_TRUE(blk.power_2_scales);
  EXPECT_EQ(blk.spec(QuantRole::Input).scaling, Scaling::Block1D);
  EXPECT_EQ(blk.spec(QuantRole::Weight).scaling, Scaling::Block2D);
  EXPECT_EQ(blk.spec(QuantRole::GradOutput).format, QuantFormat::E4M3);  // E4M3 default
  EXPECT_EQ(Recipe::parse("mxfp8").spec(QuantRole::Input).block, 32);
  EXPECT_EQ(Recipe::parse("nvfp4").spec(QuantRole::GradOutput).format, QuantFormat::E2M1);
  EXPECT_EQ(Recipe::parse("nvfp4").spec(QuantRole::Weight).block, 16);
  auto e = caught([] { Recipe::parse("fp8"); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'recipe'"), HasSubstr("fp8-block"), HasSubstr("'fp8'")));
  Recipe bad = Recipe::fp8_block();
  bad.margin = 1;
  e = caught([&] { bad.validate(); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'margin'"), HasSubstr("only fp8-current")));
  Recipe nv = Recipe::nvfp4();
  nv.fp8_format = Fp8Format::Hybrid;
  e = caught([&] { nv.spec(QuantRole::Input); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'fp8_format'"), HasSubstr("HYBRID")));
}

// The scalar math the GPU kernels use (backends/contract/quant_math.h, host/device code) equals
// the library's scalar conversions, which the CPU reference uses: on every edge value above and a
// million random fp32 bit patterns (all exponents, NaNs, infinities, subnormals).
TEST(QuantFormats, DeviceScalarMathEqualsTheCpuReferenceBitForBit) {
  namespace qm = quant_math;
  std::mt19937_64 rng(40);
  std::vector<float> values = {0.0f,
                               -0.0f,
                               448.0f,
                               464.0f,
                               480.0f,
                               57344.0f,
                               61440.0f,
                               INFINITY,
                               -INFINITY,
                               NAN,
                               -NAN,
                               FLT_MAX,
                               FLT_MIN,
                               std::ldexp(1.0f, -149),
                               std::ldexp(1.0f, -10),
                               std::ldexp(3.0f, -10),
                               0.25f,
                               0.75f,
                               5.0f};
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t u = static_cast<uint32_t>(rng());
    // Half the draws near the formats' ranges (exponents 2^-20..2^20), half anywhere.
    const uint32_t near = (u & 0x807FFFFFu) | (static_cast<uint32_t>(107 + (rng() % 41)) << 23);
    values.push_back(std::bit_cast<float>(i % 2 ? u : near));
  }
  int64_t bad = 0;
  for (float v : values) {
    bad += qm::encode_fp8(v, qm::e4m3()) != f32_to_f8e4m3(v);
    bad += qm::encode_fp8(v, qm::e5m2()) != f32_to_f8e5m2(v);
    bad += qm::encode_e2m1(v) != f32_to_e2m1(v);
    bad += qm::e8m0_round_up(v) != f32_to_e8m0_round_up(v);
    const float a = std::fabs(v);
    bad += std::bit_cast<uint32_t>(qm::scale_from_amax(a, 448.0f, false, 0.0f, FLT_MAX)) !=
           std::bit_cast<uint32_t>(scale_from_amax(a, 448.0f, false, 0.0f, FLT_MAX));
    bad += std::bit_cast<uint32_t>(qm::scale_from_amax(a, 57344.0f, true, 0.0f, 3e38f)) !=
           std::bit_cast<uint32_t>(scale_from_amax(a, 57344.0f, true, 0.0f, 3e38f));
    float enc = 0,
          dec = 0;  // NVFP4's group scales: s_enc = min(2688 / amax, FLT_MAX), s_dec = 1 / s_enc
    qm::nv_group_scales(a, &enc, &dec);
    float want_enc = std::fmin(2688.0f / a, FLT_MAX);
    if (a == 0.0f || want_enc == 0.0f) want_enc = 1.0f;
    bad += std::bit_cast<uint32_t>(enc) != std::bit_cast<uint32_t>(want_enc);
    bad += std::bit_cast<uint32_t>(dec) !=
           std::bit_cast<uint32_t>(static_cast<float>(1.0 / double(want_enc)));
    if (bad) {
      ADD_FAILURE() << "first mismatch at " << v << " (bits 0x" << std::hex
                    << std::bit_cast<uint32_t>(v) << ")";
      return;
    }
  }
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const float e5 = f8e5m2_to_f32(code), e5_got = qm::decode_e5m2(code);
    EXPECT_TRUE(std::isnan(e5) ? std::isnan(e5_got) : e5_got == e5) << "e5m2 code " << c;
    const float e8 = e8m0_to_f32(code), e8_got = qm::e8m0_value(code);
    EXPECT_TRUE(std::isnan(e8) ? std::isnan(e8_got) : e8_got == e8) << "e8m0 code " << c;
    if (c < 16) {
      EXPECT_EQ(qm::decode_e2m1(code), e2m1_to_f32(code)) << "e2m1 code " << c;
    }
    const float want = f8e4m3_to_f32(static_cast<uint8_t>(c)),
                got = qm::decode_e4m3(static_cast<uint8_t>(c));
    EXPECT_TRUE(std::isnan(want) ? std::isnan(got) : got == want) << "code " << c;
    if (c < 255) {
      EXPECT_EQ(qm::e8m0_reciprocal(static_cast<uint8_t>(c)),
                e8m0_reciprocal(static_cast<uint8_t>(c)));
    }
  }
}

// ---------------------------------------------------------------- the independent reference
// Written from SPEC §6b element by element: each element's block key, the block's amax over the
// group's valid rows (NaN never wins), the block's scale, then the element's code.
struct RefQuant {
  std::vector<uint8_t> row_codes, col_codes;  // [T, C] and [C, T] (one code per element)
  std::map<std::tuple<int64_t, int64_t, int64_t>, float> row_scale_f32, col_scale_f32;
  std::map<std::tuple<int64_t, int64_t, int64_t>, uint8_t> row_scale_code, col_scale_code;
  std::vector<float> group_amax, group_dec;
};

float ref_fp8_scale(float amax, float fp8_max, bool pow2, float vfi) {
  if (amax == 0.0f || std::isinf(amax) || std::isnan(amax)) return 1.0f;
  float s = fp8_max / amax;
  if (std::isinf(s)) s = vfi;
  if (pow2) s = std::ldexp(1.0f, std::ilogb(s));  // round down to a power of two
  return s;
}

RefQuant ref_quantize(const std::vector<float>& x, int64_t T, int64_t C,
                      const std::vector<int64_t>& counts, const QuantSpec& spec, DType source) {
  RefQuant r;
  r.row_codes.assign(static_cast<size_t>(T * C), 0);
  r.col_codes.assign(static_cast<size_t>(T * C), 0);
  const int64_t b = spec.block;
  const float fmax = std::ldexp(max_finite(spec.format), -spec.margin);
  const float vfi = spec.scaling == Scaling::PerGroup ? FLT_MAX
                    : source == DType::BF16           ? bf16_to_f32(0x7F7F)
                    : source == DType::F16            ? 65504.0f
                                                      : FLT_MAX;
  using Key = std::tuple<int64_t, int64_t, int64_t>;
  auto row_key = [&](int64_t g, int64_t t, int64_t local, int64_t c) -> Key {
    switch (spec.scaling) {
      case Scaling::PerGroup:
        return {g, 0, 0};
      case Scaling::Block2D:
        return {g, local / b, c / b};
      default:
        return {t, c / b, 0};
    }
  };
  auto col_key = [&](int64_t g, int64_t /*t*/, int64_t local, int64_t c) -> Key {
    switch (spec.scaling) {
      case Scaling::PerGroup:
        return {g, 0, 0};
      case Scaling::Block2D:
        return {g, local / b, c / b};
      default:
        return {g, local / b, c};
    }
  };
  std::map<Key, float> row_amax, col_amax;
  r.group_amax.assign(counts.size(), 0.0f);
  int64_t off = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    for (int64_t l = 0; l < counts[g]; ++l) {
      for (int64_t c = 0; c < C; ++c) {
        const int64_t t = off + l;
        const float a = std::fabs(x[static_cast<size_t>(t * C + c)]);
        for (auto [map, key] : {std::pair{&row_amax, row_key(g, t, l, c)},
                                std::pair{&col_amax, col_key(g, t, l, c)}}) {
          float& m = (*map)[key];
          if (!std::isnan(a)) m = std::max(m, a);
        }
        if (!std::isnan(a)) r.group_amax[g] = std::max(r.group_amax[g], a);
      }
    }
    off += counts[g];
  }
  r.group_dec.assign(counts.size(), 1.0f);
  std::vector<float> group_enc(counts.size(), 1.0f);
  for (size_t g = 0; g < counts.size(); ++g) {
    const float a = r.group_amax[g];
    float s = std::min(2688.0f / a, FLT_MAX);
    if (a == 0.0f || s == 0.0f) s = 1.0f;
    group_enc[g] = s;
    r.group_dec[g] = static_cast<float>(1.0 / s);
  }
  // The factor an element is multiplied by, and the stored scale, of a block of amax `a`.
  auto block = [&](float a, size_t g, float* factor, float* stored, uint8_t* code) {
    switch (spec.scaling) {
      case Scaling::PerGroup:
      case Scaling::Block1D:
      case Scaling::Block2D: {
        const float s = ref_fp8_scale(a, fmax, spec.power_2_scales, vfi);
        *factor = s;
        *stored = 1.0f / s;
        break;
      }
      case Scaling::Mx: {
        const float v = a * static_cast<float>(1.0 / max_finite(spec.format));
        int e = 0;
        const float f = std::frexp(v, &e);                          // v = f · 2^e, f in [0.5, 1)
        const int up = v == 0.0f ? -127 : (f == 0.5f ? e - 1 : e);  // ⌈log2 v⌉
        *code = static_cast<uint8_t>(std::clamp(up + 127, 0, 254));
        *factor = std::ldexp(1.0f, 127 - *code);
        break;
      }
      case Scaling::Nv: {
        *code = encode(QuantFormat::E4M3, std::min(a * (group_enc[g] * (1.0f / 6.0f)), FLT_MAX));
        *factor = std::min(1.0f / (decode(QuantFormat::E4M3, *code) * r.group_dec[g]), FLT_MAX);
        break;
      }
    }
  };
  off = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    for (int64_t l = 0; l < counts[g]; ++l) {
      for (int64_t c = 0; c < C; ++c) {
        const int64_t t = off + l;
        const float v = x[static_cast<size_t>(t * C + c)];
        float factor = 1, stored = 1;
        uint8_t code = 0;
        const Key rk = row_key(g, t, l, c), ck = col_key(g, t, l, c);
        block(row_amax[rk], g, &factor, &stored, &code);
        r.row_codes[static_cast<size_t>(t * C + c)] = encode(spec.format, v * factor);
        r.row_scale_f32[rk] = stored;
        r.row_scale_code[rk] = code;
        block(col_amax[ck], g, &factor, &stored, &code);
        r.col_codes[static_cast<size_t>(c * T + t)] = encode(spec.format, v * factor);
        r.col_scale_f32[ck] = stored;
        r.col_scale_code[ck] = code;
      }
    }
    off += counts[g];
  }
  return r;
}

uint8_t code_at(const Tensor& copy, int64_t r, int64_t c, bool fp4) {
  const uint8_t* d = copy.data_as<uint8_t>();
  if (!fp4) return d[r * copy.size(1) + c];
  const uint8_t byte = d[r * copy.size(1) + c / 2];
  return c % 2 == 0 ? (byte & 0xF) : (byte >> 4);
}

// Every valid code and every scale of q against the reference, bit for bit (scale indices as
// SPEC §6a lays them out).
::testing::AssertionResult matches_reference(const QuantizedTensor& q, const RefQuant& ref,
                                             const std::vector<int64_t>& counts) {
  const bool fp4 = q.spec.format == QuantFormat::E2M1;
  const int64_t T = q.rows, C = q.cols, b = q.spec.block;
  const int64_t cb = b > 0 ? (C + b - 1) / b : 0;
  int64_t off = 0, rb_off = 0, errors = 0;
  std::string first;
  auto fail = [&](const std::string& what) {
    if (errors++ == 0) first = what;
  };
  const bool byte_scales = q.spec.scaling == Scaling::Mx || q.spec.scaling == Scaling::Nv;
  auto check_scale = [&](const Tensor& s, int64_t index, float want_f32, uint8_t want_code,
                         const std::string& where) {
    if (byte_scales) {
      const uint8_t got = s.data_as<uint8_t>()[index];
      if (got != want_code) fail(str(where, ": scale code ", int(got), ", want ", int(want_code)));
    } else {
      const float got = s.data_as<float>()[index];
      if (std::bit_cast<uint32_t>(got) != std::bit_cast<uint32_t>(want_f32)) {
        fail(str(where, ": scale_inv ", got, ", want ", want_f32));
      }
    }
  };
  for (size_t g = 0; g < counts.size(); ++g) {
    const int64_t m = counts[g];
    for (int64_t l = 0; l < m; ++l) {
      const int64_t t = off + l;
      for (int64_t c = 0; c < C; ++c) {
        const std::string at = str("group ", g, " row ", t, " col ", c);
        if (q.has_rowwise()) {
          const uint8_t got = code_at(q.rowwise, t, c, fp4),
                        want = ref.row_codes[static_cast<size_t>(t * C + c)];
          if (got != want) fail(str(at, ": rowwise code ", int(got), ", want ", int(want)));
        }
        if (q.has_columnwise()) {
          const uint8_t got = code_at(q.columnwise, c, t, fp4),
                        want = ref.col_codes[static_cast<size_t>(c * T + t)];
          if (got != want) fail(str(at, ": columnwise code ", int(got), ", want ", int(want)));
        }
        switch (q.spec.scaling) {
          case Scaling::PerGroup: {
            const auto k = std::make_tuple(int64_t(g), int64_t(0), int64_t(0));
            check_scale(q.rowwise_scale_inv, static_cast<int64_t>(g), ref.row_scale_f32.at(k), 0,
                        at);
            break;
          }
          case Scaling::Block2D: {
            const auto k = std::make_tuple(int64_t(g), l / b, c / b);
            check_scale(q.rowwise_scale_inv, (rb_off + l / b) * cb + c / b, ref.row_scale_f32.at(k),
                        0, at);
            break;
          }
          default:
            if (q.has_rowwise()) {
              const auto k = std::make_tuple(t, c / b, int64_t(0));
              check_scale(q.rowwise_scale_inv, t * cb + c / b, ref.row_scale_f32.at(k),
                          ref.row_scale_code.at(k), at + " (rowwise)");
            }
            if (q.has_columnwise()) {
              const auto k = std::make_tuple(int64_t(g), l / b, c);
              check_scale(q.columnwise_scale_inv, (rb_off + l / b) * C + c, ref.col_scale_f32.at(k),
                          ref.col_scale_code.at(k), at + " (columnwise)");
            }
        }
      }
    }
    if (q.amax.defined() && std::bit_cast<uint32_t>(q.amax.data_as<float>()[g]) !=
                                std::bit_cast<uint32_t>(ref.group_amax[g])) {
      fail(str("group ", g, ": amax ", q.amax.data_as<float>()[g], ", want ", ref.group_amax[g]));
    }
    if (q.group_scale_inv.defined() && q.group_scale_inv.data_as<float>()[g] != ref.group_dec[g]) {
      fail(str("group ", g, ": decode scale ", q.group_scale_inv.data_as<float>()[g], ", want ",
               ref.group_dec[g]));
    }
    off += m;
    if (b > 0) rb_off += (m + b - 1) / b;
  }
  if (errors == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << errors << " mismatches; first: " << first;
}

std::vector<float> floats_of(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  to_f32(t.data(), t.dtype(), out.data(), out.size());
  return out;
}

struct NamedSpec {
  std::string name;
  QuantSpec spec;
};

std::vector<NamedSpec> every_spec() {
  std::vector<NamedSpec> out;
  for (const char* r : {"fp8-current", "fp8-block", "mxfp8", "nvfp4"}) {
    const Recipe recipe = Recipe::parse(r);
    out.push_back({str(r, "/input"), recipe.spec(QuantRole::Input)});
    out.push_back({str(r, "/weight"), recipe.spec(QuantRole::Weight)});
    out.push_back({str(r, "/grad"), recipe.spec(QuantRole::GradOutput)});
  }
  Recipe blk32 = Recipe::fp8_block(Fp8Format::Hybrid, /*power_2_scales=*/false);
  out.push_back({"fp8-block-fp32-scales/grad", blk32.spec(QuantRole::GradOutput)});
  out.push_back({"fp8-block-fp32-scales/weight", blk32.spec(QuantRole::Weight)});
  out.push_back({"fp8-current-margin2/input",
                 Recipe::fp8_current(Fp8Format::Hybrid, 2).spec(QuantRole::Input)});
  return out;
}

// A poisoned CPU context: new memory is 0xFF, so an unwritten byte shows.
Context quant_ctx() {
  return poisoned(Context::cpu(1));
}

// ---------------------------------------------------------------- quantize vs the reference
TEST(QuantizeCpu, EverySpecMatchesTheReferenceWithZeroRowGroupsShortBlocksAndATail) {
  const std::vector<int64_t> counts = {130, 0, 18, 256, 2};  // short blocks, an empty group
  const int64_t S = 406, T = S + 7, C = 160;                 // C: 1.25 blocks of 128
  Tensor x = random_normal({T, C}, DType::BF16, 11, 3.0);
  // The tail holds huge values: a quantize that reads it gets other amaxes.
  for (int64_t i = S * C; i < T * C; ++i) x.data_as<uint16_t>()[i] = f32_to_bf16(1e4f);
  const std::vector<float> xf = floats_of(x);
  for (const NamedSpec& ns : every_spec()) {
    SCOPED_TRACE(ns.name);
    const Context ctx = quant_ctx();
    const QuantizedTensor q = quantize(ctx, x, Splits::host(counts), ns.spec, QuantUsage::Both);
    EXPECT_TRUE(matches_reference(q, ref_quantize(xf, T, C, counts, ns.spec, DType::BF16), counts));
    // Rows [S, T) of the copies are never written: still the allocator's 0xFF.
    const bool fp4 = ns.spec.format == QuantFormat::E2M1;
    for (int64_t t = S; t < T; ++t) {
      for (int64_t c = 0; c < C; ++c) {
        ASSERT_EQ(code_at(q.rowwise, t, c, fp4), fp4 ? 0xF : 0xFF) << "rowwise tail row " << t;
        ASSERT_EQ(code_at(q.columnwise, c, t, fp4), fp4 ? 0xF : 0xFF)
            << "columnwise tail col " << t;
      }
    }
  }
}

TEST(QuantizeCpu, FuzzedShapesAndSplitsMatchTheReference) {
  std::mt19937_64 rng(2026);
  auto uni = [&rng](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  const std::vector<NamedSpec> specs = every_spec();
  for (int iter = 0; iter < 24; ++iter) {
    const NamedSpec& ns = specs[static_cast<size_t>(iter) % specs.size()];
    const bool fp4 = ns.spec.format == QuantFormat::E2M1;
    const int64_t G = uni(1, 5);
    std::vector<int64_t> counts(static_cast<size_t>(G));
    for (auto& c : counts) c = uni(0, 3) == 0 ? 0 : uni(1, 150) * (fp4 ? 2 : 1);
    int64_t S = 0;
    for (int64_t c : counts) S += c;
    const int64_t T = S + uni(0, 5), C = uni(1, 140) * (fp4 ? 2 : 1);
    const DType dt = iter % 3 == 0 ? DType::F32 : iter % 3 == 1 ? DType::F16 : DType::BF16;
    SCOPED_TRACE(str(ns.name, " T=", T, " C=", C, " counts=", ::testing::PrintToString(counts), " ",
                     name(dt)));
    const Tensor x = random_normal({T, C}, dt, 100 + iter, std::ldexp(1.0, uni(-8, 8)));
    const QuantizedTensor q =
        quantize(quant_ctx(), x, Splits::host(counts), ns.spec, QuantUsage::Both);
    EXPECT_TRUE(
        matches_reference(q, ref_quantize(floats_of(x), T, C, counts, ns.spec, dt), counts));
  }
}

TEST(QuantizeCpu, OnlyTheCopiesAskedForExist) {
  const Tensor x = random_normal({32, 64}, DType::BF16, 3);
  const QuantSpec spec = Recipe::fp8_block().spec(QuantRole::Input);
  const QuantizedTensor r = quantize(quant_ctx(), x, Splits::host({32}), spec, QuantUsage::Rowwise);
  EXPECT_TRUE(r.has_rowwise());
  EXPECT_FALSE(r.has_columnwise());
  const QuantizedTensor c =
      quantize(quant_ctx(), x, Splits::host({32}), spec, QuantUsage::Columnwise);
  EXPECT_FALSE(c.has_rowwise());
  EXPECT_TRUE(c.has_columnwise());
  EXPECT_EQ(c.columnwise.shape(), (Shape{64, 32}));
  EXPECT_EQ(c.columnwise_scale_inv.shape(), (Shape{2, 64}));  // ⌈32/128⌉ + 1 group row blocks
  // A columnwise row's length is T rounded up to 16 bytes (kColumnwiseRowAlignment: TMA rows)
  // whatever T; the codes and the dequantized copy are the same as for any T.
  const Tensor x33 = random_normal({33, 64}, DType::BF16, 4);
  const QuantizedTensor odd =
      quantize(quant_ctx(), x33, Splits::host({33}), spec, QuantUsage::Columnwise);
  EXPECT_EQ(odd.columnwise.shape(), (Shape{64, 48}));
  EXPECT_TRUE(matches_reference(odd, ref_quantize(floats_of(x33), 33, 64, {33}, spec, DType::BF16), {33}));
}

// ---------------------------------------------------------------- format edges
TEST(QuantizeCpu, AllZeroBlocksGetScaleOneAndCodeZero) {
  const Tensor x = host_filled({4, 64}, DType::BF16, 0.0);
  for (const NamedSpec& ns : every_spec()) {
    SCOPED_TRACE(ns.name);
    const QuantizedTensor q =
        quantize(quant_ctx(), x, Splits::host({4}), ns.spec, QuantUsage::Both);
    for (int64_t i = 0; i < q.rowwise.numel(); ++i) ASSERT_EQ(q.rowwise.data_as<uint8_t>()[i], 0);
    switch (ns.spec.scaling) {
      case Scaling::Mx:
        EXPECT_EQ(q.rowwise_scale_inv.data_as<uint8_t>()[0], 0x00);
        break;  // 2^-127
      case Scaling::Nv:
        EXPECT_EQ(q.rowwise_scale_inv.data_as<uint8_t>()[0], 0x00);
        EXPECT_EQ(q.group_scale_inv.data_as<float>()[0], 1.0f);  // amax 0: s_enc = 1
        break;
      default:
        EXPECT_EQ(q.rowwise_scale_inv.data_as<float>()[0], 1.0f);
    }
    std::vector<float> out(4 * 64, 7.0f);
    dequantize(Context::cpu(1), q, Splits::host({4}), QuantUsage::Rowwise,
               Tensor::wrap(out.data(), {4, 64}, DType::F32, Device::cpu()));
    for (float v : out) ASSERT_EQ(v, 0.0f);
  }
}

TEST(QuantizeCpu, TheAmaxElementLandsOnTheFormatMax) {
  // A block whose amax is a power of two: with power-of-two scales the amax element encodes as
  // the format's max exactly (fp8-block: 448 / 2^k rounded down to 2^k keeps 1 ≤ amax·s ≤ 448).
  std::vector<float> row(128, 0.25f);
  row[5] = -4.0f;  // amax 4 → scale 448/4 = 112 → pow2 64 → 4·64 = 256 = e4m3 0x78 (exact)
  Tensor x = Tensor::wrap(row.data(), {1, 128}, DType::F32, Device::cpu());
  const QuantizedTensor q =
      quantize(quant_ctx(), x, Splits::host({1}), Recipe::fp8_block().spec(QuantRole::Input),
               QuantUsage::Rowwise);
  EXPECT_EQ(q.rowwise_scale_inv.data_as<float>()[0], 1.0f / 64.0f);
  EXPECT_EQ(q.rowwise.data_as<uint8_t>()[5], 0xF8);  // -256
  // fp8-current without power-of-two: amax · scale = 448 exactly.
  const QuantizedTensor c =
      quantize(quant_ctx(), x, Splits::host({1}), Recipe::fp8_current().spec(QuantRole::Input),
               QuantUsage::Rowwise);
  EXPECT_EQ(c.rowwise.data_as<uint8_t>()[5], 0xFE);  // -448
  EXPECT_EQ(c.rowwise_scale_inv.data_as<float>()[0], 1.0f / 112.0f);
  // MXFP8: 4/448 → 2^⌈log2⌉ = 2^-6 → 4·2^6 = 256.
  const QuantizedTensor m = quantize(quant_ctx(), x, Splits::host({1}),
                                     Recipe::mxfp8().spec(QuantRole::Input), QuantUsage::Rowwise);
  EXPECT_EQ(m.rowwise_scale_inv.data_as<uint8_t>()[0], 127 - 6);
  EXPECT_EQ(m.rowwise.data_as<uint8_t>()[5], 0xF8);
  // NVFP4: s_enc = 2688/4 = 672; block scale e4m3(4·672/6 = 448) = 0x7E; -4·(1/(448/672)) = -6.
  const QuantizedTensor n = quantize(quant_ctx(), x, Splits::host({1}),
                                     Recipe::nvfp4().spec(QuantRole::Input), QuantUsage::Rowwise);
  EXPECT_EQ(n.rowwise_scale_inv.data_as<uint8_t>()[0], 0x7E);
  EXPECT_EQ(code_at(n.rowwise, 0, 5, true), 0xF);  // -6
}

TEST(QuantizeCpu, NaNAndInfBehaveAsSpecified) {
  // Group 0 has a NaN, group 1 an inf; each group's other values are ordinary.
  std::vector<float> v = {1.0f, NAN, -2.0f, 0.5f, /*group 1*/ 1.0f, INFINITY, -3.0f, 0.25f};
  Tensor x = Tensor::wrap(v.data(), {2, 4}, DType::F32, Device::cpu());
  const Splits splits = Splits::host({1, 1});
  const QuantizedTensor c = quantize(
      quant_ctx(), x, splits, Recipe::fp8_current().spec(QuantRole::Input), QuantUsage::Rowwise);
  // NaN never wins the amax; it stays NaN (0x7F). An inf amax gives scale 1; inf saturates.
  EXPECT_EQ(c.amax.data_as<float>()[0], 2.0f);
  EXPECT_EQ(c.rowwise.data_as<uint8_t>()[1], 0x7F);
  EXPECT_EQ(c.rowwise.data_as<uint8_t>()[0], encode(QuantFormat::E4M3, 224.0f));
  EXPECT_TRUE(std::isinf(c.amax.data_as<float>()[1]));
  EXPECT_EQ(c.rowwise_scale_inv.data_as<float>()[1], 1.0f);
  EXPECT_EQ(c.rowwise.data_as<uint8_t>()[5], 0x7E);  // +inf → 448
  EXPECT_EQ(c.rowwise.data_as<uint8_t>()[6], encode(QuantFormat::E4M3, -3.0f));
  // MXFP8: an inf amax gives e8m0 0xFE (2^127): inf → 448, the rest underflow to 0.
  const QuantizedTensor m =
      quantize(quant_ctx(), x, splits, Recipe::mxfp8().spec(QuantRole::Input), QuantUsage::Rowwise);
  EXPECT_EQ(m.rowwise_scale_inv.data_as<uint8_t>()[1], 0xFE);
  EXPECT_EQ(m.rowwise.data_as<uint8_t>()[5], 0x7E);
  EXPECT_EQ(m.rowwise.data_as<uint8_t>()[4], 0x00);
  EXPECT_EQ(m.rowwise.data_as<uint8_t>()[1], 0x7F);  // NaN stays NaN
  // NVFP4: inf amax → s_enc 1; NaN → +6 (e2m1 has no NaN).
  const QuantizedTensor n =
      quantize(quant_ctx(), x, splits, Recipe::nvfp4().spec(QuantRole::Input), QuantUsage::Rowwise);
  EXPECT_EQ(n.group_scale_inv.data_as<float>()[1], 1.0f);
  EXPECT_EQ(code_at(n.rowwise, 0, 1, true), 0x7);
}

TEST(QuantizeCpu, DequantizeIsCodeTimesScale) {
  const std::vector<int64_t> counts = {48, 0, 80};
  const Tensor x = random_normal({130, 96}, DType::BF16, 5, 2.0);
  for (const NamedSpec& ns : every_spec()) {
    SCOPED_TRACE(ns.name);
    const QuantizedTensor q =
        quantize(quant_ctx(), x, Splits::host(counts), ns.spec, QuantUsage::Both);
    std::vector<float> row(130 * 96, 7.0f), col(130 * 96, 7.0f);
    dequantize(Context::cpu(1), q, Splits::host(counts), QuantUsage::Rowwise,
               Tensor::wrap(row.data(), {130, 96}, DType::F32, Device::cpu()));
    dequantize(Context::cpu(1), q, Splits::host(counts), QuantUsage::Columnwise,
               Tensor::wrap(col.data(), {96, 130}, DType::F32, Device::cpu()));
    const std::vector<float> xf = floats_of(x);
    double worst = 0, amax = 0;
    for (int64_t t = 0; t < 128; ++t) {
      for (int64_t c = 0; c < 96; ++c) {
        const float v = xf[static_cast<size_t>(t * 96 + c)];
        const float r = row[static_cast<size_t>(t * 96 + c)],
                    cl = col[static_cast<size_t>(c * 130 + t)];
        worst = std::max({worst, std::fabs(double(r) - v), std::fabs(double(cl) - v)});
        amax = std::max(amax, std::fabs(double(v)));
      }
    }
    // Round trip within half a step of the format at the largest magnitude: e4m3 2^-4, e5m2 2^-3
    // relative; e2m1's widest gap (4 → 6) is a third of the block's amax.
    const double rel = ns.spec.format == QuantFormat::E2M1   ? 0.2
                       : ns.spec.format == QuantFormat::E5M2 ? 0.126
                                                             : 0.063;
    EXPECT_LT(worst, rel * amax);
    EXPECT_GT(worst, 0.0);  // quantization did happen
    for (int64_t t = 128; t < 130; ++t)
      EXPECT_EQ(row[static_cast<size_t>(t * 96)], 7.0f) << "tail row written";
  }
}

// ---------------------------------------------------------------- checks
TEST(QuantizeCpu, ChecksNameTheRuleAndTheArgument) {
  const Tensor odd = random_normal({4, 15}, DType::BF16, 1);
  auto e = caught([&] {
    quantize(quant_ctx(), odd, Splits::host({4}), Recipe::nvfp4().spec(QuantRole::Input),
             QuantUsage::Rowwise);
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'x'"), HasSubstr("even number of columns"),
                               HasSubstr("15 columns")));
  const Tensor x = random_normal({6, 16}, DType::BF16, 1);
  e = caught([&] {
    quantize(quant_ctx(), x, Splits::host({3, 3}), Recipe::nvfp4().spec(QuantRole::Input),
             QuantUsage::Columnwise);
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'splits'"), HasSubstr("multiple of 2"),
                               HasSubstr("3 rows in group 0")));
  e = caught([&] {
    quantize(quant_ctx(), x, Splits::host({3, 4}), Recipe::mxfp8().spec(QuantRole::Input),
             QuantUsage::Rowwise);
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'splits'"));
  QuantSpec bad = Recipe::mxfp8().spec(QuantRole::Input);
  bad.block = 16;
  e = caught([&] { quantize(quant_ctx(), x, Splits::host({6}), bad, QuantUsage::Rowwise); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'spec.block'"), HasSubstr("32"), HasSubstr("16")));
  e = caught(
      [&] { quantize(quant_ctx(), x, Splits::host({6}), QuantSpec{}, QuantUsage::Rowwise); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'spec'"));
  // The bias gradient beside it: db [G, C] in a compute dtype, not over x.
  const QuantSpec grad = Recipe::fp8_block().spec(QuantRole::GradOutput);
  const QuantizedTensor q = allocate_quantized(quant_ctx(), grad, DType::BF16, 6, 16, 2, QuantUsage::Both);
  e = caught([&] {
    detail::bind_quantize(quant_ctx(), x, Splits::host({3, 3}), q, Tensor::empty({2, 15}, DType::F32, host()));
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'db'"), HasSubstr("[2, 16]"), HasSubstr("[2, 15]")));
  e = caught([&] {
    detail::bind_quantize(quant_ctx(), x, Splits::host({3, 3}), q, Tensor::empty({2, 16}, DType::I32, host()));
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'db'"), HasSubstr("i32")));
  e = caught([&] { detail::bind_quantize(quant_ctx(), x, Splits::host({3, 3}), q, x.rows(0, 2)); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'db'"), HasSubstr("'x'")));
}

// bind_quantize's db, the bias gradient of a layer whose output gradient x is: the column sums of
// each group's rows, from the quantize's own read of x on the GPU's fp8-current and fp8-block
// one-read kernels (their kDb instances), else by grouped_bias_grad beside it. Every spec, the
// three dtypes, C on (160) and off (130) the GPU's vector paths, zero-row groups, groups over a
// tile of rows, a tail of huge values, host and device counts: the copies equal the quantize's
// without db byte for byte (unwritten bytes included: a poisoned context), db the fp64 column sums
// under the fp32 accumulation bound (an empty group's exactly 0), db's guard rows untouched.
void check_quantize_with_db(const Context& ctx) {
  const std::vector<int64_t> counts = {130, 0, 18, 256, 2, 66};  // even: NVFP4's columnwise copy
  const int64_t S = sum_of(counts), T = S + 5, G = static_cast<int64_t>(counts.size());
  const Tensor counts_d = to_device(ctx, counts_tensor(counts, DType::I32));
  int round = 0;
  for (int64_t C : {160, 130}) {
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
      Tensor x = random_normal({T, C}, dt, 70 + C, 2.0);
      const Tensor huge = random_normal({T, C}, dt, 71, 1e4);
      const size_t es = size_of(dt);
      std::memcpy(static_cast<char*>(x.data()) + S * C * es, static_cast<const char*>(huge.data()) + S * C * es,
                  static_cast<size_t>((T - S) * C) * es);
      const Tensor x_d = to_device(ctx, x);
      std::vector<double> xs = to_doubles(host(), x);
      xs.resize(static_cast<size_t>(S * C));
      const Reference want = reference_dbias(xs, counts, C);
      for (const NamedSpec& ns : every_spec()) {
        const bool device_counts = round++ % 2 == 1;
        const DType db_dt = round % 3 == 0 ? DType::F32 : dt;
        SCOPED_TRACE(str(ns.name, " C=", C, " x ", name(dt), " db ", name(db_dt),
                         device_counts ? " device counts" : " host counts"));
        const Splits splits = device_counts ? Splits::device(counts_d) : Splits::host(counts);
        const QuantizedTensor plain = quantize(ctx, x_d, splits, ns.spec, QuantUsage::Both);
        const QuantizedTensor q = allocate_quantized(ctx, ns.spec, dt, T, C, G, QuantUsage::Both);
        GuardedBuffer db(ctx, {G, C}, db_dt);
        detail::bind_quantize(ctx, x_d, splits, q, db.view).run();
        for (auto [a, b] : {std::pair{&plain.rowwise, &q.rowwise}, {&plain.columnwise, &q.columnwise},
                            {&plain.rowwise_scale_inv, &q.rowwise_scale_inv},
                            {&plain.columnwise_scale_inv, &q.columnwise_scale_inv}, {&plain.amax, &q.amax},
                            {&plain.group_scale_inv, &q.group_scale_inv}}) {
          if (a->defined()) {
            ASSERT_EQ(bytes_of(ctx, *a), bytes_of(ctx, *b));
          }
        }
        EXPECT_TRUE(matches_reference("db", db.values(), want, db_dt));
        EXPECT_TRUE(db.untouched_outside(G));
        EXPECT_EQ(ctx.device_error_bits(), 0u);
      }
    }
  }
}

TEST(QuantizeCpu, TheBiasGradientBesideTheQuantizeIsTheColumnSumsOfEachGroup) {
  check_quantize_with_db(quant_ctx());
}

// ---------------------------------------------------------------- the GPU quantize
// (cuda/quantize.cu) Written for a GPU: on a machine with a CUDA device these run and fail on any
// difference from the reference; without one they skip, saying so.
#define MOEKIT_REQUIRE_CUDA()            \
  if (Context::cuda_device_count() == 0) \
  GTEST_SKIP() << "no CUDA device: the GPU quantize needs one"

// A host copy of every tensor of q (a GPU quantize's result).
QuantizedTensor host_copy(const Context& ctx, const QuantizedTensor& q) {
  QuantizedTensor h = q;
  for (Tensor* t : {&h.rowwise, &h.rowwise_scale_inv, &h.columnwise, &h.columnwise_scale_inv,
                    &h.amax, &h.group_scale_inv}) {
    if (t->defined()) *t = to_host(ctx, *t);
  }
  if (q.spec.scaling == Scaling::PerGroup || q.spec.scaling == Scaling::Block2D) {
    h.columnwise_scale_inv = h.rowwise_scale_inv;  // shared, as allocated
  }
  return h;
}

TEST(QuantizeCuda, EverySpecEqualsTheCpuReferenceBitForBitWithHostAndDeviceCounts) {
  MOEKIT_REQUIRE_CUDA();
  const Context gpu = poisoned(Context::cuda(0));
  const std::vector<int64_t> counts = {130, 0, 18, 256, 2};
  const int64_t S = 406, T = S + 7, C = 160;
  Tensor x = random_normal({T, C}, DType::BF16, 11, 3.0);
  for (int64_t i = S * C; i < T * C; ++i) x.data_as<uint16_t>()[i] = f32_to_bf16(1e4f);
  const Tensor x_d = to_device(gpu, x);
  const Tensor counts_d = to_device(gpu, counts_tensor(counts, DType::I32));
  for (const NamedSpec& ns : every_spec()) {
    for (bool device_counts : {false, true}) {
      SCOPED_TRACE(str(ns.name, device_counts ? " device counts" : " host counts"));
      const Splits splits = device_counts ? Splits::device(counts_d) : Splits::host(counts);
      const QuantizedTensor q_d = quantize(gpu, x_d, splits, ns.spec, QuantUsage::Both);
      const QuantizedTensor q = host_copy(gpu, q_d);
      EXPECT_TRUE(matches_reference(
          q, ref_quantize(floats_of(x), T, C, counts, ns.spec, DType::BF16), counts));
      // Rows [S, T) of the copies are never written: still the poisoned allocator's 0xFF.
      const bool fp4 = ns.spec.format == QuantFormat::E2M1;
      for (int64_t t = S; t < T; ++t) {
        for (int64_t c = 0; c < C; ++c) {
          ASSERT_EQ(code_at(q.rowwise, t, c, fp4), fp4 ? 0xF : 0xFF) << "rowwise tail row " << t;
          ASSERT_EQ(code_at(q.columnwise, c, t, fp4), fp4 ? 0xF : 0xFF) << "columnwise tail col " << t;
        }
      }
      // The GPU dequantize of each copy equals the CPU's of the same codes, bit for bit.
      for (QuantUsage which : {QuantUsage::Rowwise, QuantUsage::Columnwise}) {
        const Shape shape = which == QuantUsage::Rowwise ? Shape{T, C} : Shape{C, T};
        const Tensor got = Tensor::empty(shape, DType::F32, gpu);
        dequantize(gpu, q_d, splits, which, got);
        const Tensor want = Tensor::empty(shape, DType::F32, host());
        dequantize(host(), q, Splits::host(counts), which, want);
        const std::vector<uint8_t> g = bytes_of(gpu, got), w = bytes_of(host(), want);
        // Valid elements only: rows [0, S) of the rowwise copy, columns [0, S) of the columnwise.
        for (int64_t r = 0; r < shape[0]; ++r) {
          const int64_t n = which == QuantUsage::Rowwise ? (r < S ? C : 0) : S;
          const size_t at = static_cast<size_t>(r * shape[1]) * 4, len = static_cast<size_t>(n) * 4;
          ASSERT_TRUE(std::equal(g.begin() + at, g.begin() + at + len, w.begin() + at))
              << "dequantized row " << r
              << (which == QuantUsage::Rowwise ? " (rowwise)" : " (columnwise)");
        }
      }
      EXPECT_EQ(gpu.device_error_bits(), 0u);
    }
  }
}

// The GPU's FP8 codes of per-group scaling come from the hardware conversion (cvt.rn.satfinite),
// the CPU's from quant_math: equal on the format edges and a million random fp32 bit patterns
// (as QuantFormats.DeviceScalarMathEqualsTheCpuReferenceBitForBit draws them). An infinity in
// the group makes its amax infinite, so its scale is 1 and every code is encode(v) itself.
TEST(QuantizeCuda, Fp8CodesOfEdgesAndAMillionRandomFloatsEqualTheCpu) {
  MOEKIT_REQUIRE_CUDA();
  const Context gpu = Context::cuda(0);
  const int64_t T = 1024, C = 1028;  // C % 4 == 0: the vector path; the fuzz below takes the others
  std::vector<float> v = {INFINITY, -INFINITY, NAN, -NAN, 0.0f, -0.0f, 448.0f, 464.0f, 464.1f, 480.0f,
                          -479.9f, 57344.0f, 61440.0f, 61439.0f, FLT_MAX, FLT_MIN, std::ldexp(1.0f, -149),
                          std::ldexp(1.0f, -9), std::ldexp(1.0f, -10), std::ldexp(3.0f, -10),
                          std::ldexp(1.0f, -17), std::ldexp(3.0f, -17), std::ldexp(1.0f, -16), 0.25f,
                          0.75f, 5.0f, -5.5f};
  std::mt19937_64 rng(41);
  while (static_cast<int64_t>(v.size()) < T * C) {
    const uint32_t u = static_cast<uint32_t>(rng());
    const uint32_t near = (u & 0x807FFFFFu) | (static_cast<uint32_t>(107 + (rng() % 41)) << 23);
    v.push_back(std::bit_cast<float>(v.size() % 2 ? u : near));
  }
  Tensor x = Tensor::empty({T, C}, DType::F32, host());
  std::copy(v.begin(), v.end(), x.data_as<float>());
  const std::vector<int64_t> counts = {T};
  for (const Fp8Format f : {Fp8Format::E4M3, Fp8Format::Hybrid}) {  // Hybrid: e5m2 gradients
    // Per group, and fp8-block's 1×128 / 128×1 blocks (the same codes: its one-read kernel).
    for (const QuantSpec spec : {Recipe::fp8_current(f).spec(QuantRole::GradOutput),
                                 Recipe::fp8_block(f).spec(QuantRole::GradOutput)}) {
      SCOPED_TRACE(str(spec.format == QuantFormat::E4M3 ? "e4m3" : "e5m2",
                       spec.scaling == Scaling::PerGroup ? " per group" : " 1x128 blocks"));
      const QuantizedTensor q = host_copy(
          gpu, quantize(gpu, to_device(gpu, x), Splits::host(counts), spec, QuantUsage::Both));
      if (spec.scaling == Scaling::PerGroup) {
        ASSERT_EQ(q.amax.data_as<float>()[0], INFINITY);
      }
      EXPECT_TRUE(matches_reference(q, ref_quantize(v, T, C, counts, spec, DType::F32), counts));
    }
  }
}

// The 16-bit inputs' edges through fp8-current's and fp8-block's quantizes, bit for bit against
// the reference: rows holding every bf16 / f16 bit pattern (NaNs, infinities, subnormals, ±0 —
// blocks whose amax is infinite, scale 1), and rows of normal values with one NaN, one infinity,
// a -0 or a subnormal among them (NaN never wins a maximum; an infinite one gives scale 1), in
// groups of 0 rows and of row counts off the 128-row blocks. On the GPU these are the 16-bit
// paths of the one-read kernels (packed |x| maxima, a row's maximum by redux.sync on its f32
// bits, NaN fix-ups only in warps holding one).
void check_sixteen_bit_edges(const Context& ctx) {
  const std::vector<int64_t> counts = {200, 0, 131, 181};
  const int64_t T = 512, C = 1024;  // C % 4 == 0: the vector paths
  for (const DType dt : {DType::BF16, DType::F16}) {
    Tensor x = random_normal({T, C}, dt, 77, 3.0);
    uint16_t* u = x.data_as<uint16_t>();
    const uint16_t inf = dt == DType::BF16 ? 0x7F80 : 0x7C00, nan = dt == DType::BF16 ? 0x7FC1 : 0x7E01;
    std::mt19937 rng(5);
    uint32_t pattern = 0;
    for (int64_t r = 0; r < T; ++r) {
      uint16_t* row = u + r * C;
      const int64_t at = static_cast<int64_t>(rng() % C);
      switch (r % 4) {
        case 0:  // the next C of the 65536 patterns (every one appears twice)
          for (int64_t c = 0; c < C; ++c) row[c] = static_cast<uint16_t>(pattern++);
          break;
        case 1: row[at] = static_cast<uint16_t>(nan | (rng() % 2 ? 0x8000 : 0)); break;
        case 2: row[at] = static_cast<uint16_t>(inf | (rng() % 2 ? 0x8000 : 0)); break;
        default: row[at] = rng() % 2 ? uint16_t{0x8000} : uint16_t{0x0001}; break;  // -0, subnormal
      }
    }
    ASSERT_GE(pattern, 65536u * 2);
    const Tensor x_d = ctx.device().is_cuda() ? to_device(ctx, x) : x;
    for (const Fp8Format f : {Fp8Format::E4M3, Fp8Format::Hybrid}) {
      for (const QuantSpec spec : {Recipe::fp8_current(f).spec(QuantRole::GradOutput),
                                   Recipe::fp8_block(f).spec(QuantRole::GradOutput)}) {
        SCOPED_TRACE(str(name(dt), spec.format == QuantFormat::E4M3 ? " e4m3" : " e5m2",
                         spec.scaling == Scaling::PerGroup ? " per group" : " 1x128 blocks"));
        QuantizedTensor q = quantize(ctx, x_d, Splits::host(counts), spec, QuantUsage::Both);
        if (ctx.device().is_cuda()) q = host_copy(ctx, q);
        EXPECT_TRUE(matches_reference(q, ref_quantize(floats_of(x), T, C, counts, spec, dt), counts));
      }
    }
  }
}
TEST(QuantizeCpu, SixteenBitEdgesAndEveryBitPatternEqualTheReference) { check_sixteen_bit_edges(host()); }
TEST(QuantizeCuda, SixteenBitEdgesAndEveryBitPatternEqualTheCpu) {
  MOEKIT_REQUIRE_CUDA();
  check_sixteen_bit_edges(Context::cuda(0));
}

TEST(QuantizeCuda, FuzzedShapesEqualTheCpuQuantizeBitForBit) {
  MOEKIT_REQUIRE_CUDA();
  const Context gpu = Context::cuda(0);
  std::mt19937_64 rng(4242);
  auto uni = [&rng](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  const std::vector<NamedSpec> specs = every_spec();
  for (int iter = 0; iter < 3 * static_cast<int>(specs.size()); ++iter) {
    const NamedSpec& ns = specs[static_cast<size_t>(iter) % specs.size()];
    const bool fp4 = ns.spec.format == QuantFormat::E2M1;
    std::vector<int64_t> counts(static_cast<size_t>(uni(1, 6)));
    for (auto& c : counts) c = uni(0, 3) == 0 ? 0 : uni(1, 300) * (fp4 ? 2 : 1);
    // Half the trials C % 4 == 0 (the kernels' vector paths), half any C.
    const int64_t T = sum_of(counts) + uni(0, 9), C = uni(1, 300) * (fp4 ? 2 : 1) * (iter % 2 ? 4 : 1);
    const size_t round = static_cast<size_t>(iter) / specs.size();  // each spec: every usage once
    const size_t d = (static_cast<size_t>(iter) + round) % 3;          // and every dtype once
    const DType dt = d == 0 ? DType::F32 : d == 1 ? DType::F16 : DType::BF16;
    const QuantUsage usage = round == 1 ? QuantUsage::Rowwise
                             : round == 2 ? QuantUsage::Columnwise
                                          : QuantUsage::Both;
    SCOPED_TRACE(str(ns.name, " T=", T, " C=", C, " counts=", ::testing::PrintToString(counts), " ",
                     name(dt), " usage ", static_cast<int>(usage)));
    const Tensor x = random_normal({T, C}, dt, 900 + iter, std::ldexp(1.0, uni(-10, 10)));
    const QuantizedTensor q = host_copy(
        gpu, quantize(gpu, to_device(gpu, x), Splits::host(counts), ns.spec, usage));
    EXPECT_TRUE(
        matches_reference(q, ref_quantize(floats_of(x), T, C, counts, ns.spec, dt), counts));
  }
}

TEST(QuantizeCuda, TheBiasGradientBesideTheQuantizeIsTheColumnSumsOfEachGroup) {
  MOEKIT_REQUIRE_CUDA();
  check_quantize_with_db(poisoned(Context::cuda(0)));
}

TEST(QuantizeCuda, GraphCapturedQuantizeReplaysWithNewDeviceCounts) {
  MOEKIT_REQUIRE_CUDA();
  const test::CudaGraphApi& api = test::CudaGraphApi::get();
  ASSERT_TRUE(api.ok) << "libcudart entry points not found through dlopen";
  const test::OwnedStream owned(api);
  ASSERT_NE(owned.get(), nullptr);
  const Context gpu = Context::cuda(0, owned.get());
  const int64_t T = 520, C = 256;
  const Tensor x = random_normal({T, C}, DType::BF16, 21);
  const Tensor x_d = to_device(gpu, x);
  const Tensor counts_d = to_device(gpu, counts_tensor({256, 0, 200, 64}, DType::I64));
  for (const char* r : {"fp8-current", "fp8-block", "mxfp8", "nvfp4"}) {
    SCOPED_TRACE(r);
    const QuantSpec spec = Recipe::parse(r).spec(QuantRole::Input);
    const QuantizedTensor q = allocate_quantized(gpu, spec, DType::BF16, T, C, 4, QuantUsage::Both);
    GuardedBuffer db(gpu, {4, C}, DType::F32);  // the bias gradient beside it (fused: fp8-*)
    const detail::Plan plan = detail::bind_quantize(gpu, x_d, Splits::device(counts_d), q, db.view);
    gpu.synchronize();
    void* graph = nullptr;
    void* exec = nullptr;
    ASSERT_EQ(api.capture(
                  owned.get(), [&] { plan.run(); }, &graph),
              "");
    ASSERT_EQ(api.instantiate(&exec, graph, 0), 0);
    for (const std::vector<int64_t>& counts : std::vector<std::vector<int64_t>>{
             {256, 0, 200, 64}, {0, 2, 500, 0}, {0, 0, 0, 0}, {130, 130, 130, 130}}) {
      copy(gpu, counts_tensor(counts, DType::I64), counts_d);
      ASSERT_EQ(api.launch(exec, owned.get()), 0);
      ASSERT_EQ(api.stream_sync(owned.get()), 0);
      EXPECT_TRUE(matches_reference(
          host_copy(gpu, q), ref_quantize(floats_of(x), T, C, counts, spec, DType::BF16), counts))
          << "replay with counts " << ::testing::PrintToString(counts);
      std::vector<double> xs = to_doubles(host(), x);
      xs.resize(static_cast<size_t>(sum_of(counts) * C));
      EXPECT_TRUE(matches_reference("db", db.values(), reference_dbias(xs, counts, C), DType::F32))
          << "replay with counts " << ::testing::PrintToString(counts);
      EXPECT_TRUE(db.untouched_outside(4));
    }
    EXPECT_EQ(gpu.device_error_bits(), 0u);
    api.exec_destroy(exec);
    api.graph_destroy(graph);
  }
}

TEST(QuantizeCuda, InvalidDeviceCountsWriteNothingAndSetTheErrorWord) {
  MOEKIT_REQUIRE_CUDA();
  const Context gpu = poisoned(Context::cuda(0));
  const Tensor x_d = to_device(gpu, random_normal({64, 128}, DType::BF16, 2));
  const Tensor counts_d = to_device(gpu, counts_tensor({40, 40}, DType::I32));  // S = 80 > T = 64
  const QuantizedTensor q =
      host_copy(gpu, quantize(gpu, x_d, Splits::device(counts_d),
                              Recipe::fp8_block().spec(QuantRole::Input), QuantUsage::Both));
  EXPECT_EQ(gpu.device_error_bits(), Context::kCountsExceedRows);
  for (const char* r : {"fp8-current", "fp8-block", "mxfp8"}) {  // with the bias gradient: fused or not
    GuardedBuffer db(gpu, {2, 128}, DType::BF16);
    const QuantSpec spec = Recipe::parse(r).spec(QuantRole::GradOutput);
    detail::bind_quantize(gpu, x_d, Splits::device(counts_d),
                          allocate_quantized(gpu, spec, DType::BF16, 64, 128, 2, QuantUsage::Both), db.view)
        .run();
    EXPECT_TRUE(db.untouched_outside(0)) << r;
  }
  for (int64_t i = 0; i < q.rowwise.numel(); ++i)
    ASSERT_EQ(q.rowwise.data_as<uint8_t>()[i], 0xFF) << i;
  for (int64_t i = 0; i < q.columnwise.numel(); ++i)
    ASSERT_EQ(q.columnwise.data_as<uint8_t>()[i], 0xFF) << i;
}

TEST(QuantizeCuda, OddDeviceCountsForNvfp4ColumnwiseWriteNothingAndSayWhy) {
  MOEKIT_REQUIRE_CUDA();
  const Context gpu = poisoned(Context::cuda(0));
  const Tensor x_d = to_device(gpu, random_normal({64, 32}, DType::BF16, 2));
  const Tensor counts_d = to_device(gpu, counts_tensor({31, 33}, DType::I64));
  const QuantizedTensor q =
      host_copy(gpu, quantize(gpu, x_d, Splits::device(counts_d),
                              Recipe::nvfp4().spec(QuantRole::Input), QuantUsage::Both));
  EXPECT_EQ(gpu.device_error_bits(), Context::kCountsMisaligned);
  for (int64_t i = 0; i < q.columnwise.numel(); ++i) {
    ASSERT_EQ(q.columnwise.data_as<uint8_t>()[i], 0xFF) << i;
  }
  for (int64_t i = 0; i < q.rowwise.numel(); ++i)
    ASSERT_EQ(q.rowwise.data_as<uint8_t>()[i], 0xFF) << i;
  // check_device_errors names the rule.
  quantize(gpu, x_d, Splits::device(counts_d), Recipe::nvfp4().spec(QuantRole::Input),
           QuantUsage::Both);
  auto e = caught([&] { gpu.check_device_errors(); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'splits'"), HasSubstr("not a multiple")));
}

}  // namespace
}  // namespace moekit
