// Scalar and blockwise conversions between storage dtypes and fp32/fp64.
#include "moekit/core/dtype.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "moekit/core/error.h"

namespace moekit {
namespace {

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
float float_of(uint32_t u) { return std::bit_cast<float>(u); }

// A small binary float format (fp8): sign, `ebits` exponent bits with `bias`, `mbits` mantissa.
struct SmallFloat {
  int ebits, mbits, bias;
  bool ieee_special;  // true: top exponent is inf/NaN (e5m2); false: only S.1111.111 is NaN (e4m3fn)
  double max_finite;
  uint8_t nan_code;
};
constexpr SmallFloat kE4M3{4, 3, 7, false, 448.0, 0x7F};
constexpr SmallFloat kE5M2{5, 2, 15, true, 57344.0, 0x7E};

double decode_small(uint8_t v, const SmallFloat& f) {
  const int sign = v >> 7;
  const int e = (v >> f.mbits) & ((1 << f.ebits) - 1);
  const int m = v & ((1 << f.mbits) - 1);
  const int emax_field = (1 << f.ebits) - 1;
  double out;
  if (f.ieee_special && e == emax_field) {
    out = m == 0 ? INFINITY : NAN;
  } else if (!f.ieee_special && e == emax_field && m == (1 << f.mbits) - 1) {
    out = NAN;
  } else if (e == 0) {
    out = std::ldexp(static_cast<double>(m), 1 - f.bias - f.mbits);
  } else {
    out = std::ldexp(static_cast<double>(m + (1 << f.mbits)), e - f.bias - f.mbits);
  }
  return sign ? -out : out;
}

// Round-to-nearest-even, saturating to ±max_finite (the "satfinite" conversion of fp8 recipes).
uint8_t encode_small(double v, const SmallFloat& f) {
  if (std::isnan(v)) return f.nan_code;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  double a = std::fabs(v);
  if (a == 0.0) return sign;
  if (a > f.max_finite) a = f.max_finite;
  const int min_normal_exp = 1 - f.bias;
  int e;
  std::frexp(a, &e);  // a = frac * 2^e, frac in [0.5, 1): leading-one exponent is e - 1
  const int lead = std::max(e - 1, min_normal_exp);
  const double quantum = std::ldexp(1.0, lead - f.mbits);
  double q = std::nearbyint(a / quantum) * quantum;  // exact division; default mode is RNE
  if (q > f.max_finite) q = f.max_finite;
  if (q == 0.0) return sign;
  std::frexp(q, &e);
  const int qlead = e - 1;
  if (qlead < min_normal_exp) {  // subnormal
    const int m = static_cast<int>(std::ldexp(q, f.bias - 1 + f.mbits));
    return sign | static_cast<uint8_t>(m);
  }
  const int m = static_cast<int>(std::ldexp(q, f.mbits - qlead)) - (1 << f.mbits);
  return sign | static_cast<uint8_t>(((qlead + f.bias) << f.mbits) | m);
}

// fp64 → fp32 rounding to odd: exact values stay; otherwise the neighbour (of the two fp32
// values around v) whose last mantissa bit is 1. Overflow gives ±FLT_MAX (odd), which every
// 16-bit format then rounds as it would round v (f16: inf; bf16: inf, as v > bf16 max + ulp/2).
float f64_to_f32_round_to_odd(double v) {
  if (std::isnan(v) || std::isinf(v)) return static_cast<float>(v);
  float f = static_cast<float>(v);  // nearest
  if (static_cast<double>(f) == v) return f;
  if (std::isinf(f)) return std::copysign(std::numeric_limits<float>::max(), f);
  if ((bits_of(f) & 1u) == 0) f = std::nextafter(f, v > f ? INFINITY : -INFINITY);
  return f;
}

}  // namespace

std::string_view name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::F8E4M3: return "f8e4m3";
    case DType::F8E5M2: return "f8e5m2";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F8E4M3, DType::F8E5M2, DType::I32,
                  DType::I64, DType::U8}) {
    if (name(t) == s) return t;
  }
  throw_invalid("dtype", "one of f32, f16, bf16, f8e4m3, f8e5m2, i32, i64, u8", s);
}

