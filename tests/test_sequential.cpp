// Sequential (SPEC §4): the fuser's decisions, per-op arguments routed by handle and by position
// (also into a fused MLP), grad_input bound at forward and written in backward, every argument
// error with the op and the argument in its message, chains of basic ops (GroupedLinear, Bias,
// SwiGLU, ScaledSwiGLU) against fp64 and finite differences, and the probs gradient summed over
// every op that takes the probs. Device-parameterised like the other suites.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "moekit/ops/bias.h"
#include "moekit/ops/grouped_mlp.h"
#include "moekit/ops/sequential.h"
#include "support/mlp_reference.h"
#include "support/test_util.h"

namespace moekit::test {
namespace {

using ::testing::HasSubstr;

int64_t sum(const std::vector<int64_t>& v) { return sum_of(v); }

class SequentialTest : public DeviceTest {
 protected:

  // The MLP case most tests share: G 3, H 16, F 32, rows {7, 0, 9} + 5 tail rows, b1 and b2.
  struct Mlp {
    MlpData d;
    MlpOps ops;
    Tensor x, probs, dy;
    Splits splits;
    int64_t S = 0;
    ExtraInputs inputs() const { return {.splits = splits, .probs = probs}; }
  };
  Mlp mlp(DType dt = DType::BF16, uint64_t seed = 1) const {
    Mlp m;
    m.d = make_mlp_data({.G = 3, .H = 16, .F = 32, .counts = {7, 0, 9}, .dtype = dt, .seed = seed});
    m.ops = make_mlp_ops(ctx_, m.d);
    m.x = to_device(ctx_, m.d.x);
    m.probs = to_device(ctx_, m.d.probs);
    m.dy = to_device(ctx_, m.d.dy);
    m.splits = Splits::host(m.d.c.counts);
    m.S = sum(m.d.c.counts);
    return m;
  }
  Tensor sentinel(const Shape& shape, DType dt) const { return filled(ctx_, shape, dt, kSentinel); }
  std::optional<Error> forward_error(const Sequential& seq, const Mlp& m,
                                     const OpArgs& args) const {
    return caught([&] { seq.forward(m.x, m.inputs(), args); });
  }

  Context ctx_ = Context::cpu();
};

// ============================================================== the fuser
TEST_P(SequentialTest, FusesTheGroupedMlpPatternAndCanBeTurnedOff) {
  const Mlp m = mlp();
  Sequential seq({m.ops.fc1, m.ops.act, m.ops.fc2});
  EXPECT_TRUE(seq.fused());
  EXPECT_EQ(seq.plan(), "GroupedMLP(0-2)");
  seq.set_fusion(false);
  EXPECT_FALSE(seq.fused());
  EXPECT_EQ(seq.plan(), "GroupedLinear(0), ScaledSwiGLU(1), GroupedLinear(2)");
  const Sequential off({m.ops.fc1, m.ops.act, m.ops.fc2}, {.fuse = false});
  EXPECT_FALSE(off.fused());
  // The pattern anywhere in a longer chain.
  auto bias =
      std::make_shared<Bias>(BiasConfig{.groups = 3, .features = 16, .dtype = DType::BF16}, ctx_);
  const Sequential longer({bias, m.ops.fc1, m.ops.act, m.ops.fc2});
  EXPECT_EQ(longer.plan(), "Bias(0), GroupedMLP(1-3)");
}

TEST_P(SequentialTest, NonMatchingPatternsRunUnfused) {
  const Mlp m = mlp();
  const DType bf = DType::BF16;
  auto linear = [&](int64_t groups, int64_t in, int64_t out, DType dt, bool bias, bool scale) {
    return std::make_shared<GroupedLinearOp>(
        GroupedLinearConfig{.groups = groups, .in = in, .out = out, .dtype = dt, .bias = bias},
        ctx_, GroupedLinearOpOptions{.scale_bias = scale});
  };
  struct Case {
    std::string why;
    std::vector<OpHandle> ops;
    std::string reason;  // GroupedMLP::mismatch's reason
  };
  const std::vector<Case> cases = {
      {"fc2 with a plain (unscaled) bias",
       {m.ops.fc1, m.ops.act, linear(3, 32, 16, bf, true, false)},
       "plain bias"},
      {"fc1 with a prob-scaled bias",
       {linear(3, 16, 64, bf, true, true), m.ops.act, m.ops.fc2},
       "prob-scaled bias"},
      {"different group counts",
       {m.ops.fc1, m.ops.act, linear(4, 32, 16, bf, false, false)},
       "groups"},
      {"fc1 out != 2 x fc2 in",
       {m.ops.fc1, m.ops.act, linear(3, 16, 16, bf, false, false)},
       "not 2 ×"},
      {"different dtypes",
       {m.ops.fc1, m.ops.act, linear(3, 32, 16, DType::F16, false, false)},
       "fc2 f16"},
      {"plain SwiGLU",
       {m.ops.fc1, std::make_shared<SwiGLU>(SwiGLUConfig{}, ctx_), m.ops.fc2},
       "not a ScaledSwiGLU"},
      {"interleaved with 2F % 64 != 0",
       {linear(3, 16, 96, bf, false, false),
        std::make_shared<ScaledSwiGLU>(SwiGLUConfig{.layout = GluLayout::Interleaved32}, ctx_),
        linear(3, 48, 16, bf, false, false)},
       "multiple of 64"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.why);
    const Sequential seq(c.ops);
    EXPECT_FALSE(seq.fused());
    EXPECT_THAT(GroupedMLP::mismatch(*c.ops[0], *c.ops[1], *c.ops[2]), HasSubstr(c.reason));
  }
  // An unfused chain still runs.
  const Sequential plain({m.ops.fc1, std::make_shared<SwiGLU>(SwiGLUConfig{}, ctx_), m.ops.fc2});
  auto [y, tape] = plain.forward(m.x, m.inputs());  // fc2's prob-scaled bias takes the probs
  EXPECT_EQ(y.shape(), (Shape{m.d.c.T, 16}));
  // A non-fusible chain whose shapes do not fit fails up front naming the op and the rule.
  const Sequential bad(
      {linear(3, 16, 96, bf, false, false),
       std::make_shared<ScaledSwiGLU>(SwiGLUConfig{.layout = GluLayout::Interleaved32}, ctx_),
       linear(3, 48, 16, bf, false, false)});
  auto e = caught([&] { bad.forward(m.x, m.inputs()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("in op 1 (ScaledSwiGLU)"));
  EXPECT_THAT(e->what(), HasSubstr("multiple of 64 for the interleaved GLU layout"));
}

// ============================================================== routing
TEST_P(SequentialTest, RoutesBuffersByHandleAndByPositionUnfused) {
  const Mlp m = mlp();
  const MlpCase& c = m.d.c;
  const DType dt = c.dtype;
  Sequential seq({m.ops.fc1, m.ops.act, m.ops.fc2}, {.fuse = false});
  const Tensor hbuf = sentinel({c.T, 2 * c.F}, dt), ybuf = sentinel({c.T, c.N}, dt);
  const Tensor dxbuf = sentinel({c.T, c.H}, dt), dzbuf = sentinel({c.T, c.F}, dt);
  OpArgs args;
  args[m.ops.fc1].output = hbuf;       // handle
  args[2].output = ybuf;               // position
  args[0].grad_input = dxbuf;          // position
  args[m.ops.fc2].grad_input = dzbuf;  // handle
  auto [y, tape] = seq.forward(m.x, m.inputs(), args);
  EXPECT_EQ(y.data(), ybuf.data());
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, ybuf), m.S, c.T, c.N, dt));
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, hbuf), m.S, c.T, 2 * c.F, dt));
  // hbuf holds fc1's output: the layer alone gives the same bits.
  const Tensor h = m.ops.fc1->linear().forward(m.x, m.splits);
  EXPECT_TRUE(bit_identical(bytes_of(ctx_, hbuf.rows(0, m.S)), bytes_of(ctx_, h.rows(0, m.S)), dt));
  // Bound at forward, written in backward: untouched until then.
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, dxbuf), 0, c.T, c.H, dt));
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, dzbuf), 0, c.T, c.F, dt));
  const SequentialGrads g = seq.backward(tape, m.dy);
  EXPECT_EQ(g.input.data(), dxbuf.data());
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, dxbuf), m.S, c.T, c.H, dt));
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, dzbuf), m.S, c.T, c.F, dt));
  EXPECT_FALSE(rows_hold_sentinel(bytes_of(ctx_, dzbuf), 0, 1, c.F, dt)) << "dz was not written";
  // The same call without buffers gives the same bits.
  auto [y2, tape2] = seq.forward(m.x, m.inputs());
  const SequentialGrads g2 = seq.backward(tape2, m.dy);
  EXPECT_TRUE(bit_identical(bytes_of(ctx_, y.rows(0, m.S)), bytes_of(ctx_, y2.rows(0, m.S)), dt));
  EXPECT_TRUE(bit_identical(bytes_of(ctx_, g.input.rows(0, m.S)),
                            bytes_of(ctx_, g2.input.rows(0, m.S)), dt));
}

