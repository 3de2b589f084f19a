// test_grouped_linear — GroupedLinear (SPEC §2), its splits handling (§1) and caller-provided
// output / grad_input buffers (§3), on every available device.
//
// Every device-dependent test is written once (TEST_P) and instantiated for "cpu" and "cuda";
// the CUDA instantiation skips with "no CUDA device: <why>" where there is none. Data is random
// normal (fixed seeds), generated on the host in the op's dtype and moved to the device; results
// are copied back and compared with an fp64 reference of the *stored* inputs under the tolerance
// rule of support/reference.h. The op's context uses a poisoning allocator (new memory is NaN), so
// an internally allocated result with an unwritten row fails; caller buffers are pre-filled with
// the sentinel 7.0 and their tail rows [S, T) are checked bit for bit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <sstream>

#include "moekit/moekit.h"
#include "support/reference.h"
#include "support/test_util.h"

namespace moekit {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace moekit::test;

constexpr DType kDtypes[] = {DType::F32, DType::F16, DType::BF16};

// ---------------------------------------------------------------- cases

struct Case {
  std::string label;
  int64_t K = 0, N = 0;
  std::vector<int64_t> counts;
  int64_t tail = 0;  // T - S: capacity rows after the valid ones
  int64_t G() const { return static_cast<int64_t>(counts.size()); }
  int64_t S() const {
    int64_t s = 0;
    for (int64_t c : counts) s += c;
    return s;
  }
  int64_t T() const { return S() + tail; }
  std::string describe() const {
    std::ostringstream os;
    os << label << ": G=" << G() << " K=" << K << " N=" << N << " T=" << T() << " S=" << S()
       << " counts=" << ::testing::PrintToString(counts);
    return os.str();
  }
};

// Shapes every correctness suite runs: zero-row groups, one group, all rows in one group, a
// capacity tail and T == S, K/N that are multiples of nothing, groups larger than the CPU
// backend's 256-row block, and the degenerate all-empty / no-rows cases.
const std::vector<Case>& standard_cases() {
  static const std::vector<Case> cases{
      {"zero_row_groups_with_tail", 37, 29, {5, 0, 11, 3}, 4},
      {"single_group_T_equals_S", 64, 48, {33}, 0},
      {"all_rows_in_one_group", 19, 70, {0, 0, 41, 0, 0}, 4},
      {"empty_first_and_last_groups", 131, 67, {0, 7, 1, 13, 2, 0}, 9},
      {"every_group_empty", 23, 17, {0, 0, 0}, 5},
      {"no_rows_at_all", 8, 5, {0, 0}, 0},
      {"K_and_N_of_one", 1, 1, {3, 0, 2}, 1},
      {"group_larger_than_a_row_block", 200, 150, {300, 0, 17}, 13},
  };
  return cases;
}

// A random case. Seeds cycle through split patterns so every pattern is covered: random counts
// with zero-row groups, a single group, all rows in one group, mostly-empty groups; the tail is
// zero for every third seed.
Case fuzz_case(uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + 17);
  auto uni = [&rng](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  Case c;
  c.K = uni(1, 160);
  c.N = uni(1, 160);
  const int64_t G = uni(2, 9);
  switch (seed % 4) {
    case 0:  // random, about a third of the groups empty
      c.label = "fuzz_random_counts";
      for (int64_t g = 0; g < G; ++g) c.counts.push_back(uni(0, 2) == 0 ? 0 : uni(1, 40));
      break;
    case 1:
      c.label = "fuzz_single_group";
      c.counts = {uni(1, 90)};
      break;
    case 2:
      c.label = "fuzz_all_rows_in_one_group";
      c.counts.assign(static_cast<size_t>(G), 0);
      c.counts[static_cast<size_t>(uni(0, G - 1))] = uni(1, 90);
      break;
    default:
      c.label = "fuzz_mostly_empty";
      c.counts.assign(static_cast<size_t>(G), 0);
      c.counts[static_cast<size_t>(uni(0, G - 1))] += uni(1, 30);
      c.counts[static_cast<size_t>(uni(0, G - 1))] += uni(1, 30);
  }
  c.tail = seed % 3 == 0 ? 0 : uni(1, 17);
  c.label += "_seed" + std::to_string(seed);
  return c;
}

// ---------------------------------------------------------------- device fixture

class OnDevice : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    std::optional<Context> c = make_context(GetParam(), &why);
    if (!c) GTEST_SKIP() << "no CUDA device: " << why;
    ctx_.emplace(poisoned(*c));
  }
  const Context& ctx() const { return *ctx_; }
  bool on_cpu() const { return ctx().device().is_cpu(); }

 private:
  std::optional<Context> ctx_;
};

#define MOEKIT_ON_EVERY_DEVICE(Suite) \
  class Suite : public OnDevice {};   \
  INSTANTIATE_TEST_SUITE_P(Device, Suite, ::testing::ValuesIn(test::device_names()), test::device_name)

MOEKIT_ON_EVERY_DEVICE(Forward);
MOEKIT_ON_EVERY_DEVICE(Backward);
MOEKIT_ON_EVERY_DEVICE(Fuzz);
MOEKIT_ON_EVERY_DEVICE(DeviceSplits);
MOEKIT_ON_EVERY_DEVICE(ZeroRowGroups);
MOEKIT_ON_EVERY_DEVICE(MainGrad);
MOEKIT_ON_EVERY_DEVICE(FrozenWeights);
MOEKIT_ON_EVERY_DEVICE(InputWithoutGrad);
MOEKIT_ON_EVERY_DEVICE(Equivalence);
MOEKIT_ON_EVERY_DEVICE(Reproducibility);
MOEKIT_ON_EVERY_DEVICE(ExpertViews);
MOEKIT_ON_EVERY_DEVICE(Layer);
MOEKIT_ON_EVERY_DEVICE(CallerBuffer);
MOEKIT_ON_EVERY_DEVICE(CallerBufferRejects);
MOEKIT_ON_EVERY_DEVICE(BadSplits);

// ---------------------------------------------------------------- problems

enum class SplitsKind { Host, DeviceI32, DeviceI64 };
const char* describe(SplitsKind k) {
  return k == SplitsKind::Host        ? "host splits"
         : k == SplitsKind::DeviceI32 ? "device i32 splits"
                                      : "device i64 splits";
}

Splits make_splits(const Context& ctx, const std::vector<int64_t>& counts, SplitsKind kind) {
  if (kind == SplitsKind::Host) return Splits::host(counts);
  return Splits::device(to_device(
      ctx, counts_tensor(counts, kind == SplitsKind::DeviceI32 ? DType::I32 : DType::I64)));
}

// One layer with its data: random weights/bias copied into the layer's own parameters, input x
// [T, K] and upstream gradient dy [T, N] (tail rows random too: the op must ignore them).
struct Problem {
  Case c;
  DType dtype = DType::F32;
  bool has_bias = false;
  std::vector<double> x, w, b, dy;  // stored values, fp64
  Tensor x_dev, dy_dev;             // on the device under test
  std::optional<GroupedLinear> layer;

  int64_t T() const { return c.T(); }
  size_t es() const { return size_of(dtype); }
  Reference ref_y() const { return reference_forward(x, w, b, c.counts, c.K, c.N); }
  Reference ref_dx() const { return reference_dgrad(dy, w, c.counts, c.K, c.N); }
  Reference ref_dw(const std::vector<double>& start = {}) const {
    return reference_wgrad(dy, x, c.counts, c.K, c.N, start);
  }
  Reference ref_db() const { return reference_dbias(dy, c.counts, c.N); }
};

Problem make_problem(const Context& ctx, const Case& c, DType dtype, bool bias, uint64_t seed = 1) {
  Problem p;
  p.c = c;
  p.dtype = dtype;
  p.has_bias = bias;
  const int64_t G = c.G(), T = c.T();
  const Tensor xh = random_normal({T, c.K}, dtype, seed * 100 + 1);
  const Tensor wh = random_normal({G, c.N, c.K}, dtype, seed * 100 + 2);
  const Tensor dyh = random_normal({T, c.N}, dtype, seed * 100 + 3);
  p.x = to_doubles(host(), xh);
  p.w = to_doubles(host(), wh);
  p.dy = to_doubles(host(), dyh);
  p.layer.emplace(
      GroupedLinearConfig{.groups = G, .in = c.K, .out = c.N, .dtype = dtype, .bias = bias}, ctx);
  copy(ctx, wh, p.layer->weight());
  if (bias) {
    const Tensor bh = random_normal({G, c.N}, dtype, seed * 100 + 4);
    p.b = to_doubles(host(), bh);
    copy(ctx, bh, p.layer->bias());
  }
  p.x_dev = to_device(ctx, xh);
  p.dy_dev = to_device(ctx, dyh);
  return p;
}

std::string trace(const Problem& p, SplitsKind k = SplitsKind::Host) {
  return p.c.describe() + " dtype=" + std::string(name(p.dtype)) +
         (p.has_bias ? " with bias" : " without bias") + ", " + describe(k);
}

// The first `rows` rows of a [*, cols] result as fp64 (the valid rows [0, S)).
std::vector<double> valid_rows(const Context& ctx, const Tensor& t, int64_t rows) {
  std::vector<double> v = to_doubles(ctx, t);
  v.resize(static_cast<size_t>(rows * t.size(1)));
  return v;
}

// Rows [begin, end) of a reference (its `cols`-wide row layout).
Reference slice_rows(const Reference& r, int64_t begin, int64_t end) {
  Reference s;
  s.cols = r.cols;
  const auto b = static_cast<size_t>(begin * r.cols), e = static_cast<size_t>(end * r.cols);
  s.value.assign(r.value.begin() + b, r.value.begin() + e);
  s.magnitude.assign(r.magnitude.begin() + b, r.magnitude.begin() + e);
  s.length.assign(r.length.begin() + b, r.length.begin() + e);
  return s;
}

// Checks a full forward + backward result against the fp64 reference.
void expect_matches_reference(const Context& ctx, const Problem& p, const Tensor& y,
                              const GroupedLinear::Grads& g) {
  EXPECT_TRUE(matches_reference("y", valid_rows(ctx, y, p.c.S()), p.ref_y(), p.dtype));
  ASSERT_TRUE(g.input.defined());
  EXPECT_TRUE(matches_reference("dx", valid_rows(ctx, g.input, p.c.S()), p.ref_dx(), p.dtype));
  ASSERT_TRUE(g.weight.defined());
  EXPECT_TRUE(matches_reference("dW", to_doubles(ctx, g.weight), p.ref_dw(), p.dtype));
  if (p.has_bias) {
    ASSERT_TRUE(g.bias.defined());
    EXPECT_TRUE(matches_reference("db", to_doubles(ctx, g.bias), p.ref_db(), p.dtype));
  } else {
    EXPECT_FALSE(g.bias.defined());
  }
}

