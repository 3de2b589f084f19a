#include "support/mlp_reference.h"

#include <cmath>
#include <sstream>

#include "moekit/core/tensor.h"
#include "support/reference.h"
#include "support/test_util.h"

namespace moekit::test {
namespace {

constexpr double kAcc = epsilon(DType::F32);

// Spacing of the subnormals of `t`: the absolute rounding error floor below its smallest normal
// (f16 results of ~1e-5 are subnormal: their error is not relative to their size).
double tiny(DType t) {
  switch (t) {
    case DType::F16:
      return std::ldexp(1.0, -24);
    case DType::BF16:
      return std::ldexp(1.0, -133);
    default:
      return std::ldexp(1.0, -149);
  }
}
// Bound (×2 margin) of rounding v into t.
double rounding(DType t, double v) {
  return epsilon(t) * std::abs(v) + tiny(t);
}

double sigmoid(double a) {
  return 1.0 / (1.0 + std::exp(-a));
}
// An upper bound of |silu'(a)| without cancellation: σ·(1 + |a|·(1 − σ)).
double dsilu_magnitude(double a) {
  const double s = sigmoid(a);
  return s * (1.0 + std::abs(a) * (1.0 - s));
}

std::vector<int64_t> row_groups(const std::vector<int64_t>& counts) {
  std::vector<int64_t> g;
  for (size_t i = 0; i < counts.size(); ++i)
    g.insert(g.end(), static_cast<size_t>(counts[i]), static_cast<int64_t>(i));
  return g;
}

int64_t total(const std::vector<int64_t>& counts) {
  int64_t s = 0;
  for (int64_t c : counts) s += c;
  return s;
}

Expected sized(int64_t n, int64_t cols) {
  Expected e;
  e.value.assign(static_cast<size_t>(n), 0.0);
  e.tol.assign(static_cast<size_t>(n), 0.0);
  e.cols = cols;
  return e;
}

}  // namespace

::testing::AssertionResult matches_expected(std::string_view what, const std::vector<double>& got,
                                            const Expected& want) {
  if (got.size() < want.value.size()) {
    return ::testing::AssertionFailure()
           << what << ": " << got.size() << " elements, expected at least " << want.value.size();
  }
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < want.value.size(); ++i) {
    const double d = std::abs(got[i] - want.value[i]);
    if (!(d <= want.tol[i])) {
      if (bad++ == 0) first = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  const auto cols = static_cast<size_t>(want.cols);
  return ::testing::AssertionFailure()
         << what << ": " << bad << " of " << want.value.size() << " elements off; first at "
         << first << " (row " << first / cols << ", col " << first % cols << "): got " << got[first]
         << ", expected " << want.value[first] << " ± " << want.tol[first];
}

double silu(double a) {
  return a * sigmoid(a);
}
double dsilu(double a) {
  const double s = sigmoid(a);
  return s * (1.0 + a * (1.0 - s));
}

Expected swiglu_forward_ref(const std::vector<double>& h, const std::vector<double>& probs,
                            int64_t S, int64_t F, GluLayout layout, DType out) {
  Expected z = sized(S * F, F);
  for (int64_t t = 0; t < S; ++t) {
    const double p = probs.empty() ? 1.0 : probs[static_cast<size_t>(t)];
    for (int64_t j = 0; j < F; ++j) {
      const double a = h[static_cast<size_t>(t * 2 * F + glu_gate_column(j, F, layout))];
      const double b = h[static_cast<size_t>(t * 2 * F + glu_linear_column(j, F, layout))];
      const double v = p * silu(a) * b;
      const auto i = static_cast<size_t>(t * F + j);
      z.value[i] = v;
      z.tol[i] = rounding(out, v) + kAcc * kElementwiseOps * std::abs(v);
    }
  }
  return z;
}

SwigluGradExpected swiglu_backward_ref(const std::vector<double>& h,
                                       const std::vector<double>& probs,
                                       const std::vector<double>& dz, int64_t S, int64_t F,
                                       GluLayout layout, DType out,
                                       const std::vector<double>& dprobs_start, bool dz_rounded) {
  SwigluGradExpected r;
  r.dh = sized(S * 2 * F, 2 * F);
  if (!probs.empty()) r.dprobs = sized(S, 1);
  const double u_dz = dz_rounded ? epsilon(out) : 0.0;
  for (int64_t t = 0; t < S; ++t) {
    const double p = probs.empty() ? 1.0 : probs[static_cast<size_t>(t)];
    double dp = dprobs_start.empty() ? 0.0 : dprobs_start[static_cast<size_t>(t)];
    double dp_mag = std::abs(dp);
    for (int64_t j = 0; j < F; ++j) {
      const auto ia = static_cast<size_t>(t * 2 * F + glu_gate_column(j, F, layout));
      const auto ib = static_cast<size_t>(t * 2 * F + glu_linear_column(j, F, layout));
      const double a = h[ia], b = h[ib], g = dz[static_cast<size_t>(t * F + j)];
      const double da = p * g * b * dsilu(a), db = p * g * silu(a);
      const double da_mag = std::abs(p * g * b) * dsilu_magnitude(a), db_mag = std::abs(db);
      r.dh.value[ia] = da;
      r.dh.tol[ia] = rounding(out, da) + (kAcc * kElementwiseOps + u_dz) * da_mag +
                     (dz_rounded ? tiny(out) * std::abs(p * b) * dsilu_magnitude(a) : 0.0);
      r.dh.value[ib] = db;
      r.dh.tol[ib] = rounding(out, db) + (kAcc * kElementwiseOps + u_dz) * db_mag +
                     (dz_rounded ? tiny(out) * std::abs(p * silu(a)) : 0.0);
      const double term = g * silu(a) * b;
      dp += term;
      dp_mag += std::abs(term);
    }
    if (!probs.empty()) {
      r.dprobs.value[static_cast<size_t>(t)] = dp;
      r.dprobs.tol[static_cast<size_t>(t)] = kAcc * std::abs(dp) +
                                             accumulation_bound(F + 1, dp_mag) +
                                             (kAcc * kElementwiseOps + u_dz) * dp_mag;
    }
  }
  return r;
}

Expected bias_add_ref(const std::vector<double>& x, const std::vector<double>& bias,
                      const std::vector<double>& probs, const std::vector<int64_t>& counts,
                      int64_t N, DType out) {
  const int64_t S = total(counts);
  const std::vector<int64_t> group = row_groups(counts);
  Expected y = sized(S * N, N);
  for (int64_t t = 0; t < S; ++t) {
    const double s = probs.empty() ? 1.0 : probs[static_cast<size_t>(t)];
    const int64_t g = group[static_cast<size_t>(t)];
    for (int64_t n = 0; n < N; ++n) {
      const auto i = static_cast<size_t>(t * N + n);
      const double sb = s * bias[static_cast<size_t>(g * N + n)];
      y.value[i] = x[i] + sb;
      y.tol[i] = rounding(out, y.value[i]) + kAcc * 2 * (std::abs(x[i]) + std::abs(sb));
    }
  }
  return y;
}

ScaledBiasGradExpected scaled_bias_grad_ref(const std::vector<double>& dy,
                                            const std::vector<double>& probs,
                                            const std::vector<double>& bias,
                                            const std::vector<int64_t>& counts, int64_t N,
                                            DType db_dtype,
                                            const std::vector<double>& dprobs_start) {
  const auto G = static_cast<int64_t>(counts.size());
  const int64_t S = total(counts);
  const std::vector<int64_t> group = row_groups(counts);
  ScaledBiasGradExpected r;
  r.db = sized(G * N, N);
  r.dprobs = sized(S, 1);
  std::vector<double> db_mag(static_cast<size_t>(G * N), 0.0);
  for (int64_t t = 0; t < S; ++t) {
    const int64_t g = group[static_cast<size_t>(t)];
    const double p = probs[static_cast<size_t>(t)];
    double dp = dprobs_start.empty() ? 0.0 : dprobs_start[static_cast<size_t>(t)];
    double dp_mag = std::abs(dp);
    for (int64_t n = 0; n < N; ++n) {
      const double d = dy[static_cast<size_t>(t * N + n)];
      const auto gi = static_cast<size_t>(g * N + n);
      r.db.value[gi] += p * d;
      db_mag[gi] += std::abs(p * d);
      dp += d * bias[gi];
      dp_mag += std::abs(d * bias[gi]);
    }
    r.dprobs.value[static_cast<size_t>(t)] = dp;
    r.dprobs.tol[static_cast<size_t>(t)] = kAcc * std::abs(dp) + accumulation_bound(N + 1, dp_mag);
  }
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t n = 0; n < N; ++n) {
      const auto gi = static_cast<size_t>(g * N + n);
      r.db.tol[gi] = (counts[static_cast<size_t>(g)] ? rounding(db_dtype, r.db.value[gi]) : 0.0) +
                     accumulation_bound(counts[static_cast<size_t>(g)] + 1, db_mag[gi]);
    }
  }
  return r;
}

