// The router primitives (moekit/primitives/router.h) on every device against an fp64 reference
// written here in the header's order: fuzzed shapes (T = 0, E = 1, k = E), dtypes, softmax /
// sigmoid, normalised or not; sentinel-filled outputs; ties broken by the lower expert; the
// backward in place and out of place, with and without dx_e; argument errors before any work.
//
// Tolerance: on the CPU the reference is the same arithmetic in the same order, so every output is
// compared bit for bit. On CUDA the logits and every sum are the same fp64 operations (no FMA), and
// only the device's fp64 exp may differ from glibc's by an fp64 ulp: the top-k indices must be
// equal, and each weight / gradient element within one ulp of its dtype of the reference value
// (|Δ| ≤ ε_dtype·|ref|, ε = 2⁻²³ f32, 2⁻¹⁰ f16, 2⁻⁷ bf16) plus 1e-12·max|ref| for fp64 cancellation
// — a wrong element (a wrong expert, a missed term, an unwritten sentinel) is far outside that.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "moekit/moekit.h"
#include "support/test_util.h"

namespace moekit::test {
namespace {

using ::testing::HasSubstr;

struct Case {
  int64_t T = 5, E = 6, H = 7, k = 2;
  DType dt = DType::F32;
  RouterOptions o;
  uint64_t seed = 1;
};

std::string describe(const Case& c) {
  return str("T=", c.T, " E=", c.E, " H=", c.H, " k=", c.o.topk, " ", name(c.dt),
             c.o.score == RouterScore::Softmax ? " softmax" : " sigmoid",
             c.o.normalize ? " normalized" : "", " seed=", c.seed);
}

std::vector<double> f64(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  to_f64(t.data(), t.dtype(), v.data(), v.size());
  return v;
}
double rounded(double v, DType dt) {  // v rounded once to dt, as fp64
  std::vector<uint8_t> b(size_of(dt));
  from_f64(&v, b.data(), dt, 1);
  double out;
  to_f64(b.data(), dt, &out, 1);
  return out;
}

// The reference (host fp64, the header's math and order).
struct Ref {
  std::vector<double> scores;     // [T, E]
  std::vector<int64_t> idx;       // [T, k]
  std::vector<double> w;          // [T, k], rounded to f32
  std::vector<double> dgate, dx;  // [E, H], [T, H], rounded to the dtype
};
Ref reference(const Case& c, const Tensor& x, const Tensor& gate, const Tensor& gw,
              const Tensor& dxe) {
  const int64_t T = c.T, E = c.E, H = c.H, k = c.o.topk;
  const auto xv = f64(x), gv = f64(gate), g = f64(gw);
  Ref r;
  r.scores.assign(static_cast<size_t>(T * E), 0);
  r.idx.assign(static_cast<size_t>(T * k), -1);
  r.w.assign(static_cast<size_t>(T * k), 0);
  std::vector<double> dg(static_cast<size_t>(E * H), 0.0);
  std::vector<double> dx =
      dxe.defined() ? f64(dxe) : std::vector<double>(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t) {
    double* s = &r.scores[static_cast<size_t>(t * E)];
    for (int64_t e = 0; e < E; ++e) {
      double l = 0;
      for (int64_t h = 0; h < H; ++h)
        l += xv[static_cast<size_t>(t * H + h)] * gv[static_cast<size_t>(e * H + h)];
      s[e] = l;
    }
    if (c.o.score == RouterScore::Softmax) {
      double m = s[0];
      for (int64_t e = 1; e < E; ++e) m = std::max(m, s[e]);
      double z = 0;
      for (int64_t e = 0; e < E; ++e) z += (s[e] = std::exp(s[e] - m));
      for (int64_t e = 0; e < E; ++e) s[e] /= z;
    } else {
      for (int64_t e = 0; e < E; ++e) s[e] = 1.0 / (1.0 + std::exp(-s[e]));
    }
    std::vector<int64_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[a] > s[b]; });
    double zk = 0;
    for (int64_t j = 0; j < k; ++j) zk += s[order[static_cast<size_t>(j)]];
    std::vector<double> ds(static_cast<size_t>(E), 0.0);
    double gdotw = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = order[static_cast<size_t>(j)];
      r.idx[static_cast<size_t>(t * k + j)] = e;
      r.w[static_cast<size_t>(t * k + j)] = static_cast<float>(c.o.normalize ? s[e] / zk : s[e]);
      if (c.o.normalize) gdotw += g[static_cast<size_t>(t * k + j)] * s[e] / zk;
    }
    for (int64_t j = 0; j < k; ++j) {
      const double gj = g[static_cast<size_t>(t * k + j)];
      ds[static_cast<size_t>(order[static_cast<size_t>(j)])] =
          c.o.normalize ? (gj - gdotw) / zk : gj;
    }
    std::vector<double> dl(static_cast<size_t>(E));
    if (c.o.score == RouterScore::Softmax) {
      double dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += ds[static_cast<size_t>(e)] * s[e];
      for (int64_t e = 0; e < E; ++e)
        dl[static_cast<size_t>(e)] = s[e] * (ds[static_cast<size_t>(e)] - dot);
    } else {
      for (int64_t e = 0; e < E; ++e)
        dl[static_cast<size_t>(e)] = ds[static_cast<size_t>(e)] * s[e] * (1 - s[e]);
    }
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t h = 0; h < H; ++h) {
        dg[static_cast<size_t>(e * H + h)] +=
            dl[static_cast<size_t>(e)] * xv[static_cast<size_t>(t * H + h)];
        dx[static_cast<size_t>(t * H + h)] +=
            dl[static_cast<size_t>(e)] * gv[static_cast<size_t>(e * H + h)];
      }
    }
  }
  for (double& v : dg) v = rounded(v, c.dt);
  for (double& v : dx) v = rounded(v, c.dt);
  r.dgate = std::move(dg);
  r.dx = std::move(dx);
  return r;
}