// ================================================================ reference self-checks
// The checks themselves must be able to fail: a hand-computed example, and the comparison /
// sentinel helpers rejecting a wrong element, a NaN and an overwritten tail element.

TEST(Reference, HandComputedExample) {
  // G = 2, K = 2, N = 1, one row per group.
  const std::vector<double> x{1, 2, 3, 4}, w{5, 6, 7, 8}, b{0.5, -1}, dy{1, 2};
  const std::vector<int64_t> counts{1, 1};
  EXPECT_EQ(reference_forward(x, w, b, counts, 2, 1).value, (std::vector<double>{17.5, 52}));
  EXPECT_EQ(reference_forward(x, w, {}, counts, 2, 1).value, (std::vector<double>{17, 53}));
  EXPECT_EQ(reference_dgrad(dy, w, counts, 2, 1).value, (std::vector<double>{5, 6, 14, 16}));
  EXPECT_EQ(reference_wgrad(dy, x, counts, 2, 1).value, (std::vector<double>{1, 2, 6, 8}));
  EXPECT_EQ(reference_wgrad(dy, x, counts, 2, 1, {1, 1, 1, 1}).value,
            (std::vector<double>{2, 3, 7, 9}));
  EXPECT_EQ(reference_dbias(dy, counts, 1).value, (std::vector<double>{1, 2}));
  // A zero-row group: exactly zero, with zero tolerance.
  const Reference empty = reference_wgrad(dy, x, {2, 0}, 2, 1);
  EXPECT_EQ(empty.value[2], 0.0);
  EXPECT_EQ(tolerance(empty, 2, DType::BF16), 0.0);
}

TEST(Reference, ComparisonRejectsAWrongElementANaNAndAnUnwrittenRow) {
  const Tensor xh = random_normal({6, 40}, DType::BF16, 5);
  const Tensor wh = random_normal({2, 30, 40}, DType::BF16, 6);
  const std::vector<int64_t> counts{4, 2};
  const Reference r =
      reference_forward(to_doubles(host(), xh), to_doubles(host(), wh), {}, counts, 40, 30);
  std::vector<double> got = r.value;
  EXPECT_TRUE(matches_reference("y", got, r, DType::BF16));
  // One rounding of each element into bf16 is within tolerance.
  for (double& v : got) v = static_cast<double>(bf16_to_f32(f32_to_bf16(static_cast<float>(v))));
  EXPECT_TRUE(matches_reference("y", got, r, DType::BF16));
  // A dropped term (|x·w| ~ 1) in f32 is caught.
  got = r.value;
  got[37] -= to_doubles(host(), xh)[37 / 30 * 40] * to_doubles(host(), wh)[(37 % 30) * 40];
  EXPECT_FALSE(matches_reference("y", got, r, DType::F32));
  got = r.value;
  got[3] = std::nan("");
  EXPECT_FALSE(matches_reference("y", got, r, DType::BF16));
  got = r.value;
  for (int64_t n = 0; n < 30; ++n) got[static_cast<size_t>(30 + n)] = kSentinel;  // row 1 unwritten
  EXPECT_FALSE(matches_reference("y", got, r, DType::BF16));
}

TEST(Reference, SentinelCheckRejectsAnyChangedTailBit) {
  Tensor t = host_filled({5, 3}, DType::BF16, kSentinel);
  std::vector<uint8_t> bytes = bytes_of(host(), t);
  EXPECT_TRUE(rows_hold_sentinel(bytes, 0, 5, 3, DType::BF16));
  bytes[2 * 3 * 2 + 1 * 2] ^= 1;  // lowest mantissa bit of (row 2, col 1)
  EXPECT_FALSE(rows_hold_sentinel(bytes, 2, 5, 3, DType::BF16));
  EXPECT_TRUE(rows_hold_sentinel(bytes, 3, 5, 3, DType::BF16));
  EXPECT_FALSE(bit_identical(bytes, bytes_of(host(), t), DType::BF16));
}

// ================================================================ forward / backward vs fp64

TEST_P(Forward, MatchesFp64Reference) {
  for (DType dt : kDtypes) {
    for (bool bias : {false, true}) {
      for (const Case& c : standard_cases()) {
        Problem p = make_problem(ctx(), c, dt, bias);
        SCOPED_TRACE(trace(p));
        const Tensor y = p.layer->forward(p.x_dev, Splits::host(c.counts));
        EXPECT_EQ(y.shape(), (Shape{c.T(), c.N}));
        EXPECT_EQ(y.dtype(), dt);
        EXPECT_EQ(y.device(), ctx().device());
        EXPECT_TRUE(matches_reference("y", valid_rows(ctx(), y, c.S()), p.ref_y(), dt));
      }
    }
  }
}

// Runs forward + backward with internal allocation for every dtype, bias setting and standard
// case, and hands the results to `check`.
template <class Check>
void for_each_backward(const Context& ctx, Check check) {
  for (DType dt : kDtypes) {
    for (bool bias : {false, true}) {
      for (const Case& c : standard_cases()) {
        Problem p = make_problem(ctx, c, dt, bias);
        SCOPED_TRACE(trace(p));
        GroupedLinear::Saved saved;
        p.layer->forward(p.x_dev, Splits::host(c.counts), {}, &saved);
        const GroupedLinear::Grads g = p.layer->backward(saved, p.dy_dev);
        check(p, g);
      }
    }
  }
}

TEST_P(Backward, DgradMatchesFp64Reference) {
  for_each_backward(ctx(), [&](const Problem& p, const GroupedLinear::Grads& g) {
    ASSERT_TRUE(g.input.defined());
    EXPECT_EQ(g.input.shape(), (Shape{p.T(), p.c.K}));
    EXPECT_EQ(g.input.dtype(), p.dtype);
    EXPECT_TRUE(matches_reference("dx", valid_rows(ctx(), g.input, p.c.S()), p.ref_dx(), p.dtype));
  });
}

TEST_P(Backward, WgradMatchesFp64Reference) {
  for_each_backward(ctx(), [&](const Problem& p, const GroupedLinear::Grads& g) {
    ASSERT_TRUE(g.weight.defined());
    EXPECT_EQ(g.weight.shape(), (Shape{p.c.G(), p.c.N, p.c.K}));
    EXPECT_EQ(g.weight.dtype(), p.dtype);
    EXPECT_TRUE(matches_reference("dW", to_doubles(ctx(), g.weight), p.ref_dw(), p.dtype));
  });
}

TEST_P(Backward, DbiasMatchesFp64Reference) {
  for_each_backward(ctx(), [&](const Problem& p, const GroupedLinear::Grads& g) {
    if (!p.has_bias) {
      EXPECT_FALSE(g.bias.defined()) << "a layer without bias returned a bias gradient";
      return;
    }
    ASSERT_TRUE(g.bias.defined());
    EXPECT_EQ(g.bias.shape(), (Shape{p.c.G(), p.c.N}));
    EXPECT_EQ(g.bias.dtype(), p.dtype);
    EXPECT_TRUE(matches_reference("db", to_doubles(ctx(), g.bias), p.ref_db(), p.dtype));
  });
}

TEST_P(Fuzz, RandomShapesAndSplitsMatchFp64Reference) {
  // Also varies the splits form, the caller buffers and main_grad, all of which must not change
  // the result.
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    const Case c = fuzz_case(seed);
    const DType dt = kDtypes[seed % 3];
    const bool bias = (seed / 3) % 2 == 1;
    const auto kind = static_cast<SplitsKind>((seed / 2) % 3);
    const bool buffers = seed % 2 == 0, use_main_grad = seed % 5 == 0;
    const Context on = kind == SplitsKind::Host ? ctx() : test::device_splits_context(ctx(), dt, {c.K, c.N});
    Problem p = make_problem(on, c, dt, bias, seed);
    SCOPED_TRACE(trace(p, kind) + (buffers ? ", caller buffers" : "") +
                 (use_main_grad ? ", main_grad" : ""));
    const Splits splits = make_splits(ctx(), c.counts, kind);
    const int64_t T = c.T();
    const Tensor out = buffers ? filled(ctx(), {T, c.N}, dt, kSentinel) : Tensor();
    const Tensor gin = buffers ? filled(ctx(), {T, c.K}, dt, kSentinel) : Tensor();
    const Tensor start_h = random_normal({c.G(), c.N, c.K}, DType::F32, seed + 999);
    if (use_main_grad) p.layer->set_main_grad(to_device(ctx(), start_h));

    GroupedLinear::Saved saved;
    const Tensor y = p.layer->forward(p.x_dev, splits, {.output = out}, &saved);
    const GroupedLinear::Grads g = p.layer->backward(saved, p.dy_dev, {.grad_input = gin});

    EXPECT_TRUE(matches_reference("y", valid_rows(ctx(), y, c.S()), p.ref_y(), dt));
    EXPECT_TRUE(matches_reference("dx", valid_rows(ctx(), g.input, c.S()), p.ref_dx(), dt));
    if (use_main_grad) {
      EXPECT_TRUE(matches_reference("main_grad", to_doubles(ctx(), g.weight),
                                    p.ref_dw(to_doubles(host(), start_h)), DType::F32));
    } else {
      EXPECT_TRUE(matches_reference("dW", to_doubles(ctx(), g.weight), p.ref_dw(), dt));
    }
    if (bias) {
      EXPECT_TRUE(matches_reference("db", to_doubles(ctx(), g.bias), p.ref_db(), dt));
    }
    if (buffers) {
      EXPECT_EQ(y.data(), out.data());
      EXPECT_EQ(g.input.data(), gin.data());
      EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx(), y), c.S(), T, c.N, dt));
      EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx(), g.input), c.S(), T, c.K, dt));
    }
  }
}

// ================================================================ splits forms (SPEC §1)