TEST_P(SequentialTest, RoutesBuffersIntoTheFusedMlpByHandleAndByPosition) {
  for (int keyed_by_handle = 0; keyed_by_handle < 2; ++keyed_by_handle) {
    SCOPED_TRACE(keyed_by_handle ? "by handle" : "by position");
    const Mlp m = mlp();
    const MlpCase& c = m.d.c;
    const DType dt = c.dtype;
    const Sequential seq({m.ops.fc1, m.ops.act, m.ops.fc2});
    ASSERT_TRUE(seq.fused());
    const Tensor ybuf = sentinel({c.T, c.N}, dt), dxbuf = sentinel({c.T, c.H}, dt);
    OpArgs args;
    if (keyed_by_handle) {
      args[m.ops.fc2].output = ybuf;
      args[m.ops.fc1].grad_input = dxbuf;
    } else {
      args[2].output = ybuf;
      args[0].grad_input = dxbuf;
    }
    auto [y, tape] = seq.forward(m.x, m.inputs(), args);
    EXPECT_EQ(y.data(), ybuf.data());
    EXPECT_EQ(y.shape(), ybuf.shape());
    EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, ybuf), m.S, c.T, c.N, dt));
    EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, dxbuf), 0, c.T, c.H, dt))
        << "written before backward";
    const SequentialGrads g = seq.backward(tape, m.dy);
    EXPECT_EQ(g.input.data(), dxbuf.data());
    EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, dxbuf), m.S, c.T, c.H, dt));
    // Bit-identical to internal allocation.
    auto [y2, tape2] = seq.forward(m.x, m.inputs());
    const SequentialGrads g2 = seq.backward(tape2, m.dy);
    EXPECT_TRUE(bit_identical(bytes_of(ctx_, y.rows(0, m.S)), bytes_of(ctx_, y2.rows(0, m.S)), dt));
    EXPECT_TRUE(bit_identical(bytes_of(ctx_, g.input.rows(0, m.S)),
                              bytes_of(ctx_, g2.input.rows(0, m.S)), dt));
  }
}