// Bit for bit on the CPU; on CUDA within one ulp of `dt` (file comment).
::testing::AssertionResult matches(const char* what, const std::vector<double>& got,
                                   const std::vector<double>& want, DType dt, bool exact) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure()
           << what << ": " << got.size() << " elements, want " << want.size();
  double mag = 0;
  for (double v : want) mag = std::max(mag, std::fabs(v));
  for (size_t i = 0; i < want.size(); ++i) {
    const double tol = exact ? 0.0 : epsilon(dt) * std::fabs(want[i]) + 1e-12 * mag;
    const bool ok = exact ? std::memcmp(&got[i], &want[i], sizeof(double)) == 0 || got[i] == want[i]
                          : std::fabs(got[i] - want[i]) <= tol;
    if (!ok) {
      return ::testing::AssertionFailure()
             << what << "[" << i << "] = " << got[i] << ", want " << want[i]
             << (exact ? " (bit for bit)" : str(" (tolerance ", tol, ")"));
    }
  }
  return ::testing::AssertionSuccess();
}

class RouterPrimitive : public DeviceTest {
 protected:
  bool exact() const { return ctx_.device().is_cpu(); }

  // Forward + backward of one case on ctx_, checked against the reference.
  void run_case(const Case& c, Tensor gate_host = {}) {
    SCOPED_TRACE(describe(c));
    const int64_t T = c.T, E = c.E, H = c.H, k = c.o.topk;
    const Tensor x_h = random_normal({T, H}, c.dt, c.seed);
    if (!gate_host.defined()) gate_host = random_normal({E, H}, c.dt, c.seed + 1, 0.7);
    const Tensor gw_h = random_normal({T, k}, DType::F32, c.seed + 2);
    const Tensor dxe_h = random_normal({T, H}, c.dt, c.seed + 3);
    const Ref ref = reference(c, x_h, gate_host, gw_h, dxe_h);
    const Tensor x = to_device(ctx_, x_h), gate = to_device(ctx_, gate_host);
    Tensor idx = filled(ctx_, {T, k}, DType::I64, kSentinel);
    Tensor w = filled(ctx_, {T, k}, DType::F32, kSentinel);
    Tensor scores = filled(ctx_, {T, E}, DType::I64, kSentinel);
    router_topk(ctx_, x, gate, c.o, idx, w, scores);
    const std::vector<double> got_idx = to_doubles(ctx_, idx);
    for (size_t i = 0; i < ref.idx.size(); ++i)
      ASSERT_EQ(got_idx[i], static_cast<double>(ref.idx[i])) << "topk_idx element " << i;
    EXPECT_TRUE(matches("topk_weights", to_doubles(ctx_, w), ref.w, DType::F32, exact()));
    const std::vector<uint8_t> sb = bytes_of(ctx_, scores);
    std::vector<double> got_scores(ref.scores.size());
    std::memcpy(got_scores.data(), sb.data(), sb.size());
    EXPECT_TRUE(matches("scores (fp64)", got_scores, ref.scores, DType::F32, exact()));

    // Backward out of place (dx_e kept), then in place (dx into dx_e), then without dx_e.
    const Tensor gw = to_device(ctx_, gw_h), dxe = to_device(ctx_, dxe_h);
    Tensor dgate = filled(ctx_, {E, H}, c.dt, kSentinel),
           dx = filled(ctx_, {T, H}, c.dt, kSentinel);
    router_topk_backward(ctx_, x, gate, scores, idx, gw, dxe, c.o, dgate, dx);
    EXPECT_TRUE(matches("grad_gate", to_doubles(ctx_, dgate), ref.dgate, c.dt, exact()));
    EXPECT_TRUE(matches("grad_input", to_doubles(ctx_, dx), ref.dx, c.dt, exact()));
    EXPECT_EQ(to_doubles(ctx_, dxe), f64(dxe_h)) << "dx_e is an input when grad_input is not it";
    Tensor dgate2 = filled(ctx_, {E, H}, c.dt, kSentinel);
    router_topk_backward(ctx_, x, gate, scores, idx, gw, dxe, c.o, dgate2, dxe);
    EXPECT_EQ(bytes_of(ctx_, dxe), bytes_of(ctx_, dx)) << "in place = out of place, bit for bit";
    EXPECT_EQ(bytes_of(ctx_, dgate2), bytes_of(ctx_, dgate));
    Tensor dx0 = filled(ctx_, {T, H}, c.dt, kSentinel);
    router_topk_backward(ctx_, x, gate, scores, idx, gw, Tensor(), c.o, dgate2, dx0);
    const Ref ref0 = reference(c, x_h, gate_host, gw_h, Tensor());
    EXPECT_TRUE(matches("grad_input without dx_e", to_doubles(ctx_, dx0), ref0.dx, c.dt, exact()));
  }
};