TEST_P(DeviceSplits, HostAndDeviceCountsGiveIdenticalBits) {
  const Case c{"zero_row_groups_with_tail", 45, 38, {9, 0, 30, 0, 4, 12}, 6};
  for (DType dt : kDtypes) {
    Problem p = make_problem(test::device_splits_context(ctx(), dt, {c.K, c.N}), c, dt, /*bias=*/true);
    std::vector<std::vector<uint8_t>> host_bits;
    for (SplitsKind kind : {SplitsKind::Host, SplitsKind::DeviceI32, SplitsKind::DeviceI64}) {
      SCOPED_TRACE(trace(p, kind));
      const Tensor out = filled(ctx(), {c.T(), c.N}, dt, kSentinel);
      const Tensor gin = filled(ctx(), {c.T(), c.K}, dt, kSentinel);
      GroupedLinear::Saved saved;
      const Tensor y =
          p.layer->forward(p.x_dev, make_splits(ctx(), c.counts, kind), {.output = out}, &saved);
      const GroupedLinear::Grads g = p.layer->backward(saved, p.dy_dev, {.grad_input = gin});
      const std::vector<std::vector<uint8_t>> bits{bytes_of(ctx(), y), bytes_of(ctx(), g.input),
                                                   bytes_of(ctx(), g.weight),
                                                   bytes_of(ctx(), g.bias)};
      if (kind == SplitsKind::Host) {
        expect_matches_reference(ctx(), p, y, g);
        host_bits = bits;
        continue;
      }
      const char* names[] = {"y", "dx", "dW", "db"};
      for (size_t i = 0; i < bits.size(); ++i) {
        EXPECT_TRUE(bit_identical(bits[i], host_bits[i], dt)) << names[i];
      }
    }
  }
}

// ================================================================ zero-row groups

TEST_P(ZeroRowGroups, WeightAndBiasGradsOfEmptyGroupsAreExactlyZero) {
  // The result tensors come from the poisoning allocator (NaN-filled): exact zeros prove the
  // empty groups were written, not left as they came.
  const Case c{"zero_row_groups", 33, 21, {0, 6, 0, 0, 3, 0}, 5};
  for (DType dt : kDtypes) {
    Problem p = make_problem(ctx(), c, dt, /*bias=*/true);
    SCOPED_TRACE(trace(p));
    GroupedLinear::Saved saved;
    p.layer->forward(p.x_dev, Splits::host(c.counts), {}, &saved);
    const GroupedLinear::Grads g = p.layer->backward(saved, p.dy_dev);
    const std::vector<double> dw = to_doubles(ctx(), g.weight), db = to_doubles(ctx(), g.bias);
    for (int64_t grp = 0; grp < c.G(); ++grp) {
      if (c.counts[static_cast<size_t>(grp)] != 0) continue;
      const size_t nk = static_cast<size_t>(c.N * c.K);
      size_t nonzero = 0;
      for (size_t i = 0; i < nk; ++i) nonzero += dw[static_cast<size_t>(grp) * nk + i] != 0.0;
      EXPECT_EQ(nonzero, 0u) << "dW of empty group " << grp;
      for (int64_t n = 0; n < c.N; ++n) {
        EXPECT_EQ(db[static_cast<size_t>(grp * c.N + n)], 0.0) << "db of empty group " << grp;
      }
    }
    EXPECT_TRUE(matches_reference("dW", dw, p.ref_dw(), dt));
    EXPECT_TRUE(matches_reference("db", db, p.ref_db(), dt));
  }
}

TEST_P(ZeroRowGroups, MainGradOfEmptyGroupsIsUnchangedBitForBit) {
  const Case c{"zero_row_groups", 27, 30, {4, 0, 0, 9, 0}, 3};
  for (DType dt : kDtypes) {
    Problem p = make_problem(ctx(), c, dt, /*bias=*/false);
    SCOPED_TRACE(trace(p));
    const Tensor start_h = random_normal({c.G(), c.N, c.K}, DType::F32, 77);
    const Tensor start = to_device(ctx(), start_h);
    const std::vector<uint8_t> before = bytes_of(ctx(), start);
    p.layer->set_main_grad(start);
    GroupedLinear::Saved saved;
    p.layer->forward(p.x_dev, Splits::host(c.counts), {}, &saved);
    p.layer->backward(saved, p.dy_dev);
    const std::vector<uint8_t> after = bytes_of(ctx(), start);
    const size_t slice = static_cast<size_t>(c.N * c.K) * 4;
    for (int64_t grp = 0; grp < c.G(); ++grp) {
      if (c.counts[static_cast<size_t>(grp)] != 0) continue;
      const auto b = static_cast<std::ptrdiff_t>(grp * static_cast<int64_t>(slice));
      EXPECT_TRUE(bit_identical(
          {after.begin() + b, after.begin() + b + static_cast<std::ptrdiff_t>(slice)},
          {before.begin() + b, before.begin() + b + static_cast<std::ptrdiff_t>(slice)},
          DType::F32))
          << "main_grad of empty group " << grp;
    }
    EXPECT_TRUE(matches_reference("main_grad", to_doubles(ctx(), start),
                                  p.ref_dw(to_doubles(host(), start_h)), DType::F32));
  }
}

// ================================================================ main_grad (Megatron path)

TEST_P(MainGrad, AccumulatesWeightGradInFp32OntoItsStartValues) {
  const Case c{"main_grad", 52, 41, {13, 0, 7, 22}, 3};
  for (DType dt : kDtypes) {
    Problem p = make_problem(ctx(), c, dt, /*bias=*/true);
    SCOPED_TRACE(trace(p));
    const Tensor start_h = random_normal({c.G(), c.N, c.K}, DType::F32, 31);
    const Tensor main_grad = to_device(ctx(), start_h);
    p.layer->set_main_grad(main_grad);
    EXPECT_EQ(p.layer->main_grad().data(), main_grad.data());
    GroupedLinear::Saved saved;
    p.layer->forward(p.x_dev, Splits::host(c.counts), {}, &saved);
    const GroupedLinear::Grads g1 = p.layer->backward(saved, p.dy_dev, {.retain_saved = true});
    EXPECT_EQ(g1.weight.data(), main_grad.data()) << "Grads::weight must be the main_grad buffer";
    EXPECT_EQ(g1.weight.dtype(), DType::F32);
    const std::vector<double> after1 = to_doubles(ctx(), main_grad);
    EXPECT_TRUE(matches_reference("main_grad after 1 step", after1,
                                  p.ref_dw(to_doubles(host(), start_h)), DType::F32));
    // A second backward (the context retained) accumulates again, onto the values as they stand.
    p.layer->backward(saved, p.dy_dev, {.retain_saved = true});
    EXPECT_TRUE(matches_reference("main_grad after 2 steps", to_doubles(ctx(), main_grad),
                                  p.ref_dw(after1), DType::F32));
    // The bias gradient is still returned (param dtype), not accumulated.
    ASSERT_TRUE(g1.bias.defined());
    EXPECT_TRUE(matches_reference("db", to_doubles(ctx(), g1.bias), p.ref_db(), dt));
    // Turning it off returns a fresh dW again.
    p.layer->set_main_grad(Tensor());
    const GroupedLinear::Grads g3 = p.layer->backward(saved, p.dy_dev);
    EXPECT_NE(g3.weight.data(), main_grad.data());
    EXPECT_TRUE(matches_reference("dW", to_doubles(ctx(), g3.weight), p.ref_dw(), dt));
  }
}

TEST_P(MainGrad, WrongDtypeOrShapeIsRejected) {
  Problem p = make_problem(ctx(), {"main_grad", 8, 6, {2, 3}, 0}, DType::BF16, false);
  auto e = caught([&] { p.layer->set_main_grad(filled(ctx(), {2, 6, 8}, DType::BF16, 0)); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(),
              AllOf(HasSubstr("'main_grad'"), HasSubstr("dtype f32"), HasSubstr("got bf16")));
  e = caught([&] { p.layer->set_main_grad(filled(ctx(), {2, 8, 6}, DType::F32, 0)); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'main_grad'"), HasSubstr("shape [2, 6, 8]"),
                               HasSubstr("got [2, 8, 6]")));
  EXPECT_FALSE(p.layer->main_grad().defined());
}

// ================================================================ gradients nobody needs

TEST_P(FrozenWeights, BackwardComputesNeitherWeightNorBiasGrad) {
  const Case c{"frozen", 29, 23, {6, 0, 10}, 4};
  for (DType dt : kDtypes) {
    Problem p = make_problem(ctx(), c, dt, /*bias=*/true);
    SCOPED_TRACE(trace(p));
    const Tensor main_grad = to_device(ctx(), random_normal({c.G(), c.N, c.K}, DType::F32, 9));
    const std::vector<uint8_t> before = bytes_of(ctx(), main_grad);
    p.layer->set_main_grad(main_grad);
    p.layer->set_weight_requires_grad(false);
    EXPECT_FALSE(p.layer->weight_requires_grad());
    GroupedLinear::Saved saved;
    p.layer->forward(p.x_dev, Splits::host(c.counts), {}, &saved);
    ctx().allocator().reset_stats();
    const GroupedLinear::Grads g = p.layer->backward(saved, p.dy_dev);
    EXPECT_FALSE(g.weight.defined());
    EXPECT_FALSE(g.bias.defined());
    ASSERT_TRUE(g.input.defined());
    EXPECT_TRUE(matches_reference("dx", valid_rows(ctx(), g.input, c.S()), p.ref_dx(), dt));
    EXPECT_TRUE(bit_identical(bytes_of(ctx(), main_grad), before, DType::F32))
        << "main_grad changed";
    // Not computed means not allocated either: beyond dx, the allocator saw only scratch (the
    // host counts copied to the device for the bias kernels) — less than db, the smaller of the
    // two gradients that must not exist.
    const auto es = static_cast<int64_t>(size_of(dt));
    const int64_t dx_bytes = c.T() * c.K * es;
    EXPECT_GE(ctx().allocator().stats().bytes, dx_bytes);
    EXPECT_LT(ctx().allocator().stats().bytes - dx_bytes, c.G() * c.N * es);
  }
}

TEST_P(InputWithoutGrad, BackwardComputesNoGradInput) {
  const Case c{"no_input_grad", 29, 23, {6, 0, 10}, 4};
  for (DType dt : kDtypes) {
    Problem p = make_problem(ctx(), c, dt, /*bias=*/true);
    SCOPED_TRACE(trace(p));
    GroupedLinear::Saved saved;
    p.layer->forward(p.x_dev, Splits::host(c.counts), {.input_requires_grad = false}, &saved);
    ctx().allocator().reset_stats();
    const GroupedLinear::Grads g = p.layer->backward(saved, p.dy_dev);
    EXPECT_FALSE(g.input.defined());
    EXPECT_TRUE(matches_reference("dW", to_doubles(ctx(), g.weight), p.ref_dw(), dt));
    EXPECT_TRUE(matches_reference("db", to_doubles(ctx(), g.bias), p.ref_db(), dt));
    const auto es = static_cast<int64_t>(size_of(dt));
    // dW and db, plus at most scratch (host counts copied to the device) smaller than dx.
    const int64_t grads = (c.G() * c.N * c.K + c.G() * c.N) * es;
    EXPECT_GE(ctx().allocator().stats().bytes, grads);
    EXPECT_LT(ctx().allocator().stats().bytes - grads, c.T() * c.K * es)
        << "only dW and db may be allocated";
  }
}

TEST_P(InputWithoutGrad, GivingGradInputIsAnErrorAndWritesNothing) {
  const Case c{"no_input_grad", 17, 11, {3, 0, 5}, 2};
  Problem p = make_problem(ctx(), c, DType::BF16, /*bias=*/true);
  const Tensor main_grad = to_device(ctx(), random_normal({c.G(), c.N, c.K}, DType::F32, 9));
  const std::vector<uint8_t> before = bytes_of(ctx(), main_grad);
  p.layer->set_main_grad(main_grad);
  GroupedLinear::Saved saved;
  p.layer->forward(p.x_dev, Splits::host(c.counts), {.input_requires_grad = false}, &saved);
  const Tensor gin = filled(ctx(), {c.T(), c.K}, DType::BF16, kSentinel);
  auto e = caught([&] { p.layer->backward(saved, p.dy_dev, {.grad_input = gin}); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'grad_input'"), HasSubstr("does not require grad"),
                               HasSubstr("bf16[" + std::to_string(c.T()) + ", 17]")));
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx(), gin), 0, c.T(), c.K, DType::BF16));
  EXPECT_TRUE(bit_identical(bytes_of(ctx(), main_grad), before, DType::F32)) << "main_grad changed";
}