// SPEC §4: backward follows the plan recorded at forward even if fusion is toggled in between —
// the same bits as without the toggle (dx into the caller buffer bound at forward, dprobs, every
// parameter gradient; rows [0, S) of the internally allocated dprobs), in both directions.
TEST_P(SequentialTest, BackwardFollowsThePlanRecordedAtForwardWhenFusionIsToggled) {
  for (int fused_at_forward = 0; fused_at_forward < 2; ++fused_at_forward) {
    SCOPED_TRACE(fused_at_forward ? "fused at forward, unfused at backward"
                                  : "unfused at forward, fused at backward");
    const Mlp m = mlp();
    const MlpCase& c = m.d.c;
    const DType dt = c.dtype;
    Sequential seq({m.ops.fc1, m.ops.act, m.ops.fc2}, {.fuse = fused_at_forward != 0});
    auto [y0, tape0] = seq.forward(m.x, m.inputs());
    const SequentialGrads want = seq.backward(tape0, m.dy);

    const Tensor dxbuf = sentinel({c.T, c.H}, dt);
    OpArgs args;
    args[0].grad_input = dxbuf;
    auto [y, tape] = seq.forward(m.x, m.inputs(), args);
    seq.set_fusion(fused_at_forward == 0);
    ASSERT_EQ(seq.fused(), fused_at_forward == 0);
    const SequentialGrads got = seq.backward(tape, m.dy);

    EXPECT_EQ(got.input.data(), dxbuf.data());
    EXPECT_TRUE(bit_identical(bytes_of(ctx_, got.input.rows(0, m.S)),
                              bytes_of(ctx_, want.input.rows(0, m.S)), dt));
    EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, dxbuf), m.S, c.T, c.H, dt));
    EXPECT_TRUE(bit_identical(bytes_of(ctx_, got.probs.rows(0, m.S)),  // [S, T): uninitialised
                              bytes_of(ctx_, want.probs.rows(0, m.S)), DType::F32));
    ASSERT_EQ(got.params.size(), want.params.size());
    for (size_t i = 0; i < got.params.size(); ++i) {
      SCOPED_TRACE("op " + std::to_string(i));
      for (const auto& [g, w] : {std::pair{got.params[i].weight, want.params[i].weight},
                                 std::pair{got.params[i].bias, want.params[i].bias}}) {
        ASSERT_EQ(g.defined(), w.defined());
        if (g.defined()) {
          EXPECT_TRUE(bit_identical(bytes_of(ctx_, g), bytes_of(ctx_, w), g.dtype()));
        }
      }
    }
  }
}

// ExtraInputs::input_requires_grad / probs_requires_grad false: backward returns no dx / no
// dprobs, and every other gradient keeps its bits (fused and unfused).
TEST_P(SequentialTest, InputOrProbsNotRequiringGradChangeNothingElse) {
  for (bool fuse : {false, true}) {
    SCOPED_TRACE(fuse ? "fused" : "unfused");
    const Mlp m = mlp();
    const DType dt = m.d.c.dtype;
    const Sequential seq({m.ops.fc1, m.ops.act, m.ops.fc2}, {.fuse = fuse});
    auto [y0, tape0] = seq.forward(m.x, m.inputs());
    const SequentialGrads all = seq.backward(tape0, m.dy);
    for (int which = 0; which < 2; ++which) {
      SCOPED_TRACE(which == 0 ? "input needs no grad" : "probs need no grad");
      ExtraInputs in = m.inputs();
      (which == 0 ? in.input_requires_grad : in.probs_requires_grad) = false;
      auto [y, tape] = seq.forward(m.x, in);
      const SequentialGrads g = seq.backward(tape, m.dy);
      EXPECT_EQ(g.input.defined(), which != 0);
      EXPECT_EQ(g.probs.defined(), which == 0);
      if (g.input.defined()) {
        EXPECT_TRUE(bit_identical(bytes_of(ctx_, g.input.rows(0, m.S)),
                                  bytes_of(ctx_, all.input.rows(0, m.S)), dt));
      }
      if (g.probs.defined()) {
        EXPECT_TRUE(bit_identical(bytes_of(ctx_, g.probs.rows(0, m.S)),
                                  bytes_of(ctx_, all.probs.rows(0, m.S)), DType::F32));
      }
      for (size_t i = 0; i < g.params.size(); ++i) {
        for (const auto& [got, want] : {std::pair{g.params[i].weight, all.params[i].weight},
                                        std::pair{g.params[i].bias, all.params[i].bias}}) {
          ASSERT_EQ(got.defined(), want.defined()) << "op " << i;
          if (got.defined()) {
            EXPECT_TRUE(bit_identical(bytes_of(ctx_, got), bytes_of(ctx_, want), got.dtype()))
                << "op " << i;
          }
        }
      }
    }
  }
}

