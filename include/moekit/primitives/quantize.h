// moekit/primitives/quantize.h — quantized recipes (SPEC §6): formats, recipes, quantized tensors,
// quantize / dequantize and the quantized grouped GEMMs the ops emulate them with.
//
// Formats (bit layouts in SPEC §6a; scalar conversions below):
//   e4m3 (OCP "fn": max 448, no inf, NaN = S.1111.111), e5m2 (IEEE-like: max 57344, inf, NaN),
//   e2m1 (fp4: values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; no inf/NaN; two per byte,
//   element 2i in the low nibble), e8m0 (a scale 2^(e-127), e = 0..254; 255 = NaN).
// Every conversion to a narrow format rounds to nearest, ties to even, and saturates to ±max
// (infinities too); NaN stays NaN in e4m3/e5m2 and becomes +6 in e2m1 (as the GPU's satfinite cvt).
//
// Recipes (SPEC §6b), named and configured as TransformerEngine's (common/recipe):
//   fp8-current  Float8CurrentScaling: one fp32 scale per group (expert) from the group's amax,
//                scale = fp8_max / amax / 2^margin; HYBRID (e4m3 x and w, e5m2 dy) or E4M3.
//   fp8-block    Float8BlockScaling: x and dy 1×128 blocks, w 128×128 blocks, fp32 scales,
//                power-of-two by default (scale rounded down to 2^⌊log2⌋); E4M3 or HYBRID.
//   mxfp8        MXFP8BlockScaling: e4m3 data, one e8m0 scale per 32 consecutive elements,
//                scale = 2^⌈log2(amax / fp8_max)⌉.
//   nvfp4        NVFP4BlockScaling (without RHT, stochastic rounding and 2-D weight blocks): e2m1
//                data, one e4m3 scale per 16 elements, one fp32 scale per group from its amax.
// A quantized operand x ≈ dequant(q) = decode(q) · scale_inv (per-tensor, block) or
// decode(q) · e8m0 (MX) or decode(q) · decode_e4m3(s_block) · s_dec_group (NV).
//
// A tensor is quantized as a grouped matrix X [T, C] whose rows are grouped (splits; a weight
// [G, N, K] is X = [G·N, K] with G groups of N rows). Two copies may exist (QuantUsage):
//   rowwise     [T, C]: blocks run along C (the GEMM reduction of fprop and dgrad),
//   columnwise  [C, T]: Xᵀ, blocks run along T inside each group (wgrad reduces over a group's
//               rows; Hopper's FP8 wgmma reads 8-bit operands K-major only, hence the copy).
// Blocks never cross a group boundary and never include rows [S, T): a group's last block may be
// short (rows not a multiple of the block), a group of 0 rows has none. Rows [S, T) are never
// read; the quantized copies' tail is left unwritten.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "moekit/core/context.h"
#include "moekit/core/splits.h"
#include "moekit/core/tensor.h"
#include "moekit/primitives/grouped_gemm.h"