// ================================================================ equivalence and reproducibility

TEST_P(Equivalence, EqualsIndependentSingleExpertLayersOnRowBlocks) {
  // SPEC §2: G independent Linear layers on the row blocks. Each expert becomes a G = 1 layer
  // over the same weight memory (per-expert views) and its rows (row views). On the CPU the
  // results must be bit-identical; elsewhere each must be within tolerance of the fp64 reference.
  const Case c{"equivalence", 70, 45, {12, 0, 40, 1, 26}, 7};
  for (DType dt : kDtypes) {
    for (bool bias : {false, true}) {
      Problem p = make_problem(ctx(), c, dt, bias);
      SCOPED_TRACE(trace(p));
      GroupedLinear::Saved saved;
      const Tensor y = p.layer->forward(p.x_dev, Splits::host(c.counts), {}, &saved);
      const GroupedLinear::Grads g = p.layer->backward(saved, p.dy_dev);
      const std::vector<uint8_t> y_bits = bytes_of(ctx(), y), dx_bits = bytes_of(ctx(), g.input);
      const std::vector<uint8_t> dw_bits = bytes_of(ctx(), g.weight);
      const std::vector<uint8_t> db_bits = bias ? bytes_of(ctx(), g.bias) : std::vector<uint8_t>{};
      const Reference ry = p.ref_y(), rdx = p.ref_dx(), rdw = p.ref_dw(), rdb = p.ref_db();
      const size_t es = size_of(dt);
      auto part = [](const std::vector<uint8_t>& v, int64_t begin, int64_t end) {
        return std::vector<uint8_t>(v.begin() + begin, v.begin() + end);
      };
      int64_t off = 0;
      for (int64_t e = 0; e < c.G(); ++e) {
        const int64_t m = c.counts[static_cast<size_t>(e)];
        SCOPED_TRACE("expert " + std::to_string(e) + " with " + std::to_string(m) + " rows");
        GroupedLinear single({.groups = 1, .in = c.K, .out = c.N, .dtype = dt, .bias = bias},
                             ctx());
        single.set_weight(p.layer->weight(e).view({1, c.N, c.K}));
        if (bias) single.set_bias(p.layer->bias().rows(e, e + 1));
        GroupedLinear::Saved s1;
        const Tensor y1 = single.forward(p.x_dev.rows(off, off + m), Splits::host({m}), {}, &s1);
        const GroupedLinear::Grads g1 = single.backward(s1, p.dy_dev.rows(off, off + m));
        const auto ies = static_cast<int64_t>(es);
        if (on_cpu()) {
          EXPECT_TRUE(bit_identical(bytes_of(ctx(), y1),
                                    part(y_bits, off * c.N * ies, (off + m) * c.N * ies), dt))
              << "y";
          EXPECT_TRUE(bit_identical(bytes_of(ctx(), g1.input),
                                    part(dx_bits, off * c.K * ies, (off + m) * c.K * ies), dt))
              << "dx";
          EXPECT_TRUE(bit_identical(bytes_of(ctx(), g1.weight),
                                    part(dw_bits, e * c.N * c.K * ies, (e + 1) * c.N * c.K * ies),
                                    dt))
              << "dW";
          if (bias) {
            EXPECT_TRUE(bit_identical(bytes_of(ctx(), g1.bias),
                                      part(db_bits, e * c.N * ies, (e + 1) * c.N * ies), dt))
                << "db";
          }
        } else {
          EXPECT_TRUE(
              matches_reference("y", to_doubles(ctx(), y1), slice_rows(ry, off, off + m), dt));
          EXPECT_TRUE(matches_reference("dx", to_doubles(ctx(), g1.input),
                                        slice_rows(rdx, off, off + m), dt));
          EXPECT_TRUE(matches_reference("dW", to_doubles(ctx(), g1.weight),
                                        slice_rows(rdw, e * c.N, (e + 1) * c.N), dt));
          if (bias) {
            EXPECT_TRUE(
                matches_reference("db", to_doubles(ctx(), g1.bias), slice_rows(rdb, e, e + 1), dt));
          }
        }
        off += m;
      }
    }
  }
}

TEST_P(Reproducibility, ForwardAndBackwardAreBitIdenticalRunToRun) {
  const Case c{"reproducibility", 96, 80, {40, 0, 130, 3}, 5};
  for (DType dt : kDtypes) {
    Problem p = make_problem(ctx(), c, dt, /*bias=*/true);
    SCOPED_TRACE(trace(p));
    std::vector<std::vector<uint8_t>> first;
    for (int run = 0; run < 3; ++run) {
      GroupedLinear::Saved saved;
      const Tensor y = p.layer->forward(p.x_dev, Splits::host(c.counts), {}, &saved);
      const GroupedLinear::Grads g = p.layer->backward(saved, p.dy_dev);
      // Only the valid rows: internal allocations leave the tail uninitialised.
      const std::vector<std::vector<uint8_t>> bits{
          bytes_of(ctx(), y.rows(0, c.S())), bytes_of(ctx(), g.input.rows(0, c.S())),
          bytes_of(ctx(), g.weight), bytes_of(ctx(), g.bias)};
      if (run == 0) {
        expect_matches_reference(ctx(), p, y, g);
        first = bits;
        continue;
      }
      for (size_t i = 0; i < bits.size(); ++i) {
        EXPECT_TRUE(bit_identical(bits[i], first[i], dt)) << "run " << run << ", result " << i;
      }
    }
  }
}

// ================================================================ parameters

TEST_P(ExpertViews, WeightGIsExpertGsSliceOfThePackedWeight) {
  const Case c{"expert_views", 21, 13, {5, 4, 0, 6}, 2};
  const DType dt = DType::BF16;
  Problem p = make_problem(ctx(), c, dt, /*bias=*/false);
  const size_t es = size_of(dt);
  for (int64_t e = 0; e < c.G(); ++e) {
    const Tensor we = p.layer->weight(e);
    EXPECT_EQ(we.shape(), (Shape{c.N, c.K}));
    EXPECT_EQ(we.dtype(), dt);
    EXPECT_EQ(we.device(), ctx().device());
    EXPECT_TRUE(we.is_contiguous());
    EXPECT_EQ(we.data(), static_cast<char*>(p.layer->weight().data()) +
                             static_cast<size_t>(e * c.N * c.K) * es);
  }
  auto err = caught([&] { p.layer->weight(c.G()); });
  ASSERT_TRUE(err);
  EXPECT_THAT(err->what(), AllOf(HasSubstr("'index'"), HasSubstr("[0, 4)"), HasSubstr("got 4")));
  // Writing expert 1 through its view changes exactly expert 1's rows of the result.
  const Tensor y0 = p.layer->forward(p.x_dev, Splits::host(c.counts));
  const std::vector<uint8_t> before = bytes_of(ctx(), y0.rows(0, c.S()));
  const Tensor new_w1 = random_normal({c.N, c.K}, dt, 4242);
  copy(ctx(), new_w1, p.layer->weight(1));
  const std::vector<double> w1 = to_doubles(host(), new_w1);
  std::copy(w1.begin(), w1.end(), p.w.begin() + c.N * c.K);
  const Tensor y1 = p.layer->forward(p.x_dev, Splits::host(c.counts));
  EXPECT_TRUE(matches_reference("y", valid_rows(ctx(), y1, c.S()), p.ref_y(), dt));
  const std::vector<uint8_t> after = bytes_of(ctx(), y1.rows(0, c.S()));
  const auto row = static_cast<std::ptrdiff_t>(c.N * static_cast<int64_t>(es));
  EXPECT_TRUE(bit_identical({after.begin(), after.begin() + 5 * row},
                            {before.begin(), before.begin() + 5 * row}, dt));
  EXPECT_TRUE(bit_identical({after.begin() + 9 * row, after.end()},
                            {before.begin() + 9 * row, before.end()}, dt));
  EXPECT_FALSE(bit_identical({after.begin() + 5 * row, after.begin() + 9 * row},
                             {before.begin() + 5 * row, before.begin() + 9 * row}, dt));
}

TEST_P(Layer, CallerOwnedParametersAreUsedInPlace) {
  const Case c{"set_weight", 16, 12, {4, 0, 5}, 1};
  const DType dt = DType::F16;
  Problem p = make_problem(ctx(), c, dt, /*bias=*/true);
  const Tensor w = to_device(ctx(), random_normal({c.G(), c.N, c.K}, dt, 55));
  const Tensor b = to_device(ctx(), random_normal({c.G(), c.N}, dt, 56));
  p.layer->set_weight(w);
  p.layer->set_bias(b);
  EXPECT_EQ(p.layer->weight().data(), w.data());
  EXPECT_EQ(p.layer->bias().data(), b.data());
  p.w = to_doubles(ctx(), w);
  p.b = to_doubles(ctx(), b);
  const Tensor y = p.layer->forward(p.x_dev, Splits::host(c.counts));
  EXPECT_TRUE(matches_reference("y", valid_rows(ctx(), y, c.S()), p.ref_y(), dt));
}

