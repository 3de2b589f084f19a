// test_core — core types: dtype conversions, Tensor, Allocator, Splits (SPEC §1), argument checks,
// Error, Context and backend forcing.
//
// Conversions are checked against a reference written from the format definitions (an
// independent decoder and a nearest-value search over every representable value, ties to the
// even code), exhaustively over every 16-bit and 8-bit pattern and every rounding midpoint.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <tuple>

#include "moekit/moekit.h"
#include "core/block_cache.h"
#include "core/checks.h"
#include "support/test_util.h"

namespace moekit {
namespace {

using test::caught;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// ================================================================ dtype conversions

// A binary floating-point storage format, from its definition.
struct Format {
  const char* label;
  DType dtype;
  int bits, ebits, mbits, bias;
  bool ieee;  // top exponent field = inf (m = 0) / NaN; else (e4m3 "fn") only S.1111.111 is NaN
};
constexpr Format kF16{"f16", DType::F16, 16, 5, 10, 15, true};
constexpr Format kBF16{"bf16", DType::BF16, 16, 8, 7, 127, true};
constexpr Format kE4M3{"f8e4m3", DType::F8E4M3, 8, 4, 3, 7, false};
constexpr Format kE5M2{"f8e5m2", DType::F8E5M2, 8, 5, 2, 15, true};
constexpr Format kFormats[] = {kF16, kBF16, kE4M3, kE5M2};

double decode_ref(uint32_t code, const Format& f) {
  const bool neg = (code >> (f.bits - 1)) & 1u;
  const int e = static_cast<int>((code >> f.mbits) & ((1u << f.ebits) - 1));
  const int m = static_cast<int>(code & ((1u << f.mbits) - 1));
  const int emax = (1 << f.ebits) - 1;
  double v;
  if (f.ieee && e == emax) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (!f.ieee && e == emax && m == (1 << f.mbits) - 1) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = m * std::pow(2.0, 1 - f.bias - f.mbits);  // subnormal
  } else {
    v = (1.0 + m / std::pow(2.0, f.mbits)) * std::pow(2.0, e - f.bias);
  }
  return neg ? -v : v;
}

// The library's scalar conversions, by format.
float lib_decode(uint32_t code, const Format& f) {
  switch (f.dtype) {
    case DType::F16:
      return f16_to_f32(static_cast<uint16_t>(code));
    case DType::BF16:
      return bf16_to_f32(static_cast<uint16_t>(code));
    case DType::F8E4M3:
      return f8e4m3_to_f32(static_cast<uint8_t>(code));
    default:
      return f8e5m2_to_f32(static_cast<uint8_t>(code));
  }
}
uint32_t lib_encode(float v, const Format& f) {
  switch (f.dtype) {
    case DType::F16:
      return f32_to_f16(v);
    case DType::BF16:
      return f32_to_bf16(v);
    case DType::F8E4M3:
      return f32_to_f8e4m3(v);
    default:
      return f32_to_f8e5m2(v);
  }
}
uint32_t lib_encode_f64(double v, const Format& f) {
  uint32_t out = 0;  // little-endian: the low bytes hold the code
  from_f64(&v, &out, f.dtype, 1);
  return out;
}

// Every non-negative finite value of a format, ascending, with its code.
struct Grid {
  std::vector<double> value;
  std::vector<uint32_t> code;
};
const Grid& grid(const Format& f) {
  static std::map<DType, Grid> cache;
  Grid& g = cache[f.dtype];
  if (g.value.empty()) {
    for (uint32_t c = 0; c < (1u << (f.bits - 1)); ++c) {
      const double v = decode_ref(c, f);
      if (std::isfinite(v)) {
        g.value.push_back(v);
        g.code.push_back(c);
      }
    }
  }
  return g;
}
uint32_t inf_code(const Format& f) {
  return ((1u << f.ebits) - 1) << f.mbits;
}

// Round to nearest, ties to the even code, by searching the value grid. Overflow: IEEE formats
// go to ±inf once past max + ulp(max)/2 (the tie goes to inf, whose code is even); the fp8
// formats saturate to ±max (the library's documented "satfinite" conversion). NaN: not handled.
uint32_t round_ref(double v, const Format& f) {
  const Grid& g = grid(f);
  const uint32_t sign = std::signbit(v) ? 1u << (f.bits - 1) : 0u;
  const double a = std::fabs(v);
  const double max = g.value.back();
  const bool saturate = f.dtype == DType::F8E4M3 || f.dtype == DType::F8E5M2;
  if (a >= max) {
    if (a == max || saturate) return sign | g.code.back();
    const double half_ulp = (max - g.value[g.value.size() - 2]) / 2;
    return sign | (a >= max + half_ulp ? inf_code(f) : g.code.back());
  }
  const size_t hi =
      static_cast<size_t>(std::upper_bound(g.value.begin(), g.value.end(), a) - g.value.begin());
  const size_t lo = hi - 1;
  if (g.value[lo] == a) return sign | g.code[lo];
  const double dlo = a - g.value[lo], dhi = g.value[hi] - a;
  if (dlo < dhi) return sign | g.code[lo];
  if (dhi < dlo) return sign | g.code[hi];
  return sign | ((g.code[lo] & 1u) == 0 ? g.code[lo] : g.code[hi]);
}

bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

TEST(DType, DecodeMatchesFormatDefinitionForEveryBitPattern) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.label);
    int bad = 0;
    for (uint32_t c = 0; c < (1u << f.bits); ++c) {
      const double want = decode_ref(c, f);
      const double got = lib_decode(c, f);
      if (!same_value(got, want) && bad++ < 5) {
        ADD_FAILURE() << "code 0x" << std::hex << c << std::dec << ": got " << got << ", want "
                      << want;
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

TEST(DType, EveryBitPatternRoundTripsExactly) {
  // encode(decode(c)) == c for every non-NaN code; NaN stays NaN. The one documented exception:
  // fp8 conversions saturate, so e5m2's ±inf codes come back as ±max (0x7B / 0xFB).
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.label);
    int bad = 0;
    for (uint32_t c = 0; c < (1u << f.bits); ++c) {
      const float v = lib_decode(c, f);
      const uint32_t back = lib_encode(v, f);
      if (std::isnan(v)) {
        if (!std::isnan(lib_decode(back, f)) && bad++ < 5) {
          ADD_FAILURE() << "NaN code 0x" << std::hex << c << " came back as non-NaN 0x" << back;
        }
        continue;
      }
      uint32_t want = c;
      if (f.dtype == DType::F8E5M2 && std::isinf(v)) want = (c & 0x80u) | 0x7Bu;
      if (back != want && bad++ < 5) {
        ADD_FAILURE() << "code 0x" << std::hex << c << " (" << std::dec << v << ") came back as 0x"
                      << std::hex << back << ", want 0x" << want;
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

TEST(DType, NarrowingRoundsToNearestEvenAtEveryMidpoint) {
  // For each pair of adjacent finite values (and the overflow boundary): the two values, the
  // exact midpoint (representable in f32 for all four formats) and the f32 neighbours of the
  // midpoint; both signs. Ties go to the even code.
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.label);
    const Grid& g = grid(f);
    std::vector<double> probes;
    for (size_t i = 0; i + 1 < g.value.size(); ++i) {
      const double lo = g.value[i], hi = g.value[i + 1];
      const float mid = static_cast<float>((lo + hi) / 2);
      ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2) << "midpoint not exact in f32";
      for (float p : {static_cast<float>(lo), mid, std::nextafter(mid, 0.0f),
                      std::nextafter(mid, INFINITY), static_cast<float>(hi)}) {
        probes.push_back(p);
      }
    }
    const double max = g.value.back(), ulp = max - g.value[g.value.size() - 2];
    for (double p : {max + ulp / 2, max + ulp / 4, max + ulp, max * 4, 1e30}) {
      probes.push_back(static_cast<float>(p));
    }
    probes.push_back(std::nextafter(static_cast<float>(max + ulp / 2), 0.0f));
    int bad = 0;
    for (double p : probes) {
      for (double v : {p, -p}) {
        const uint32_t want = round_ref(v, f);
        const uint32_t got = lib_encode(static_cast<float>(v), f);
        if (got != want && bad++ < 8) {
          ADD_FAILURE() << "encode(" << std::setprecision(17) << v << ") = 0x" << std::hex << got
                        << ", want 0x" << want;
        }
      }
    }
    EXPECT_EQ(bad, 0) << "of " << 2 * probes.size() << " probes";
  }
}

TEST(DType, NarrowingMatchesNearestEvenForRandomF32BitPatterns) {
  // Random f32 bit patterns cover every exponent: overflow, underflow to zero, subnormals.
  std::mt19937 rng(20240611);
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.label);
    int bad = 0;
    for (int i = 0; i < 200000; ++i) {
      const float v = std::bit_cast<float>(static_cast<uint32_t>(rng()));
      if (std::isnan(v)) continue;
      const uint32_t want = round_ref(v, f);
      const uint32_t got = lib_encode(v, f);
      if (got != want && bad++ < 8) {
        ADD_FAILURE() << "encode(" << std::setprecision(9) << v << ") = 0x" << std::hex << got
                      << ", want 0x" << want;
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

TEST(DType, FromF64RoundsOnceToNearestEven) {
  // from_f64 must round the double itself, not a float rounding of it: a value a hair above a
  // midpoint rounds up, a hair below rounds down (a double→f32→16-bit path turns both into a
  // tie and rounds them to even: double rounding).
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.label);
    const Grid& g = grid(f);
    int bad = 0;
    for (size_t i = 0; i + 1 < g.value.size(); ++i) {
      const double lo = g.value[i], hi = g.value[i + 1], mid = (lo + hi) / 2;
      for (double v : {mid * (1 + 0x1p-40), mid * (1 - 0x1p-40), mid, lo, hi}) {
        const uint32_t want = round_ref(v, f);
        const uint32_t got = lib_encode_f64(v, f);
        if (got != want && bad++ < 8) {
          ADD_FAILURE() << "from_f64(" << std::setprecision(17) << v << ") = 0x" << std::hex << got
                        << ", want 0x" << want;
        }
      }
    }
    EXPECT_EQ(bad, 0);
  }
  // Named instances: 1 + 2^-8 + 2^-40 is closer to bf16 1 + 2^-7 than to 1.
  uint16_t b = 0;
  const double v = 1 + 0x1p-8 + 0x1p-40;
  from_f64(&v, &b, DType::BF16, 1);
  EXPECT_EQ(b, 0x3F81);
  const double h = 1 + 0x1p-11 + 0x1p-40;
  from_f64(&h, &b, DType::F16, 1);
  EXPECT_EQ(b, 0x3C01);
}

TEST(DType, Bf16TiesGoToEven) {
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);                        // tie, 1.0 is even
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);                    // tie, 1 + 2^-6 is even
  EXPECT_EQ(f32_to_bf16(std::nextafter(1.0f + 0x1p-8f, 2.0f)), 0x3F81);  // just above: up
  EXPECT_EQ(f32_to_bf16(std::nextafter(1.0f + 0x1p-8f, 0.0f)), 0x3F80);  // just below: down
  EXPECT_EQ(f32_to_bf16(-(1.0f + 3 * 0x1p-8f)), 0xBF82);
}

