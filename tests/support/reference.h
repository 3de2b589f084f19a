// tests/support/reference.h — fp64 reference of GroupedLinear (SPEC §2) and the tolerance rule.
//
// The reference takes the inputs *as stored* (already rounded to the op's dtype, converted to
// fp64 exactly) so the only differences left are the op's own roundings: fp32 accumulation and
// one final rounding into the output dtype. Layouts are the library's canonical ones:
//   x [T, K], dy [T, N], w [G, N, K], bias [G, N], dW [G, N, K], db [G, N]; group g owns rows
//   [off_g, off_g + m_g), S = Σ m_g. Row-grouped results (y, dx) cover rows [0, S) only.
//
// Tolerance (per element i), with u_out = epsilon(output dtype), u_acc = epsilon(f32) (epsilon()
// is the spacing at 1.0: twice the unit roundoff) and tiny_out the output's subnormal spacing:
//   tol_i = u_out/2 · |ref_i|  +  A(L_i, Σ_i)  +  tiny_out/2          (0 when L_i = 0)
//   A(L, Σ) = kAccumulationLambda/2 · √L · u_acc · Σ                    (accumulation_bound)
// where L_i is the number of terms (and additions) of element i's reduction (K for y, N for dx,
// m_g for dW and db, plus one for an added bias or main_grad start) and Σ_i = Σ|term| its
// magnitude.
//
// Why it holds. The op converts 16-bit inputs to fp32 exactly and their products are exact in
// fp32 (8- or 11-bit significands: 16 or 22 bits ≤ 24; f32 inputs add one rounding per product,
// well inside λ's margin), accumulates in fp32 in some order and rounds once into the output. Each
// term then goes through at most L roundings of relative size ≤ u = u_acc/2. Worst case (Higham's
// γ_L) the sum errs by L·u·Σ — a bound that grows with K² for data of fixed scale and lets a
// dropped or duplicated product pass at K = 4096. Higham & Mary's probabilistic bound (SIAM J. Sci.
// Comput. 41(5), 2019, Thm. 3.1), for rounding errors that are independent and mean-zero, is
// λ·√L·u·Σ with probability ≥ 1 − 2L·exp(−λ²/2) per element, for any summation order (each term's
// own chain of roundings is what is bounded: BLAS blocking, GPU tiles and split-K alike) and any
// signs of the data. With λ = 8 that is 1 − 2L·1.3e-14: no suite comes near a failure by chance.
// The output rounding (round to nearest) adds at most half an ulp: u_out/2 · |value|, and |value|
// exceeds |ref| only by A.
//
// On the GPU paths (sm90 wgmma, cuBLAS; bf16/f16 inputs, fp32 accumulation, one rounding to the
// output — the kernels do no split-K in 16 bits and add bias or C in fp32), tensor cores align
// the products of one MMA step and truncate toward zero rather than round to nearest (Fasi,
// Higham, Mikaitis & Pranesh, PeerJ CS 2021): the errors are one-sided in magnitude, not
// mean-zero. Their signs follow the signs of the terms and partial sums, which for the suites'
// data (independent zero-mean normals, so products of random sign) are random: the systematic
// part averages out to a spread of ~u·L^1.5·σ/(√3·B) (σ the terms' scale, B products per
// truncating step) against the bound's λ·u·L^1.5·(2/π)·σ ≈ 5·u·L^1.5·σ — about 9·B standard
// deviations of margin. (Data whose terms all share one sign would need the worst-case bound
// there; no suite uses such data in a GEMM.) fp32 GEMMs on cuBLAS run without TF32
// (src/backends/cuda/runtime.cpp), so the same rule holds for them.
//
// What it catches: at K = 4096 with unit-normal data (Σ ≈ 4096 · 2/π ≈ 2600), A ≈ 0.08 — an
// eighth of a typical product (2/π) — where the worst-case rule's u_acc·L·Σ ≈ 1.3 let a dropped
// or duplicated product through; a missing bias or wrong group is O(1) for every dtype. A
// 16-bit output's half ulp (bf16: |ref| ~ 64 → 0.25) can still hide one product: the integer
// cases of test_core (ExactGemm) check K tails exactly. The tolerance is relative to the
// reference's magnitude, so results near zero by cancellation are not held to an impossible
// relative bound. A group with no rows has L = 0 and magnitude 0: its result must be exactly 0.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "moekit/core/dtype.h"