TEST_P(Layer, InvalidConfigurationsAndParametersAreRejected) {
  auto make = [&](GroupedLinearConfig cfg) { GroupedLinear l(cfg, ctx()); };
  auto e = caught([&] { make({.groups = 0, .in = 4, .out = 4, .dtype = DType::F32}); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'groups'"), HasSubstr("got 0")));
  e = caught([&] { make({.groups = 2, .in = -1, .out = 4, .dtype = DType::F32}); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'in'"), HasSubstr("got -1")));
  e = caught([&] { make({.groups = 2, .in = 4, .out = 0, .dtype = DType::F32}); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'out'"), HasSubstr("got 0")));
  e = caught([&] { make({.groups = 2, .in = 4, .out = 4, .dtype = DType::F8E4M3}); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'dtype'"), HasSubstr("got f8e4m3")));

  Problem p = make_problem(ctx(), {"params", 8, 6, {2, 3}, 0}, DType::BF16, false);
  e = caught([&] { p.layer->set_weight(filled(ctx(), {2, 8, 6}, DType::BF16, 1)); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'weight'"), HasSubstr("shape [2, 6, 8]"),
                               HasSubstr("got [2, 8, 6]")));
  e = caught([&] { p.layer->set_weight(filled(ctx(), {2, 6, 8}, DType::F16, 1)); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(),
              AllOf(HasSubstr("'weight'"), HasSubstr("dtype bf16"), HasSubstr("got f16")));
  e = caught([&] { p.layer->set_bias(filled(ctx(), {2, 6}, DType::BF16, 1)); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'bias'"), HasSubstr("bias = false")));
  // Inputs of forward / backward are checked too.
  e = caught([&] {
    p.layer->forward(filled(ctx(), {5, 7}, DType::BF16, 1), Splits::host({2, 3}));
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(),
              AllOf(HasSubstr("'input'"), HasSubstr("shape [*, 8]"), HasSubstr("got [5, 7]")));
  e = caught([&] { p.layer->forward(filled(ctx(), {5, 8}, DType::F32, 1), Splits::host({2, 3})); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(),
              AllOf(HasSubstr("'input'"), HasSubstr("dtype bf16"), HasSubstr("got f32")));
  GroupedLinear::Saved saved;
  e = caught([&] { p.layer->backward(saved, p.dy_dev); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'saved'"));
  p.layer->forward(p.x_dev, Splits::host({2, 3}), {}, &saved);
  e = caught([&] { p.layer->backward(saved, filled(ctx(), {5, 5}, DType::BF16, 1)); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'grad_output'"), HasSubstr("shape [5, 6]"),
                               HasSubstr("got [5, 5]")));
}

// ================================================================ caller buffers (SPEC §3)

const Case kBufferCase{"caller_buffers", 34, 27, {7, 0, 12, 5, 0}, 6};

// Forward + backward with and without caller buffers; checks aliasing, bit-identity with the
// internally allocated results, the tails and the reference.
void expect_buffers_match_internal(const Context& ctx, bool use_output, bool use_grad_input) {
  for (const Case& c : {kBufferCase, Case{"caller_buffers_T_equals_S", 30, 22, {0, 9, 14}, 0},
                        Case{"caller_buffers_every_group_empty", 12, 9, {0, 0}, 7}}) {
    for (DType dt : kDtypes) {
      Problem p = make_problem(ctx, c, dt, /*bias=*/true);
      SCOPED_TRACE(trace(p));
      const Splits splits = Splits::host(c.counts);
      GroupedLinear::Saved s0;
      const Tensor y0 = p.layer->forward(p.x_dev, splits, {}, &s0);
      const GroupedLinear::Grads g0 = p.layer->backward(s0, p.dy_dev);

      const Tensor out = use_output ? filled(ctx, {c.T(), c.N}, dt, kSentinel) : Tensor();
      const Tensor gin = use_grad_input ? filled(ctx, {c.T(), c.K}, dt, kSentinel) : Tensor();
      GroupedLinear::Saved s1;
      const Tensor y1 = p.layer->forward(p.x_dev, splits, {.output = out}, &s1);
      const GroupedLinear::Grads g1 = p.layer->backward(s1, p.dy_dev, {.grad_input = gin});
      expect_matches_reference(ctx, p, y1, g1);
      if (use_output) {
        EXPECT_EQ(y1.data(), out.data()) << "the returned output must be the buffer";
        EXPECT_EQ(y1.shape(), out.shape());
        EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx, y1), c.S(), c.T(), c.N, dt)) << "output tail";
      }
      if (use_grad_input) {
        EXPECT_EQ(g1.input.data(), gin.data()) << "the returned grad_input must be the buffer";
        EXPECT_EQ(g1.input.shape(), gin.shape());
        EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx, g1.input), c.S(), c.T(), c.K, dt))
            << "grad_input tail";
      }
      EXPECT_TRUE(
          bit_identical(bytes_of(ctx, y1.rows(0, c.S())), bytes_of(ctx, y0.rows(0, c.S())), dt))
          << "y";
      EXPECT_TRUE(bit_identical(bytes_of(ctx, g1.input.rows(0, c.S())),
                                bytes_of(ctx, g0.input.rows(0, c.S())), dt))
          << "dx";
      EXPECT_TRUE(bit_identical(bytes_of(ctx, g1.weight), bytes_of(ctx, g0.weight), dt)) << "dW";
      EXPECT_TRUE(bit_identical(bytes_of(ctx, g1.bias), bytes_of(ctx, g0.bias), dt)) << "db";
    }
  }
}

TEST_P(CallerBuffer, OutputAloneIsBitIdenticalToInternalAllocation) {
  expect_buffers_match_internal(ctx(), true, false);
}
TEST_P(CallerBuffer, GradInputAloneIsBitIdenticalToInternalAllocation) {
  expect_buffers_match_internal(ctx(), false, true);
}
TEST_P(CallerBuffer, BothBuffersAreBitIdenticalToInternalAllocation) {
  expect_buffers_match_internal(ctx(), true, true);
}

TEST_P(CallerBuffer, OutputAliasesBuffer) {
  Problem p = make_problem(ctx(), kBufferCase, DType::BF16, true);
  const Tensor out = filled(ctx(), {p.T(), p.c.N}, DType::BF16, kSentinel);
  const Tensor y = p.layer->forward(p.x_dev, Splits::host(p.c.counts), {.output = out});
  EXPECT_EQ(y.data(), out.data());
  EXPECT_EQ(y.shape(), out.shape());
  EXPECT_EQ(y.strides(), out.strides());
  EXPECT_EQ(y.dtype(), out.dtype());
  EXPECT_EQ(y.device(), out.device());
}

TEST_P(CallerBuffer, GradInputAliasesBuffer) {
  Problem p = make_problem(ctx(), kBufferCase, DType::BF16, true);
  const Tensor gin = filled(ctx(), {p.T(), p.c.K}, DType::BF16, kSentinel);
  GroupedLinear::Saved saved;
  p.layer->forward(p.x_dev, Splits::host(p.c.counts), {}, &saved);
  const GroupedLinear::Grads g = p.layer->backward(saved, p.dy_dev, {.grad_input = gin});
  EXPECT_EQ(g.input.data(), gin.data());
  EXPECT_EQ(g.input.shape(), gin.shape());
  EXPECT_EQ(g.input.strides(), gin.strides());
}

TEST_P(CallerBuffer, BufferInsideALargerAllocationIsWrittenOnlyInItsValidRows) {
  // A buffer that is a row view of a larger (e.g. symmetric-memory) allocation: nothing before
  // it, nothing in its tail and nothing after it changes.
  Problem p = make_problem(ctx(), kBufferCase, DType::F16, true);
  const int64_t T = p.T(), N = p.c.N, S = p.c.S();
  const Tensor big = filled(ctx(), {T + 8, N}, DType::F16, kSentinel);
  const Tensor out = big.rows(3, 3 + T);
  const Tensor y = p.layer->forward(p.x_dev, Splits::host(p.c.counts), {.output = out});
  EXPECT_EQ(y.data(), out.data());
  const std::vector<uint8_t> bits = bytes_of(ctx(), big);
  EXPECT_TRUE(rows_hold_sentinel(bits, 0, 3, N, DType::F16)) << "rows before the buffer";
  EXPECT_TRUE(rows_hold_sentinel(bits, 3 + S, T + 8, N, DType::F16)) << "tail and rows after";
  EXPECT_TRUE(matches_reference("y", valid_rows(ctx(), y, S), p.ref_y(), DType::F16));
}

TEST_P(CallerBuffer, OutputIsWrittenInPlaceWithNoTemporaryOfItsSize) {
  // Internal allocation costs exactly one [T, N] tensor more than the caller-buffer path: a
  // temporary output plus a copy into the buffer would make the difference 0.
  for (DType dt : kDtypes) {
    Problem p = make_problem(ctx(), kBufferCase, dt, true);
    SCOPED_TRACE(trace(p));
    const Splits splits = Splits::host(p.c.counts);
    const Tensor out = filled(ctx(), {p.T(), p.c.N}, dt, kSentinel);
    p.layer->forward(p.x_dev, splits);  // warm-up: lazily created workspaces
    p.layer->forward(p.x_dev, splits, {.output = out});
    Allocator& a = ctx().allocator();
    a.reset_stats();
    p.layer->forward(p.x_dev, splits);
    const Allocator::Stats internal = a.stats();
    a.reset_stats();
    p.layer->forward(p.x_dev, splits, {.output = out});
    const Allocator::Stats buffer = a.stats();
    EXPECT_EQ(internal.bytes - buffer.bytes, p.T() * p.c.N * static_cast<int64_t>(size_of(dt)));
    EXPECT_EQ(internal.count - buffer.count, 1);
  }
}

TEST_P(CallerBuffer, GradInputIsWrittenInPlaceWithNoTemporaryOfItsSize) {
  for (DType dt : kDtypes) {
    Problem p = make_problem(ctx(), kBufferCase, dt, true);
    SCOPED_TRACE(trace(p));
    const Tensor gin = filled(ctx(), {p.T(), p.c.K}, dt, kSentinel);
    GroupedLinear::Saved saved;
    p.layer->forward(p.x_dev, Splits::host(p.c.counts), {}, &saved);
    p.layer->backward(saved, p.dy_dev, {.retain_saved = true});  // warm-up
    p.layer->backward(saved, p.dy_dev, {.grad_input = gin, .retain_saved = true});
    Allocator& a = ctx().allocator();
    a.reset_stats();
    p.layer->backward(saved, p.dy_dev, {.retain_saved = true});
    const Allocator::Stats internal = a.stats();
    a.reset_stats();
    p.layer->backward(saved, p.dy_dev, {.grad_input = gin, .retain_saved = true});
    const Allocator::Stats buffer = a.stats();
    EXPECT_EQ(internal.bytes - buffer.bytes, p.T() * p.c.K * static_cast<int64_t>(size_of(dt)));
    EXPECT_EQ(internal.count - buffer.count, 1);
  }
}

TEST_P(CallerBuffer, DeviceSplitsWriteTheSameBitsIntoTheBuffers) {
  for (SplitsKind kind : {SplitsKind::DeviceI32, SplitsKind::DeviceI64}) {
    const Context on = test::device_splits_context(ctx(), DType::BF16, {kBufferCase.K, kBufferCase.N});
    Problem p = make_problem(on, kBufferCase, DType::BF16, true);
    SCOPED_TRACE(trace(p, kind));
    const Tensor out = filled(ctx(), {p.T(), p.c.N}, DType::BF16, kSentinel);
    const Tensor gin = filled(ctx(), {p.T(), p.c.K}, DType::BF16, kSentinel);
    GroupedLinear::Saved saved;
    const Tensor y =
        p.layer->forward(p.x_dev, make_splits(ctx(), p.c.counts, kind), {.output = out}, &saved);
    const GroupedLinear::Grads g = p.layer->backward(saved, p.dy_dev, {.grad_input = gin});
    expect_matches_reference(ctx(), p, y, g);
    EXPECT_EQ(y.data(), out.data());
    EXPECT_EQ(g.input.data(), gin.data());
    EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx(), out), p.c.S(), p.T(), p.c.N, DType::BF16));
    EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx(), gin), p.c.S(), p.T(), p.c.K, DType::BF16));
  }
}

// ---------------------------------------------------------------- rejected buffers
//
// Each case builds one wrong buffer from memory pre-filled with the sentinel, expects an
// InvalidArgument naming the buffer, the expected and the seen value, and then checks that the
// buffer's memory (all of it, including any other tensor sharing it), main_grad and the
// parameters are bit-for-bit unchanged.

// Memory that is not on the op's device, pre-filled with the sentinel. On a CPU op with a GPU
// present: real GPU memory. On a CPU op without GPU: host memory whose Tensor claims cuda:0 (only
// metadata: validation must reject it before any access). On a GPU op: host memory.
struct ForeignMemory {
  Tensor storage;                 // where the bytes really are
  std::optional<Context> reader;  // a context that can copy them back
  Device claimed;                 // the device the buffer's Tensor states

  ForeignMemory(const Context& op_ctx, const Shape& shape, DType dtype) {
    if (op_ctx.device().is_cpu() && Context::cuda_device_count() > 0) {
      reader.emplace(Context::cuda(0));
      storage = filled(*reader, shape, dtype, kSentinel);
      claimed = Device::cuda(0);
    } else {
      reader.emplace(host());
      storage = host_filled(shape, dtype, kSentinel);
      claimed = op_ctx.device().is_cpu() ? Device::cuda(0) : Device::cpu();
    }
  }
  Tensor as(const Shape& shape, const Shape& strides, DType dtype) const {
    return Tensor::wrap(storage.data(), shape, strides, dtype, claimed);
  }
  std::vector<uint8_t> bytes() const { return bytes_of(*reader, storage); }
};

Shape dense_strides(const Shape& shape) {
  Shape s(shape.size());
  int64_t step = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = step;
    step *= shape[i];
  }
  return s;
}

// A layer with bias and main_grad set, a valid forward already done (for backward cases), and
// snapshots of everything a failed call must leave alone.
struct Rig {
  const Context& ctx;
  Problem p;
  Tensor main_grad;
  GroupedLinear::Saved saved;
  std::vector<uint8_t> main_grad_before, weight_before, bias_before;
  static constexpr DType kDtype = DType::BF16;

  // On a GPU the buffer case's K = 34 is one the sm90 kernels refuse: its layer is forced onto
  // cuBLAS, so that device splits are allowed (SPEC §1: never the automatic choice for them).
  explicit Rig(const Context& c)
      : ctx(c),
        p(make_problem(test::device_splits_context(c, kDtype, {kBufferCase.K, kBufferCase.N}),
                       kBufferCase, kDtype, true)) {
    main_grad = to_device(ctx, random_normal({p.c.G(), p.c.N, p.c.K}, DType::F32, 1234));
    p.layer->set_main_grad(main_grad);
    p.layer->forward(p.x_dev, Splits::host(p.c.counts), {}, &saved);
    snapshot();
  }
  void snapshot() {
    main_grad_before = bytes_of(ctx, main_grad);
    weight_before = bytes_of(ctx, p.layer->weight());
    bias_before = bytes_of(ctx, p.layer->bias());
  }
  int64_t T() const { return p.T(); }
  int64_t K() const { return p.c.K; }
  int64_t N() const { return p.c.N; }
  std::string shape_TN() const { return to_string(Shape{T(), N()}); }
  std::string shape_TK() const { return to_string(Shape{T(), K()}); }

  std::optional<Error> forward_with(const Tensor& output) {
    return caught([&] { p.layer->forward(p.x_dev, Splits::host(p.c.counts), {.output = output}); });
  }
  std::optional<Error> backward_with(const Tensor& grad_input) {
    return caught([&] { p.layer->backward(saved, p.dy_dev, {.grad_input = grad_input}); });
  }
  // Nothing the call could have written changed.
  void expect_untouched() const {
    EXPECT_TRUE(bit_identical(bytes_of(ctx, main_grad), main_grad_before, DType::F32))
        << "main_grad";
    EXPECT_TRUE(bit_identical(bytes_of(ctx, p.layer->weight()), weight_before, kDtype)) << "weight";
    EXPECT_TRUE(bit_identical(bytes_of(ctx, p.layer->bias()), bias_before, kDtype)) << "bias";
  }
};

void expect_invalid(const std::optional<Error>& e, const std::string& buffer,
                    const std::string& expected, const std::string& seen) {
  ASSERT_TRUE(e) << "the call accepted a wrong '" << buffer << "'";
  EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument) << e->what();
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'" + buffer + "'"), HasSubstr("expected " + expected),
                               HasSubstr("got " + seen)));
}