namespace moekit {

// ---------------------------------------------------------------- formats and scalar conversions
enum class QuantFormat : uint8_t { E4M3, E5M2, E2M1 };
std::string_view name(QuantFormat f);  // "e4m3", "e5m2", "e2m1"
float max_finite(QuantFormat f);       // 448, 57344, 6
/// One element in a narrow format (RNE, saturating; see the file comment). e2m1: the 4-bit code.
uint8_t encode(QuantFormat f, float v);
float decode(QuantFormat f, uint8_t code);

/// e2m1: code bits S.EE.M (bias 1): 0x0..0x7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6; 0x8 | c = -value(c).
uint8_t f32_to_e2m1(float v);
float e2m1_to_f32(uint8_t code);  // low 4 bits
/// e8m0 as the MX scale of a block: 2^⌈log2 v⌉ (round up; TE's float_to_e8m0): 0 → 0x00 (2^-127),
/// NaN → 0xFF, inf → 0xFE, values above 2^127 → 0xFE (saturating); fp32 subnormals round up to
/// 2^-126 (0x01) except those ≤ 2^-127, which give 0x00.
uint8_t f32_to_e8m0_round_up(float v);
float e8m0_to_f32(uint8_t code);      // 2^(code-127); 0xFF → NaN
float e8m0_reciprocal(uint8_t code);  // 2^(127-code), exact (0xFE → 2^-127); 0xFF → NaN

/// The fp8 scale of a per-tensor or block amax (TE's compute_scale_from_amax), in fp32:
/// amax < epsilon → epsilon; amax 0, inf or NaN → 1; scale = fp8_max / amax (rounded once);
/// an infinite scale → value_for_inf; power_2 → the scale's mantissa cleared (rounded down to a
/// power of two). The stored scale_inv is 1 / scale rounded once.
float scale_from_amax(float amax, float fp8_max, bool power_2, float epsilon, float value_for_inf);

// ---------------------------------------------------------------- recipes
enum class RecipeKind : uint8_t { None, Fp8CurrentScaling, Fp8BlockScaling, Mxfp8, Nvfp4 };
/// TE's Format: E4M3 everywhere, or HYBRID (e4m3 forward tensors, e5m2 gradients).
enum class Fp8Format : uint8_t { E4M3, Hybrid };
/// Which operand of a linear layer a quantization is for (the formats differ by role).
enum class QuantRole : uint8_t { Input, Weight, GradOutput };

/// How the scales of a quantized tensor tile it.
enum class Scaling : uint8_t {
  PerGroup,  // one fp32 scale_inv per group (per expert), shared by both copies
  Block1D,   // fp32 scale_inv per 1×block (block = 128) along the copy's reduction dim
  Block2D,   // fp32 scale_inv per block×block tile (128×128), shared by both copies
  Mx,        // e8m0 scale per 1×32
  Nv,        // e4m3 scale per 1×16, and one fp32 decode scale per group
};

/// Everything a quantize needs: format, scaling and its options. Made by Recipe::spec(role).
struct QuantSpec {
  RecipeKind recipe = RecipeKind::None;  // for messages
  QuantFormat format = QuantFormat::E4M3;
  Scaling scaling = Scaling::PerGroup;
  int64_t block = 0;            // 0 (per group), 128, 32, 16
  bool power_2_scales = false;  // Block1D / Block2D / PerGroup
  float amax_epsilon = 0.0f;    // floor of the amax (PerGroup, Block1D, Block2D)
  int margin = 0;               // PerGroup: scale = fp8_max / amax / 2^margin
};

struct Recipe {
  RecipeKind kind = RecipeKind::None;
  Fp8Format fp8_format = Fp8Format::Hybrid;
  bool power_2_scales = false;  // fp8-current: TE default false; fp8-block: TE default true
  float amax_epsilon = 0.0f;
  int margin = 0;  // fp8-current only (as DelayedScaling's margin)

  static Recipe none() { return {}; }
  static Recipe fp8_current(Fp8Format format = Fp8Format::Hybrid, int margin = 0) {
    return {RecipeKind::Fp8CurrentScaling, format, false, 0.0f, margin};
  }
  static Recipe fp8_block(Fp8Format format = Fp8Format::E4M3, bool power_2_scales = true) {
    return {RecipeKind::Fp8BlockScaling, format, power_2_scales, 0.0f, 0};
  }
  static Recipe mxfp8(Fp8Format format = Fp8Format::E4M3) {
    return {RecipeKind::Mxfp8, format, true, 0.0f, 0};
  }
  static Recipe nvfp4() { return {RecipeKind::Nvfp4, Fp8Format::E4M3, false, 0.0f, 0}; }
  /// By name: "none" (or "bf16"), "fp8-current", "fp8-block", "mxfp8", "nvfp4" (TE defaults).
  static Recipe parse(std::string_view name);

  bool enabled() const { return kind != RecipeKind::None; }
  std::string_view name() const;
  /// The quantization of one operand (SPEC §6b table). Validates the recipe first.
  QuantSpec spec(QuantRole role) const;
  /// InvalidArgument naming the field when the recipe is not one TE accepts (negative margin or
  /// epsilon; a margin on a recipe other than fp8-current; NVFP4 with HYBRID; MXFP8 without
  /// power-of-two scales).
  void validate() const;
  /// Alignment rules of the recipe's GEMMs (SPEC §6c): K and N multiples, rows per group.
  int64_t dim_multiple() const;
  int64_t group_rows_multiple() const;
};

// ---------------------------------------------------------------- quantized tensors
enum class QuantUsage : uint8_t { Rowwise = 1, Columnwise = 2, Both = 3 };
constexpr bool has(QuantUsage u, QuantUsage bit) {
  return (static_cast<uint8_t>(u) & static_cast<uint8_t>(bit)) != 0;
}
/// The copies an operand needs: rowwise when fprop / dgrad read it, columnwise when wgrad does
/// (at least one of them).
constexpr QuantUsage usage_for(bool rowwise, bool columnwise) {
  return rowwise && columnwise ? QuantUsage::Both : rowwise ? QuantUsage::Rowwise : QuantUsage::Columnwise;
}

/// A grouped matrix X [rows, cols] quantized by `spec`. Layouts (u8 storage; fp4 packs two per
/// byte along the copy's last dimension; RB = ⌈rows/block⌉ + groups, an upper bound on the row
/// blocks of any splits with S <= rows; a group's row blocks follow its predecessors'):
///   rowwise            [rows, cols]   (e2m1: [rows, ⌈cols/2⌉])
///   columnwise         [cols, ld]: row c holds column c's codes for rows [0, rows) (e2m1: two a
///                      byte, ⌈rows/2⌉ bytes), ld the byte length rounded up to a multiple of 16
///                      (kColumnwiseRowAlignment: TMA's 16-byte rows on every T); the padding bytes
///                      are never written nor read as data
///   rowwise_scale_inv  PerGroup: f32 [G] · Block1D: f32 [rows, ⌈cols/128⌉] · Block2D: f32
///                      [RB, ⌈cols/128⌉] · Mx: u8 e8m0 [rows, ⌈cols/32⌉] · Nv: u8 e4m3
///                      [rows, ⌈cols/16⌉]
///   columnwise_scale_inv  PerGroup, Block2D: the rowwise one (shared) · Block1D: f32 [RB, cols]
///                      · Mx: u8 [RB, cols] · Nv: u8 [RB, cols] (row-block major: a group's
///                      scales are one compact [blocks, cols] slab, as the block-scaled GEMM
///                      reads them)
///   amax               f32 [G]: PerGroup and Nv (each group's amax over its rows)
///   group_scale_inv    f32 [G]: Nv only, s_dec = 1 / s_enc, s_enc = 448·6 / amax
struct QuantizedTensor {
  QuantSpec spec;
  DType source_dtype = DType::BF16;
  int64_t rows = 0, cols = 0, groups = 0;
  QuantUsage usage = QuantUsage::Rowwise;
  Tensor rowwise, rowwise_scale_inv;
  Tensor columnwise, columnwise_scale_inv;
  Tensor amax, group_scale_inv;

