// Internal: the scalar math of SPEC §6 in plain fp32 operations, callable from host and device
// code (the GPU quantize kernels use it; tests/test_quant.cpp checks it against the library's
// scalar conversions — the CPU reference's — on every edge and a million random values, so the
// GPU computes what the CPU reference computes, bit for bit). No CUDA headers needed.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "moekit/core/dtype.h"

#if defined(__CUDACC__)
#define MOEKIT_HD __host__ __device__ __forceinline__
#else
#define MOEKIT_HD inline
#endif

namespace moekit::quant_math {

MOEKIT_HD uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
MOEKIT_HD float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
MOEKIT_HD bool is_nan(float f) {
  return (bits(f) & 0x7FFFFFFFu) > 0x7F800000u;
}
MOEKIT_HD bool is_inf(float f) {
  return (bits(f) & 0x7FFFFFFFu) == 0x7F800000u;
}
MOEKIT_HD float abs_f(float f) {
  return from_bits(bits(f) & 0x7FFFFFFFu);
}
/// 2^e for -149 <= e <= 127, exactly.
MOEKIT_HD float exp2i(int e) {
  if (e >= -126) return from_bits(static_cast<uint32_t>(e + 127) << 23);
  return from_bits(1u << (e + 149));
}
/// ⌊log2 a⌋ of a finite a > 0 (subnormals included).
MOEKIT_HD int ilog2(float a) {
  const uint32_t u = bits(a);
  const int e = static_cast<int>((u >> 23) & 0xFF);
  if (e != 0) return e - 127;
  uint32_t m = u & 0x7FFFFF;
  int l = -127;
  while ((m & 0x400000u) == 0) {
    m <<= 1;
    --l;
  }
  return l;
}
/// Round to nearest integer, ties to even (the default rounding mode on host and device).
MOEKIT_HD float rint_even(float v) {
  return rintf(v);
}

/// A small float format: ebits, mbits, bias; ieee = top exponent is inf/NaN (e5m2).
struct Fp8Format {
  int ebits, mbits, bias;
  bool ieee;
  float max_finite;
  uint8_t nan_code;
};
MOEKIT_HD Fp8Format e4m3() {
  return {4, 3, 7, false, 448.0f, 0x7F};
}
MOEKIT_HD Fp8Format e5m2() {
  return {5, 2, 15, true, 57344.0f, 0x7E};
}

/// RNE, saturating to ±max (inf too), NaN → nan_code (no sign): as moekit::f32_to_f8e4m3/e5m2.
MOEKIT_HD uint8_t encode_fp8(float v, const Fp8Format& f) {
  if (is_nan(v)) return f.nan_code;
  const uint8_t sign = (bits(v) >> 31) ? 0x80 : 0x00;
  float a = abs_f(v);
  if (a == 0.0f) return sign;
  if (a > f.max_finite) a = f.max_finite;
  const int min_normal = 1 - f.bias;
  int lead = ilog2(a);
  if (lead < min_normal) lead = min_normal;
  const int qexp = lead - f.mbits;
  // a / 2^qexp is exact (a power-of-two scaling of a value at most 2^(mbits+1) after it).
  float q = rint_even(a * exp2i(-qexp)) * exp2i(qexp);
  if (q > f.max_finite) q = f.max_finite;
  if (q == 0.0f) return sign;
  const int qlead = ilog2(q);
  if (qlead < min_normal) {  // subnormal: q / 2^(min_normal - mbits)
    return sign | static_cast<uint8_t>(q * exp2i(f.mbits - min_normal));
  }
  const int m = static_cast<int>(q * exp2i(f.mbits - qlead)) - (1 << f.mbits);
  return sign | static_cast<uint8_t>(((qlead + f.bias) << f.mbits) | m);
}

/// e2m1 (as moekit::f32_to_e2m1): RNE to 0, 0.5, 1, 1.5, 2, 3, 4, 6, saturating; NaN → +6.
MOEKIT_HD uint8_t encode_e2m1(float v) {
  if (is_nan(v)) return 0x7;
  const uint8_t sign = (bits(v) >> 31) ? 0x8 : 0x0;
  const float a = abs_f(v);
  // Midpoints between neighbours; at a midpoint the even code wins.
  uint8_t c;
  if (a <= 0.25f)
    c = 0;
  else if (a < 0.75f)
    c = 1;
  else if (a <= 1.25f)
    c = 2;
  else if (a < 1.75f)
    c = 3;
  else if (a <= 2.5f)
    c = 4;
  else if (a < 3.5f)
    c = 5;
  else if (a <= 5.0f)
    c = 6;
  else
    c = 7;
  return sign | c;
}

/// As moekit::f32_to_e8m0_round_up.
MOEKIT_HD uint8_t e8m0_round_up(float v) {
  if (is_nan(v)) return 0xFF;
  if (is_inf(v)) return 0xFE;
  if (v == 0.0f) return 0x00;
  const uint32_t u = bits(v);
  uint32_t e = (u >> 23) & 0xFF;
  const uint32_t m = u & 0x7FFFFF;
  if (m > 0 && e != 0xFE && !(e == 0 && m <= 0x400000)) ++e;
  return static_cast<uint8_t>(e);
}
/// 2^(127 - code) (code 255: NaN).
MOEKIT_HD float e8m0_reciprocal(uint8_t code) {
  if (code == 0xFF) return from_bits(0x7FC00000u);
  return exp2i(127 - static_cast<int>(code));
}

/// As moekit::scale_from_amax.
MOEKIT_HD float scale_from_amax(float amax, float fp8_max, bool power_2, float epsilon,
                                float value_for_inf) {
  if (amax < epsilon) amax = epsilon;
  if (is_inf(amax) || amax == 0.0f || is_nan(amax)) return 1.0f;
  float scale = fp8_max / amax;
  if (is_inf(scale)) scale = value_for_inf;
  if (power_2) scale = from_bits(bits(scale) & 0xFF800000u);
  return scale;
}

/// scale_from_amax's value_for_inf as TE's kernels take it (host code): current scaling's kernel
/// (one scale per group) FLT_MAX, the block kernels the source type's largest finite value (TE's
/// compute_scale_from_types).
inline float value_for_infinite_scale(bool per_group, DType source) {
  constexpr float kFltMax = 3.40282347e38f;
  if (per_group) return kFltMax;
  switch (source) {
    case DType::BF16:
      return from_bits(0x7F7F0000u);  // bf16's largest finite value
    case DType::F16:
      return 65504.0f;
    default:
      return kFltMax;
  }
}

/// Decodes e4m3 (for NVFP4's block scales): exact.
MOEKIT_HD float decode_e4m3(uint8_t c) {
  const int e = (c >> 3) & 0xF, m = c & 0x7;
  float v;
  if (e == 0xF && m == 0x7) return from_bits(0x7FC00000u);
  if (e == 0)
    v = static_cast<float>(m) * exp2i(-9);
  else
    v = static_cast<float>(8 + m) * exp2i(e - 10);
  return (c & 0x80) ? -v : v;
}

/// Decodes e5m2 / e2m1 / an e8m0 scale: exact.
MOEKIT_HD float decode_e5m2(uint8_t c) {
  const int e = (c >> 2) & 0x1F, m = c & 0x3;
  if (e == 0x1F) return m == 0 ? ((c & 0x80) ? -INFINITY : INFINITY) : from_bits(0x7FC00000u);
  const float v =
      e == 0 ? static_cast<float>(m) * exp2i(-16) : static_cast<float>(4 + m) * exp2i(e - 17);
  return (c & 0x80) ? -v : v;
}
MOEKIT_HD float decode_e2m1(uint8_t c) {
  const int code = c & 0x7;
  const float v = code < 4    ? 0.5f * static_cast<float>(code)
                  : code == 4 ? 2.0f
                  : code == 5 ? 3.0f
                  : code == 6 ? 4.0f
                              : 6.0f;
  return (c & 0x8) ? -v : v;
}
MOEKIT_HD float e8m0_value(uint8_t code) {
  if (code == 0xFF) return from_bits(0x7FC00000u);
  return exp2i(static_cast<int>(code) - 127);
}

/// NVFP4's per-group scales from the group's amax.
MOEKIT_HD void nv_group_scales(float amax, float* s_enc, float* s_dec) {
  float s = 448.0f * 6.0f / amax;
  const float fmax = 3.40282347e38f;
  if (!(s <= fmax)) s = fmax;  // fminf(s, FLT_MAX): inf and NaN give FLT_MAX
  if (amax == 0.0f || s == 0.0f) s = 1.0f;
  *s_enc = s;
  *s_dec = 1.0f / s;
}

}  // namespace moekit::quant_math