// A caller buffer overlapping input `input` of the call (Overlapping): an error naming both, the
// arena unchanged since its last snapshot, and the rig's other buffers untouched.
void expect_overlap_rejected(const std::optional<Error>& e, const std::string& buffer,
                             const std::string& input, const Overlapping& o, const Rig& r) {
  expect_invalid(e, buffer, "memory that overlaps no input of the call",
                 "memory overlapping input '" + input + "'");
  EXPECT_TRUE(o.unchanged(r.ctx)) << "arena changed";
  r.expect_untouched();
}

// A wrong-shaped buffer (own memory, sentinel-filled) for `which` = "output" or "grad_input".
void expect_wrong_shape_rejected(const Context& ctx, const std::string& which, const Shape& shape,
                                 const std::string& expected_shape) {
  Rig r(ctx);
  const Tensor buf = filled(ctx, shape, Rig::kDtype, kSentinel);
  const std::vector<uint8_t> before = bytes_of(ctx, buf);
  const auto e = which == "output" ? r.forward_with(buf) : r.backward_with(buf);
  expect_invalid(e, which, "shape " + expected_shape, to_string(shape));
  EXPECT_TRUE(bit_identical(bytes_of(ctx, buf), before, Rig::kDtype)) << which << " was written";
  r.expect_untouched();
}

TEST_P(CallerBufferRejects, OutputWithWrongRowCount) {
  Rig r(ctx());
  expect_wrong_shape_rejected(ctx(), "output", {r.T() - 1, r.N()}, r.shape_TN());
  expect_wrong_shape_rejected(ctx(), "output", {r.T() + 1, r.N()}, r.shape_TN());
  expect_wrong_shape_rejected(ctx(), "output", {r.p.c.S(), r.N()}, r.shape_TN());  // S, not T
}
TEST_P(CallerBufferRejects, OutputWithWrongColumnCount) {
  Rig r(ctx());
  expect_wrong_shape_rejected(ctx(), "output", {r.T(), r.N() + 1}, r.shape_TN());
  expect_wrong_shape_rejected(ctx(), "output", {r.T(), r.K()}, r.shape_TN());
}
TEST_P(CallerBufferRejects, OutputWithWrongRank) {
  Rig r(ctx());
  expect_wrong_shape_rejected(ctx(), "output", {r.T() * r.N()}, r.shape_TN());
  expect_wrong_shape_rejected(ctx(), "output", {1, r.T(), r.N()}, r.shape_TN());
}
TEST_P(CallerBufferRejects, GradInputWithWrongRowCount) {
  Rig r(ctx());
  expect_wrong_shape_rejected(ctx(), "grad_input", {r.T() - 1, r.K()}, r.shape_TK());
  expect_wrong_shape_rejected(ctx(), "grad_input", {r.T() + 2, r.K()}, r.shape_TK());
}
TEST_P(CallerBufferRejects, GradInputWithWrongColumnCount) {
  Rig r(ctx());
  expect_wrong_shape_rejected(ctx(), "grad_input", {r.T(), r.K() - 1}, r.shape_TK());
  expect_wrong_shape_rejected(ctx(), "grad_input", {r.T(), r.N()}, r.shape_TK());
}
TEST_P(CallerBufferRejects, GradInputWithWrongRank) {
  Rig r(ctx());
  expect_wrong_shape_rejected(ctx(), "grad_input", {r.T() * r.K()}, r.shape_TK());
  expect_wrong_shape_rejected(ctx(), "grad_input", {r.T(), r.K(), 1}, r.shape_TK());
}