  bool defined() const { return rowwise.defined() || columnwise.defined(); }
  bool has_rowwise() const { return rowwise.defined(); }
  bool has_columnwise() const { return columnwise.defined(); }
  /// Row blocks a columnwise / 2-D scale has room for: ⌈rows/block⌉ + groups.
  int64_t row_block_capacity() const;
};

/// The row length of a columnwise copy is a multiple of this many bytes (see QuantizedTensor).
inline constexpr int64_t kColumnwiseRowAlignment = 16;

/// Allocates (uninitialised) the copies `usage` asks for on ctx's device.
QuantizedTensor allocate_quantized(const Context& ctx, const QuantSpec& spec, DType source_dtype,
                                   int64_t rows, int64_t cols, int64_t groups, QuantUsage usage);

/// Quantizes x [T, C] (f32, f16 or bf16) grouped by `splits` into the copies `usage` names:
/// amaxes and scales per group / block as spec says (SPEC §6b), then each element
/// q = encode(x · scale) (Mx: x · e8m0_reciprocal; Nv: x · block encode scale). Checks up front:
/// x contiguous 2-D on ctx's device, splits valid for T, spec consistent, and the packing rules of
/// e2m1 (SPEC §6c: rowwise: C even; columnwise: every group's rows even). Any other T, C and
/// counts are fine: short last blocks. Rows [S, T) are neither read nor written.
QuantizedTensor quantize(const Context& ctx, const Tensor& x, const Splits& splits,
                         const QuantSpec& spec, QuantUsage usage);
/// A weight [G, N, K]: quantize(w as [G·N, K], splits of N rows each).
QuantizedTensor quantize_weight(const Context& ctx, const Tensor& w, const QuantSpec& spec,
                                QuantUsage usage);
/// Dequantizes one copy into out (f32): Rowwise → out [T, C], Columnwise → out [C, T] (the
/// transposed copy as stored). Only valid rows (columns of the columnwise copy) are written.
void dequantize(const Context& ctx, const QuantizedTensor& q, const Splits& splits,
                QuantUsage which, const Tensor& out);

/// Quantized group-M GEMM (fprop / dgrad), accumulated in fp32 from the dequantized operands:
///   Transposed (fprop): out_g = dq(a.rowwise)_g · dq(b.rowwise)_gᵀ (+ bias_g)   b = W [G·N, K]
///   Plain (dgrad):      out_g = dq(a.rowwise)_g · dq(b.columnwise)_gᵀ           b = W, a = dy
/// out [T, N'] (f32, f16, bf16) rounded once; bias in out's dtype, added in fp32. Rows [S, T)
/// untouched.
void grouped_gemm_group_m_quantized(const Context& ctx, const QuantizedTensor& a,
                                    const QuantizedTensor& b, BOp op, const Splits& splits,
                                    const Tensor& out, const Tensor& bias = {});
/// Quantized group-K GEMM (wgrad): dw_g (+)= dq(dy.columnwise)_g · dq(x.columnwise)_gᵀ, i.e.
/// Σ over the group's rows of dyᵀ·x with both copies blocked along the rows.
void grouped_gemm_group_k_quantized(const Context& ctx, const QuantizedTensor& dy,
                                    const QuantizedTensor& x, const Splits& splits,
                                    const Tensor& dw, bool accumulate);

}  // namespace moekit
