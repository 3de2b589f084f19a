// Narrow formats (e2m1, e8m0), the fp8 scale of an amax, and recipes (SPEC §6a–§6c).
#include <bit>
#include <cfloat>
#include <cmath>

#include "moekit/core/error.h"
#include "moekit/primitives/quantize.h"

namespace moekit {

std::string_view name(QuantFormat f) {
  switch (f) {
    case QuantFormat::E4M3:
      return "e4m3";
    case QuantFormat::E5M2:
      return "e5m2";
    case QuantFormat::E2M1:
      return "e2m1";
  }
  return "?";
}

float max_finite(QuantFormat f) {
  switch (f) {
    case QuantFormat::E4M3:
      return 448.0f;
    case QuantFormat::E5M2:
      return 57344.0f;
    case QuantFormat::E2M1:
      return 6.0f;
  }
  return 0.0f;
}

uint8_t encode(QuantFormat f, float v) {
  switch (f) {
    case QuantFormat::E4M3:
      return f32_to_f8e4m3(v);
    case QuantFormat::E5M2:
      return f32_to_f8e5m2(v);
    case QuantFormat::E2M1:
      return f32_to_e2m1(v);
  }
  return 0;
}

float decode(QuantFormat f, uint8_t code) {
  switch (f) {
    case QuantFormat::E4M3:
      return f8e4m3_to_f32(code);
    case QuantFormat::E5M2:
      return f8e5m2_to_f32(code);
    case QuantFormat::E2M1:
      return e2m1_to_f32(code);
  }
  return 0.0f;
}

namespace {
constexpr float kE2M1Values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
}

float e2m1_to_f32(uint8_t code) {
  const float v = kE2M1Values[code & 0x7];
  return (code & 0x8) ? -v : v;
}

uint8_t f32_to_e2m1(float v) {
  if (std::isnan(v)) return 0x7;  // no NaN in e2m1: +max, as cvt.rn.satfinite.e2m1x2.f32
  const uint8_t sign = std::signbit(v) ? 0x8 : 0x0;
  const float a = std::fabs(v);
  if (a >= 6.0f) return sign | 0x7;  // saturate (inf too)
  // Nearest of the 8 magnitudes; a tie goes to the even code (the one whose mantissa bit is 0).
  uint8_t best = 0;
  for (uint8_t c = 1; c < 8; ++c) {
    const float d = std::fabs(a - kE2M1Values[c]), db = std::fabs(a - kE2M1Values[best]);
    if (d < db || (d == db && (c & 1) == 0)) best = c;
  }
  return sign | best;
}

uint8_t f32_to_e8m0_round_up(float v) {
  if (std::isnan(v)) return 0xFF;
  if (std::isinf(v)) return 0xFE;
  if (v == 0.0f) return 0x00;
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  uint32_t exponent = (bits >> 23) & 0xFF;
  const uint32_t mantissa = bits & 0x7FFFFF;
  // Round the exponent up when the value is not a power of two, saturating at 0xFE; an fp32
  // subnormal above 2^-127 rounds up to 2^-126.
  if (mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x400000)) ++exponent;
  return static_cast<uint8_t>(exponent);
}

float e8m0_to_f32(uint8_t code) {
  if (code == 0xFF) return NAN;
  return std::ldexp(1.0f, static_cast<int>(code) - 127);
}

float e8m0_reciprocal(uint8_t code) {
  if (code == 0xFF) return NAN;
  return std::ldexp(1.0f, 127 - static_cast<int>(code));
}

float scale_from_amax(float amax, float fp8_max, bool power_2, float epsilon, float value_for_inf) {
  if (amax < epsilon) amax = epsilon;  // NaN compares false: handled below
  if (std::isinf(amax) || amax == 0.0f || std::isnan(amax)) return 1.0f;
  float scale = fp8_max / amax;
  if (std::isinf(scale)) scale = value_for_inf;
  if (power_2) scale = std::bit_cast<float>(std::bit_cast<uint32_t>(scale) & 0xFF800000u);
  return scale;
}

