// tests/support/mlp_reference.h — fp64 reference of SwiGLU, the prob-scaled grouped bias and the
// grouped MLP (SPEC §5), with a per-element tolerance for each result.
//
// Like reference.h, the reference takes the op's inputs *as stored* (rounded to the op's dtype,
// then exact in fp64) — including the intermediates h [T, 2F] and z [T, F] that the op kept in
// its saved context — so each stage is checked against the exact value of what that stage was
// given. Tolerances (per element, with u_out = epsilon(output dtype), u_acc = epsilon(f32) and
// u_dt = epsilon(activation dtype)):
//   reductions (GEMMs, bias sums, dp)   u_out·|ref| + A(L, Σ|term|)       (reference.h's
//                                       accumulation_bound: ∝ √L, Higham & Mary's bound)
//   elementwise fp32 math (SwiGLU)      u_out·|ref| + u_acc·kElementwiseOps·Σ|factors' product|
//   + u_dt·Σ|term| per rounding the op applied to an intermediate it did not store for us
//     (backward: dz and dh are rounded to the activation dtype before they are used; forward: the
//     GEMM result of fc2 is rounded before p·b2 is added).
// The magnitudes make the bound relative to the size of the terms, so values that cancel to near
// zero (silu'(a) crosses zero at a ≈ -1.28) are not held to an impossible relative bound.
//
// Layouts: x [T, H], w1 [G, 2F, H], b1 [G, 2F], w2 [G, N, F], b2 [G, N], probs [T], h [T, 2F] in
// the GluLayout, z [T, F], y and dy [T, N] (N = H in SPEC §5). Row-grouped results cover rows
// [0, S) only (S = Σ counts).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/core/context.h"
#include "moekit/core/dtype.h"
#include "moekit/ops/activation.h"
#include "moekit/ops/grouped_linear_op.h"
#include "moekit/primitives/activation.h"