int64_t MlpProblem::valid_rows() const {
  return total(counts);
}

MlpForwardExpected mlp_forward_ref(const MlpProblem& p, const std::vector<double>& h_stored,
                                   const std::vector<double>& z_stored) {
  const int64_t S = p.valid_rows(), H = p.H, F = p.F, N = p.N, W = 2 * F;
  const std::vector<int64_t> group = row_groups(p.counts);
  MlpForwardExpected r;
  r.h = sized(S * W, W);
  r.y = sized(S * N, N);
  for (int64_t t = 0; t < S; ++t) {
    const int64_t g = group[static_cast<size_t>(t)];
    for (int64_t c = 0; c < W; ++c) {
      double v = p.b1.empty() ? 0.0 : p.b1[static_cast<size_t>(g * W + c)];
      double mag = std::abs(v);
      for (int64_t k = 0; k < H; ++k) {
        const double term =
            p.x[static_cast<size_t>(t * H + k)] * p.w1[static_cast<size_t>((g * W + c) * H + k)];
        v += term;
        mag += std::abs(term);
      }
      const auto i = static_cast<size_t>(t * W + c);
      r.h.value[i] = v;
      r.h.tol[i] = rounding(p.dtype, v) + accumulation_bound(H + 1, mag);
    }
  }
  r.z = swiglu_forward_ref(h_stored, p.probs, S, F, p.layout, p.dtype);
  for (int64_t t = 0; t < S; ++t) {
    const int64_t g = group[static_cast<size_t>(t)];
    const double pt = p.probs[static_cast<size_t>(t)];
    for (int64_t n = 0; n < N; ++n) {
      double gemm = 0.0, mag = 0.0;
      for (int64_t j = 0; j < F; ++j) {
        const double term = z_stored[static_cast<size_t>(t * F + j)] *
                            p.w2[static_cast<size_t>((g * N + n) * F + j)];
        gemm += term;
        mag += std::abs(term);
      }
      const double bias = p.b2.empty() ? 0.0 : pt * p.b2[static_cast<size_t>(g * N + n)];
      const double v = gemm + bias;
      const auto i = static_cast<size_t>(t * N + n);
      r.y.value[i] = v;
      // + the rounding of the GEMM result before the scaled bias is added (when there is one).
      r.y.tol[i] = rounding(p.dtype, v) + accumulation_bound(F + 2, mag + std::abs(bias)) +
                   (p.b2.empty() ? 0.0 : rounding(p.dtype, gemm));
    }
  }
  return r;
}

