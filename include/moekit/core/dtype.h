// moekit/core/dtype.h — element types and scalar conversions.
//
// Storage types: f32, f16, bf16, fp8 e4m3 / e5m2 (OCP FP8, "fn" variant for e4m3: no infinities,
// max 448), i32, i64, u8. 16-bit and 8-bit floats are stored as raw bits; compute converts them to
// fp32 (round-to-nearest-even on the way back, saturating for fp8).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace moekit {

enum class DType : uint8_t { F32, F16, BF16, F8E4M3, F8E5M2, I32, I64, U8 };

/// Bytes per element.
constexpr size_t size_of(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::F8E4M3: return 1;
    case DType::F8E5M2: return 1;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}

/// Lower-case name: "f32", "f16", "bf16", "f8e4m3", "f8e5m2", "i32", "i64", "u8".
std::string_view name(DType t);

/// Parses a name produced by name(); throws Error(InvalidArgument) otherwise.
DType parse_dtype(std::string_view s);

constexpr bool is_floating(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F8E4M3 ||
         t == DType::F8E5M2;
}

/// Activation/parameter dtypes that GEMM primitives accept (fp8 needs a quantized recipe, §6).
constexpr bool is_compute_dtype(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

// ---- scalar conversions (exact for widening, round-to-nearest-even for narrowing) ----
float bf16_to_f32(uint16_t bits);
uint16_t f32_to_bf16(float v);
float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float v);
float f8e4m3_to_f32(uint8_t bits);
uint8_t f32_to_f8e4m3(float v);  // saturates to ±448; NaN stays NaN
float f8e5m2_to_f32(uint8_t bits);
uint8_t f32_to_f8e5m2(float v);  // saturates to ±57344; NaN stays NaN

/// Converts n elements of floating dtype `src_type` at `src` to fp32.
void to_f32(const void* src, DType src_type, float* dst, size_t n);
/// Converts n fp32 values to floating dtype `dst_type` at `dst` (rounding as above).
void from_f32(const float* src, void* dst, DType dst_type, size_t n);
/// Converts n elements of floating dtype to / from fp64 (reference code and tests).
void to_f64(const void* src, DType src_type, double* dst, size_t n);
void from_f64(const double* src, void* dst, DType dst_type, size_t n);

/// Unit roundoff-based tolerance suggestion for results of a K-long fp32-accumulated dot
/// product stored in `t`: relative to the magnitude of the reference (see tests).
constexpr double epsilon(DType t) {
  switch (t) {
    case DType::F32: return 1.0 / (1 << 23);
    case DType::F16: return 1.0 / (1 << 10);
    case DType::BF16: return 1.0 / (1 << 7);
    case DType::F8E4M3: return 1.0 / (1 << 3);
    case DType::F8E5M2: return 1.0 / (1 << 2);
    default: return 0.0;
  }
}

}  // namespace moekit