TEST(DType, F16TiesGoToEven) {
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3C00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);
  EXPECT_EQ(f32_to_f16(std::nextafter(1.0f + 0x1p-11f, 2.0f)), 0x3C01);
  EXPECT_EQ(f32_to_f16(2049.0f), 0x6800);  // 2049 is a tie between 2048 and 2050 → 2048
  EXPECT_EQ(f32_to_f16(2051.0f), 0x6802);  // tie between 2050 and 2052 → 2052
}

TEST(DType, SubnormalsRoundCorrectly) {
  // f16: smallest subnormal 2^-24; 2^-25 is a tie with 0 → 0; 3·2^-25 ties 1 and 2 → 2.
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0x1p-25f), 0x8000);
  EXPECT_EQ(f32_to_f16(3 * 0x1p-25f), 0x0002);
  EXPECT_EQ(f32_to_f16(1023.5f * 0x1p-24f), 0x0400);  // largest subnormal + half: up to min normal
  EXPECT_EQ(f16_to_f32(0x03FF), 1023 * 0x1p-24f);
  // bf16 keeps f32's exponent range: subnormal quantum 2^-133.
  EXPECT_EQ(f32_to_bf16(0x1p-133f), 0x0001);
  EXPECT_EQ(f32_to_bf16(0x1p-134f), 0x0000);
  EXPECT_EQ(f32_to_bf16(3 * 0x1p-134f), 0x0002);
  EXPECT_EQ(f32_to_bf16(0x1p-149f), 0x0000);  // f32's smallest subnormal
  EXPECT_EQ(bf16_to_f32(0x0001), 0x1p-133f);
  // fp8: e4m3 smallest subnormal 2^-9, e5m2 2^-16.
  EXPECT_EQ(f32_to_f8e4m3(0x1p-9f), 0x01);
  EXPECT_EQ(f32_to_f8e4m3(0x1p-10f), 0x00);
  EXPECT_EQ(f32_to_f8e4m3(0x1.8p-9f), 0x02);
  EXPECT_EQ(f8e4m3_to_f32(0x07), 7 * 0x1p-9f);
  EXPECT_EQ(f32_to_f8e5m2(0x1p-16f), 0x01);
  EXPECT_EQ(f8e5m2_to_f32(0x03), 3 * 0x1p-16f);
}

TEST(DType, InfinityAndNaNAreKeptIn16BitFormats) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_f16(inf), 0x7C00);
  EXPECT_EQ(f32_to_f16(-inf), 0xFC00);
  EXPECT_EQ(f32_to_bf16(inf), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-inf), 0xFF80);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);                            // max
  EXPECT_EQ(f32_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7BFF);      // below max + ulp/2
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);                            // tie → inf (even)
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds past bf16 max
  for (uint32_t nan_bits : {0x7FC00000u, 0x7F800001u, 0xFFC00000u, 0x7FBFFFFFu, 0x7F800100u}) {
    const float nan = std::bit_cast<float>(nan_bits);
    EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(nan)))) << std::hex << nan_bits;
    // A NaN whose payload sits only in the low 16 bits must not truncate to inf.
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(nan)))) << std::hex << nan_bits;
  }
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7C00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7C01)));
  EXPECT_TRUE(std::isnan(bf16_to_f32(0x7F81)));
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
}

TEST(DType, Fp8E4M3SaturatesAt448AndHasNoInfinity) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f8e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(f32_to_f8e4m3(448.0f), 0x7E);
  EXPECT_EQ(f32_to_f8e4m3(464.0f), 0x7E);  // midpoint to the (NaN) next code: saturates
  EXPECT_EQ(f32_to_f8e4m3(480.0f), 0x7E);
  EXPECT_EQ(f32_to_f8e4m3(1e6f), 0x7E);
  EXPECT_EQ(f32_to_f8e4m3(-1e6f), 0xFE);
  EXPECT_EQ(f32_to_f8e4m3(inf), 0x7E);
  EXPECT_EQ(f32_to_f8e4m3(-inf), 0xFE);
  EXPECT_EQ(f32_to_f8e4m3(432.0f), 0x7E);  // tie between 416 (0x7D) and 448 (0x7E, even)
  EXPECT_EQ(f32_to_f8e4m3(400.0f), 0x7C);  // tie between 384 (0x7C, even) and 416 (0x7D)
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0xFF)));
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(f32_to_f8e4m3(std::nanf("")))));
  for (uint32_t c = 0; c < 256; ++c) {
    if ((c & 0x7F) != 0x7F) {
      EXPECT_TRUE(std::isfinite(f8e4m3_to_f32(static_cast<uint8_t>(c)))) << c;
    }
  }
}

TEST(DType, Fp8E5M2HasInfinityButConversionSaturatesAt57344) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f8e5m2_to_f32(0x7B), 57344.0f);
  EXPECT_EQ(f32_to_f8e5m2(57344.0f), 0x7B);
  EXPECT_EQ(f32_to_f8e5m2(61440.0f), 0x7B);  // midpoint to 65536: saturates, no inf
  EXPECT_EQ(f32_to_f8e5m2(1e9f), 0x7B);
  EXPECT_EQ(f32_to_f8e5m2(-1e9f), 0xFB);
  EXPECT_EQ(f32_to_f8e5m2(inf), 0x7B);
  EXPECT_EQ(f32_to_f8e5m2(-inf), 0xFB);
  EXPECT_TRUE(std::isinf(f8e5m2_to_f32(0x7C)));
  EXPECT_TRUE(std::isinf(f8e5m2_to_f32(0xFC)));
  for (uint8_t c : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}) EXPECT_TRUE(std::isnan(f8e5m2_to_f32(c)));
  EXPECT_TRUE(std::isnan(f8e5m2_to_f32(f32_to_f8e5m2(std::nanf("")))));
}