namespace moekit::test {

/// An expected result: exact values and per-element tolerances (|got − value| ≤ tol).
struct Expected {
  std::vector<double> value;
  std::vector<double> tol;
  int64_t cols = 1;  // row length, for (row, col) in messages
};

/// Compares the first want.value.size() elements of `got`. On failure: how many are off, the
/// first one (index, row, col), its value, the expected value and the tolerance. NaN never passes.
::testing::AssertionResult matches_expected(std::string_view what, const std::vector<double>& got,
                                            const Expected& want);

inline constexpr int kElementwiseOps = 8;  // fp32 roundings in one SwiGLU element (generous)

double silu(double a);
double dsilu(double a);  // d silu / da

/// z[t, j] = p_t · silu(a) · b on rows [0, S). probs empty: plain SwiGLU.
Expected swiglu_forward_ref(const std::vector<double>& h, const std::vector<double>& probs,
                            int64_t S, int64_t F, GluLayout layout, DType out);

struct SwigluGradExpected {
  Expected dh;      // [S, 2F] in h's layout
  Expected dprobs;  // [S] (empty when probs are empty)
};
/// Backward of swiglu_forward_ref from dz. dprobs_start (empty: none) is what dprobs held when
/// accumulating. dz_rounded: dz was rounded to `out` by the op before use (adds u_out·magnitude).
SwigluGradExpected swiglu_backward_ref(const std::vector<double>& h,
                                       const std::vector<double>& probs,
                                       const std::vector<double>& dz, int64_t S, int64_t F,
                                       GluLayout layout, DType out,
                                       const std::vector<double>& dprobs_start = {},
                                       bool dz_rounded = false);

/// out[t] = x[t] + s_t · bias[g(t)] on rows [0, S); probs empty: s_t = 1.
Expected bias_add_ref(const std::vector<double>& x, const std::vector<double>& bias,
                      const std::vector<double>& probs, const std::vector<int64_t>& counts,
                      int64_t N, DType out);
struct ScaledBiasGradExpected {
  Expected db;      // [G, N]
  Expected dprobs;  // [S]
};
/// db[g] = Σ p_t·dy[t]; dp_t = start_t + Σ_n dy[t, n]·bias[g(t), n].
ScaledBiasGradExpected scaled_bias_grad_ref(const std::vector<double>& dy,
                                            const std::vector<double>& probs,
                                            const std::vector<double>& bias,
                                            const std::vector<int64_t>& counts, int64_t N,
                                            DType db_dtype,
                                            const std::vector<double>& dprobs_start = {});

/// A grouped MLP problem: the stored inputs in fp64 and the shapes.
struct MlpProblem {
  int64_t T = 0, H = 0, F = 0, N = 0, G = 0;  // N: fc2 out_features (H in SPEC §5)
  std::vector<int64_t> counts;
  GluLayout layout = GluLayout::Halves;
  DType dtype = DType::F32;
  std::vector<double> x, w1, b1, w2, b2, probs;  // b1, b2 empty: no bias
  int64_t valid_rows() const;
};

struct MlpForwardExpected {
  Expected h;  // from x
  Expected z;  // from the stored h
  Expected y;  // from the stored z
};
/// Stage-wise forward reference from the op's stored intermediates h and z.
MlpForwardExpected mlp_forward_ref(const MlpProblem& p, const std::vector<double>& h_stored,
                                   const std::vector<double>& z_stored);

struct MlpGradExpected {
  Expected dx, dw1, db1, dw2, db2, dprobs;
};
/// Backward reference from the stored h, z and dy (dz and dh are formed in fp64 and the op's
/// roundings of them are in the tolerances). main_grad1/2 (empty: none) are the fp32
/// main_grad values before the call (dW then accumulates into them, in f32).
MlpGradExpected mlp_backward_ref(const MlpProblem& p, const std::vector<double>& h_stored,
                                 const std::vector<double>& z_stored, const std::vector<double>& dy,
                                 const std::vector<double>& main_grad1 = {},
                                 const std::vector<double>& main_grad2 = {});

/// The whole forward in fp64 with no intermediate rounding: y [S, N] (end-to-end checks).
std::vector<double> mlp_forward_exact(const MlpProblem& p);

// ---------------------------------------------------------------- test problems

/// A grouped MLP test case: shapes, splits (Σ counts ≤ T; the rest is the tail), options.
struct MlpCase {
  int64_t G = 3, H = 16, F = 32, T = 0;  // T = 0: Σ counts + 5 tail rows
  std::vector<int64_t> counts;           // empty: a default with a zero-row group
  int64_t N = 0;                         // fc2 out_features; 0: H
  DType dtype = DType::F32;
  GluLayout layout = GluLayout::Halves;
  bool b1 = true, b2 = true;
  uint64_t seed = 1;
  /// Fills the defaults in (counts, T, N).
  MlpCase resolved() const;
};

/// The data of a case as host tensors (random normal, never zeros; probs in (0.1, 1)).
struct MlpData {
  MlpCase c;
  Tensor x, w1, b1, w2, b2, probs, dy;  // host; b1/b2 undefined without bias
  MlpProblem problem() const;           // the stored values in fp64
};
MlpData make_mlp_data(const MlpCase& c);

/// fc1 → ScaledSwiGLU → fc2 on ctx with the data's parameters (fc2's bias prob-scaled).
struct MlpOps {
  std::shared_ptr<GroupedLinearOp> fc1;
  std::shared_ptr<ScaledSwiGLU> act;
  std::shared_ptr<GroupedLinearOp> fc2;
};
MlpOps make_mlp_ops(const Context& ctx, const MlpData& data);

// ---------------------------------------------------------------- finite differences

/// One f32 tensor whose gradient is checked: `device` is what the computation reads, `host` its
/// host copy (perturbed, then copied to `device`), `analytic` the gradient under test.
struct FdSlot {
  std::string name;
  Tensor device;
  Tensor host;
  std::vector<double> analytic;
};

/// For every element of every slot: central difference of `loss` with the actual f32 steps
/// (value ± step, rounded), compared with the analytic gradient: |fd − g| ≤ rtol·(1 + |g|).
/// On failure: the slot, element, both values and how many elements are off.
::testing::AssertionResult matches_finite_differences(const Context& ctx,
                                                      std::vector<FdSlot>& slots,
                                                      const std::function<double()>& loss,
                                                      double step = 4e-3, double rtol = 2e-3);

}  // namespace moekit::test