namespace moekit::test {

struct Reference {
  std::vector<double> value;      // exact result (fp64 from the stored inputs)
  std::vector<double> magnitude;  // Σ |term| of each element's reduction (incl. bias / start)
  std::vector<int64_t> length;    // number of terms of each element's reduction
  int64_t cols = 1;               // row length, for (row, col) in messages
};

/// y[r, n] = Σ_k x[r, k] · w[g, n, k] + bias[g, n] for the rows r of each group g.
/// bias: empty = no bias.
Reference reference_forward(const std::vector<double>& x, const std::vector<double>& w,
                            const std::vector<double>& bias, const std::vector<int64_t>& counts,
                            int64_t K, int64_t N);
/// dx[r, k] = Σ_n dy[r, n] · w[g, n, k].
Reference reference_dgrad(const std::vector<double>& dy, const std::vector<double>& w,
                          const std::vector<int64_t>& counts, int64_t K, int64_t N);
/// dW[g, n, k] = start[g, n, k] + Σ_{r in g} dy[r, n] · x[r, k]. start: empty = none (zeros).
Reference reference_wgrad(const std::vector<double>& dy, const std::vector<double>& x,
                          const std::vector<int64_t>& counts, int64_t K, int64_t N,
                          const std::vector<double>& start = {});
/// db[g, n] = Σ_{r in g} dy[r, n].
Reference reference_dbias(const std::vector<double>& dy, const std::vector<int64_t>& counts,
                          int64_t N);

/// λ of Higham & Mary's probabilistic bound (above).
inline constexpr double kAccumulationLambda = 8.0;

/// The bound above on the fp32 accumulation error of a reduction of `terms` terms whose
/// magnitudes sum to `magnitude`: kAccumulationLambda/2 · √terms · u_acc · magnitude, u_acc =
/// `acc_epsilon` (0: epsilon(f32)).
double accumulation_bound(int64_t terms, double magnitude, double acc_epsilon = 0.0);

/// u_acc of Hopper's FP8 tensor cores (the native FP8 GEMMs, "cuda-fp8"). Their MMA aligns the
/// products of a step to the largest exponent and keeps about 14 bits (DeepSeek-V3 report, §3.3.2:
/// "around 14 bits"), i.e. relative truncations up to 2^-13 per step, with fp32 registers only
/// between steps (promoted accumulation) or across the whole K (fast accumulation). Taken as
/// 2^-12 in the rule above: twice the truncation, for its one-sidedness. With unit-normal data
/// at K = 160 (Σ ≈ 100) that is ≈ 1.2 against |ref| ≈ 13: a wrong group, scale or bias is
/// caught, a single wrong product of a long reduction is not (test_core's exact cases are the
/// 16-bit kernels'; the FP8 codes' exactness is test_quant's).
inline constexpr double kFp8TensorCoreEpsilon = 1.0 / 4096.0;

/// The tolerance rule above for element i stored in `out` (acc_epsilon as accumulation_bound's).
double tolerance(const Reference& ref, size_t i, DType out, double acc_epsilon = 0.0);

/// Compares the first ref.value.size() elements of `got` with the reference under the tolerance
/// rule. On failure: how many elements are off, the first one (index, row, col), its value, the
/// reference and the tolerance. NaN never passes. acc_epsilon as accumulation_bound's.
::testing::AssertionResult matches_reference(std::string_view what, const std::vector<double>& got,
                                             const Reference& ref, DType out,
                                             double acc_epsilon = 0.0);

/// Same rule for two results of the same computation that may differ in summation order (e.g.
/// two backends): each may be tol away from the exact value, so |a - b| <= 2 · tol.
::testing::AssertionResult close_to_each_other(std::string_view what, const std::vector<double>& a,
                                               const std::vector<double>& b, const Reference& ref,
                                               DType out);

}  // namespace moekit::test