MlpGradExpected mlp_backward_ref(const MlpProblem& p, const std::vector<double>& h_stored,
                                 const std::vector<double>& z_stored, const std::vector<double>& dy,
                                 const std::vector<double>& main_grad1,
                                 const std::vector<double>& main_grad2) {
  const int64_t S = p.valid_rows(), H = p.H, F = p.F, N = p.N, G = p.G, W = 2 * F;
  const std::vector<int64_t> group = row_groups(p.counts);
  const double u = epsilon(p.dtype);
  const auto at = [](const std::vector<double>& v, int64_t i) { return v[static_cast<size_t>(i)]; };

  // dz = dy·W2_g in fp64, with the bound of the op's error in it (fp32 accumulation, rounding).
  std::vector<double> dz(static_cast<size_t>(S * F)), dz_mag(dz.size()), dz_err(dz.size());
  for (int64_t t = 0; t < S; ++t) {
    const int64_t g = group[static_cast<size_t>(t)];
    for (int64_t j = 0; j < F; ++j) {
      double v = 0.0, mag = 0.0;
      for (int64_t n = 0; n < N; ++n) {
        const double term = at(dy, t * N + n) * at(p.w2, (g * N + n) * F + j);
        v += term;
        mag += std::abs(term);
      }
      const auto i = static_cast<size_t>(t * F + j);
      dz[i] = v;
      dz_mag[i] = mag;
      dz_err[i] = accumulation_bound(N, mag) + rounding(p.dtype, v);
    }
  }
  // dh (in h's layout) and dp, with magnitudes and propagated error bounds.
  MlpGradExpected r;
  r.dprobs = sized(S, 1);
  std::vector<double> dh(static_cast<size_t>(S * W)), dh_mag(dh.size()), dh_err(dh.size());
  for (int64_t t = 0; t < S; ++t) {
    const int64_t g = group[static_cast<size_t>(t)];
    const double pt = at(p.probs, t);
    double dp = 0.0, dp_mag = 0.0, dp_err = 0.0;
    for (int64_t j = 0; j < F; ++j) {
      const auto ia = static_cast<size_t>(t * W + glu_gate_column(j, F, p.layout));
      const auto ib = static_cast<size_t>(t * W + glu_linear_column(j, F, p.layout));
      const auto iz = static_cast<size_t>(t * F + j);
      const double a = h_stored[ia], b = h_stored[ib], s = silu(a);
      dh[ia] = pt * dz[iz] * b * dsilu(a);
      dh[ib] = pt * dz[iz] * s;
      const double ka = std::abs(pt * b) * dsilu_magnitude(a), kb = std::abs(pt * s);
      dh_mag[ia] = ka * dz_mag[iz];
      dh_mag[ib] = kb * dz_mag[iz];
      dh_err[ia] =
          ka * dz_err[iz] + kAcc * kElementwiseOps * dh_mag[ia] + rounding(p.dtype, dh[ia]);
      dh_err[ib] =
          kb * dz_err[iz] + kAcc * kElementwiseOps * dh_mag[ib] + rounding(p.dtype, dh[ib]);
      dp += dz[iz] * s * b;
      dp_mag += dz_mag[iz] * std::abs(s * b);
      dp_err += dz_err[iz] * std::abs(s * b);
    }
    if (!p.b2.empty()) {
      for (int64_t n = 0; n < N; ++n) {
        const double term = at(dy, t * N + n) * at(p.b2, g * N + n);
        dp += term;
        dp_mag += std::abs(term);
      }
    }
    r.dprobs.value[static_cast<size_t>(t)] = dp;
    r.dprobs.tol[static_cast<size_t>(t)] = kAcc * std::abs(dp) + accumulation_bound(F + N, dp_mag) +
                                           kAcc * kElementwiseOps * dp_mag + dp_err;
  }
  // dx = dh·W1_g.
  r.dx = sized(S * H, H);
  for (int64_t t = 0; t < S; ++t) {
    const int64_t g = group[static_cast<size_t>(t)];
    for (int64_t k = 0; k < H; ++k) {
      double v = 0.0, mag = 0.0, err = 0.0;
      for (int64_t c = 0; c < W; ++c) {
        const double w = at(p.w1, (g * W + c) * H + k);
        v += at(dh, t * W + c) * w;
        mag += at(dh_mag, t * W + c) * std::abs(w);
        err += at(dh_err, t * W + c) * std::abs(w);
      }
      const auto i = static_cast<size_t>(t * H + k);
      r.dx.value[i] = v;
      r.dx.tol[i] = rounding(p.dtype, v) + accumulation_bound(W, mag) + err;
    }
  }
  // dW1 = Σ dhᵀx (+ main_grad), db1 = Σ dh; dW2 = Σ dyᵀz (+ main_grad), db2 = Σ p·dy.
  r.dw1 = sized(G * W * H, H);
  r.db1 = sized(p.b1.empty() ? 0 : G * W, W);
  r.dw2 = sized(G * N * F, F);
  r.db2 = sized(p.b2.empty() ? 0 : G * N, N);
  const double u_w1 = main_grad1.empty() ? u : kAcc, u_w2 = main_grad2.empty() ? u : kAcc;
  int64_t off = 0;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t m = p.counts[static_cast<size_t>(g)];
    for (int64_t c = 0; c < W; ++c) {
      for (int64_t k = 0; k < H; ++k) {
        const auto i = static_cast<size_t>((g * W + c) * H + k);
        double v = main_grad1.empty() ? 0.0 : main_grad1[i];
        double mag = std::abs(v), err = 0.0;
        for (int64_t t = off; t < off + m; ++t) {
          const double x = at(p.x, t * H + k);
          v += at(dh, t * W + c) * x;
          mag += at(dh_mag, t * W + c) * std::abs(x);
          err += at(dh_err, t * W + c) * std::abs(x);
        }
        r.dw1.value[i] = v;
        r.dw1.tol[i] =
            m ? u_w1 * std::abs(v) + tiny(p.dtype) + accumulation_bound(m + 1, mag) + err : 0.0;
      }
      if (!p.b1.empty()) {
        double v = 0.0, mag = 0.0, err = 0.0;
        for (int64_t t = off; t < off + m; ++t) {
          v += at(dh, t * W + c);
          mag += at(dh_mag, t * W + c);
          err += at(dh_err, t * W + c);
        }
        const auto i = static_cast<size_t>(g * W + c);
        r.db1.value[i] = v;
        r.db1.tol[i] = (m ? rounding(p.dtype, v) : 0.0) + accumulation_bound(m, mag) + err;
      }
    }
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t j = 0; j < F; ++j) {
        const auto i = static_cast<size_t>((g * N + n) * F + j);
        double v = main_grad2.empty() ? 0.0 : main_grad2[i];
        double mag = std::abs(v);
        for (int64_t t = off; t < off + m; ++t) {
          const double term = at(dy, t * N + n) * at(z_stored, t * F + j);
          v += term;
          mag += std::abs(term);
        }
        r.dw2.value[i] = v;
        r.dw2.tol[i] =
            m ? u_w2 * std::abs(v) + tiny(p.dtype) + accumulation_bound(m + 1, mag) : 0.0;
      }
      if (!p.b2.empty()) {
        double v = 0.0, mag = 0.0;
        for (int64_t t = off; t < off + m; ++t) {
          const double term = at(p.probs, t) * at(dy, t * N + n);
          v += term;
          mag += std::abs(term);
        }
        const auto i = static_cast<size_t>(g * N + n);
        r.db2.value[i] = v;
        r.db2.tol[i] = (m ? rounding(p.dtype, v) : 0.0) + accumulation_bound(m + 1, mag);
      }
    }
    off += m;
  }
  return r;
}