// ---------------------------------------------------------------- recipes
std::string_view Recipe::name() const {
  switch (kind) {
    case RecipeKind::None:
      return "none";
    case RecipeKind::Fp8CurrentScaling:
      return "fp8-current";
    case RecipeKind::Fp8BlockScaling:
      return "fp8-block";
    case RecipeKind::Mxfp8:
      return "mxfp8";
    case RecipeKind::Nvfp4:
      return "nvfp4";
  }
  return "?";
}

Recipe Recipe::parse(std::string_view s) {
  if (s == "none" || s == "bf16") return none();
  if (s == "fp8-current") return fp8_current();
  if (s == "fp8-block") return fp8_block();
  if (s == "mxfp8") return mxfp8();
  if (s == "nvfp4") return nvfp4();
  throw_invalid("recipe", "one of none, fp8-current, fp8-block, mxfp8, nvfp4", str("'", s, "'"));
}

void Recipe::validate() const {
  const std::string who = str("recipe ", name());
  if (margin < 0) throw_invalid("margin", str("a margin >= 0 (", who, ")"), std::to_string(margin));
  if (margin != 0 && kind != RecipeKind::Fp8CurrentScaling) {
    throw_invalid("margin", str("0: only fp8-current takes a margin (", who, ")"),
                  std::to_string(margin));
  }
  if (!(amax_epsilon >= 0.0f)) {
    throw_invalid("amax_epsilon", str("an epsilon >= 0 (", who, ")"), str(amax_epsilon));
  }
  if (kind == RecipeKind::Nvfp4 && fp8_format != Fp8Format::E4M3) {
    throw_invalid("fp8_format",
                  "E4M3: NVFP4's block scales are e4m3 and its data e2m1 for every "
                  "tensor (recipe nvfp4)",
                  "HYBRID");
  }
  if (kind == RecipeKind::Mxfp8 && !power_2_scales) {
    throw_invalid("power_2_scales", "true: e8m0 scales are powers of two (recipe mxfp8)", "false");
  }
}

QuantSpec Recipe::spec(QuantRole role) const {
  validate();
  QuantSpec s;
  s.recipe = kind;
  s.power_2_scales = power_2_scales;
  s.amax_epsilon = amax_epsilon;
  s.margin = margin;
  const bool grad = role == QuantRole::GradOutput;
  s.format = grad && fp8_format == Fp8Format::Hybrid ? QuantFormat::E5M2 : QuantFormat::E4M3;
  switch (kind) {
    case RecipeKind::None:
      throw_invalid("recipe", "a quantized recipe (fp8-current, fp8-block, mxfp8, nvfp4)", "none");
    case RecipeKind::Fp8CurrentScaling:
      s.scaling = Scaling::PerGroup;
      s.block = 0;
      break;
    case RecipeKind::Fp8BlockScaling:
      s.scaling = role == QuantRole::Weight ? Scaling::Block2D : Scaling::Block1D;
      s.block = 128;
      break;
    case RecipeKind::Mxfp8:
      s.scaling = Scaling::Mx;
      s.block = 32;
      break;
    case RecipeKind::Nvfp4:
      s.scaling = Scaling::Nv;
      s.block = 16;
      s.format = QuantFormat::E2M1;
      s.power_2_scales = false;
      break;
  }
  return s;
}

int64_t Recipe::dim_multiple() const {
  switch (kind) {
    case RecipeKind::None:
      return 1;
    case RecipeKind::Fp8CurrentScaling:
    case RecipeKind::Fp8BlockScaling:
      return 16;
    case RecipeKind::Mxfp8:
    case RecipeKind::Nvfp4:
      return 32;
  }
  return 1;
}

int64_t Recipe::group_rows_multiple() const {
  return dim_multiple();
}

int64_t QuantizedTensor::row_block_capacity() const {
  if (spec.block <= 0) return groups;
  return (rows + spec.block - 1) / spec.block + groups;
}

}  // namespace moekit
