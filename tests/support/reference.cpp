#include "support/reference.h"

#include <cmath>
#include <numeric>

namespace moekit::test {
namespace {

std::vector<int64_t> offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> off(counts.size() + 1, 0);
  for (size_t g = 0; g < counts.size(); ++g) off[g + 1] = off[g] + counts[g];
  return off;
}

size_t at(int64_t i) {
  return static_cast<size_t>(i);
}

}  // namespace

Reference reference_forward(const std::vector<double>& x, const std::vector<double>& w,
                            const std::vector<double>& bias, const std::vector<int64_t>& counts,
                            int64_t K, int64_t N) {
  const auto off = offsets(counts);
  const int64_t S = off.back();
  Reference r;
  r.cols = N;
  r.value.assign(at(S * N), 0.0);
  r.magnitude.assign(at(S * N), 0.0);
  r.length.assign(at(S * N), K + (bias.empty() ? 0 : 1));
  for (size_t g = 0; g < counts.size(); ++g) {
    for (int64_t row = off[g]; row < off[g + 1]; ++row) {
      for (int64_t n = 0; n < N; ++n) {
        double s = 0, m = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double t = x[at(row * K + k)] * w[at((static_cast<int64_t>(g) * N + n) * K + k)];
          s += t;
          m += std::fabs(t);
        }
        if (!bias.empty()) {
          const double b = bias[at(static_cast<int64_t>(g) * N + n)];
          s += b;
          m += std::fabs(b);
        }
        r.value[at(row * N + n)] = s;
        r.magnitude[at(row * N + n)] = m;
      }
    }
  }
  return r;
}

// dgrad and wgrad walk their operands along rows (the k loop innermost, contiguous): each sum
// still takes its terms in the order of its reduction index (n, or the group's rows), so the
// values are those of the textbook loops, at a fraction of their cache misses.
Reference reference_dgrad(const std::vector<double>& dy, const std::vector<double>& w,
                          const std::vector<int64_t>& counts, int64_t K, int64_t N) {
  const auto off = offsets(counts);
  const int64_t S = off.back();
  Reference r;
  r.cols = K;
  r.value.assign(at(S * K), 0.0);
  r.magnitude.assign(at(S * K), 0.0);
  r.length.assign(at(S * K), N);
  for (size_t g = 0; g < counts.size(); ++g) {
    for (int64_t row = off[g]; row < off[g + 1]; ++row) {
      double* s = r.value.data() + at(row * K);
      double* m = r.magnitude.data() + at(row * K);
      for (int64_t n = 0; n < N; ++n) {
        const double d = dy[at(row * N + n)];
        const double* wr = w.data() + at((static_cast<int64_t>(g) * N + n) * K);
        for (int64_t k = 0; k < K; ++k) {
          const double t = d * wr[k];
          s[k] += t;
          m[k] += std::fabs(t);
        }
      }
    }
  }
  return r;
}

Reference reference_wgrad(const std::vector<double>& dy, const std::vector<double>& x,
                          const std::vector<int64_t>& counts, int64_t K, int64_t N,
                          const std::vector<double>& start) {
  const auto off = offsets(counts);
  const auto G = static_cast<int64_t>(counts.size());
  Reference r;
  r.cols = K;
  r.value.assign(at(G * N * K), 0.0);
  r.magnitude.assign(at(G * N * K), 0.0);
  r.length.assign(at(G * N * K), 0);
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t row = off[at(g)]; row < off[at(g) + 1]; ++row) {
      const double* xr = x.data() + at(row * K);
      for (int64_t n = 0; n < N; ++n) {
        const double d = dy[at(row * N + n)];
        double* s = r.value.data() + at((g * N + n) * K);
        double* m = r.magnitude.data() + at((g * N + n) * K);
        for (int64_t k = 0; k < K; ++k) {
          const double t = d * xr[k];
          s[k] += t;
          m[k] += std::fabs(t);
        }
      }
    }
    for (int64_t i = g * N * K; i < (g + 1) * N * K; ++i) {
      r.length[at(i)] = counts[at(g)];
      if (!start.empty()) {
        r.value[at(i)] += start[at(i)];
        r.magnitude[at(i)] += std::fabs(start[at(i)]);
        r.length[at(i)] += 1;
      }
    }
  }
  return r;
}

