// tests/support/reference.h — fp64 reference of GroupedLinear (SPEC §2) and the tolerance rule.
//
// The reference takes the inputs *as stored* (already rounded to the op's dtype, converted to
// fp64 exactly) so the only differences left are the op's own roundings: fp32 accumulation and
// one final rounding into the output dtype. Layouts are the library's canonical ones:
//   x [T, K], dy [T, N], w [G, N, K], bias [G, N], dW [G, N, K], db [G, N]; group g owns rows
//   [off_g, off_g + m_g), S = Σ m_g. Row-grouped results (y, dx) cover rows [0, S) only.
//
// Tolerance (per element i), with u_out = epsilon(output dtype) and u_acc = epsilon(f32):
//   tol_i = u_out · |ref_i|  +  u_acc · L_i · Σ_terms_i |term|
// where L_i is the number of terms (and additions) of element i's reduction (K for y, N for dx,
// m_g for dW and db, plus one for an added bias or main_grad start) and Σ|term| its magnitude.
// Why: the op converts 16-bit inputs to fp32 exactly, accumulates in fp32 and rounds once into
// the output. Any order of L fp32 additions of products (each product rounded at most once)
// errs by at most about L · (u_acc / 2) · Σ|term| (Higham's γ_L bound), and the final rounding by
// (u_out / 2) · |result|. epsilon() is the spacing at 1.0 (twice the unit roundoff), so the rule
// above is the worst-case bound with a factor-2 margin — it holds for any summation order (BLAS
// blocking, GPU split-K) and still catches real bugs: a dropped, duplicated or misplaced term
// (|term| ~ 1 for normal data) is orders of magnitude above u_acc · L · Σ|term| for fp32
// accumulation, and a missing bias or wrong group is O(1) for every dtype. It is relative to the
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

/// The tolerance rule above for element i stored in `out`.
double tolerance(const Reference& ref, size_t i, DType out);

/// Compares the first ref.value.size() elements of `got` with the reference under the tolerance
/// rule. On failure: how many elements are off, the first one (index, row, col), its value, the
/// reference and the tolerance. NaN never passes.
::testing::AssertionResult matches_reference(std::string_view what, const std::vector<double>& got,
                                             const Reference& ref, DType out);

/// Same rule for two results of the same computation that may differ in summation order (e.g.
/// two backends): each may be tol away from the exact value, so |a - b| <= 2 · tol.
::testing::AssertionResult close_to_each_other(std::string_view what, const std::vector<double>& a,
                                               const std::vector<double>& b, const Reference& ref,
                                               DType out);

}  // namespace moekit::test