TEST_P(SequentialTest, InferenceKeepsNoTapeAndTakesNoGradInput) {
  const Mlp m = mlp();
  const Sequential seq({m.ops.fc1, m.ops.act, m.ops.fc2});
  ExtraInputs in = m.inputs();
  in.save_for_backward = false;
  auto [y, tape] = seq.forward(m.x, in);
  EXPECT_TRUE(tape.empty());
  auto [y2, tape2] = seq.forward(m.x, m.inputs());
  EXPECT_FALSE(tape2.empty());
  EXPECT_TRUE(
      bit_identical(bytes_of(ctx_, y.rows(0, m.S)), bytes_of(ctx_, y2.rows(0, m.S)), m.d.c.dtype));
  auto e = caught([&] { seq.backward(tape, m.dy); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'tape'"));
  OpArgs args;
  args[0].grad_input = sentinel({m.d.c.T, m.d.c.H}, m.d.c.dtype);
  e = caught([&] { seq.forward(m.x, in, args); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("op_args[0].grad_input"));
  EXPECT_THAT(e->what(), HasSubstr("save_for_backward is false"));
}

// ============================================================== errors
TEST_P(SequentialTest, KeyNotInThisSequentialIsAnError) {
  const Mlp m = mlp();
  const Sequential seq({m.ops.fc1, m.ops.act, m.ops.fc2});
  auto stranger = std::make_shared<GroupedLinearOp>(
      GroupedLinearConfig{.groups = 3, .in = 32, .out = 16, .dtype = DType::BF16}, ctx_);
  OpArgs args;
  args[stranger].output = sentinel({m.d.c.T, 16}, DType::BF16);
  auto e = forward_error(seq, m, args);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
  EXPECT_THAT(e->what(), HasSubstr("op_args[GroupedLinear handle]"));
  EXPECT_THAT(e->what(), HasSubstr("not in this Sequential"));
  EXPECT_THAT(e->what(), HasSubstr("0 GroupedLinear, 1 ScaledSwiGLU, 2 GroupedLinear"));
}

TEST_P(SequentialTest, PositionOutOfRangeIsAnError) {
  const Mlp m = mlp();
  const Sequential seq({m.ops.fc1, m.ops.act, m.ops.fc2});
  for (int64_t pos : {3, -1}) {
    OpArgs args;
    args[pos].output = sentinel({m.d.c.T, 16}, DType::BF16);
    auto e = forward_error(seq, m, args);
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), HasSubstr(str("op_args[", pos, "]")));
    EXPECT_THAT(e->what(), HasSubstr("an op position in [0, 3)"));
  }
}

TEST_P(SequentialTest, ArgumentTheOpDoesNotAcceptIsAnError) {
  const Mlp m = mlp();
  const MlpCase& c = m.d.c;
  const Sequential seq({m.ops.fc1, m.ops.act, m.ops.fc2}, {.fuse = false});
  {
    OpArgs args;
    args[1].output = sentinel({c.T, c.F}, DType::BF16);
    auto e = forward_error(seq, m, args);
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), HasSubstr("op_args[1].output"));
    EXPECT_THAT(e->what(), HasSubstr("op 1 (ScaledSwiGLU), which does not accept 'output'"));
  }
  {
    OpArgs args;
    args[m.ops.act].grad_input = sentinel({c.T, 2 * c.F}, DType::BF16);
    auto e = forward_error(seq, m, args);
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), HasSubstr("op_args[ScaledSwiGLU handle].grad_input"));
    EXPECT_THAT(e->what(), HasSubstr("does not accept 'grad_input'"));
  }
  {  // Bias accepts no buffers either.
    auto bias =
        std::make_shared<Bias>(BiasConfig{.groups = 3, .features = 16, .dtype = DType::BF16}, ctx_);
    const Sequential with_bias({m.ops.fc1, m.ops.act, m.ops.fc2, bias});
    OpArgs args;
    args[bias].output = sentinel({c.T, 16}, DType::BF16);
    auto e = forward_error(with_bias, m, args);
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), HasSubstr("op_args[Bias handle].output"));
    EXPECT_THAT(e->what(), HasSubstr("op 3 (Bias), which does not accept 'output'"));
  }
}

TEST_P(SequentialTest, FusedMlpAcceptsOutputOnlyOnFc2AndGradInputOnlyOnFc1) {
  const Mlp m = mlp();
  const MlpCase& c = m.d.c;
  const Sequential seq({m.ops.fc1, m.ops.act, m.ops.fc2});
  ASSERT_TRUE(seq.fused());
  {
    OpArgs args;
    args[m.ops.fc1].output = sentinel({c.T, 2 * c.F}, DType::BF16);
    auto e = forward_error(seq, m, args);
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), HasSubstr("op_args[GroupedLinear handle].output"));
    EXPECT_THAT(e->what(), HasSubstr("'output' only on fc2 (the last op) of a fused grouped MLP"));
    EXPECT_THAT(e->what(), HasSubstr("'output' on fc1, op 0 (GroupedLinear)"));
    EXPECT_THAT(e->what(), HasSubstr("turn fusion off"));
  }
  {
    OpArgs args;
    args[2].grad_input = sentinel({c.T, c.F}, DType::BF16);
    auto e = forward_error(seq, m, args);
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), HasSubstr("op_args[2].grad_input"));
    EXPECT_THAT(e->what(),
                HasSubstr("'grad_input' only on fc1 (the first op) of a fused grouped MLP"));
    EXPECT_THAT(e->what(), HasSubstr("on fc2, op 2 (GroupedLinear)"));
  }
  {
    OpArgs args;
    args[1].output = sentinel({c.T, c.F}, DType::BF16);
    auto e = forward_error(seq, m, args);
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), HasSubstr("op_args[1].output"));
    EXPECT_THAT(e->what(), HasSubstr("on the activation, op 1 (ScaledSwiGLU)"));
  }
}

TEST_P(SequentialTest, ArgumentGivenTwiceIsAnError) {
  const Mlp m = mlp();
  const Sequential seq({m.ops.fc1, m.ops.act, m.ops.fc2});
  OpArgs args;
  args[m.ops.fc2].output = sentinel({m.d.c.T, 16}, DType::BF16);
  args[2].output = sentinel({m.d.c.T, 16}, DType::BF16);
  auto e = forward_error(seq, m, args);
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("op_args[2].output"));
  EXPECT_THAT(e->what(), HasSubstr("given again (first as op_args[GroupedLinear handle].output)"));
}