std::vector<double> mlp_forward_exact(const MlpProblem& p) {
  const int64_t S = p.valid_rows(), H = p.H, F = p.F, N = p.N, W = 2 * F;
  const std::vector<int64_t> group = row_groups(p.counts);
  std::vector<double> y(static_cast<size_t>(S * N)), h(static_cast<size_t>(W)),
      z(static_cast<size_t>(F));
  for (int64_t t = 0; t < S; ++t) {
    const int64_t g = group[static_cast<size_t>(t)];
    for (int64_t c = 0; c < W; ++c) {
      double v = p.b1.empty() ? 0.0 : p.b1[static_cast<size_t>(g * W + c)];
      for (int64_t k = 0; k < H; ++k)
        v += p.x[static_cast<size_t>(t * H + k)] * p.w1[static_cast<size_t>((g * W + c) * H + k)];
      h[static_cast<size_t>(c)] = v;
    }
    const double pt = p.probs[static_cast<size_t>(t)];
    for (int64_t j = 0; j < F; ++j) {
      const double a = h[static_cast<size_t>(glu_gate_column(j, F, p.layout))];
      const double b = h[static_cast<size_t>(glu_linear_column(j, F, p.layout))];
      z[static_cast<size_t>(j)] = pt * silu(a) * b;
    }
    for (int64_t n = 0; n < N; ++n) {
      double v = p.b2.empty() ? 0.0 : pt * p.b2[static_cast<size_t>(g * N + n)];
      for (int64_t j = 0; j < F; ++j)
        v += z[static_cast<size_t>(j)] * p.w2[static_cast<size_t>((g * N + n) * F + j)];
      y[static_cast<size_t>(t * N + n)] = v;
    }
  }
  return y;
}

