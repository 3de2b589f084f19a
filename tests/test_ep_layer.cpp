// The MoE layer end to end on CPU ranks (moekit/ep/moe_layer.h): router → dispatch → fused grouped
// MLP → combine, forward and backward on 1, 2, 4 and 8 ranks against a dense single-rank fp64
// reference of the whole layer written here; zero copy (the MLP writes the EP buffers: pointers
// and the exact bytes allocated); one backward per forward.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "moekit/ep/moe_layer.h"
#include "moekit/moekit.h"
#include "support/test_util.h"

namespace moekit::test {
namespace {

using ::testing::HasSubstr;

struct LayerCase {
  int W = 2;
  int64_t E = 8, H = 16, F = 24, k = 2, Tm = 14;
  DType dtype = DType::F32;
  RouterScore score = RouterScore::Softmax;
  bool normalize = false;
  uint64_t seed = 1;
};

std::vector<double> f64(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  to_f64(t.data(), t.dtype(), v.data(), v.size());
  return v;
}

// Host data of the whole (global) layer.
struct LayerData {
  LayerCase c;
  Tensor gate, w1, w2;        // [E, H], [E, 2F, H], [E, H, F]
  std::vector<Tensor> x, dy;  // per rank [T_r, H]
};
LayerData make_layer_data(const LayerCase& c) {
  LayerData d{c,
              random_normal({c.E, c.H}, c.dtype, c.seed, 0.5),
              random_normal({c.E, 2 * c.F, c.H}, c.dtype, c.seed + 1, 1.0 / std::sqrt(double(c.H))),
              random_normal({c.E, c.H, c.F}, c.dtype, c.seed + 2, 1.0 / std::sqrt(double(c.F))),
              {},
              {}};
  for (int r = 0; r < c.W; ++r) {
    const int64_t T = c.Tm - (r % 3);
    d.x.push_back(random_normal({T, c.H}, c.dtype, c.seed * 10 + 100 + static_cast<uint64_t>(r)));
    d.dy.push_back(random_normal({T, c.H}, c.dtype, c.seed * 10 + 200 + static_cast<uint64_t>(r)));
  }
  return d;
}

double silu(double a) {
  return a / (1 + std::exp(-a));
}
double dsilu(double a) {
  const double s = 1 / (1 + std::exp(-a));
  return s * (1 + a * (1 - s));
}

// The dense fp64 reference of one rank's tokens (every expert local): y, dx, dgate, and each
// expert's dW1 / dW2 contributions added into dw1 / dw2 ([E, 2F, H], [E, H, F]).
struct RankRef {
  std::vector<double> y, dx, dgate;
};
RankRef reference(const LayerData& d, int r, std::vector<double>& dw1, std::vector<double>& dw2) {
  const LayerCase& c = d.c;
  const int64_t H = c.H, F = c.F, E = c.E, k = c.k;
  const auto x = f64(d.x[static_cast<size_t>(r)]), dy = f64(d.dy[static_cast<size_t>(r)]);
  const auto gate = f64(d.gate), w1 = f64(d.w1), w2 = f64(d.w2);
  const int64_t T = d.x[static_cast<size_t>(r)].size(0);
  RankRef out{std::vector<double>(static_cast<size_t>(T * H)),
              std::vector<double>(static_cast<size_t>(T * H)),
              std::vector<double>(static_cast<size_t>(E * H))};
  for (int64_t t = 0; t < T; ++t) {
    const double* xt = &x[static_cast<size_t>(t * H)];
    const double* dyt = &dy[static_cast<size_t>(t * H)];
    std::vector<double> s(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      double l = 0;
      for (int64_t h = 0; h < H; ++h) l += xt[h] * gate[static_cast<size_t>(e * H + h)];
      s[static_cast<size_t>(e)] = l;
    }
    if (c.score == RouterScore::Softmax) {
      const double m = *std::max_element(s.begin(), s.end());
      double z = 0;
      for (auto& v : s) z += (v = std::exp(v - m));
      for (auto& v : s) v /= z;
    } else {
      for (auto& v : s) v = 1 / (1 + std::exp(-v));
    }
    std::vector<int64_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return s[static_cast<size_t>(a)] > s[static_cast<size_t>(b)];
    });
    double zk = 0;
    for (int64_t j = 0; j < k; ++j) zk += s[static_cast<size_t>(order[static_cast<size_t>(j)])];
    std::vector<double> dwt(static_cast<size_t>(k)), wt(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j) {
      const int64_t g = order[static_cast<size_t>(j)];
      const double p = c.normalize ? s[static_cast<size_t>(g)] / zk : s[static_cast<size_t>(g)];
      wt[static_cast<size_t>(j)] = p;
      const double* W1 = &w1[static_cast<size_t>(g * 2 * F * H)];
      const double* W2 = &w2[static_cast<size_t>(g * H * F)];
      std::vector<double> hv(static_cast<size_t>(2 * F)), act(static_cast<size_t>(F)),
          dz(static_cast<size_t>(F));
      for (int64_t i = 0; i < 2 * F; ++i) {
        double a = 0;
        for (int64_t h = 0; h < H; ++h) a += W1[i * H + h] * xt[h];
        hv[static_cast<size_t>(i)] = a;
      }
      for (int64_t i = 0; i < F; ++i)
        act[static_cast<size_t>(i)] =
            silu(hv[static_cast<size_t>(i)]) * hv[static_cast<size_t>(F + i)];
      for (int64_t o = 0; o < H; ++o) {
        double a = 0;
        for (int64_t i = 0; i < F; ++i) a += W2[o * F + i] * p * act[static_cast<size_t>(i)];
        out.y[static_cast<size_t>(t * H + o)] += a;
      }
      // backward of this expert's row
      double dp = 0;
      for (int64_t i = 0; i < F; ++i) {
        double a = 0;
        for (int64_t o = 0; o < H; ++o) a += W2[o * F + i] * dyt[o];
        dz[static_cast<size_t>(i)] = a;
        dp += a * act[static_cast<size_t>(i)];
      }
      dwt[static_cast<size_t>(j)] = dp;
      for (int64_t o = 0; o < H; ++o)
        for (int64_t i = 0; i < F; ++i)
          dw2[static_cast<size_t>(g * H * F + o * F + i)] +=
              dyt[o] * p * act[static_cast<size_t>(i)];
      std::vector<double> dh(static_cast<size_t>(2 * F));
      for (int64_t i = 0; i < F; ++i) {
        const double a = hv[static_cast<size_t>(i)], b = hv[static_cast<size_t>(F + i)];
        dh[static_cast<size_t>(i)] = p * dz[static_cast<size_t>(i)] * b * dsilu(a);
        dh[static_cast<size_t>(F + i)] = p * dz[static_cast<size_t>(i)] * silu(a);
      }
      for (int64_t i = 0; i < 2 * F; ++i)
        for (int64_t h = 0; h < H; ++h) {
          dw1[static_cast<size_t>(g * 2 * F * H + i * H + h)] += dh[static_cast<size_t>(i)] * xt[h];
          out.dx[static_cast<size_t>(t * H + h)] += dh[static_cast<size_t>(i)] * W1[i * H + h];
        }
    }
    // router backward
    std::vector<double> ds(static_cast<size_t>(E), 0.0), dl(static_cast<size_t>(E));
    if (c.normalize) {
      double gw = 0;
      for (int64_t j = 0; j < k; ++j)
        gw += dwt[static_cast<size_t>(j)] * wt[static_cast<size_t>(j)];
      for (int64_t j = 0; j < k; ++j)
        ds[static_cast<size_t>(order[static_cast<size_t>(j)])] =
            (dwt[static_cast<size_t>(j)] - gw) / zk;
    } else {
      for (int64_t j = 0; j < k; ++j)
        ds[static_cast<size_t>(order[static_cast<size_t>(j)])] = dwt[static_cast<size_t>(j)];
    }
    double dot = 0;
    for (int64_t e = 0; e < E; ++e) dot += ds[static_cast<size_t>(e)] * s[static_cast<size_t>(e)];
    for (int64_t e = 0; e < E; ++e) {
      const double se = s[static_cast<size_t>(e)];
      dl[static_cast<size_t>(e)] = c.score == RouterScore::Softmax
                                       ? se * (ds[static_cast<size_t>(e)] - dot)
                                       : ds[static_cast<size_t>(e)] * se * (1 - se);
      for (int64_t h = 0; h < H; ++h) {
        out.dgate[static_cast<size_t>(e * H + h)] += dl[static_cast<size_t>(e)] * xt[h];
        out.dx[static_cast<size_t>(t * H + h)] +=
            dl[static_cast<size_t>(e)] * gate[static_cast<size_t>(e * H + h)];
      }
    }
  }
  return out;
}