TEST_P(RouterPrimitive, FuzzedShapesMatchTheFp64Reference) {
  std::mt19937_64 rng(41);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const DType dtypes[] = {DType::F32, DType::BF16, DType::F16};
  for (int i = 0; i < 40; ++i) {
    Case c;
    c.T = i == 0 ? 0 : pick(1, 70);
    c.E = i == 1 ? 1 : pick(1, 70);
    c.H = pick(1, 80);
    c.o.topk = i == 2 ? c.E : pick(1, std::min<int64_t>(c.E, 9));
    c.dt = dtypes[i % 3];
    c.o.score = pick(0, 1) ? RouterScore::Softmax : RouterScore::Sigmoid;
    c.o.normalize = pick(0, 1) == 1;
    c.seed = 1000 + static_cast<uint64_t>(i) * 10;
    run_case(c);
    if (HasFatalFailure()) return;
  }
}

// Two experts with the same gate row have the same score for every token: the lower index comes
// first; with k = 1 only the lower one is chosen. Rows 1 and 4 are (3, ..., 3) and x > 0, so they
// lead every token; the other rows are small.
TEST_P(RouterPrimitive, TiesGoToTheLowerExpert) {
  for (RouterScore score : {RouterScore::Softmax, RouterScore::Sigmoid}) {
    for (int64_t k : {1, 2, 3}) {
      Case c;
      c.T = 9;
      c.E = 6;
      c.H = 5;
      c.o = {.topk = k, .score = score};
      Tensor gate = random_normal({c.E, c.H}, c.dt, 77, 0.05);
      Tensor x = random_normal({c.T, c.H}, c.dt, 78);
      for (int64_t i = 0; i < x.numel(); ++i)
        x.data_as<float>()[i] = std::fabs(x.data_as<float>()[i]) + 0.25f;
      for (int64_t h = 0; h < c.H; ++h) {
        gate.data_as<float>()[1 * c.H + h] = 3.0f;
        gate.data_as<float>()[4 * c.H + h] = 3.0f;
      }
      run_case(c, gate);  // the reference (a stable sort) agrees, on random x
      Tensor idx = filled(ctx_, {c.T, k}, DType::I64, kSentinel);
      Tensor w = filled(ctx_, {c.T, k}, DType::F32, kSentinel);
      Tensor scores = filled(ctx_, {c.T, c.E}, DType::I64, kSentinel);
      router_topk(ctx_, to_device(ctx_, x), to_device(ctx_, gate), c.o, idx, w, scores);
      const auto got = to_doubles(ctx_, idx), gw = to_doubles(ctx_, w);
      for (int64_t t = 0; t < c.T; ++t) {
        EXPECT_EQ(got[static_cast<size_t>(t * k)], 1.0) << "token " << t << " k " << k;
        if (k > 1) {
          EXPECT_EQ(got[static_cast<size_t>(t * k + 1)], 4.0) << "token " << t;
          EXPECT_EQ(gw[static_cast<size_t>(t * k)], gw[static_cast<size_t>(t * k + 1)]);
        }
      }
    }
  }
}