TEST_P(SequentialTest, BufferChecksNameTheOpArgumentAndAFailedCallWritesNothing) {
  const Mlp m = mlp();
  const MlpCase& c = m.d.c;
  const Sequential seq({m.ops.fc1, m.ops.act, m.ops.fc2}, {.fuse = false});
  const Tensor hbuf = sentinel({c.T, 2 * c.F}, DType::BF16);
  {  // shape: the op's output with the tail
    OpArgs args;
    args[0].output = hbuf;
    args[2].output = sentinel({c.T - 1, c.N}, DType::BF16);
    auto e = forward_error(seq, m, args);
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), HasSubstr("op_args[2].output of op 2 (GroupedLinear)"));
    EXPECT_THAT(e->what(), HasSubstr(str("expected shape [", c.T, ", ", c.N, "]")));
  }
  {  // dtype
    OpArgs args;
    args[0].output = hbuf;
    args[m.ops.fc1].grad_input = sentinel({c.T, c.H}, DType::F32);
    auto e = forward_error(seq, m, args);
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(),
                HasSubstr("op_args[GroupedLinear handle].grad_input of op 0 (GroupedLinear)"));
    EXPECT_THAT(e->what(), HasSubstr("expected dtype bf16"));
  }
  {  // two buffers of one call overlapping
    const Tensor big = sentinel({c.T, 2 * c.F}, DType::BF16);
    OpArgs args;
    args[0].output = big;
    args[2].grad_input = Tensor::wrap(big.data(), {c.T, c.F}, DType::BF16, ctx_.device());
    auto e = forward_error(seq, m, args);
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), HasSubstr("op_args[2].grad_input of op 2 (GroupedLinear)"));
    EXPECT_THAT(e->what(), HasSubstr("overlapping 'op_args[0].output' of op 0 (GroupedLinear)"));
  }
  {  // a buffer overlapping a parameter
    OpArgs args;
    const Tensor w = m.ops.fc2->linear().weight();
    args[0].output = hbuf;
    args[2].output = Tensor::wrap(w.data(), {c.T, c.N}, DType::BF16, ctx_.device());
    auto e = forward_error(seq, m, args);
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), HasSubstr("op_args[2].output of op 2 (GroupedLinear)"));
    EXPECT_THAT(e->what(), HasSubstr("overlapping input 'op 2 (GroupedLinear) weight'"));
  }
  // None of the failed calls wrote the valid buffer of op 0.
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, hbuf), 0, c.T, 2 * c.F, DType::BF16));
}

// SPEC §4: no caller buffer may overlap the call's input, probs, splits (device counts) or an op's
// main_grad. Each error names the key and its op (a handle key names no position) and what it
// overlaps; a failed call writes nothing: not the valid buffer of op 0, not the arena holding the
// overlapped input and the buffer (Overlapping: the buffer overlaps the input's last element).
TEST_P(SequentialTest, BuffersOverlappingTheCallsInputsAreErrorsThatWriteNothing) {
  const Mlp m = mlp();
  const MlpCase& c = m.d.c;
  const Sequential seq({m.ops.fc1, m.ops.act, m.ops.fc2}, {.fuse = false});
  const Tensor counts_h = counts_tensor(c.counts, DType::I64);
  const Tensor main_grad_h = random_normal({c.G, 2 * c.F, c.H}, DType::F32, 5);
  const Tensor hbuf = sentinel({c.T, 2 * c.F}, DType::BF16);
  const char* const inputs[] = {"input", "probs", "splits", "op 0 (GroupedLinear) main_grad"};
  const Tensor hosts[] = {m.d.x, m.d.probs, counts_h, main_grad_h};
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(inputs[i]);
    const Overlapping o(ctx_, hosts[i], {c.T, c.N}, DType::BF16, /*overlap_elems=*/1);
    const Tensor x = i == 0 ? o.data : m.x;
    const Tensor counts = i == 2 ? o.data : to_device(ctx_, counts_h);
    const ExtraInputs in{.splits = Splits::device(counts), .probs = i == 1 ? o.data : m.probs};
    m.ops.fc1->linear().set_main_grad(i == 3 ? o.data : to_device(ctx_, main_grad_h));
    OpArgs args;
    args[0].output = hbuf;
    args[m.ops.fc2].output = o.buffer;
    auto e = caught([&] { seq.forward(x, in, args); });
    ASSERT_TRUE(e);
    EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
    EXPECT_THAT(e->what(), HasSubstr("op_args[GroupedLinear handle].output of op 2 (GroupedLinear)"));
    EXPECT_THAT(e->what(), HasSubstr(str("overlapping input '", inputs[i], "'")));
    EXPECT_TRUE(o.unchanged(ctx_));
  }
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, hbuf), 0, c.T, 2 * c.F, DType::BF16));
  m.ops.fc1->linear().set_main_grad(Tensor());
}