void expect_wrong_dtype_rejected(const Context& ctx, const std::string& which) {
  for (DType wrong : {DType::F16, DType::F32}) {
    Rig r(ctx);
    const Shape shape = which == "output" ? Shape{r.T(), r.N()} : Shape{r.T(), r.K()};
    const Tensor buf = filled(ctx, shape, wrong, kSentinel);
    const auto e = which == "output" ? r.forward_with(buf) : r.backward_with(buf);
    expect_invalid(e, which, "dtype bf16", std::string(name(wrong)));
    EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx, buf), 0, shape[0], shape[1], wrong));
    r.expect_untouched();
  }
}
TEST_P(CallerBufferRejects, OutputWithWrongDtype) {
  expect_wrong_dtype_rejected(ctx(), "output");
}
TEST_P(CallerBufferRejects, GradInputWithWrongDtype) {
  expect_wrong_dtype_rejected(ctx(), "grad_input");
}

void expect_wrong_device_rejected(const Context& ctx, const std::string& which) {
  Rig r(ctx);
  const Shape shape = which == "output" ? Shape{r.T(), r.N()} : Shape{r.T(), r.K()};
  const ForeignMemory mem(ctx, shape, Rig::kDtype);
  const std::vector<uint8_t> before = mem.bytes();
  const Tensor buf = mem.as(shape, dense_strides(shape), Rig::kDtype);
  const auto e = which == "output" ? r.forward_with(buf) : r.backward_with(buf);
  expect_invalid(e, which, "device " + ctx.device().to_string(), mem.claimed.to_string());
  EXPECT_TRUE(bit_identical(mem.bytes(), before, Rig::kDtype)) << which << " was written";
  r.expect_untouched();
}
TEST_P(CallerBufferRejects, OutputOnWrongDevice) {
  expect_wrong_device_rejected(ctx(), "output");
}
TEST_P(CallerBufferRejects, GradInputOnWrongDevice) {
  expect_wrong_device_rejected(ctx(), "grad_input");
}

void expect_non_contiguous_rejected(const Context& ctx, const std::string& which) {
  Rig r(ctx);
  const int64_t cols = which == "output" ? r.N() : r.K();
  // Padded rows (pitch cols + 3) and a column-major view of the same memory.
  const Tensor storage = filled(ctx, {r.T() + 1, cols + 3}, Rig::kDtype, kSentinel);
  const std::vector<uint8_t> before = bytes_of(ctx, storage);
  for (const Shape& strides : {Shape{cols + 3, 1}, Shape{1, r.T()}}) {
    const Tensor buf =
        Tensor::wrap(storage.data(), {r.T(), cols}, strides, Rig::kDtype, ctx.device());
    const auto e = which == "output" ? r.forward_with(buf) : r.backward_with(buf);
    expect_invalid(e, which, "a contiguous (row-major, dense) tensor",
                   "strides " + to_string(strides) + " for shape " + to_string(Shape{r.T(), cols}));
    EXPECT_TRUE(bit_identical(bytes_of(ctx, storage), before, Rig::kDtype))
        << which << " was written";
    r.expect_untouched();
  }
}
TEST_P(CallerBufferRejects, OutputNonContiguous) {
  expect_non_contiguous_rejected(ctx(), "output");
}
TEST_P(CallerBufferRejects, GradInputNonContiguous) {
  expect_non_contiguous_rejected(ctx(), "grad_input");
}

// Overlap: the buffer and an input of the call are carved out of one arena (Overlapping,
// support/test_util.h); after the failed call the whole arena is unchanged.
TEST_P(CallerBufferRejects, OutputOverlappingInput) {
  Rig r(ctx());
  const Tensor xh = to_host(ctx(), r.p.x_dev);
  Overlapping o(ctx(), xh, {r.T(), r.N()}, Rig::kDtype, /*overlap_elems=*/r.K());  // last row of x
  const auto e =
      caught([&] { r.p.layer->forward(o.data, Splits::host(r.p.c.counts), {.output = o.buffer}); });
  expect_overlap_rejected(e, "output", "input", o, r);
}

TEST_P(CallerBufferRejects, OutputOverlappingWeight) {
  Rig r(ctx());
  const Tensor wh = to_host(ctx(), r.p.layer->weight());
  Overlapping o(ctx(), wh, {r.T(), r.N()}, Rig::kDtype, /*overlap_elems=*/1);  // one element
  r.p.layer->set_weight(o.data);
  r.snapshot();
  const auto e = r.forward_with(o.buffer);
  expect_overlap_rejected(e, "output", "weight", o, r);
}

TEST_P(CallerBufferRejects, OutputOverlappingBias) {
  Rig r(ctx());
  const Tensor bh = to_host(ctx(), r.p.layer->bias());
  Overlapping o(ctx(), bh, {r.T(), r.N()}, Rig::kDtype, /*overlap_elems=*/r.N());
  r.p.layer->set_bias(o.data);
  r.snapshot();
  const auto e = r.forward_with(o.buffer);
  expect_overlap_rejected(e, "output", "bias", o, r);
}

TEST_P(CallerBufferRejects, OutputOverlappingDeviceCounts) {
  Rig r(ctx());
  // counts i32 [G] at the start of the arena, the bf16 buffer starting on its last count.
  const Tensor counts = counts_tensor(r.p.c.counts, DType::I32);
  Overlapping o(ctx(), counts, {r.T(), r.N()}, Rig::kDtype, /*overlap_elems=*/2);  // 4 bytes
  const auto e =
      caught([&] { r.p.layer->forward(r.p.x_dev, Splits::device(o.data), {.output = o.buffer}); });
  expect_overlap_rejected(e, "output", "splits", o, r);
}

TEST_P(CallerBufferRejects, GradInputOverlappingGradOutput) {
  Rig r(ctx());
  const Tensor dyh = to_host(ctx(), r.p.dy_dev);
  Overlapping o(ctx(), dyh, {r.T(), r.K()}, Rig::kDtype, /*overlap_elems=*/3);
  const auto e = caught([&] { r.p.layer->backward(r.saved, o.data, {.grad_input = o.buffer}); });
  expect_overlap_rejected(e, "grad_input", "grad_output", o, r);
}

TEST_P(CallerBufferRejects, GradInputOverlappingInput) {
  Rig r(ctx());
  const Tensor xh = to_host(ctx(), r.p.x_dev);
  Overlapping o(ctx(), xh, {r.T(), r.K()}, Rig::kDtype, /*overlap_elems=*/r.K() * 2);
  GroupedLinear::Saved saved;
  r.p.layer->forward(o.data, Splits::host(r.p.c.counts), {}, &saved);  // x lives in the arena
  r.snapshot();
  o.snapshot(ctx());
  const auto e = caught([&] { r.p.layer->backward(saved, r.p.dy_dev, {.grad_input = o.buffer}); });
  expect_overlap_rejected(e, "grad_input", "input", o, r);
}

TEST_P(CallerBufferRejects, GradInputOverlappingWeight) {
  Rig r(ctx());
  const Tensor wh = to_host(ctx(), r.p.layer->weight());
  Overlapping o(ctx(), wh, {r.T(), r.K()}, Rig::kDtype, /*overlap_elems=*/1);
  r.p.layer->set_weight(o.data);
  r.snapshot();
  const auto e = r.backward_with(o.buffer);
  expect_overlap_rejected(e, "grad_input", "weight", o, r);
}

TEST_P(CallerBufferRejects, GradInputOverlappingMainGrad) {
  // main_grad is written by the same call: sharing memory with it would race.
  Rig r(ctx());
  const Tensor mgh = to_host(ctx(), r.main_grad);
  Overlapping o(ctx(), mgh, {r.T(), r.K()}, Rig::kDtype, /*overlap_elems=*/1);  // 2 of 4 bytes
  r.main_grad = o.data;
  r.p.layer->set_main_grad(o.data);
  r.snapshot();
  const auto e = r.backward_with(o.buffer);
  expect_overlap_rejected(e, "grad_input", "main_grad", o, r);
}

TEST_P(CallerBufferRejects, OutputOverlappingMainGrad) {
  // Forward would write y where backward then accumulates dW.
  Rig r(ctx());
  const Tensor mgh = to_host(ctx(), r.main_grad);
  Overlapping o(ctx(), mgh, {r.T(), r.N()}, Rig::kDtype, /*overlap_elems=*/1);
  r.main_grad = o.data;
  r.p.layer->set_main_grad(o.data);
  r.snapshot();
  const auto e = r.forward_with(o.buffer);
  expect_overlap_rejected(e, "output", "main_grad", o, r);
}

TEST_P(CallerBufferRejects, GradInputOverlappingDeviceCounts) {
  // The backward reads the splits saved at forward: device counts there are an input too.
  Rig r(ctx());
  const Tensor counts = counts_tensor(r.p.c.counts, DType::I32);
  Overlapping o(ctx(), counts, {r.T(), r.K()}, Rig::kDtype, /*overlap_elems=*/2);  // 4 bytes
  GroupedLinear::Saved saved;
  r.p.layer->forward(r.p.x_dev, Splits::device(o.data), {}, &saved);
  r.snapshot();
  o.snapshot(ctx());
  const auto e = caught([&] { r.p.layer->backward(saved, r.p.dy_dev, {.grad_input = o.buffer}); });
  expect_overlap_rejected(e, "grad_input", "splits", o, r);
}

// main_grad is written by backward: it may not overlap what backward reads (SPEC §3) — the
// gradient of the output, the weight, the saved input, the saved device counts. The arena holds
// that input, with main_grad [G, N, K] f32 overlapping its last element.
TEST_P(CallerBufferRejects, MainGradOverlappingABackwardInput) {
  for (const std::string which : {"grad_output", "weight", "input", "splits"}) {
    SCOPED_TRACE(which);
    Rig r(ctx());
    const Shape mg_shape{r.p.c.G(), r.N(), r.K()};
    const Tensor host = which == "grad_output" ? to_host(ctx(), r.p.dy_dev)
                        : which == "weight"    ? to_host(ctx(), r.p.layer->weight())
                        : which == "input"     ? to_host(ctx(), r.p.x_dev)
                                               : counts_tensor(r.p.c.counts, DType::I32);
    const int64_t overlap = which == "splits" ? 1 : 2;  // f32 elements over the input's last bytes
    Overlapping o(ctx(), host, mg_shape, DType::F32, overlap);
    Tensor dy = r.p.dy_dev;
    GroupedLinear::Saved saved = r.saved;
    if (which == "grad_output") dy = o.data;
    if (which == "weight") r.p.layer->set_weight(o.data);
    if (which == "input") r.p.layer->forward(o.data, Splits::host(r.p.c.counts), {}, &saved);
    if (which == "splits") r.p.layer->forward(r.p.x_dev, Splits::device(o.data), {}, &saved);
    r.main_grad = o.buffer;
    r.p.layer->set_main_grad(o.buffer);
    r.snapshot();
    o.snapshot(ctx());
    const auto e = caught([&] { r.p.layer->backward(saved, dy, {}); });
    expect_overlap_rejected(e, "main_grad", which, o, r);
  }
}