// |got − ref| ≤ rtol·(|ref| + rms(ref)) for every element; names the first one off.
::testing::AssertionResult close(const char* what, const std::vector<double>& got,
                                 const std::vector<double>& ref, double rtol) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs " << ref.size();
  double ss = 0;
  for (double v : ref) ss += v * v;
  const double rms = std::sqrt(ss / std::max<size_t>(1, ref.size()));
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = rtol * (std::fabs(ref[i]) + rms);
    if (!(std::fabs(got[i] - ref[i]) <= tol)) {
      return ::testing::AssertionFailure() << what << "[" << i << "]: got " << got[i] << ", want "
                                           << ref[i] << " (tolerance " << tol << ")";
    }
  }
  if (rms == 0)
    return ::testing::AssertionFailure()
           << what << ": the reference is all zeros (a test that cannot fail)";
  return ::testing::AssertionSuccess();
}

MoELayerConfig layer_config(const LayerCase& c) {
  const int64_t L = c.E / c.W;
  return {.ep = {.experts_per_rank = L,
                 .hidden = c.H,
                 .dtype = c.dtype,
                 .topk = c.k,
                 .max_tokens = c.Tm,
                 .receive_capacity = c.Tm * c.W * c.k},
          .ffn = c.F,
          .score = c.score,
          .normalize_topk = c.normalize};
}