TEST(DType, BlockConversionsEqualScalarOnesForEveryPattern) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.label);
    const size_t n = size_t{1} << f.bits, es = size_of(f.dtype);
    std::vector<uint8_t> codes(n * es);
    for (uint32_t c = 0; c < n; ++c) std::memcpy(codes.data() + c * es, &c, es);
    std::vector<float> f32(n);
    std::vector<double> f64(n);
    to_f32(codes.data(), f.dtype, f32.data(), n);
    to_f64(codes.data(), f.dtype, f64.data(), n);
    std::vector<uint8_t> back32(n * es), back64(n * es);
    from_f32(f32.data(), back32.data(), f.dtype, n);
    from_f64(f64.data(), back64.data(), f.dtype, n);
    int bad = 0;
    for (uint32_t c = 0; c < n; ++c) {
      const float scalar = lib_decode(c, f);
      uint32_t e32 = 0, e64 = 0;
      std::memcpy(&e32, back32.data() + c * es, es);
      std::memcpy(&e64, back64.data() + c * es, es);
      if (!same_value(f32[c], scalar) || !same_value(f64[c], scalar) ||
          e32 != lib_encode(scalar, f) || e64 != lib_encode(scalar, f)) {
        if (bad++ < 5) ADD_FAILURE() << "code 0x" << std::hex << c;
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

TEST(DType, EpsilonIsTheSpacingAtOne) {
  // The tests' tolerances are built on epsilon(): it must be the format's spacing at 1.0.
  for (const Format& f : kFormats) {
    const uint32_t one = lib_encode(1.0f, f);
    EXPECT_EQ(lib_decode(one + 1, f) - 1.0f, epsilon(f.dtype)) << f.label;
  }
  EXPECT_EQ(std::nextafter(1.0f, 2.0f) - 1.0f, epsilon(DType::F32));
}

TEST(DType, NamesParseBackAndUnknownNamesAreRejected) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F8E4M3, DType::F8E5M2, DType::I32,
                  DType::I64, DType::U8}) {
    EXPECT_EQ(parse_dtype(name(t)), t) << name(t);
  }
  auto e = caught([] { parse_dtype("f64"); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'dtype'"), HasSubstr("bf16"), HasSubstr("got f64")));
  EXPECT_EQ(size_of(DType::BF16), 2u);
  EXPECT_EQ(size_of(DType::F8E5M2), 1u);
  EXPECT_EQ(size_of(DType::I64), 8u);
  EXPECT_TRUE(is_compute_dtype(DType::BF16));
  EXPECT_FALSE(is_compute_dtype(DType::F8E4M3));
  EXPECT_TRUE(is_floating(DType::F8E4M3));
  EXPECT_FALSE(is_floating(DType::I32));
}

// ================================================================ Tensor

TEST(Tensor, WrapDescribesCallerMemoryWithoutOwningIt) {
  std::vector<float> mem(12);
  Tensor t = Tensor::wrap(mem.data(), {3, 4}, DType::F32, Device::cpu());
  EXPECT_TRUE(t.defined());
  EXPECT_FALSE(t.owns_memory());
  EXPECT_EQ(t.data(), mem.data());
  EXPECT_EQ(t.shape(), (Shape{3, 4}));
  EXPECT_EQ(t.strides(), (Shape{4, 1}));
  EXPECT_EQ(t.dim(), 2);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.describe(), "f32[3, 4] on cpu");
  EXPECT_FALSE(Tensor().defined());
  // A CUDA-labelled wrap is only metadata: creating it never touches the memory.
  Tensor d = Tensor::wrap(mem.data(), {3, 4}, DType::F32, Device::cuda(0));
  EXPECT_EQ(d.device(), Device::cuda(0));
  EXPECT_EQ(d.describe(), "f32[3, 4] on cuda:0");
}