// ---------------------------------------------------------------- test problems
MlpCase MlpCase::resolved() const {
  MlpCase c = *this;
  if (c.counts.empty()) {
    c.counts.assign(static_cast<size_t>(c.G), 0);
    for (int64_t g = 0; g < c.G; ++g) c.counts[static_cast<size_t>(g)] = g == 1 ? 0 : 3 + 2 * g;
  }
  if (c.T == 0) c.T = total(c.counts) + 5;
  if (c.N == 0) c.N = c.H;
  return c;
}

MlpData make_mlp_data(const MlpCase& in) {
  MlpData d;
  d.c = in.resolved();
  const MlpCase& c = d.c;
  const DType dt = c.dtype;
  d.x = random_normal({c.T, c.H}, dt, c.seed * 101 + 1);
  d.w1 = random_normal({c.G, 2 * c.F, c.H}, dt, c.seed * 101 + 2,
                       1.0 / std::sqrt(static_cast<double>(c.H)));
  d.w2 = random_normal({c.G, c.N, c.F}, dt, c.seed * 101 + 3,
                       1.0 / std::sqrt(static_cast<double>(c.F)));
  if (c.b1) d.b1 = random_normal({c.G, 2 * c.F}, dt, c.seed * 101 + 4, 0.5);
  if (c.b2) d.b2 = random_normal({c.G, c.N}, dt, c.seed * 101 + 5, 0.5);
  d.dy = random_normal({c.T, c.N}, dt, c.seed * 101 + 6);
  // Routing weights in (0.1, 1): a normal draw squashed, so never 0 and never all equal.
  d.probs = random_normal({c.T}, DType::F32, c.seed * 101 + 7);
  for (int64_t t = 0; t < c.T; ++t) {
    float& p = d.probs.data_as<float>()[t];
    p = 0.1f + 0.9f * std::abs(p) / (1.0f + std::abs(p));
  }
  return d;
}