Reference reference_dbias(const std::vector<double>& dy, const std::vector<int64_t>& counts,
                          int64_t N) {
  const auto off = offsets(counts);
  const auto G = static_cast<int64_t>(counts.size());
  Reference r;
  r.cols = N;
  r.value.assign(at(G * N), 0.0);
  r.magnitude.assign(at(G * N), 0.0);
  r.length.assign(at(G * N), 0);
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, m = 0;
      for (int64_t row = off[at(g)]; row < off[at(g) + 1]; ++row) {
        s += dy[at(row * N + n)];
        m += std::fabs(dy[at(row * N + n)]);
      }
      r.value[at(g * N + n)] = s;
      r.magnitude[at(g * N + n)] = m;
      r.length[at(g * N + n)] = counts[at(g)];
    }
  }
  return r;
}

double accumulation_bound(int64_t terms, double magnitude, double acc_epsilon) {
  const double u = acc_epsilon > 0 ? acc_epsilon : epsilon(DType::F32);
  return kAccumulationLambda / 2 * std::sqrt(static_cast<double>(terms)) * u * magnitude;
}

namespace {
// Spacing of the subnormals of `t` (the rounding error floor below its smallest normal).
double subnormal_spacing(DType t) {
  switch (t) {
    case DType::F16:
      return std::ldexp(1.0, -24);
    case DType::BF16:
      return std::ldexp(1.0, -133);
    default:
      return std::ldexp(1.0, -149);
  }
}
}  // namespace

double tolerance(const Reference& ref, size_t i, DType out, double acc_epsilon) {
  if (ref.length[i] == 0) return 0.0;  // an empty reduction is exactly 0 (no rounding at all)
  const double acc = accumulation_bound(ref.length[i], ref.magnitude[i], acc_epsilon);
  return epsilon(out) / 2 * (std::fabs(ref.value[i]) + acc) + acc + subnormal_spacing(out) / 2;
}

namespace {
::testing::AssertionResult compare(std::string_view what, const std::vector<double>& got,
                                   const std::vector<double>& want, const Reference& ref, DType out,
                                   double scale, std::string_view want_name, double acc_epsilon = 0.0) {
  const size_t n = ref.value.size();
  if (got.size() < n || want.size() < n) {
    return ::testing::AssertionFailure()
           << what << ": " << got.size() << " values, expected at least " << n;
  }
  size_t bad = 0, first = n;
  for (size_t i = 0; i < n; ++i) {
    const double tol = scale * tolerance(ref, i, out, acc_epsilon);
    if (!(std::fabs(got[i] - want[i]) <= tol)) {  // written so that NaN fails
      if (first == n) first = i;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  const auto cols = static_cast<size_t>(ref.cols);
  return ::testing::AssertionFailure()
         << what << " (" << name(out) << "): " << bad << " of " << n
         << " elements outside tolerance; first at index " << first << " (row " << first / cols
         << ", col " << first % cols << "): got " << got[first] << ", " << want_name << " "
         << want[first] << ", |diff| " << std::fabs(got[first] - want[first]) << ", tolerance "
         << scale * tolerance(ref, first, out, acc_epsilon) << " (fp64 reference " << ref.value[first]
         << ", magnitude " << ref.magnitude[first] << ", terms " << ref.length[first] << ")";
}
}  // namespace

::testing::AssertionResult matches_reference(std::string_view what, const std::vector<double>& got,
                                             const Reference& ref, DType out, double acc_epsilon) {
  return compare(what, got, ref.value, ref, out, 1.0, "reference", acc_epsilon);
}

::testing::AssertionResult close_to_each_other(std::string_view what, const std::vector<double>& a,
                                               const std::vector<double>& b, const Reference& ref,
                                               DType out) {
  return compare(what, a, b, ref, out, 2.0, "other");
}

}  // namespace moekit::test