TEST_P(RouterPrimitive, ArgumentErrorsNameTheArgumentAndWriteNothing) {
  const int64_t T = 4, E = 3, H = 5;
  const Tensor x = to_device(ctx_, random_normal({T, H}, DType::F32, 1));
  const Tensor gate = to_device(ctx_, random_normal({E, H}, DType::F32, 2));
  Tensor idx = filled(ctx_, {T, 4}, DType::I64, kSentinel),
         w = filled(ctx_, {T, 4}, DType::F32, kSentinel);
  Tensor scores = filled(ctx_, {T, E}, DType::I64, kSentinel);
  auto e = caught([&] { router_topk(ctx_, x, gate, {.topk = 4}, idx, w, scores); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'topk'"));
  EXPECT_THAT(e->what(), HasSubstr("1 <= topk <= E = 3"));
  EXPECT_THAT(e->what(), HasSubstr("4"));
  const Tensor gate16 = to_device(ctx_, random_normal({E, H}, DType::BF16, 2));
  e = caught([&] { router_topk(ctx_, x, gate16, {.topk = 2}, idx.rows(0, T), w, scores); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'gate'"));
  Tensor small = filled(ctx_, {T, 1}, DType::I64, kSentinel);
  e = caught([&] { router_topk(ctx_, x, gate, {.topk = 2}, small, w, scores); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'topk_idx'"));
  EXPECT_EQ(to_doubles(ctx_, scores), std::vector<double>(static_cast<size_t>(T * E), kSentinel));
  EXPECT_EQ(to_doubles(ctx_, small), std::vector<double>(static_cast<size_t>(T), kSentinel));
}

INSTANTIATE_TEST_SUITE_P(Devices, RouterPrimitive, ::testing::ValuesIn(device_names()),
                         test::device_name);

}  // namespace
}  // namespace moekit::test