TEST_P(CallerBufferRejects, AdjacentButNotOverlappingIsAccepted) {
  // The boundary of the overlap rule: x and the buffer back to back in one arena.
  Rig r(ctx());
  const Tensor xh = to_host(ctx(), r.p.x_dev);
  Overlapping o(ctx(), xh, {r.T(), r.N()}, Rig::kDtype, /*overlap_elems=*/0);
  const Tensor y = r.p.layer->forward(o.data, Splits::host(r.p.c.counts), {.output = o.buffer});
  EXPECT_EQ(y.data(), o.buffer.data());
  EXPECT_TRUE(bit_identical(bytes_of(ctx(), o.data), bytes_of(ctx(), xh), Rig::kDtype))
      << "input changed";
  EXPECT_TRUE(matches_reference("y", valid_rows(ctx(), y, r.p.c.S()), r.p.ref_y(), Rig::kDtype));
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx(), y), r.p.c.S(), r.T(), r.N(), Rig::kDtype));
}

// ---------------------------------------------------------------- validation order
// shape → dtype → device → contiguity → overlap: a buffer wrong in two respects reports the first.

void expect_order(const Context& ctx, const std::string& which) {
  Rig r(ctx);
  const bool out = which == "output";
  const int64_t T = r.T(), cols = out ? r.N() : r.K();
  auto call = [&](const Tensor& buf) { return out ? r.forward_with(buf) : r.backward_with(buf); };
  // Memory for the wrong buffers: big enough for every shape and pitch used below.
  const Tensor local = filled(ctx, {T + 2, cols + 4}, DType::F32, kSentinel);
  const std::vector<uint8_t> local_before = bytes_of(ctx, local);
  const ForeignMemory foreign(ctx, {T + 2, cols + 4}, DType::F32);
  const std::vector<uint8_t> foreign_before = foreign.bytes();
  auto wrap_local = [&](const Shape& shape, const Shape& strides, DType dt) {
    return Tensor::wrap(local.data(), shape, strides, dt, ctx.device());
  };
  {
    SCOPED_TRACE("shape and dtype wrong: shape reported");
    const auto e = call(wrap_local({T - 1, cols}, dense_strides({T - 1, cols}), DType::F16));
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), AllOf(HasSubstr("'" + which + "'"), HasSubstr("expected shape"),
                                 Not(HasSubstr("dtype"))));
  }
  {
    SCOPED_TRACE("dtype and device wrong: dtype reported");
    const auto e = call(foreign.as({T, cols}, dense_strides({T, cols}), DType::F16));
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), AllOf(HasSubstr("'" + which + "'"), HasSubstr("expected dtype bf16"),
                                 HasSubstr("got f16")));
  }
  {
    SCOPED_TRACE("device wrong and non-contiguous: device reported");
    const auto e = call(foreign.as({T, cols}, {cols + 4, 1}, Rig::kDtype));
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), AllOf(HasSubstr("'" + which + "'"), HasSubstr("expected device"),
                                 Not(HasSubstr("contiguous"))));
  }
  {
    SCOPED_TRACE("non-contiguous and overlapping an input: contiguity reported");
    // The input (x for forward, dy for backward) and, starting on its last element, padded rows
    // of pitch cols + 4, all inside one arena.
    const Tensor input_h = to_host(ctx, out ? r.p.x_dev : r.p.dy_dev);
    Overlapping o(ctx, input_h, {T + 1, cols + 4}, Rig::kDtype, /*overlap_elems=*/1);
    const Tensor padded =
        Tensor::wrap(o.buffer.data(), {T, cols}, {cols + 4, 1}, Rig::kDtype, ctx.device());
    const auto e = caught([&] {
      if (out) {
        r.p.layer->forward(o.data, Splits::host(r.p.c.counts), {.output = padded});
      } else {
        r.p.layer->backward(r.saved, o.data, {.grad_input = padded});
      }
    });
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), AllOf(HasSubstr("'" + which + "'"), HasSubstr("contiguous"),
                                 Not(HasSubstr("overlap"))));
    EXPECT_TRUE(o.unchanged(ctx)) << "arena changed";
  }
  EXPECT_TRUE(bit_identical(bytes_of(ctx, local), local_before, DType::F32))
      << "buffer memory changed";
  EXPECT_TRUE(bit_identical(foreign.bytes(), foreign_before, DType::F32))
      << "foreign memory changed";
  r.expect_untouched();
}
TEST_P(CallerBufferRejects, OutputChecksShapeDtypeDeviceContiguityOverlapInThatOrder) {
  expect_order(ctx(), "output");
}
TEST_P(CallerBufferRejects, GradInputChecksShapeDtypeDeviceContiguityOverlapInThatOrder) {
  expect_order(ctx(), "grad_input");
}

// ================================================================ bad splits through the op

// Forward with `splits` must fail naming `substrings`, before writing anything.
void expect_splits_rejected(const Context& ctx, const Splits& splits,
                            const std::vector<std::string>& substrings) {
  Rig r(ctx);
  const Tensor out = filled(ctx, {r.T(), r.N()}, Rig::kDtype, kSentinel);
  const auto e = caught([&] { r.p.layer->forward(r.p.x_dev, splits, {.output = out}); });
  ASSERT_TRUE(e) << "bad splits accepted";
  EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
  for (const std::string& s : substrings) EXPECT_THAT(e->what(), HasSubstr(s));
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx, out), 0, r.T(), r.N(), Rig::kDtype))
      << "output written";
  r.expect_untouched();
}

// kBufferCase: G = 5, T = 30.
TEST_P(BadSplits, NegativeCountIsRejectedNamingValue) {
  expect_splits_rejected(ctx(), Splits::host({7, 0, -2, 5, 0}),
                         {"'splits'", "every count >= 0", "got count -2 for group 2"});
}
TEST_P(BadSplits, WrongGroupCountIsRejectedNamingBoth) {
  expect_splits_rejected(ctx(), Splits::host({7, 0, 12, 5}),
                         {"'splits'", "expected 5 group counts", "got 4 counts"});
  expect_splits_rejected(ctx(), Splits::host({7, 0, 12, 5, 0, 0}),
                         {"'splits'", "expected 5 group counts", "got 6 counts"});
}
TEST_P(BadSplits, TotalAboveRowsIsRejectedNamingSAndT) {
  expect_splits_rejected(ctx(), Splits::host({7, 0, 12, 5, 7}),
                         {"'splits'", "S <= T = 30", "got S = 31"});
}
TEST_P(BadSplits, DeviceCountsOfWrongShapeOrDtypeAreRejected) {
  for (DType dt : {DType::I32, DType::I64}) {
    expect_splits_rejected(ctx(),
                           Splits::device(to_device(ctx(), counts_tensor({7, 0, 12, 5}, dt))),
                           {"'splits'", "shape [5]", "got [4]"});
  }
  expect_splits_rejected(ctx(), Splits::device(filled(ctx(), {5}, DType::F32, 1)),
                         {"'splits'", "i32 or i64", "got f32"});
}
TEST_P(BadSplits, DeviceCountsOnAnotherDeviceAreRejected) {
  const ForeignMemory mem(ctx(), {5}, DType::I32);
  expect_splits_rejected(
      ctx(), Splits::device(mem.as({5}, {1}, DType::I32)),
      {"'splits'", "counts on " + ctx().device().to_string(), "got " + mem.claimed.to_string()});
}
// Device counts with a negative count or S > T: on the CPU an error at the call, naming the value;
// on CUDA (SPEC §1: checked on the device, no host sync) no error at the call, nothing written by
// forward or backward (output, grad_input, main_grad), and check_device_errors() then raises an
// InvalidArgument naming 'splits' and what was wrong.
TEST_P(BadSplits, DeviceCountValuesAreCheckedBeforeAnyWork) {
  struct Bad {
    std::vector<int64_t> counts;
    std::vector<std::string> cpu_says;
    const char* device_says;
  };
  const Bad bad[] = {{{7, 0, -2, 5, 0}, {"'splits'", "got count -2 for group 2"},
                      "a negative count"},
                     {{7, 0, 12, 5, 7}, {"'splits'", "S <= T = 30", "got S = 31"},
                      "a total S larger than the T rows presented"}};
  for (DType dt : {DType::I32, DType::I64}) {
    for (const Bad& b : bad) {
      SCOPED_TRACE(str(::testing::PrintToString(b.counts), " ", name(dt)));
      const Splits splits = Splits::device(to_device(ctx(), counts_tensor(b.counts, dt)));
      if (on_cpu()) {
        expect_splits_rejected(ctx(), splits, b.cpu_says);
        continue;
      }
      Rig r(ctx());
      (void)ctx().device_error_bits();  // a clear word: what follows is this call's
      const Tensor out = filled(ctx(), {r.T(), r.N()}, Rig::kDtype, kSentinel);
      const Tensor dx = filled(ctx(), {r.T(), r.K()}, Rig::kDtype, kSentinel);
      // A backend that reads the counts to the host raises at the call instead (SPEC §1).
      GroupedLinear::Saved saved;
      auto e = caught([&] { r.p.layer->forward(r.p.x_dev, splits, {.output = out}, &saved); });
      if (!e) e = caught([&] { r.p.layer->backward(saved, r.p.dy_dev, {.grad_input = dx}); });
      if (!e) e = caught([&] { ctx().check_device_errors(); });
      ASSERT_TRUE(e) << "no error reported, at the call or on the device";
      EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
      const bool on_device =
          std::string(e->what()).find("the kernel found invalid") != std::string::npos;
      for (const std::string& says : on_device ? std::vector<std::string>{"'splits'", b.device_says}
                                               : b.cpu_says) {
        EXPECT_THAT(e->what(), HasSubstr(says));
      }
      EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx(), out), 0, r.T(), r.N(), Rig::kDtype)) << "y";
      EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx(), dx), 0, r.T(), r.K(), Rig::kDtype)) << "dx";
      r.expect_untouched();  // main_grad, weight, bias
    }
  }
}

}  // namespace
}  // namespace moekit