TEST(Tensor, WrapRejectsBadArguments) {
  std::vector<float> mem(4);
  auto e = caught([] { Tensor::wrap(nullptr, {2, 2}, DType::F32, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'data'"), HasSubstr("non-null"), HasSubstr("nullptr")));
  EXPECT_FALSE(caught([] { Tensor::wrap(nullptr, {0, 2}, DType::F32, Device::cpu()); }));
  e = caught([&] { Tensor::wrap(mem.data(), {2, -2}, DType::F32, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'shape'"), HasSubstr("[2, -2]")));
  e = caught([&] { Tensor::wrap(mem.data(), {2, 2}, {2}, DType::F32, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'strides'"), HasSubstr("2 entries"), HasSubstr("[2]")));
  e = caught([&] { Tensor::wrap(mem.data(), {2, 2}, DType::F32, Device::cpu()).size(2); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'dim'"), HasSubstr("[-2, 2)"), HasSubstr("got 2")));
}

TEST(Tensor, EmptyAllocatesExactlyItsBytesThroughTheContextAllocator) {
  Context ctx = Context::cpu();
  ctx.allocator().reset_stats();
  {
    Tensor t = Tensor::empty({5, 7}, DType::BF16, ctx);
    EXPECT_TRUE(t.owns_memory());
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_EQ(t.device(), Device::cpu());
    Tensor copy_of_handle = t;  // copying the handle allocates nothing
    EXPECT_EQ(copy_of_handle.data(), t.data());
  }
  const auto s = ctx.allocator().stats();
  EXPECT_EQ(s.count, 1);
  EXPECT_EQ(s.bytes, 5 * 7 * 2);
  EXPECT_EQ(s.largest, 5 * 7 * 2);
  ctx.allocator().reset_stats();
  EXPECT_EQ(ctx.allocator().stats().bytes, 0);
  EXPECT_EQ(ctx.allocator().stats().count, 0);
}

TEST(Tensor, RowsIsAViewOfARowRange) {
  Tensor t = test::random_normal({6, 5}, DType::F16, 1);
  Tensor r = t.rows(2, 5);
  EXPECT_EQ(r.shape(), (Shape{3, 5}));
  EXPECT_EQ(r.data(), static_cast<char*>(t.data()) + 2 * 5 * 2);
  EXPECT_TRUE(r.owns_memory());  // shares the storage
  EXPECT_TRUE(r.is_contiguous());
  // The view survives its source handle.
  std::vector<uint8_t> before = test::bytes_of(test::host(), r);
  t = Tensor();
  EXPECT_TRUE(test::bit_identical(test::bytes_of(test::host(), r), before, DType::F16));
  Tensor e = r.rows(1, 1);
  EXPECT_EQ(e.numel(), 0);
  auto err = caught([&] { r.rows(2, 4); });
  ASSERT_TRUE(err);
  EXPECT_THAT(err->what(), AllOf(HasSubstr("'rows'"), HasSubstr("0 <= begin <= end <= 3"),
                                 HasSubstr("got [2, 4)")));
  EXPECT_TRUE(caught([&] { r.rows(-1, 1); }));
  EXPECT_TRUE(caught([&] { r.rows(2, 1); }));
}

TEST(Tensor, IndexDropsTheFirstDimension) {
  Tensor w = test::random_normal({4, 3, 2}, DType::F32, 2);
  Tensor w2 = w.index(2);
  EXPECT_EQ(w2.shape(), (Shape{3, 2}));
  EXPECT_EQ(w2.strides(), (Shape{2, 1}));
  EXPECT_EQ(w2.data(), w.data_as<float>() + 2 * 6);
  EXPECT_TRUE(w2.is_contiguous());
  auto e = caught([&] { w.index(4); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'index'"), HasSubstr("[0, 4)"), HasSubstr("got 4")));
  EXPECT_TRUE(caught([&] { w.index(-1); }));
}

TEST(Tensor, ViewReshapesContiguousTensorsOnly) {
  Tensor t = test::random_normal({4, 6}, DType::F32, 3);
  Tensor v = t.view({2, 3, 4});
  EXPECT_EQ(v.data(), t.data());
  EXPECT_EQ(v.strides(), (Shape{12, 4, 1}));
  auto e = caught([&] { t.view({5, 5}); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("24 elements"), HasSubstr("[5, 5]")));
  Tensor strided = Tensor::wrap(t.data(), {4, 3}, {6, 2}, DType::F32, Device::cpu());
  e = caught([&] { strided.view({12}); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'view'"), HasSubstr("contiguous")));
}

TEST(Tensor, ContiguityIsRowMajorDenseIgnoringSizeOneDims) {
  std::vector<float> mem(64);
  auto wrap = [&](Shape shape, Shape strides) {
    return Tensor::wrap(mem.data(), shape, strides, DType::F32, Device::cpu());
  };
  EXPECT_TRUE(wrap({4, 8}, {8, 1}).is_contiguous());
  EXPECT_FALSE(wrap({4, 7}, {8, 1}).is_contiguous());   // padded rows
  EXPECT_FALSE(wrap({4, 8}, {1, 4}).is_contiguous());   // column-major
  EXPECT_FALSE(wrap({4, 4}, {8, 2}).is_contiguous());   // every other column
  EXPECT_TRUE(wrap({1, 8}, {999, 1}).is_contiguous());  // size-1 dim: stride irrelevant
  EXPECT_TRUE(wrap({4, 1, 8}, {8, 3, 1}).is_contiguous());
  EXPECT_TRUE(wrap({0, 8}, {8, 1}).is_contiguous());
  EXPECT_THAT(wrap({4, 7}, {8, 1}).describe(), HasSubstr("non-contiguous"));
}

TEST(Tensor, ByteExtentCoversExactlyTheReachableBytes) {
  std::vector<float> mem(64);
  const auto base = reinterpret_cast<uintptr_t>(mem.data());
  Tensor c = Tensor::wrap(mem.data(), {3, 4}, DType::F32, Device::cpu());
  EXPECT_EQ(c.byte_extent(), std::make_pair(base, base + 48));
  Tensor s = Tensor::wrap(mem.data(), {3, 4}, {10, 2}, DType::F32, Device::cpu());
  EXPECT_EQ(s.byte_extent(), std::make_pair(base, base + (2 * 10 + 3 * 2 + 1) * 4));
  Tensor neg = Tensor::wrap(mem.data() + 20, {3}, {-5}, DType::F32, Device::cpu());
  EXPECT_EQ(neg.byte_extent(), std::make_pair(base + 40, base + 84));
  Tensor e = Tensor::wrap(mem.data() + 3, {0, 4}, DType::F32, Device::cpu());
  EXPECT_EQ(e.byte_extent().first, e.byte_extent().second);
  Tensor h = Tensor::wrap(mem.data(), {5}, DType::BF16, Device::cpu());
  EXPECT_EQ(h.byte_extent(), std::make_pair(base, base + 10));
}

TEST(Tensor, OverlapsDetectsSharedBytesOnly) {
  std::vector<float> mem(64);
  auto rows = [&](int64_t b, int64_t e) {
    return Tensor::wrap(mem.data() + b * 4, {e - b, 4}, DType::F32, Device::cpu());
  };
  EXPECT_TRUE(overlaps(rows(0, 4), rows(0, 4)));
  EXPECT_TRUE(overlaps(rows(0, 4), rows(3, 6)));
  EXPECT_TRUE(overlaps(rows(3, 6), rows(0, 4)));
  EXPECT_TRUE(overlaps(rows(0, 8), rows(2, 3)));   // contained
  EXPECT_FALSE(overlaps(rows(0, 4), rows(4, 8)));  // adjacent, not overlapping
  EXPECT_FALSE(overlaps(rows(4, 8), rows(0, 4)));
  EXPECT_FALSE(overlaps(rows(0, 2), rows(5, 8)));
  EXPECT_FALSE(overlaps(rows(2, 2), rows(0, 8)));  // empty tensors overlap nothing
  EXPECT_FALSE(overlaps(Tensor(), rows(0, 8)));
  // One byte of overlap counts: a bf16 view starting inside the last f32 element.
  Tensor half = Tensor::wrap(reinterpret_cast<char*>(mem.data()) + 4 * 4 - 2, {4}, DType::BF16,
                             Device::cpu());
  EXPECT_TRUE(overlaps(rows(0, 1), half));
  // Same address on different devices is different memory.
  Tensor dev = Tensor::wrap(mem.data(), {4, 4}, DType::F32, Device::cuda(0));
  EXPECT_FALSE(overlaps(rows(0, 4), dev));
  EXPECT_TRUE(overlaps(dev, Tensor::wrap(mem.data() + 8, {2}, DType::F32, Device::cuda(0))));
}

TEST(Tensor, CopyFillAndToDeviceOnTheHost) {
  const Context& ctx = test::host();
  Tensor a = test::random_normal({3, 5}, DType::BF16, 4);
  Tensor b = to_device(ctx, a);
  EXPECT_NE(b.data(), a.data());
  EXPECT_TRUE(test::bit_identical(test::bytes_of(ctx, b), test::bytes_of(ctx, a), DType::BF16));
  fill(ctx, b, -2.5);
  for (double v : test::to_doubles(ctx, b)) EXPECT_EQ(v, -2.5);
  Tensor i = Tensor::empty({4}, DType::I32, ctx);
  fill(ctx, i, 9);
  for (double v : test::to_doubles(ctx, i)) EXPECT_EQ(v, 9);
  auto e = caught([&] { copy(ctx, a, Tensor::empty({5, 3}, DType::BF16, ctx)); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(),
              AllOf(HasSubstr("'dst'"), HasSubstr("shape [3, 5]"), HasSubstr("got [5, 3]")));
  e = caught([&] { copy(ctx, a, Tensor::empty({3, 5}, DType::F16, ctx)); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'dst'"), HasSubstr("dtype bf16"), HasSubstr("got f16")));
}

TEST(Tensor, ShapeToString) {
  EXPECT_EQ(to_string(Shape{96, 64}), "[96, 64]");
  EXPECT_EQ(to_string(Shape{}), "[]");
  EXPECT_EQ(numel(Shape{2, 3, 4}), 24);
  EXPECT_EQ(numel(Shape{2, 0}), 0);
}

// ================================================================ Splits (SPEC §1)

TEST(Splits, ValidHostCountsPass) {
  EXPECT_FALSE(caught([] {
    validate_splits(Splits::host({3, 0, 7}), 3, 10, Device::cpu());
  }));  // S == T
  EXPECT_FALSE(caught([] {
    validate_splits(Splits::host({0, 0, 0}), 3, 10, Device::cpu());
  }));  // all empty
  EXPECT_FALSE(caught([] {
    validate_splits(Splits::host({2, 0, 1}), 3, 10, Device::cpu());
  }));  // tail
  EXPECT_FALSE(caught([] { validate_splits(Splits::host({0}), 1, 0, Device::cpu()); }));
  Splits s = Splits::host({4, 0, 2});
  EXPECT_TRUE(s.on_host());
  EXPECT_EQ(s.groups(), 3);
  EXPECT_EQ(s.host_counts(), (std::vector<int64_t>{4, 0, 2}));
  EXPECT_EQ(offsets_of({4, 0, 2}), (std::vector<int64_t>{0, 4, 4, 6}));
}

TEST(Splits, NegativeCountIsRejectedNamingValue) {
  auto e = caught([] { validate_splits(Splits::host({2, -3, 4}), 3, 10, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'splits'"), HasSubstr("expected every count >= 0"),
                               HasSubstr("got count -3 for group 1"), HasSubstr("[2, -3, 4]")));
}

TEST(Splits, WrongGroupCountIsRejectedNamingBoth) {
  auto e = caught([] { validate_splits(Splits::host({2, 3, 4}), 4, 10, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'splits'"), HasSubstr("expected 4 group counts"),
                               HasSubstr("got 3 counts")));
}

TEST(Splits, TotalAboveRowsIsRejectedNamingSAndT) {
  auto e = caught([] { validate_splits(Splits::host({5, 0, 7}), 3, 10, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
  EXPECT_THAT(e->what(),
              AllOf(HasSubstr("'splits'"), HasSubstr("S <= T = 10"), HasSubstr("got S = 12")));
}

TEST(Splits, HugeCountsCannotOverflowTheTotal) {
  // Each count >= 0 but the int64 sum wraps negative: must still be S > T, never accepted (the
  // kernels would read and write far out of bounds).
  const int64_t big = std::numeric_limits<int64_t>::max();
  auto e = caught([&] { validate_splits(Splits::host({big, 2}), 2, 10, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'splits'"), HasSubstr("S <= T = 10")));
  e = caught([&] {
    validate_splits(Splits::host({big / 2 + 1, big / 2 + 1, 0}), 3, 10, Device::cpu());
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("S <= T = 10"));
  Tensor c = test::counts_tensor({big, big, 5}, DType::I64);
  e = caught([&] { validate_splits(Splits::device(c), 3, 10, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("S <= T = 10"));
}

TEST(Splits, ArgumentNameIsTheCallersName) {
  auto e = caught([] { validate_splits(Splits::host({-1}), 1, 10, Device::cpu(), "m_splits"); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'m_splits'"));
}

class DeviceCounts : public ::testing::TestWithParam<DType> {};

TEST_P(DeviceCounts, ValidCountsPassAndReadBack) {
  const std::vector<int64_t> counts{3, 0, 5, 1};
  Splits s = Splits::device(test::counts_tensor(counts, GetParam()));
  EXPECT_FALSE(s.on_host());
  EXPECT_EQ(s.groups(), 4);
  EXPECT_FALSE(caught([&] { validate_splits(s, 4, 9, Device::cpu()); }));
  EXPECT_EQ(read_counts(test::host(), s), counts);
  auto e = caught([&] { s.host_counts(); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(),
              AllOf(HasSubstr("'splits'"), HasSubstr("host counts"), HasSubstr("device counts")));
}

TEST_P(DeviceCounts, NegativeCountIsRejectedNamingValue) {
  Splits s = Splits::device(test::counts_tensor({3, 0, -5, 1}, GetParam()));
  auto e = caught([&] { validate_splits(s, 4, 9, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'splits'"), HasSubstr("every count >= 0"),
                               HasSubstr("got count -5 for group 2")));
}

TEST_P(DeviceCounts, TotalAboveRowsIsRejected) {
  Splits s = Splits::device(test::counts_tensor({3, 0, 5, 2}, GetParam()));
  auto e = caught([&] { validate_splits(s, 4, 9, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(),
              AllOf(HasSubstr("'splits'"), HasSubstr("S <= T = 9"), HasSubstr("got S = 10")));
}

TEST_P(DeviceCounts, WrongShapeIsRejectedNamingBoth) {
  Tensor c = test::counts_tensor({1, 2, 3, 4}, GetParam());
  auto e = caught([&] { validate_splits(Splits::device(c.view({2, 2})), 4, 10, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(),
              AllOf(HasSubstr("'splits'"), HasSubstr("shape [4]"), HasSubstr("got [2, 2]")));
  e = caught([&] { validate_splits(Splits::device(c), 3, 10, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("shape [3]"), HasSubstr("got [4]")));
}

TEST_P(DeviceCounts, WrongDeviceIsRejectedNamingBoth) {
  Tensor c = test::counts_tensor({1, 2}, GetParam());
  Tensor on_gpu = Tensor::wrap(c.data(), {2}, GetParam(), Device::cuda(0));  // metadata only
  auto e = caught([&] { validate_splits(Splits::device(on_gpu), 2, 10, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(),
              AllOf(HasSubstr("'splits'"), HasSubstr("counts on cpu"), HasSubstr("got cuda:0")));
}

TEST_P(DeviceCounts, NonContiguousIsRejected) {
  Tensor c = test::counts_tensor({1, 9, 2, 9}, GetParam());
  Tensor strided = Tensor::wrap(c.data(), {2}, {2}, GetParam(), Device::cpu());
  auto e = caught([&] { validate_splits(Splits::device(strided), 2, 10, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'splits'"), HasSubstr("contiguous")));
}

INSTANTIATE_TEST_SUITE_P(Counts, DeviceCounts, ::testing::Values(DType::I32, DType::I64),
                         [](const auto& info) { return std::string(name(info.param)); });

TEST(Splits, DeviceCountsOfWrongDtypeAreRejectedNamingBoth) {
  for (DType t : {DType::F32, DType::U8, DType::BF16}) {
    Tensor c = Tensor::empty({3}, t, test::host());
    fill(test::host(), c, 1);
    auto e = caught([&] { validate_splits(Splits::device(c), 3, 10, Device::cpu()); });
    ASSERT_TRUE(e) << name(t);
    EXPECT_THAT(e->what(), AllOf(HasSubstr("'splits'"), HasSubstr("i32 or i64"),
                                 HasSubstr(std::string("got ") + std::string(name(t)))));
  }
  auto e = caught([] { Splits::device(Tensor()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'splits'"), HasSubstr("undefined")));
}

// ================================================================ argument checks

TEST(Checks, InputChecksShapeDtypeDeviceContiguityInThatOrder) {
  std::vector<float> mem(64);
  Tensor good = Tensor::wrap(mem.data(), {4, 8}, DType::F32, Device::cpu());
  EXPECT_FALSE(caught([&] { check_input("x", good, {-1, 8}, DType::F32, Device::cpu()); }));
  // Wrong in everything: shape is reported.
  Tensor all_bad = Tensor::wrap(mem.data(), {4, 7}, {9, 2}, DType::F16, Device::cuda(0));
  auto e = caught([&] { check_input("x", all_bad, {4, 8}, DType::F32, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(),
              AllOf(HasSubstr("'x'"), HasSubstr("expected shape [4, 8]"), HasSubstr("got [4, 7]")));
  Tensor dtype_bad = Tensor::wrap(mem.data(), {4, 8}, {9, 2}, DType::F16, Device::cuda(0));
  e = caught([&] { check_input("x", dtype_bad, {4, 8}, DType::F32, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("expected dtype f32"), HasSubstr("got f16")));
  Tensor device_bad = Tensor::wrap(mem.data(), {4, 8}, {9, 2}, DType::F32, Device::cuda(0));
  e = caught([&] { check_input("x", device_bad, {4, 8}, DType::F32, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("expected device cpu"), HasSubstr("got cuda:0")));
  Tensor strided = Tensor::wrap(mem.data(), {4, 8}, {9, 1}, DType::F32, Device::cpu());
  e = caught([&] { check_input("x", strided, {4, 8}, DType::F32, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("contiguous"), HasSubstr("strides [9, 1]")));
  e = caught([&] { check_input("x", Tensor(), {4, 8}, DType::F32, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'x'"), HasSubstr("[4, 8]"), HasSubstr("undefined")));
  e = caught([&] { check_input("x", good, {-1, 8, 1}, DType::F32, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("[*, 8, 1]"), HasSubstr("got [4, 8]")));
}

TEST(Checks, CallerBufferOverlapNamesTheInput) {
  std::vector<float> mem(64);
  Tensor in = Tensor::wrap(mem.data(), {4, 8}, DType::F32, Device::cpu());
  Tensor buf = Tensor::wrap(mem.data() + 24, {4, 8}, DType::F32, Device::cpu());
  auto e = caught([&] {
    check_caller_buffer("out", buf, {4, 8}, DType::F32, Device::cpu(),
                        {{"a", Tensor()}, {"x", in}});
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'out'"), HasSubstr("overlaps no input"),
                               HasSubstr("overlapping input 'x'"), HasSubstr("f32[4, 8] on cpu")));
  Tensor adjacent = Tensor::wrap(mem.data() + 32, {4, 8}, DType::F32, Device::cpu());
  EXPECT_FALSE(caught([&] {
    check_caller_buffer("out", adjacent, {4, 8}, DType::F32, Device::cpu(), {{"x", in}});
  }));
}

// ================================================================ Error

TEST(Error, KindsHaveNames) {
  EXPECT_EQ(name(ErrorKind::InvalidArgument), "invalid argument");
  EXPECT_EQ(name(ErrorKind::Unsupported), "unsupported");
  EXPECT_EQ(name(ErrorKind::Runtime), "runtime error");
  EXPECT_EQ(name(ErrorKind::Communication), "communication error");
}

TEST(Error, InvalidArgumentNamesArgumentExpectedAndSeen) {
  auto e = caught([] { throw_invalid("output", "shape [96, 64]", "[95, 64]"); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
  EXPECT_STREQ(e->what(),
               "moekit: invalid argument 'output': expected shape [96, 64], got [95, 64]");
}

TEST(Error, EveryKindIsThrownWithItsKindAndIsAStdRuntimeError) {
  for (ErrorKind k : {ErrorKind::InvalidArgument, ErrorKind::Unsupported, ErrorKind::Runtime,
                      ErrorKind::Communication}) {
    auto e = caught([&] { throw_error(k, "details 42"); });
    ASSERT_TRUE(e);
    EXPECT_EQ(e->kind(), k);
    EXPECT_EQ(std::string(e->what()), "moekit: " + std::string(name(k)) + ": details 42");
  }
  EXPECT_THROW(throw_error(ErrorKind::Runtime, "x"), std::runtime_error);
  EXPECT_EQ(str("a", 1, '-', 2.5), "a1-2.5");
}

// ================================================================ Context and backend forcing

TEST(Context, CpuContextDescribesItself) {
  Context ctx = Context::cpu(3);
  EXPECT_EQ(ctx.device(), Device::cpu());
  EXPECT_EQ(ctx.threads(), 3);
  EXPECT_EQ(ctx.allocator().device(), Device::cpu());
  EXPECT_EQ(ctx.forced_backend(), "");
  EXPECT_GE(Context::cpu().threads(), 1);
  ctx.synchronize();  // no-op on the CPU
  EXPECT_EQ(Device::cuda(2).to_string(), "cuda:2");
}

TEST(Context, CudaIsUnsupportedWithoutTheBackendOrInvalidForABadIndex) {
  if (!Context::built_with_cuda()) {
    EXPECT_EQ(Context::cuda_device_count(), 0);
    auto e = caught([] { Context::cuda(0); });
    ASSERT_TRUE(e);
    EXPECT_EQ(e->kind(), ErrorKind::Unsupported);
    EXPECT_THAT(e->what(), HasSubstr("without CUDA"));
    EXPECT_EQ(Context::best_available().device(), Device::cpu());
    return;
  }
  const int n = Context::cuda_device_count();
  auto e = caught([&] { Context::cuda(n); });
  ASSERT_TRUE(e);
  if (n == 0) {  // a CUDA build on a machine without a usable GPU: says so, not "[0, 0)"
    EXPECT_EQ(e->kind(), ErrorKind::Unsupported);
    EXPECT_THAT(e->what(), HasSubstr("no CUDA device"));
  } else {
    EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
    EXPECT_THAT(e->what(), AllOf(HasSubstr("'device'"), HasSubstr("got " + std::to_string(n))));
  }
  EXPECT_EQ(Context::best_available().device(), n > 0 ? Device::cuda(0) : Device::cpu());
}

// Context::release_cached_memory reaches the context's allocator (on the CPU nothing else: no pool).
TEST(Context, ReleaseCachedMemoryAsksTheContextsAllocator) {
  struct Keeping final : Allocator {
    int releases = 0;
    Device device() const override { return Device::cpu(); }
    void* do_allocate(size_t bytes) override { return std::malloc(bytes > 0 ? bytes : 1); }
    void do_deallocate(void* p, size_t) noexcept override { std::free(p); }
    void release_cached() override { ++releases; }
  };
  auto keeping = std::make_shared<Keeping>();
  const Context ctx = Context::cpu().with_allocator(keeping);
  ctx.release_cached_memory();
  ctx.release_cached_memory();
  EXPECT_EQ(keeping->releases, 2);
  Context::cpu().release_cached_memory();  // the default CPU allocator keeps nothing
}

TEST(Context, WithAllocatorRejectsNullAndForeignDevices) {
  Context ctx = Context::cpu();
  auto e = caught([&] { ctx.with_allocator(nullptr); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'allocator'"), HasSubstr("nullptr")));
  struct FakeGpuAllocator final : Allocator {
    Device device() const override { return Device::cuda(0); }
    void* do_allocate(size_t) override { return nullptr; }
    void do_deallocate(void*, size_t) noexcept override {}
  };
  e = caught([&] { ctx.with_allocator(std::make_shared<FakeGpuAllocator>()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(),
              AllOf(HasSubstr("'allocator'"), HasSubstr("for cpu"), HasSubstr("got cuda:0")));
  // A poisoning allocator is a real allocator of the same device: its memory is 0xFF-filled.
  Context p = test::poisoned(ctx);
  Tensor t = Tensor::empty({3}, DType::F32, p);
  for (double v : test::to_doubles(p, t)) EXPECT_TRUE(std::isnan(v));
  EXPECT_EQ(p.allocator().stats().bytes, 12);
}

TEST(Context, SmMarginIsCheckedKeptByCopiesAndIgnoredOnTheCpu) {
  const Context ctx = Context::cpu(2);
  EXPECT_EQ(ctx.sm_margin(), 0);
  auto e = caught([&] { ctx.with_sm_margin(-1); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'sms'"), HasSubstr(">= 0"), HasSubstr("got -1")));
  const Context m = ctx.with_sm_margin(16);
  EXPECT_EQ(m.sm_margin(), 16);
  EXPECT_EQ(ctx.sm_margin(), 0);  // a copy: the original keeps its own
  EXPECT_EQ(m.with_backend("cpu").sm_margin(), 16);
  EXPECT_EQ(test::poisoned(m).sm_margin(), 16);  // with_allocator
  EXPECT_EQ(m.with_sm_margin(0).sm_margin(), 0);
  // The CPU has no SMs to leave: the same results as without a margin.
  Tensor a = test::random_normal({5, 4}, DType::F32, 21),
         b = test::random_normal({2, 3, 4}, DType::F32, 22);
  Tensor out0 = test::host_filled({5, 3}, DType::F32, test::kSentinel);
  Tensor out1 = test::host_filled({5, 3}, DType::F32, test::kSentinel);
  grouped_gemm_group_m(ctx, a, b, BOp::Transposed, Splits::host({2, 3}), out0);
  grouped_gemm_group_m(m, a, b, BOp::Transposed, Splits::host({2, 3}), out1);
  EXPECT_EQ(test::to_doubles(ctx, out0), test::to_doubles(ctx, out1));
}

// A tiny group-M GEMM on the host: [3, 2] x [1, 2, 2]^T.
struct TinyGemm {
  Tensor a = test::random_normal({3, 2}, DType::F32, 11);
  Tensor b = test::random_normal({1, 2, 2}, DType::F32, 12);
  Tensor out = test::host_filled({3, 2}, DType::F32, test::kSentinel);
  Splits splits = Splits::host({3});
  void run(const Context& ctx) { grouped_gemm_group_m(ctx, a, b, BOp::Transposed, splits, out); }
};

class EnvGuard {
 public:
  explicit EnvGuard(const char* value) {
    if (const char* old = std::getenv("MOEKIT_BACKEND")) old_ = old, had_ = true;
    setenv("MOEKIT_BACKEND", value, 1);
  }
  ~EnvGuard() {
    had_ ? (void)setenv("MOEKIT_BACKEND", old_.c_str(), 1) : (void)unsetenv("MOEKIT_BACKEND");
  }

 private:
  std::string old_;
  bool had_ = false;
};

TEST(Backend, ForcingCpuRunsTheCpuBackendBitIdenticalToAutomatic) {
  Context ctx = Context::cpu();
  Context forced = ctx.with_backend("cpu");
  EXPECT_EQ(forced.forced_backend(), "cpu");
  EXPECT_EQ(ctx.forced_backend(), "");  // with_backend returns a copy
  TinyGemm automatic, cpu;
  automatic.run(ctx);
  cpu.run(forced);
  EXPECT_TRUE(test::bit_identical(test::bytes_of(ctx, cpu.out), test::bytes_of(ctx, automatic.out),
                                  DType::F32));
  const auto a = test::to_doubles(ctx, cpu.a), b = test::to_doubles(ctx, cpu.b);
  const auto y = test::to_doubles(ctx, cpu.out);
  EXPECT_NEAR(y[0], a[0] * b[0] + a[1] * b[1], 1e-5);  // it did run
}

TEST(Backend, UnknownForcedNameIsRejectedListingTheBackends) {
  TinyGemm g;
  auto e = caught([&] { g.run(Context::cpu().with_backend("nope")); });
  ASSERT_TRUE(e) << "a misspelt forced backend must not silently run another backend";
  EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'nope'"), HasSubstr("cpu")));
  EXPECT_TRUE(test::rows_hold_sentinel(test::bytes_of(test::host(), g.out), 0, 3, 2, DType::F32));
}

TEST(Backend, UnknownNameInEnvironmentIsRejectedToo) {
  EnvGuard env("nope");
  TinyGemm g;
  auto e = caught([&] { g.run(Context::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'nope'"), HasSubstr("MOEKIT_BACKEND"), HasSubstr("cpu")));
  // The context's own choice wins over the environment.
  TinyGemm ok;
  EXPECT_FALSE(caught([&] { ok.run(Context::cpu().with_backend("cpu")); }));
}

TEST(Backend, ForcedBackendThatCannotRunTheCallReportsItsReason) {
  if (!Context::built_with_cuda()) {
    GTEST_SKIP() << "built without CUDA: the CPU build has a single backend, none to mis-force";
  }
  TinyGemm g;
  auto e = caught([&] { g.run(Context::cpu().with_backend("cublas")); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::Unsupported);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("forced backend 'cublas'"), HasSubstr("cannot run")));
  EXPECT_TRUE(test::rows_hold_sentinel(test::bytes_of(test::host(), g.out), 0, 3, 2, DType::F32));
}

// ================================================================ size overflow (issue 39 §6)

constexpr int64_t kP62 = int64_t{1} << 62;

TEST(Overflow, NumelOfAShapeBeyondInt64IsRejectedNamingTheShape) {
  auto e = caught([] { numel({kP62, 4}); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'shape'"), HasSubstr("2^63 - 1 elements"),
                               HasSubstr("[4611686018427387904, 4]")));
  EXPECT_FALSE(caught([] { numel({3, kP62, 3, 0}); })) << "a zero size is 0 elements";
  EXPECT_EQ(numel({3, kP62, 3, 0}), 0);
  EXPECT_EQ(numel({kP62, 1}), kP62);
  EXPECT_EQ(numel({}), 1);
}

TEST(Overflow, EmptyRefusesAShapeBeyondInt64BeforeAllocating) {
  Context ctx = Context::cpu();
  ctx.allocator().reset_stats();
  // Elements beyond int64 (2^64: wrapped to 0 before, a defined tensor with null data).
  auto e = caught([&] { Tensor::empty({kP62, 4}, DType::F32, ctx); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'shape'"), HasSubstr("[4611686018427387904, 4]")));
  // Elements that fit, bytes that do not (2^62 f32 elements: 2^64 bytes).
  e = caught([&] { Tensor::empty({kP62 / 2, 2}, DType::F32, ctx); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'shape'"), HasSubstr("2^63 - 1 bytes"), HasSubstr("f32"),
                               HasSubstr("[2305843009213693952, 2]")));
  // No element, but strides past the zero size that overflow.
  e = caught([&] { Tensor::empty({0, kP62, 4}, DType::U8, ctx); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'shape'"), HasSubstr("[0, 4611686018427387904, 4]")));
  EXPECT_EQ(ctx.allocator().stats().count, 0) << "nothing may be allocated for a refused shape";
  // The same checks for views of caller memory and reshapes.
  std::vector<float> mem(4);
  e = caught([&] { Tensor::wrap(mem.data(), {kP62, 4}, DType::F32, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("[4611686018427387904, 4]"));
  e = caught([&] { Tensor::wrap(mem.data(), {2, 2}, {kP62, 1}, DType::F32, Device::cpu()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'strides'"), HasSubstr("[4611686018427387904, 1]")));
  e = caught([&] {
    Tensor::wrap(mem.data(), {2, 2}, {std::numeric_limits<int64_t>::min(), 1}, DType::F32,
                 Device::cpu());
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'strides'"));
  e = caught([&] { Tensor::wrap(mem.data(), {4}, DType::F32, Device::cpu()).view({kP62, 4}); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'shape'"), HasSubstr("[4611686018427387904, 4]")));
}

TEST(Overflow, AFailedAllocationThrowsAndNeverYieldsNullData) {
  // More bytes than any address space: the CPU allocator fails, and says so.
  Context ctx = Context::cpu();
  auto e = caught([&] { Tensor::empty({int64_t{1} << 40, int64_t{1} << 20}, DType::U8, ctx); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::Runtime);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("out of host memory"), HasSubstr("1152921504606846976")));
  // A caller's allocator that returns null instead of throwing: an error too, not a tensor.
  struct NullAllocator final : Allocator {
    Device device() const override { return Device::cpu(); }
    void* do_allocate(size_t) override { return nullptr; }
    void do_deallocate(void*, size_t) noexcept override {}
  };
  Context null_ctx = ctx.with_allocator(std::make_shared<NullAllocator>());
  e = caught([&] { Tensor::empty({16}, DType::F32, null_ctx); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::Runtime);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("out of memory"), HasSubstr("64 bytes")));
  EXPECT_TRUE(Tensor::empty({0, 16}, DType::F32, null_ctx).defined()) << "0 bytes need no memory";
}

TEST(Overflow, GroupedLinearOfTooManyWeightElementsIsRefusedAtConstruction) {
  const Context ctx = Context::cpu();
  // 2^22 · 2^21 · 2^21 = 2^64 weight elements (it used to build, then segfault).
  auto e = caught([&] {
    GroupedLinear fc({.groups = int64_t{1} << 22, .in = int64_t{1} << 21, .out = int64_t{1} << 21},
                     ctx);
  });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'shape'"), HasSubstr("[4194304, 2097152, 2097152]")));
  // Representable, but 2^50 bytes: the allocation fails with an error.
  e = caught([&] {
    GroupedLinear fc(
        {.groups = 1024, .in = int64_t{1} << 19, .out = int64_t{1} << 20, .dtype = DType::BF16},
        ctx);
  });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::Runtime);
}

// The CPU GEMMs pass K and N to CBLAS as ints: larger ones are refused before any work (they were
// narrowed: K = 2^32 + 4 computed with K = 4, K = 2^31 left the output unwritten). The operands
// are views of addresses nothing is ever read from or written to (the refusal comes first), far
// apart so that the overlap checks pass: no memory of their size is needed.
struct HugeOperands {
  static void* at(int i) {
    return reinterpret_cast<void*>(uintptr_t{1} << 44 | uintptr_t(i) << 40);
  }
  static Tensor view(int i, const Shape& shape) {
    return Tensor::wrap(at(i), shape, DType::F32, Device::cpu());
  }
};

TEST(Overflow, CpuGemmRefusesKAndNBeyondIntNamingTheDimension) {
  const Context ctx = Context::cpu();
  const int64_t over[] = {int64_t{1} << 31, (int64_t{1} << 32) + 4};
  for (int64_t big : over) {
    SCOPED_TRACE(big);
    // group-M (fprop): K = a's columns.
    auto e = caught([&] {
      grouped_gemm_group_m(ctx, HugeOperands::view(0, {1, big}), HugeOperands::view(1, {1, 2, big}),
                           BOp::Transposed, Splits::host({1}), HugeOperands::view(2, {1, 2}));
    });
    ASSERT_TRUE(e);
    EXPECT_EQ(e->kind(), ErrorKind::Unsupported);
    EXPECT_THAT(e->what(), AllOf(HasSubstr("K (a's columns) = " + std::to_string(big)),
                                 HasSubstr("limit of 2147483647")));
    // group-M (dgrad): N = out's columns.
    e = caught([&] {
      grouped_gemm_group_m(ctx, HugeOperands::view(0, {1, 2}), HugeOperands::view(1, {1, 2, big}),
                           BOp::Plain, Splits::host({1}), HugeOperands::view(2, {1, big}));
    });
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), HasSubstr("N (out's columns) = " + std::to_string(big)));
    // group-K (wgrad): K = x's columns, N = dy's columns.
    e = caught([&] {
      grouped_gemm_group_k(ctx, HugeOperands::view(0, {1, 2}), HugeOperands::view(1, {1, big}),
                           Splits::host({1}), HugeOperands::view(2, {1, 2, big}), false);
    });
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), HasSubstr("K (x's columns) = " + std::to_string(big)));
    e = caught([&] {
      grouped_gemm_group_k(ctx, HugeOperands::view(0, {1, big}), HugeOperands::view(1, {1, 2}),
                           Splits::host({1}), HugeOperands::view(2, {1, big, 2}), false);
    });
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), HasSubstr("N (dy's columns) = " + std::to_string(big)));
  }
}

// ================================================================ exact large-K GEMMs (issue 39
// §1) Integer data in {-1, 0, 1}: products and fp32 partial sums are exact (|sums| < 2^24), and the
// results stay within ±256 (asserted), where every integer is exact in bf16, f16 and f32 — so
// every backend must return the exact result, bit for bit, in any summation order and any
// rounding mode. An off-by-one in a K tail (a dropped, duplicated or misplaced product) changes
// an element by ±1, which no tolerance hides. K = 4104 = 64 · 64 + 8 leaves a K tail after
// 64-wide blocks (the sm90 kernels take it on the GPU: K % 8 == 0); K = 4101 is odd (cuBLAS
// there). Reductions over rows (wgrad) get groups of 4099 and 4104 rows.

// Host tensor of `shape` in `dtype` holding `values` (exact small integers).
Tensor host_tensor(const std::vector<double>& values, const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype, test::host());
  from_f64(values.data(), t.data(), dtype, values.size());
  return t;
}

// n values in {-1, 0, 1}, seeded.
std::vector<double> trits(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> v(n);
  for (double& x : v) x = static_cast<double>(rng() % 3) - 1.0;
  return v;
}

// got equals want exactly on the first want.size() elements; else the first difference.
::testing::AssertionResult exactly(const std::vector<double>& got, const std::vector<double>& want,
                                   int64_t cols) {
  if (got.size() < want.size()) return ::testing::AssertionFailure() << "too few values";
  size_t bad = 0, first = want.size();
  for (size_t i = 0; i < want.size(); ++i) {
    if (!(got[i] == want[i])) {
      if (first == want.size()) first = i;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << want.size() << " elements differ; first at row "
         << first / static_cast<size_t>(cols) << ", col " << first % static_cast<size_t>(cols)
         << ": got " << got[first] << ", exact " << want[first];
}

// Every |value| fits the exact-integer range of every compute dtype (bf16: 2^8).
void expect_exactly_representable(const std::vector<double>& ref) {
  double m = 0;
  for (double v : ref) m = std::max(m, std::abs(v));
  ASSERT_LE(m, 256.0) << "the test's data must keep results exact in bf16";
}

class ExactGemm : public ::testing::TestWithParam<std::tuple<std::string, DType>> {
 protected:
  void SetUp() override {
    std::string why;
    std::optional<Context> c = test::make_context(std::get<0>(GetParam()), &why);
    if (!c) GTEST_SKIP() << why;
    ctx_ = *c;
    dt_ = std::get<1>(GetParam());
  }
  Splits splits(const std::vector<int64_t>& counts, bool on_device) const {
    return on_device ? Splits::device(to_device(ctx_, test::counts_tensor(counts, DType::I64)))
                     : Splits::host(counts);
  }
  Context ctx_ = Context::cpu();
  DType dt_ = DType::BF16;
};

// group-M in both B layouts (fprop: B = W [G, N, K] transposed; dgrad: B [G, K, N] plain), over a
// reduction of K terms; rows [S, T) keep the sentinel.
TEST_P(ExactGemm, GroupMOverLargeKIsExactToTheLastProduct) {
  const std::vector<int64_t> counts{37, 0, 1, 64, 33};
  const int64_t G = 5, S = 135, T = S + 3, N = 24;
  uint64_t seed = 100;
  for (int64_t K : {int64_t{4104}, int64_t{4101}}) {
    for (BOp op : {BOp::Transposed, BOp::Plain}) {
      for (bool on_device : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "K " << K << (op == BOp::Plain ? " plain" : " transposed")
                     << (on_device ? " device" : " host") << " splits");
        const std::vector<double> a = trits(static_cast<size_t>(T * K), ++seed);
        const std::vector<double> b = trits(static_cast<size_t>(G * N * K), ++seed);
        std::vector<double> want(static_cast<size_t>(S * N), 0.0);
        int64_t row = 0;
        for (int64_t g = 0; g < G; ++g) {
          for (int64_t r = 0; r < counts[static_cast<size_t>(g)]; ++r, ++row) {
            for (int64_t n = 0; n < N; ++n) {
              double sum = 0;
              for (int64_t k = 0; k < K; ++k) {
                const int64_t bi =
                    op == BOp::Transposed ? (g * N + n) * K + k : (g * K + k) * N + n;
                sum += a[static_cast<size_t>(row * K + k)] * b[static_cast<size_t>(bi)];
              }
              want[static_cast<size_t>(row * N + n)] = sum;
            }
          }
        }
        expect_exactly_representable(want);
        const Shape b_shape = op == BOp::Transposed ? Shape{G, N, K} : Shape{G, K, N};
        const Tensor a_d = to_device(ctx_, host_tensor(a, {T, K}, dt_));
        const Tensor b_d = to_device(ctx_, host_tensor(b, b_shape, dt_));
        const Tensor out = test::filled(ctx_, {T, N}, dt_, test::kSentinel);
        // Device splits where the sm90 kernels refuse the call (K = 4101, fp32): forced cuBLAS.
        const Context on = on_device ? test::device_splits_context(ctx_, dt_, {K, N}) : ctx_;
        grouped_gemm_group_m(on, a_d, b_d, op, splits(counts, on_device), out);
        const std::vector<uint8_t> bytes = test::bytes_of(ctx_, out);
        EXPECT_TRUE(exactly(test::to_doubles(ctx_, out), want, N));
        EXPECT_TRUE(test::rows_hold_sentinel(bytes, S, T, N, dt_));
      }
    }
  }
}

// group-K (wgrad) over groups of thousands of rows: dW in the compute dtype and in f32, and
// accumulated onto an f32 main_grad.
TEST_P(ExactGemm, GroupKOverManyRowsIsExactToTheLastRow) {
  const std::vector<int64_t> counts{4099, 0, 4104, 1};
  const int64_t G = 4, T = 4099 + 4104 + 1 + 5, N = 16, K = 24;
  const std::vector<double> dy = trits(static_cast<size_t>(T * N), 7);
  const std::vector<double> x = trits(static_cast<size_t>(T * K), 8);
  const std::vector<double> start = trits(static_cast<size_t>(G * N * K), 9);
  std::vector<double> want(static_cast<size_t>(G * N * K), 0.0);
  int64_t off = 0;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t k = 0; k < K; ++k) {
        double sum = 0;
        for (int64_t r = off; r < off + counts[static_cast<size_t>(g)]; ++r) {
          sum += dy[static_cast<size_t>(r * N + n)] * x[static_cast<size_t>(r * K + k)];
        }
        want[static_cast<size_t>((g * N + n) * K + k)] = sum;
      }
    }
    off += counts[static_cast<size_t>(g)];
  }
  expect_exactly_representable(want);
  std::vector<double> want_accumulated = want;
  for (size_t i = 0; i < want.size(); ++i) want_accumulated[i] += start[i];
  const Tensor dy_d = to_device(ctx_, host_tensor(dy, {T, N}, dt_));
  const Tensor x_d = to_device(ctx_, host_tensor(x, {T, K}, dt_));
  for (bool on_device : {false, true}) {
    SCOPED_TRACE(on_device ? "device splits" : "host splits");
    const Context on = on_device ? test::device_splits_context(ctx_, dt_, {K, N}) : ctx_;
    for (DType dw_type : {dt_, DType::F32}) {
      const Tensor dw = test::filled(ctx_, {G, N, K}, dw_type, test::kSentinel);
      grouped_gemm_group_k(on, dy_d, x_d, splits(counts, on_device), dw, false);
      EXPECT_TRUE(exactly(test::to_doubles(ctx_, dw), want, K)) << "dw " << name(dw_type);
    }
    const Tensor main_grad = to_device(ctx_, host_tensor(start, {G, N, K}, DType::F32));
    grouped_gemm_group_k(on, dy_d, x_d, splits(counts, on_device), main_grad, true);
    EXPECT_TRUE(exactly(test::to_doubles(ctx_, main_grad), want_accumulated, K)) << "main_grad";
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, ExactGemm,
                         ::testing::Combine(::testing::ValuesIn(test::device_names()),
                                            ::testing::Values(DType::BF16, DType::F16, DType::F32)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, DType>>& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::string(name(std::get<1>(info.param)));
                         });

// ================================================================ the allocator's block cache
// core/block_cache.h: the policy of the CUDA allocator's cache of freed large blocks (pointers
// and sizes only, so it is checked here on any machine; the CUDA allocator's own cases are in
// test_cuda_runtime, CudaRuntime.Allocator*).
char g_blocks[64];  // distinct addresses standing in for blocks
void* blk(int i) { return &g_blocks[i]; }
constexpr size_t kMiB = size_t{1} << 20;

constexpr auto kKeep = [] { return true; };   // freed(): keep it (no stream capture)
constexpr auto kDrop = [] { return false; };  // freed(): the caller frees it (a capture)

// A block the allocator got from its pool and then freed: what the cap evicted.
std::vector<void*> keep(detail::BlockCache& c, void* p, size_t bytes) {
  c.allocated(p, bytes);
  detail::BlockCache::Freed f = c.freed(p, kKeep);
  EXPECT_TRUE(f.kept);
  return f.evicted;
}

TEST(BlockCache, TakesTheSmallestKeptBlockUpToAnEighthLarger) {
  std::atomic<size_t> total{0};
  detail::BlockCache c(total, 1000 * kMiB, 100);
  EXPECT_TRUE(keep(c, blk(0), 18 * kMiB).empty());
  EXPECT_TRUE(keep(c, blk(1), 16 * kMiB).empty());
  EXPECT_TRUE(keep(c, blk(2), 40 * kMiB).empty());
  EXPECT_EQ(total.load(), 74 * kMiB);
  EXPECT_EQ(c.take(14 * kMiB).block, nullptr) << "16 MiB is more than an eighth above 14";
  EXPECT_EQ(c.take(16 * kMiB).block, blk(1)) << "the smallest that fits";
  const detail::BlockCache::Taken larger = c.take(16 * kMiB);
  EXPECT_EQ(larger.block, blk(0)) << "18 <= 16 + 16 / 8";
  EXPECT_EQ(larger.bytes, 18 * kMiB);
  EXPECT_EQ(c.take(16 * kMiB).block, nullptr);
  EXPECT_EQ(c.take(41 * kMiB).block, nullptr) << "never a smaller block";
  EXPECT_EQ(c.take(36 * kMiB).block, blk(2));
  EXPECT_EQ(total.load(), 0u);
  EXPECT_EQ(c.blocks(), 0u);
}

// The bug CudaRuntime.AllocatorReusesALargeFreedBlockOnItsStream found on an H100 (2026-12-06):
// a larger block taken for a smaller request was booked at the request's size, came back as that,
// and the next request of its own size missed it.
TEST(BlockCache, ATakenBlockComesBackAtItsOwnSize) {
  std::atomic<size_t> total{0};
  detail::BlockCache c(total, 1000 * kMiB, 100);
  EXPECT_TRUE(keep(c, blk(0), 18 * kMiB).empty());
  EXPECT_EQ(c.take(16 * kMiB).block, blk(0));
  const detail::BlockCache::Freed back = c.freed(blk(0), kKeep);
  EXPECT_TRUE(back.kept);
  EXPECT_EQ(total.load(), 18 * kMiB) << "kept at its own 18 MiB";
  EXPECT_EQ(c.take(18 * kMiB).block, blk(0)) << "an 18 MiB request takes it again";
  EXPECT_EQ(c.take(18 * kMiB).block, nullptr);
}

// freed(): a block not booked here (a small one, or one allocated under stream capture) and a
// booked one handed back with keep false (freed under capture) are the caller's to free; the
// latter is forgotten, so a second hand-back does not keep it either.
TEST(BlockCache, OnlyBookedBlocksAreKeptAndOnlyWhenAsked) {
  std::atomic<size_t> total{0};
  detail::BlockCache c(total, 1000 * kMiB, 100);
  int asked = 0;
  detail::BlockCache::Freed f = c.freed(blk(5), [&] { return ++asked > 0; });
  EXPECT_EQ(asked, 0) << "keep_if is asked only for a booked block";
  EXPECT_FALSE(f.kept);
  EXPECT_TRUE(f.evicted.empty());
  c.allocated(blk(6), 4 * kMiB);
  EXPECT_FALSE(c.freed(blk(6), kDrop).kept) << "keep_if false: the caller frees it";
  EXPECT_FALSE(c.freed(blk(6), kKeep).kept) << "no longer booked";
  EXPECT_EQ(c.blocks(), 0u);
  EXPECT_EQ(total.load(), 0u);
}

TEST(BlockCache, TheDevicesCapIsSharedAndEachCacheEvictsItsOwnOldestFirst) {
  std::atomic<size_t> total{0};
  detail::BlockCache a(total, 10 * kMiB, 100), b(total, 10 * kMiB, 100);
  EXPECT_TRUE(keep(a, blk(0), 4 * kMiB).empty());
  EXPECT_TRUE(keep(a, blk(1), 4 * kMiB).empty());
  EXPECT_EQ(keep(a, blk(2), 4 * kMiB), std::vector<void*>{blk(0)}) << "12 > 10: a's oldest";
  // b's own block is evicted: the cap is full of a's.
  EXPECT_EQ(keep(b, blk(3), 4 * kMiB), std::vector<void*>{blk(3)});
  EXPECT_EQ(total.load(), 8 * kMiB);
  EXPECT_EQ(a.release_all(), (std::vector<void*>{blk(1), blk(2)}));
  EXPECT_EQ(total.load(), 0u);
  EXPECT_TRUE(keep(b, blk(3), 4 * kMiB).empty()) << "room again";
  EXPECT_EQ(b.release_all(), std::vector<void*>{blk(3)});
}

TEST(BlockCache, ABlockNotTakenWithinItsAgeGoesBack) {
  std::atomic<size_t> total{0};
  detail::BlockCache c(total, 1000 * kMiB, 3);
  keep(c, blk(0), 8 * kMiB);
  keep(c, blk(1), 2 * kMiB);
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(c.take(100 * kMiB).evicted.empty());  // misses age both
  EXPECT_EQ(c.take(2 * kMiB).block, blk(1)) << "taken at the third request: in time";
  const detail::BlockCache::Taken t = c.take(100 * kMiB);  // the fourth: 8 MiB is too old
  EXPECT_EQ(t.block, nullptr);
  EXPECT_EQ(t.evicted, std::vector<void*>{blk(0)});
  EXPECT_EQ(total.load(), 0u);
  keep(c, blk(2), 8 * kMiB);  // its age counts from when it was kept
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(c.take(100 * kMiB).evicted.empty());
  EXPECT_EQ(c.take(100 * kMiB).evicted, std::vector<void*>{blk(2)});
}

}  // namespace
}  // namespace moekit