// Copies the global parameters' slices of rank r into the layer.
void load(MoELayer& moe, const LayerData& d, const Context& ctx, int r) {
  const LayerCase& c = d.c;
  const int64_t L = c.E / c.W;
  copy(ctx, d.gate, moe.gate_weight());
  const size_t es = size_of(c.dtype);
  Tensor w1 = Tensor::wrap(
      static_cast<char*>(d.w1.data()) + static_cast<size_t>(r * L * 2 * c.F * c.H) * es,
      {L, 2 * c.F, c.H}, c.dtype, Device::cpu());
  Tensor w2 =
      Tensor::wrap(static_cast<char*>(d.w2.data()) + static_cast<size_t>(r * L * c.H * c.F) * es,
                   {L, c.H, c.F}, c.dtype, Device::cpu());
  copy(ctx, w1, moe.experts().fc1()->linear().weight());
  copy(ctx, w2, moe.experts().fc2()->linear().weight());
}

class MoELayerRanks : public ::testing::TestWithParam<int> {};

TEST_P(MoELayerRanks, ForwardAndBackwardMatchTheDenseFp64Reference) {
  for (const auto& [dtype, score, normalize] :
       {std::tuple{DType::F32, RouterScore::Softmax, false},
        std::tuple{DType::F32, RouterScore::Sigmoid, true},
        std::tuple{DType::BF16, RouterScore::Softmax, true}}) {
    LayerCase c;
    c.W = GetParam();
    c.dtype = dtype;
    c.score = score;
    c.normalize = normalize;
    SCOPED_TRACE(str(name(dtype), score == RouterScore::Softmax ? " softmax" : " sigmoid",
                     normalize ? " normalized" : ""));
    const LayerData d = make_layer_data(c);
    std::vector<double> dw1(static_cast<size_t>(c.E * 2 * c.F * c.H)),
        dw2(static_cast<size_t>(c.E * c.H * c.F));
    std::vector<RankRef> ref;
    for (int r = 0; r < c.W; ++r) ref.push_back(reference(d, r, dw1, dw2));
    const double rtol = dtype == DType::F32 ? 1e-4 : 4e-2;
    CpuRanks ranks(c.W, [](int) { return poisoned(Context::cpu(1)); });  // unwritten memory is NaN
    ranks.run([&](Communicator& comm) {
      const int r = comm.rank();
      const Context& ctx = comm.context();
      MoELayer moe(comm, layer_config(c));
      load(moe, d, ctx, r);
      MoELayer::Saved saved;
      Tensor y = moe.forward(to_device(ctx, d.x[static_cast<size_t>(r)]), &saved);
      MoELayer::Grads g = moe.backward(saved, to_device(ctx, d.dy[static_cast<size_t>(r)]));
      const RankRef& rr = ref[static_cast<size_t>(r)];
      EXPECT_TRUE(close("y", f64(y), rr.y, rtol)) << "rank " << r;
      EXPECT_TRUE(close("dx", f64(g.input), rr.dx, rtol)) << "rank " << r;
      EXPECT_TRUE(close("dgate", f64(g.gate), rr.dgate, rtol)) << "rank " << r;
      const int64_t L = c.E / c.W;
      const auto b1 = dw1.begin() + r * L * 2 * c.F * c.H, b2 = dw2.begin() + r * L * c.H * c.F;
      EXPECT_TRUE(close("dW1", f64(g.experts.fc1.weight),
                        std::vector<double>(b1, b1 + L * 2 * c.F * c.H), rtol))
          << "rank " << r;
      EXPECT_TRUE(close("dW2", f64(g.experts.fc2.weight),
                        std::vector<double>(b2, b2 + L * c.H * c.F), rtol))
          << "rank " << r;
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, MoELayerRanks, ::testing::Values(1, 2, 4, 8),
                         [](const auto& info) { return str("W", info.param); });

// A recipe reaches the experts (their MLP quantized: GroupedMLPConfig::recipe, bit for bit the
// quantized ops in test_quant_ops): the layer's y differs from the unquantized layer's by the
// quantization only (within the recipe's tolerance of the fp64 reference, not equal to it), on 2
// ranks; an ep.alignment that is not the recipe's row multiple is refused, naming it.
TEST(MoELayerRecipe, TheExpertsRunTheRecipeAndTheAlignmentIsChecked) {
  LayerCase c;
  c.W = 2;
  c.E = 4;
  c.H = 32;
  c.F = 32;
  c.dtype = DType::BF16;
  const LayerData d = make_layer_data(c);
  std::vector<double> dw1(static_cast<size_t>(c.E * 2 * c.F * c.H)),
      dw2(static_cast<size_t>(c.E * c.H * c.F));
  std::vector<RankRef> ref;
  for (int r = 0; r < c.W; ++r) ref.push_back(reference(d, r, dw1, dw2));
  const Recipe recipe = Recipe::mxfp8();
  CpuRanks ranks(c.W, [](int) { return poisoned(Context::cpu(1)); });
  ranks.run([&](Communicator& comm) {
    const int r = comm.rank();
    const Context& ctx = comm.context();
    MoELayerConfig cfg = layer_config(c);
    cfg.recipe = recipe;
    cfg.ep.alignment = 16;  // mxfp8 pads every expert's rows to 32
    auto e = caught([&] { MoELayer bad(comm, cfg); });
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), HasSubstr("'ep.alignment'"));
    cfg.ep.alignment = recipe.group_rows_multiple();
    cfg.ep.receive_capacity += c.E / c.W * (cfg.ep.alignment - 1);
    MoELayer moe(comm, cfg);
    EXPECT_TRUE(moe.experts().quantized());
    load(moe, d, ctx, r);
    MoELayer::Saved saved;
    const Tensor y = moe.forward(to_device(ctx, d.x[static_cast<size_t>(r)]), &saved);
    const RankRef& rr = ref[static_cast<size_t>(r)];
    EXPECT_TRUE(close("y", f64(y), rr.y, 0.25)) << "rank " << r;   // the recipe's smoke tolerance
    EXPECT_FALSE(close("y", f64(y), rr.y, 4e-2)) << "rank " << r;  // bf16's: the recipe ran
    const MoELayer::Grads g = moe.backward(saved, to_device(ctx, d.dy[static_cast<size_t>(r)]));
    EXPECT_TRUE(close("dx", f64(g.input), rr.dx, 0.25)) << "rank " << r;
  });
}

// Zero copy: the MLP's output is combine_input() and its input gradient dispatch_backward_input()
// (the same memory), and the forward allocates exactly the bytes listed here — a staged copy of the
// MLP's output would add one [R, H] block.
TEST(MoELayerZeroCopy, TheMlpWritesTheEpBuffersInPlace) {
  LayerCase c;
  c.W = 2;
  const LayerData d = make_layer_data(c);
  CpuRanks ranks(c.W, [](int) { return poisoned(Context::cpu(1)); });  // unwritten memory is NaN
  ranks.run([&](Communicator& comm) {
    const int r = comm.rank();
    const Context& ctx = comm.context();
    MoELayer moe(comm, layer_config(c));
    load(moe, d, ctx, r);
    Tensor x = to_device(ctx, d.x[static_cast<size_t>(r)]),
           dy = to_device(ctx, d.dy[static_cast<size_t>(r)]);
    const int64_t T = x.size(0), R = moe.ep().config().receive_capacity, H = c.H, F = c.F, k = c.k,
                  L = c.E / c.W;
    MoELayer::Saved saved;
    ctx.allocator().reset_stats();
    Tensor y = moe.forward(x, &saved);
    const Allocator::Stats fw = ctx.allocator().stats();
    EXPECT_EQ(saved.expert_out.data(), moe.ep().combine_input().data());
    // router idx + weights + fp64 scores [T, E]; dispatch recv, row weights, tokens per expert,
    // padded counts; the MLP's h and z; the combine's output. Nothing [R, H] beyond recv.
    const int64_t es = 4;
    EXPECT_EQ(fw.bytes, T * k * 8 + T * k * 4 + T * c.E * 8 + R * H * es + R * 4 + L * 8 + L * 8 +
                            R * 2 * F * es + R * F * es + T * H * es);
    ctx.allocator().reset_stats();
    MoELayer::Grads g = moe.backward(saved, dy);
    EXPECT_EQ(g.experts.input.data(), moe.ep().dispatch_backward_input().data());
    const Allocator::Stats bw = ctx.allocator().stats();
    EXPECT_LT(bw.count, 100);
    (void)y;
  });
}

TEST(MoELayerOnce, ASecondBackwardOfOneForwardIsRefused) {
  LayerCase c;
  c.W = 1;
  const LayerData d = make_layer_data(c);
  CpuRanks ranks(1, [](int) { return poisoned(Context::cpu(1)); });
  ranks.run([&](Communicator& comm) {
    const Context& ctx = comm.context();
    MoELayer moe(comm, layer_config(c));
    load(moe, d, ctx, 0);
    MoELayer::Saved saved;
    moe.forward(to_device(ctx, d.x[0]), &saved);
    Tensor dy = to_device(ctx, d.dy[0]);
    MoELayer::Grads g1 = moe.backward(saved, dy, {.retain_saved = true});
    const auto first = f64(g1.input);
    MoELayer::Grads g2 = moe.backward(saved, dy);
    EXPECT_EQ(f64(g2.input), first) << "a retained backward repeats bit for bit";
    auto e = caught([&] { moe.backward(saved, dy); });
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), HasSubstr("invalid argument 'saved'"));
  });
}

}  // namespace
}  // namespace moekit::test