MlpProblem MlpData::problem() const {
  MlpProblem p;
  p.T = c.T;
  p.H = c.H;
  p.F = c.F;
  p.N = c.N;
  p.G = c.G;
  p.counts = c.counts;
  p.layout = c.layout;
  p.dtype = c.dtype;
  p.x = to_doubles(host(), x);
  p.w1 = to_doubles(host(), w1);
  p.w2 = to_doubles(host(), w2);
  if (b1.defined()) p.b1 = to_doubles(host(), b1);
  if (b2.defined()) p.b2 = to_doubles(host(), b2);
  p.probs = to_doubles(host(), probs);
  return p;
}

MlpOps make_mlp_ops(const Context& ctx, const MlpData& d) {
  const MlpCase& c = d.c;
  MlpOps ops;
  ops.fc1 = std::make_shared<GroupedLinearOp>(
      GroupedLinearConfig{.groups = c.G, .in = c.H, .out = 2 * c.F, .dtype = c.dtype, .bias = c.b1},
      ctx);
  ops.act = std::make_shared<ScaledSwiGLU>(SwiGLUConfig{.layout = c.layout}, ctx);
  ops.fc2 = std::make_shared<GroupedLinearOp>(
      GroupedLinearConfig{.groups = c.G, .in = c.F, .out = c.N, .dtype = c.dtype, .bias = c.b2},
      ctx, GroupedLinearOpOptions{.scale_bias = c.b2});
  copy(ctx, d.w1, ops.fc1->linear().weight());
  copy(ctx, d.w2, ops.fc2->linear().weight());
  if (c.b1) copy(ctx, d.b1, ops.fc1->bias());
  if (c.b2) copy(ctx, d.b2, ops.fc2->bias());
  return ops;
}

// ---------------------------------------------------------------- finite differences
::testing::AssertionResult matches_finite_differences(const Context& ctx,
                                                      std::vector<FdSlot>& slots,
                                                      const std::function<double()>& loss,
                                                      double step, double rtol) {
  std::ostringstream failures;
  int64_t bad = 0, checked = 0;
  for (FdSlot& s : slots) {
    if (s.host.dtype() != DType::F32) {
      return ::testing::AssertionFailure() << s.name << ": finite differences need an f32 tensor";
    }
    float* v = s.host.data_as<float>();
    const auto n = static_cast<size_t>(s.host.numel());
    if (s.analytic.size() < n) {
      return ::testing::AssertionFailure()
             << s.name << ": " << s.analytic.size() << " analytic values for " << n << " elements";
    }
    for (size_t i = 0; i < n; ++i) {
      const float orig = v[i];
      const float plus = static_cast<float>(orig + step), minus = static_cast<float>(orig - step);
      v[i] = plus;
      copy(ctx, s.host, s.device);
      const double lp = loss();
      v[i] = minus;
      copy(ctx, s.host, s.device);
      const double lm = loss();
      v[i] = orig;
      copy(ctx, s.host, s.device);
      const double fd = (lp - lm) / (static_cast<double>(plus) - static_cast<double>(minus));
      const double g = s.analytic[i];
      ++checked;
      if (!(std::abs(fd - g) <= rtol * (1.0 + std::abs(g)))) {
        if (bad++ < 3) {
          failures << "\n  " << s.name << "[" << i << "]: analytic " << g << ", finite difference "
                   << fd;
        }
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess() << checked << " elements checked";
  return ::testing::AssertionFailure()
         << bad << " of " << checked
         << " gradient elements disagree with finite differences:" << failures.str();
}

}  // namespace moekit::test