TEST_P(SequentialTest, ExtraInputsAndChainShapesAreCheckedUpFront) {
  const Mlp m = mlp();
  const MlpCase& c = m.d.c;
  const Sequential seq({m.ops.fc1, m.ops.act, m.ops.fc2}, {.fuse = false});
  auto e = caught([&] { seq.forward(m.x, {.splits = m.splits}); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'probs'"));
  EXPECT_THAT(e->what(), HasSubstr("op 1 (ScaledSwiGLU) takes them"));

  const Sequential linear_only({m.ops.fc1});
  e = caught([&] { linear_only.forward(m.x, m.inputs()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("no op of this Sequential takes routing probs"));

  const Tensor narrow = to_device(ctx_, random_normal({c.T, c.H + 1}, DType::BF16, 3));
  e = caught([&] { seq.forward(narrow, m.inputs()); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("in op 0 (GroupedLinear)"));
  EXPECT_THAT(e->what(), HasSubstr(str("'input': expected shape [*, ", c.H, "]")));

  e = caught([&] { seq.forward(m.x, {.splits = Splits::host({1, 2}), .probs = m.probs}); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("in op 0 (GroupedLinear)"));
  EXPECT_THAT(e->what(), HasSubstr("'splits'"));

  OpArgs args;
  args[0].grad_input = sentinel({c.T, c.H}, DType::BF16);
  ExtraInputs no_dx = m.inputs();
  no_dx.input_requires_grad = false;
  e = caught([&] { seq.forward(m.x, no_dx, args); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("op_args[0].grad_input"));
  EXPECT_THAT(e->what(), HasSubstr("the input does not require grad"));
}

// SPEC §4: the whole call is validated before any op runs — an error found at a later op (its
// probs, its dtype in the chain, its splits) leaves a valid caller buffer of op 0 unwritten.
TEST_P(SequentialTest, AnErrorAtALaterOpLeavesTheFirstOpsBufferUnwritten) {
  const Mlp m = mlp();
  const MlpCase& c = m.d.c;
  auto fc2_like = [&](int64_t groups, DType dt) {
    return std::make_shared<GroupedLinearOp>(
        GroupedLinearConfig{.groups = groups, .in = c.F, .out = c.N, .dtype = dt}, ctx_);
  };
  struct Case {
    const char* what;
    std::vector<OpHandle> ops;
    Tensor probs;
    const char* message;
  };
  const Case cases[] = {
      {"probs of the wrong dtype (op 1 takes them)", {m.ops.fc1, m.ops.act, m.ops.fc2},
       to_device(ctx_, random_normal({c.T}, DType::BF16, 3)), "'probs'"},
      {"op 2 of another dtype", {m.ops.fc1, m.ops.act, fc2_like(c.G, DType::F16)}, m.probs,
       "op 2 (GroupedLinear)"},
      {"splits of 3 groups for op 2 of 4", {m.ops.fc1, m.ops.act, fc2_like(c.G + 1, DType::BF16)},
       m.probs, "in op 2 (GroupedLinear)"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    const Sequential seq(k.ops, {.fuse = false});
    const Tensor hbuf = sentinel({c.T, 2 * c.F}, DType::BF16);
    OpArgs args;
    args[0].output = hbuf;
    auto e = caught([&] { seq.forward(m.x, {.splits = m.splits, .probs = k.probs}, args); });
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), HasSubstr(k.message));
    EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, hbuf), 0, c.T, 2 * c.F, DType::BF16));
  }
}

// A grad_input buffer bound at forward is written during backward: it may not overlap that call's
// dy (unfused, op 0 checks it against its own grad_output only). The error names the key and the
// op; nothing is written — the buffer and dy share one arena that keeps its bytes.
TEST_P(SequentialTest, GradInputOverlappingTheBackwardsDyIsAnError) {
  const Mlp m = mlp();
  const MlpCase& c = m.d.c;
  for (bool fuse : {false, true}) {
    SCOPED_TRACE(fuse ? "fused" : "unfused");
    const Sequential seq({m.ops.fc1, m.ops.act, m.ops.fc2}, {.fuse = fuse});
    Overlapping o(ctx_, m.d.dy, {c.T, c.H}, DType::BF16, /*overlap_elems=*/1);
    OpArgs args;
    args[0].grad_input = o.buffer;
    auto [y, tape] = seq.forward(m.x, m.inputs(), args);
    o.snapshot(ctx_);
    auto e = caught([&] { seq.backward(tape, o.data); });
    ASSERT_TRUE(e);
    EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
    EXPECT_THAT(e->what(), HasSubstr("op_args[0].grad_input of op 0 (GroupedLinear)"));
    EXPECT_THAT(e->what(), HasSubstr("overlapping input 'grad_output'"));
    EXPECT_TRUE(o.unchanged(ctx_));
  }
}

TEST_P(SequentialTest, TapeMustComeFromThisSequential) {
  const Mlp m = mlp();
  const Sequential a({m.ops.fc1, m.ops.act, m.ops.fc2});
  const Sequential b({m.ops.fc1, m.ops.act});
  auto [y, tape] = a.forward(m.x, m.inputs());
  auto e = caught([&] { b.backward(tape, m.dy); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'tape'"));
  EXPECT_THAT(e->what(), HasSubstr("recorded by this Sequential"));
  e = caught([&] { a.backward(Tape{}, m.dy); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("an empty tape"));
}

TEST_P(SequentialTest, ConstructionRejectsNullDuplicateAndEmpty) {
  const Mlp m = mlp();
  auto e = caught([&] { Sequential({}); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("at least one op"));
  e = caught([&] { Sequential({m.ops.fc1, nullptr}); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'ops[1]'"));
  e = caught([&] { Sequential({m.ops.fc1, m.ops.act, m.ops.fc1}); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("the GroupedLinear of position 0 again"));
  e = caught([&] {
    GroupedLinearOp({.groups = 2, .in = 4, .out = 4, .dtype = DType::F32, .bias = false}, ctx_,
                    {.scale_bias = true});
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'scale_bias'"));
}

// ============================================================== chains of basic ops
// x → GroupedLinear(b1) → Bias(prob-scaled) → SwiGLU → GroupedLinear(b2, plain): y against fp64
// end to end and every gradient against finite differences (f32).
// The Bias op alone (SPEC §4), plain and prob-scaled, bf16 and f32, with a zero-row group and a
// tail: y = x + s_t·b_g against fp64 (one rounding), dx is dy itself (no copy), db_g = Σ s_t·dy_t
// with the empty group's db exactly 0, and dp_t = Σ_n dy[t, n]·b[g(t), n] when scaled.
TEST_P(SequentialTest, BiasOpAloneMatchesFp64WithAnEmptyGroup) {
  const int64_t G = 3, N = 12, T = 11;
  const std::vector<int64_t> counts = {4, 0, 5};  // + 2 tail rows
  const int64_t S = sum(counts);
  for (DType dt : {DType::F32, DType::BF16}) {
    for (bool scaled : {false, true}) {
      SCOPED_TRACE(str(name(dt), scaled ? ", scaled" : ", plain"));
      auto bias = std::make_shared<Bias>(
          BiasConfig{.groups = G, .features = N, .dtype = dt, .scale_bias = scaled}, ctx_);
      const Tensor b_h = random_normal({G, N}, dt, 51), x_h = random_normal({T, N}, dt, 52);
      const Tensor dy_h = random_normal({T, N}, dt, 53);
      const Tensor p_h = make_mlp_data({.T = T}).probs;
      copy(ctx_, b_h, bias->bias());
      const Sequential seq({bias});
      const Tensor dy = to_device(ctx_, dy_h);
      ExtraInputs in{.splits = Splits::host(counts)};
      if (scaled) in.probs = to_device(ctx_, p_h);
      auto [y, tape] = seq.forward(to_device(ctx_, x_h), in);
      const SequentialGrads g = seq.backward(tape, dy);

      const auto b = to_doubles(host(), b_h), x = to_doubles(host(), x_h);
      const auto dyd = to_doubles(host(), dy_h), p = to_doubles(host(), p_h);
      const auto yv = to_doubles(ctx_, y);
      const double tol = dt == DType::BF16 ? 1.0 / 128 : 1e-6;  // one rounding of the sum
      std::vector<double> db(G * N, 0.0), dp(S, 0.0);
      for (int64_t t = 0, gi = 0, end = counts[0]; t < S; ++t) {
        while (t >= end) end += counts[static_cast<size_t>(++gi)];
        const double s = scaled ? p[t] : 1.0;
        for (int64_t n = 0; n < N; ++n) {
          const double want = x[t * N + n] + s * b[gi * N + n];
          ASSERT_NEAR(yv[t * N + n], want, tol * (1 + std::abs(want))) << "y " << t << ", " << n;
          db[gi * N + n] += s * dyd[t * N + n];
          dp[t] += dyd[t * N + n] * b[gi * N + n];
        }
      }
      EXPECT_EQ(g.input.data(), dy.data()) << "dx is dy itself";
      const auto dbv = to_doubles(ctx_, g.params[0].bias);
      for (int64_t i = 0; i < G * N; ++i) {
        if (i / N == 1) {
          ASSERT_EQ(dbv[i], 0.0) << "db of the empty group, column " << i % N;
        } else {
          ASSERT_NEAR(dbv[i], db[i], tol * (1 + std::abs(db[i])) * 4) << "db " << i;
        }
      }
      ASSERT_EQ(g.probs.defined(), scaled);
      if (scaled) {
        const auto dpv = to_doubles(ctx_, g.probs);
        for (int64_t t = 0; t < S; ++t) ASSERT_NEAR(dpv[t], dp[t], 1e-4 * (1 + std::abs(dp[t]))) << t;
      }
    }
  }
}

TEST_P(SequentialTest, ChainOfBasicOpsMatchesFp64AndFiniteDifferences) {
  const int64_t G = 2, H = 8, F = 8, N = 6, T = 11;
  const std::vector<int64_t> counts = {4, 5};  // + 2 tail rows
  const int64_t S = sum(counts);
  const DType f32 = DType::F32;
  auto fc1 = std::make_shared<GroupedLinearOp>(
      GroupedLinearConfig{.groups = G, .in = H, .out = 2 * F, .dtype = f32, .bias = true}, ctx_);
  auto bias = std::make_shared<Bias>(
      BiasConfig{.groups = G, .features = 2 * F, .dtype = f32, .scale_bias = true}, ctx_);
  auto act = std::make_shared<SwiGLU>(SwiGLUConfig{}, ctx_);
  auto fc2 = std::make_shared<GroupedLinearOp>(
      GroupedLinearConfig{.groups = G, .in = F, .out = N, .dtype = f32, .bias = true}, ctx_);
  const Tensor w1_h = random_normal({G, 2 * F, H}, f32, 1, 0.35),
               b1_h = random_normal({G, 2 * F}, f32, 2, 0.5);
  const Tensor bb_h = random_normal({G, 2 * F}, f32, 3, 0.5),
               w2_h = random_normal({G, N, F}, f32, 4, 0.35);
  const Tensor b2_h = random_normal({G, N}, f32, 5, 0.5), x_h = random_normal({T, H}, f32, 6);
  const Tensor dy_h = random_normal({T, N}, f32, 7);
  const Tensor p_h = make_mlp_data({.T = T}).probs;
  copy(ctx_, w1_h, fc1->linear().weight());
  copy(ctx_, b1_h, fc1->bias());
  copy(ctx_, bb_h, bias->bias());
  copy(ctx_, w2_h, fc2->linear().weight());
  copy(ctx_, b2_h, fc2->bias());
  Tensor x = to_device(ctx_, x_h), probs = to_device(ctx_, p_h);
  const Splits splits = Splits::host(counts);
  const Sequential seq({fc1, bias, act, fc2});
  EXPECT_FALSE(seq.fused());

  // fp64 forward.
  const auto w1 = to_doubles(host(), w1_h), b1 = to_doubles(host(), b1_h),
             bb = to_doubles(host(), bb_h);
  const auto w2 = to_doubles(host(), w2_h), b2 = to_doubles(host(), b2_h),
             xd = to_doubles(host(), x_h);
  const auto pd = to_doubles(host(), p_h), dy = to_doubles(host(), dy_h);
  std::vector<double> y_ref;
  for (int64_t t = 0; t < S; ++t) {
    const int64_t g = t < counts[0] ? 0 : 1;
    std::vector<double> h(2 * F);
    for (int64_t c = 0; c < 2 * F; ++c) {
      double v = b1[g * 2 * F + c] + pd[t] * bb[g * 2 * F + c];
      for (int64_t k = 0; k < H; ++k) v += xd[t * H + k] * w1[(g * 2 * F + c) * H + k];
      h[c] = v;
    }
    for (int64_t n = 0; n < N; ++n) {
      double v = b2[g * N + n];
      for (int64_t j = 0; j < F; ++j) v += silu(h[j]) * h[F + j] * w2[(g * N + n) * F + j];
      y_ref.push_back(v);
    }
  }
  auto [y, tape] = seq.forward(x, {.splits = splits, .probs = probs});
  const std::vector<double> yv = to_doubles(ctx_, y);
  for (size_t i = 0; i < y_ref.size(); ++i)
    ASSERT_NEAR(yv[i], y_ref[i], 1e-4 * (1 + std::abs(y_ref[i]))) << i;

  const SequentialGrads g = seq.backward(tape, to_device(ctx_, dy_h));
  EXPECT_FALSE(g.params[2].weight.defined());  // SwiGLU has no parameters
  auto valid_rows_only = [&](const Tensor& t, int64_t cols) {
    std::vector<double> v = to_doubles(ctx_, t);
    std::fill(v.begin() + S * cols, v.end(), 0.0);
    return v;
  };
  std::vector<FdSlot> slots = {
      {"x", x, to_host(ctx_, x), valid_rows_only(g.input, H)},
      {"probs", probs, to_host(ctx_, probs), valid_rows_only(g.probs, 1)},
      {"W1", fc1->linear().weight(), to_host(ctx_, fc1->linear().weight()),
       to_doubles(ctx_, g.params[0].weight)},
      {"b1", fc1->bias(), to_host(ctx_, fc1->bias()), to_doubles(ctx_, g.params[0].bias)},
      {"Bias", bias->bias(), to_host(ctx_, bias->bias()), to_doubles(ctx_, g.params[1].bias)},
      {"W2", fc2->linear().weight(), to_host(ctx_, fc2->linear().weight()),
       to_doubles(ctx_, g.params[3].weight)},
      {"b2", fc2->bias(), to_host(ctx_, fc2->bias()), to_doubles(ctx_, g.params[3].bias)},
  };
  ExtraInputs inference{.splits = splits, .probs = probs};
  inference.save_for_backward = false;
  EXPECT_TRUE(matches_finite_differences(ctx_, slots, [&] {
    inference.probs = probs;
    const std::vector<double> v = to_doubles(ctx_, seq.forward(x, inference).output);
    double l = 0.0;
    for (int64_t i = 0; i < S * N; ++i) l += v[i] * dy[i];
    return l;
  }));
}

// fc1 → ScaledSwiGLU → fc2 (prob-scaled bias) → Bias (prob-scaled): the probs feed three ops and
// their gradient is the sum of the three parts; the fused plan (GroupedMLP + Bias) matches finite
// differences and the unfused plan bit for bit.
TEST_P(SequentialTest, ProbsGradientSumsOverEveryOpThatTakesProbs) {
  MlpData d = make_mlp_data({.G = 2, .H = 8, .F = 8, .T = 9, .counts = {3, 4}, .seed = 11});
  const MlpCase& c = d.c;
  const int64_t S = sum(c.counts);
  const Tensor bb_h = random_normal({c.G, c.N}, DType::F32, 12, 0.5);
  std::vector<std::vector<uint8_t>> results[2];
  for (int fused = 0; fused < 2; ++fused) {
    const MlpOps ops = make_mlp_ops(ctx_, d);
    auto bias = std::make_shared<Bias>(
        BiasConfig{.groups = c.G, .features = c.N, .dtype = DType::F32, .scale_bias = true},
        ctx_);
    copy(ctx_, bb_h, bias->bias());
    const Sequential seq({ops.fc1, ops.act, ops.fc2, bias}, {.fuse = fused == 1});
    EXPECT_EQ(seq.plan(), fused ? "GroupedMLP(0-2), Bias(3)"
                                : "GroupedLinear(0), ScaledSwiGLU(1), GroupedLinear(2), Bias(3)");
    Tensor x = to_device(ctx_, d.x), probs = to_device(ctx_, d.probs);
    const Splits splits = Splits::host(c.counts);
    auto [y, tape] = seq.forward(x, {.splits = splits, .probs = probs});
    const SequentialGrads g = seq.backward(tape, to_device(ctx_, d.dy));
    for (const Tensor& t :
         {y.rows(0, S), g.input.rows(0, S), g.probs.rows(0, S), g.params[0].weight,
          g.params[0].bias, g.params[2].weight, g.params[2].bias, g.params[3].bias}) {
      results[fused].push_back(bytes_of(ctx_, t));
    }
    if (!fused) continue;
    const std::vector<double> dy = to_doubles(host(), d.dy);
    std::vector<double> dp = to_doubles(ctx_, g.probs), dx = to_doubles(ctx_, g.input);
    std::fill(dp.begin() + S, dp.end(), 0.0);
    std::fill(dx.begin() + S * c.H, dx.end(), 0.0);
    std::vector<FdSlot> slots = {
        {"probs", probs, to_host(ctx_, probs), dp},
        {"x", x, to_host(ctx_, x), dx},
        {"b2", ops.fc2->bias(), to_host(ctx_, ops.fc2->bias()), to_doubles(ctx_, g.params[2].bias)},
        {"Bias", bias->bias(), to_host(ctx_, bias->bias()), to_doubles(ctx_, g.params[3].bias)},
        {"W2", ops.fc2->linear().weight(), to_host(ctx_, ops.fc2->linear().weight()),
         to_doubles(ctx_, g.params[2].weight)},
    };
    ExtraInputs inference{.splits = splits, .probs = probs};
    inference.save_for_backward = false;
    EXPECT_TRUE(matches_finite_differences(ctx_, slots, [&] {
      const std::vector<double> v = to_doubles(ctx_, seq.forward(x, inference).output);
      double l = 0.0;
      for (int64_t i = 0; i < S * c.N; ++i) l += v[i] * dy[i];
      return l;
    }));
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  const char* what[] = {"y", "dx", "dprobs", "dW1", "db1", "dW2", "db2", "dBias"};
  for (size_t i = 0; i < results[0].size(); ++i) {
    EXPECT_TRUE(bit_identical(results[1][i], results[0][i], DType::F32)) << what[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, SequentialTest, ::testing::ValuesIn(device_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace moekit::test