float bf16_to_f32(uint16_t bits) { return float_of(static_cast<uint32_t>(bits) << 16); }

uint16_t f32_to_bf16(float v) {
  uint32_t u = bits_of(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = static_cast<float>(m) * 0x1p-24f;  // exact: subnormal or zero
    return sign ? -v : v;
  }
  if (e == 31) return float_of(sign | 0x7f800000u | (m << 13));
  return float_of(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t f32_to_f16(float v) {
  uint32_t u = bits_of(v);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint16_t out;
  if (u >= (143u << 23)) {  // |v| >= 65536 (or inf/NaN): overflow to inf, NaN stays NaN
    out = u > 0x7f800000u ? 0x7e00 : 0x7c00;
  } else if (u < (113u << 23)) {  // |v| < 2^-14: half subnormal or zero
    // Adding 0.5 aligns the half-subnormal quantum (2^-24) with the float's last mantissa bit,
    // so the FPU's round-to-nearest-even does the rounding.
    const float magic = float_of(126u << 23);
    out = static_cast<uint16_t>(bits_of(float_of(u) + magic) - (126u << 23));
  } else {
    const uint32_t mant_odd = (u >> 13) & 1u;
    u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + mant_odd;  // rebias and round (RNE)
    out = static_cast<uint16_t>(u >> 13);
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

float f8e4m3_to_f32(uint8_t b) { return static_cast<float>(decode_small(b, kE4M3)); }
uint8_t f32_to_f8e4m3(float v) { return encode_small(v, kE4M3); }
float f8e5m2_to_f32(uint8_t b) { return static_cast<float>(decode_small(b, kE5M2)); }
uint8_t f32_to_f8e5m2(float v) { return encode_small(v, kE5M2); }

void to_f32(const void* src, DType t, float* dst, size_t n) {
  switch (t) {
    case DType::F32: std::memcpy(dst, src, n * 4); return;
    case DType::BF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::F16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::F8E4M3: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f8e4m3_to_f32(s[i]);
      return;
    }
    case DType::F8E5M2: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f8e5m2_to_f32(s[i]);
      return;
    }
    default: throw_invalid("dtype", "a floating dtype", name(t));
  }
}

void from_f32(const float* src, void* dst, DType t, size_t n) {
  switch (t) {
    case DType::F32: std::memcpy(dst, src, n * 4); return;
    case DType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::F8E4M3: {
      auto* d = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f8e4m3(src[i]);
      return;
    }
    case DType::F8E5M2: {
      auto* d = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f8e5m2(src[i]);
      return;
    }
    default: throw_invalid("dtype", "a floating dtype", name(t));
  }
}

void to_f64(const void* src, DType t, double* dst, size_t n) {
  if (t == DType::F32) {
    const auto* s = static_cast<const float*>(src);
    for (size_t i = 0; i < n; ++i) dst[i] = s[i];
    return;
  }
  const size_t es = size_of(t);
  for (size_t i = 0; i < n; ++i) {
    float f;
    to_f32(static_cast<const char*>(src) + i * es, t, &f, 1);
    dst[i] = f;
  }
}

void from_f64(const double* src, void* dst, DType t, size_t n) {
  const size_t es = size_of(t);
  for (size_t i = 0; i < n; ++i) {
    if (t == DType::F32) {
      static_cast<float*>(dst)[i] = static_cast<float>(src[i]);
    } else if (t == DType::F8E4M3) {
      static_cast<uint8_t*>(dst)[i] = encode_small(src[i], kE4M3);  // single rounding from fp64
    } else if (t == DType::F8E5M2) {
      static_cast<uint8_t*>(dst)[i] = encode_small(src[i], kE5M2);
    } else {
      // fp64 → fp32 → 16-bit would round twice (a value just above a 16-bit midpoint becomes the
      // midpoint in fp32, then ties to even). Rounding to fp32 *to odd* first keeps the sticky
      // information: fp32 has ≥ 2 more bits than f16/bf16, so the second rounding is then exact RNE.
      const float f = f64_to_f32_round_to_odd(src[i]);
      from_f32(&f, static_cast<char*>(dst) + i * es, t, 1);
    }
  }
}

}  // namespace moekit
