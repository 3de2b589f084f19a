// Deferred weight gradients (SPEC §1b, moekit/core/pending.h): GroupedLinear, GroupedMLP and
// Sequential backward with `defer_weight_grads` return once dx is queued; the weight gradients
// run after it on a side stream until the returned PendingWork is waited for. Checked here:
// every result equals the joined backward's bit for bit (bf16, biases, fp32 main_grad, zero-row
// groups, host and device counts; the MLP fused and unfused), the handle is pending exactly when
// a side stream exists (CUDA with MOEKIT_SIDE_STREAM not 0) and done after wait(), and the memory
// the deferred work reads (x, dy, device counts, the MLP's internal dh) is not handed back to its
// allocator before wait(), even when the caller drops every handle to it. On the CPU nothing is
// deferred. (The graph capture of a deferred backward: test_sm90, GraphCapturedMlp....)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <mutex>
#include <set>

#include "moekit/ops/grouped_mlp.h"
#include "moekit/ops/sequential.h"
#include "support/mlp_reference.h"
#include "support/test_util.h"

namespace moekit::test {
namespace {

// Takes memory from `base`'s allocator and records which blocks are live and which were handed
// back: shows what a pending handle keeps alive.
class ReleaseLog final : public Allocator {
 public:
  explicit ReleaseLog(Context base) : base_(std::move(base)) {}
  Device device() const override { return base_.device(); }
  bool released(const void* p) const {
    std::lock_guard lock(mutex_);
    return released_.count(p) > 0;
  }
  /// Live blocks of exactly `bytes`.
  int live_of_size(size_t bytes) const {
    std::lock_guard lock(mutex_);
    int n = 0;
    for (const auto& [p, b] : live_) n += b == bytes;
    return n;
  }

 protected:
  void* do_allocate(size_t bytes) override {
    void* p = base_.allocator().allocate(bytes);
    std::lock_guard lock(mutex_);
    live_[p] = bytes;
    released_.erase(p);
    return p;
  }
  void do_deallocate(void* p, size_t bytes) noexcept override {
    {
      std::lock_guard lock(mutex_);
      live_.erase(p);
      released_.insert(p);
    }
    base_.allocator().deallocate(p, bytes);
  }

 private:
  Context base_;
  mutable std::mutex mutex_;
  std::map<const void*, size_t> live_;
  std::set<const void*> released_;
};

class Deferred : public DeviceTest {
 protected:
  // Deferred work exists only beside a side stream.
  bool expect_pending() const { return ctx_.device().is_cuda() && side_stream_enabled(); }
};

using Images = std::vector<std::vector<uint8_t>>;

// names[i] ends in " f32" for an fp32 image (dprobs, main_grad); the others are of dtype dt.
void expect_same(const Images& got, const Images& want, const std::vector<std::string>& names,
                 DType dt) {
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(got.size(), names.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const bool f32 = names[i].ends_with(" f32");
    EXPECT_TRUE(bit_identical(got[i], want[i], f32 ? DType::F32 : dt))
        << names[i] << ": deferred vs joined";
  }
}

// ============================================================== GroupedLinear
struct LinearCase {
  int64_t G = 4, K = 96, N = 80, T = 180;
  std::vector<int64_t> counts{40, 0, 130, 3};  // S 173, a zero-row group, a 7-row tail
  DType dt = DType::BF16;
};

GroupedLinear make_linear(const Context& ctx, const LinearCase& c) {
  GroupedLinear fc({.groups = c.G, .in = c.K, .out = c.N, .dtype = c.dt, .bias = true}, ctx);
  fc.set_weight(to_device(ctx, random_normal({c.G, c.N, c.K}, c.dt, 11)));
  fc.set_bias(to_device(ctx, random_normal({c.G, c.N}, c.dt, 12)));
  return fc;
}

TEST_P(Deferred, LinearEqualsTheJoinedBackwardBitForBit) {
  const LinearCase c;
  const int64_t S = sum_of(c.counts);
  for (bool main_grad : {false, true}) {
    for (bool device_counts : {false, true}) {
      SCOPED_TRACE(
          str(main_grad ? "main_grad" : "dW", device_counts ? ", device counts" : ", host counts"));
      GroupedLinear fc = make_linear(ctx_, c);
      const Tensor mg_h = random_normal({c.G, c.N, c.K}, DType::F32, 13);
      Tensor mg;
      if (main_grad) {
        mg = to_device(ctx_, mg_h);
        fc.set_main_grad(mg);
      }
      const Tensor x = to_device(ctx_, random_normal({c.T, c.K}, c.dt, 14));
      const Tensor dy = to_device(ctx_, random_normal({c.T, c.N}, c.dt, 15));
      const Splits splits =
          device_counts ? Splits::device(to_device(ctx_, counts_tensor(c.counts, DType::I64)))
                        : Splits::host(c.counts);
      GroupedLinear::Saved saved;
      fc.forward(x, splits, {}, &saved);
      auto images = [&](const GroupedLinear::Grads& g) {
        return Images{bytes_of(ctx_, g.input.rows(0, S)), bytes_of(ctx_, g.weight),
                      bytes_of(ctx_, g.bias)};
      };
      if (main_grad) copy(ctx_, mg_h, mg);
      const GroupedLinear::Grads joined = fc.backward(saved, dy, {.retain_saved = true});
      EXPECT_FALSE(joined.weight_grads.pending());
      const Images want = images(joined);

      if (main_grad) copy(ctx_, mg_h, mg);
      GroupedLinear::Grads deferred = fc.backward(saved, dy, {.defer_weight_grads = true});
      EXPECT_EQ(deferred.weight_grads.pending(), expect_pending());
      deferred.weight_grads.wait();
      EXPECT_FALSE(deferred.weight_grads.pending());
      if (main_grad) {
        EXPECT_EQ(deferred.weight.data(), mg.data());
      }
      expect_same(images(deferred), want, {"dx", main_grad ? "main_grad f32" : "dW", "db"}, c.dt);
    }
  }
}

// The caller drops x, dy, the device counts and the saved context right after the call: the
// handle keeps their memory from its allocator until wait(); dW is still right after it.
TEST_P(Deferred, LinearHandleHoldsWhatTheWeightGradientReads) {
  const LinearCase c;
  auto log = std::make_shared<ReleaseLog>(ctx_);
  const Context lctx = ctx_.with_allocator(log);
  const GroupedLinear fc = make_linear(lctx, c);
  const Tensor x_h = random_normal({c.T, c.K}, c.dt, 21),
               dy_h = random_normal({c.T, c.N}, c.dt, 22);
  Images want;
  {
    GroupedLinear::Saved saved;
    fc.forward(to_device(lctx, x_h), Splits::host(c.counts), {}, &saved);
    const GroupedLinear::Grads g = fc.backward(saved, to_device(lctx, dy_h));
    want = {bytes_of(lctx, g.weight)};
  }
  const void *x_mem = nullptr, *dy_mem = nullptr, *counts_mem = nullptr;
  PendingWork pending;
  Tensor dw;
  {
    const Tensor x = to_device(lctx, x_h), dy = to_device(lctx, dy_h);
    const Tensor counts = to_device(lctx, counts_tensor(c.counts, DType::I64));
    x_mem = x.data();
    dy_mem = dy.data();
    counts_mem = counts.data();
    GroupedLinear::Saved saved;
    fc.forward(x, Splits::device(counts), {}, &saved);
    GroupedLinear::Grads g = fc.backward(saved, dy, {.defer_weight_grads = true});
    pending = std::move(g.weight_grads);
    dw = g.weight;
  }
  for (const void* p : {x_mem, dy_mem, counts_mem}) {
    EXPECT_EQ(log->released(p), !expect_pending()) << "released before wait()";
  }
  EXPECT_EQ(pending.pending(), expect_pending());
  pending.wait();
  for (const void* p : {x_mem, dy_mem, counts_mem}) EXPECT_TRUE(log->released(p));
  expect_same({bytes_of(lctx, dw)}, want, {"dW"}, c.dt);
}

// Frozen weights or an input without grad: nothing to defer, nothing pending, results as joined.
TEST_P(Deferred, LinearWithNothingToOverlapDefersNothing) {
  const LinearCase c;
  GroupedLinear fc = make_linear(ctx_, c);
  const Tensor x = to_device(ctx_, random_normal({c.T, c.K}, c.dt, 31));
  const Tensor dy = to_device(ctx_, random_normal({c.T, c.N}, c.dt, 32));
  GroupedLinear::Saved saved;
  fc.forward(x, Splits::host(c.counts), {.input_requires_grad = false}, &saved);
  const GroupedLinear::Grads joined = fc.backward(saved, dy, {.retain_saved = true});
  const GroupedLinear::Grads g = fc.backward(saved, dy, {.defer_weight_grads = true});
  EXPECT_FALSE(g.weight_grads.pending());
  EXPECT_FALSE(g.input.defined());
  expect_same({bytes_of(ctx_, g.weight)}, {bytes_of(ctx_, joined.weight)}, {"dW"}, c.dt);

  fc.set_weight_requires_grad(false);
  fc.forward(x, Splits::host(c.counts), {}, &saved);
  const GroupedLinear::Grads frozen = fc.backward(saved, dy, {.defer_weight_grads = true});
  EXPECT_FALSE(frozen.weight_grads.pending());
  EXPECT_FALSE(frozen.weight.defined());
  EXPECT_TRUE(frozen.input.defined());
}

// ============================================================== GroupedMLP
struct MlpResult {
  Images images;
  PendingWork pending;
};

// One MLP backward (bf16, both biases, fc1 accumulating into an fp32 main_grad, device counts)
// with caller buffers for dx; returns dx's valid rows, dprobs, dW1 (main_grad), db1, dW2, db2.
MlpResult run_mlp(const Context& ctx, const MlpData& d, const MlpOps& ops, const Tensor& mg1,
                  const Tensor& mg1_h, bool defer, bool wait) {
  const MlpCase& c = d.c;
  const int64_t S = sum_of(c.counts);
  copy(ctx, mg1_h, mg1);
  const GroupedMLP mlp(ops.fc1, ops.act, ops.fc2);
  const Tensor counts = to_device(ctx, counts_tensor(c.counts, DType::I64));
  GroupedMLP::Saved saved;
  mlp.forward(to_device(ctx, d.x), to_device(ctx, d.probs), Splits::device(counts), {}, &saved);
  const Tensor dx = filled(ctx, {c.T, c.H}, c.dtype, kSentinel);
  GroupedMLP::Grads g =
      mlp.backward(saved, to_device(ctx, d.dy), {.grad_input = dx, .defer_weight_grads = defer});
  MlpResult r;
  r.pending = std::move(g.weight_grads);
  if (wait) r.pending.wait();
  EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx, dx), S, c.T, c.H, c.dtype)) << "dx tail";
  if (!wait) return r;
  r.images = {bytes_of(ctx, dx.rows(0, S)), bytes_of(ctx, g.probs.rows(0, S)),
              bytes_of(ctx, g.fc1.weight),  bytes_of(ctx, g.fc1.bias),
              bytes_of(ctx, g.fc2.weight),  bytes_of(ctx, g.fc2.bias)};
  return r;
}

TEST_P(Deferred, MlpEqualsTheJoinedBackwardBitForBit) {
  const MlpData d = make_mlp_data({.G = 4,
                                   .H = 64,
                                   .F = 64,
                                   .counts = {50, 0, 77, 9},
                                   .dtype = DType::BF16,
                                   .layout = GluLayout::Interleaved32,
                                   .seed = 41});
  const MlpOps ops = make_mlp_ops(ctx_, d);
  const Tensor mg1_h = random_normal({d.c.G, 2 * d.c.F, d.c.H}, DType::F32, 42);
  const Tensor mg1 = to_device(ctx_, mg1_h);
  ops.fc1->linear().set_main_grad(mg1);
  const MlpResult joined = run_mlp(ctx_, d, ops, mg1, mg1_h, false, true);
  EXPECT_FALSE(joined.pending.pending());
  MlpResult deferred = run_mlp(ctx_, d, ops, mg1, mg1_h, true, false);
  EXPECT_EQ(deferred.pending.pending(), expect_pending());
  deferred.pending.wait();
  EXPECT_FALSE(deferred.pending.pending());
  const MlpResult again = run_mlp(ctx_, d, ops, mg1, mg1_h, true, true);
  expect_same(again.images, joined.images,
              {"dx", "dprobs f32", "main_grad1 f32", "db1", "dW2", "db2"}, DType::BF16);
}

// The MLP's internal dh [T, 2F] (fc1's weight gradient reads it) stays allocated until wait().
TEST_P(Deferred, MlpHandleHoldsItsInternalTemporaries) {
  const MlpData d = make_mlp_data(
      {.G = 3, .H = 64, .F = 96, .counts = {30, 0, 41}, .dtype = DType::BF16, .seed = 43});
  auto log = std::make_shared<ReleaseLog>(ctx_);
  const Context lctx = ctx_.with_allocator(log);
  const MlpOps ops = make_mlp_ops(lctx, d);
  const Tensor mg1_h = random_normal({d.c.G, 2 * d.c.F, d.c.H}, DType::F32, 44);
  const Tensor mg1 = to_device(lctx, mg1_h);
  ops.fc1->linear().set_main_grad(mg1);
  const size_t dh_bytes = static_cast<size_t>(d.c.T * 2 * d.c.F) * size_of(DType::BF16);
  const int before = log->live_of_size(dh_bytes);
  MlpResult r = run_mlp(lctx, d, ops, mg1, mg1_h, true, false);
  // dh while pending (the saved h, of the same size, went with run_mlp's saved context).
  EXPECT_EQ(log->live_of_size(dh_bytes) - before, expect_pending() ? 1 : 0);
  r.pending.wait();
  EXPECT_EQ(log->live_of_size(dh_bytes), before);
}

// ============================================================== Sequential
TEST_P(Deferred, SequentialFusedAndUnfusedEqualTheJoinedBackward) {
  const MlpData d = make_mlp_data({.G = 3,
                                   .H = 64,
                                   .F = 64,
                                   .counts = {21, 0, 35},
                                   .dtype = DType::BF16,
                                   .layout = GluLayout::Interleaved32,
                                   .seed = 45});
  const MlpOps ops = make_mlp_ops(ctx_, d);
  const Tensor x = to_device(ctx_, d.x), probs = to_device(ctx_, d.probs),
               dy = to_device(ctx_, d.dy);
  const int64_t S = sum_of(d.c.counts);
  for (bool fuse : {true, false}) {
    SCOPED_TRACE(fuse ? "fused" : "unfused");
    Sequential seq({ops.fc1, ops.act, ops.fc2}, {.fuse = fuse});
    EXPECT_EQ(seq.fused(), fuse);
    auto run = [&](bool defer) {
      auto [y, tape] = seq.forward(x, {.splits = Splits::host(d.c.counts), .probs = probs});
      // Deferred with an SM margin on the deferred GEMMs (deferred_sm_margin; the CPU ignores it).
      SequentialGrads g = seq.backward(
          tape, dy, {.defer_weight_grads = defer, .deferred_sm_margin = defer ? 16 : 0});
      EXPECT_EQ(g.weight_grads.pending(), defer && expect_pending());
      g.weight_grads.wait();
      EXPECT_FALSE(g.weight_grads.pending());
      return Images{bytes_of(ctx_, g.input.rows(0, S)), bytes_of(ctx_, g.probs.rows(0, S)),
                    bytes_of(ctx_, g.params[0].weight), bytes_of(ctx_, g.params[0].bias),
                    bytes_of(ctx_, g.params[2].weight), bytes_of(ctx_, g.params[2].bias)};
    };
    const Images joined = run(false);
    expect_same(run(true), joined, {"dx", "dprobs f32", "dW1", "db1", "dW2", "db2"}, DType::BF16);
  }
}

// A bad deferred_sm_margin (negative; on a GPU, not below its SM count) is an InvalidArgument
// naming it, raised before any work: the caller's dx buffer keeps its sentinels.
TEST_P(Deferred, BadDeferredSmMarginIsRejectedBeforeAnyWork) {
  const MlpData d = make_mlp_data(
      {.G = 3, .H = 64, .F = 64, .counts = {21, 0, 35}, .dtype = DType::BF16, .seed = 47});
  const MlpOps ops = make_mlp_ops(ctx_, d);
  const Tensor x = to_device(ctx_, d.x), probs = to_device(ctx_, d.probs),
               dy = to_device(ctx_, d.dy);
  const Splits splits = Splits::host(d.c.counts);
  const GroupedMLP mlp(ops.fc1, ops.act, ops.fc2);
  GroupedMLP::Saved mlp_saved;
  mlp.forward(x, probs, splits, {}, &mlp_saved);
  GroupedLinear::Saved fc2_saved;
  ops.fc2->linear().forward(to_device(ctx_, random_normal({d.c.T, d.c.F}, DType::BF16, 48)), splits,
                            {}, &fc2_saved);
  Sequential seq({ops.fc1, ops.act, ops.fc2});
  std::vector<int> bad{-1};
  if (ctx_.device().is_cuda()) bad.push_back(1 << 20);  // more SMs than any GPU has
  for (int margin : bad) {
    SCOPED_TRACE(str("deferred_sm_margin ", margin));
    const Tensor dx = filled(ctx_, {d.c.T, d.c.H}, DType::BF16, kSentinel);
    const Tensor dz = filled(ctx_, {d.c.T, d.c.F}, DType::BF16, kSentinel);
    OpArgs args;
    args[0].grad_input = dx;
    auto [y, tape] = seq.forward(x, {.splits = splits, .probs = probs}, args);
    const std::vector<std::function<void()>> calls = {
        [&] {
          ops.fc2->linear().backward(
              fc2_saved, dy,
              {.grad_input = dz, .defer_weight_grads = true, .deferred_sm_margin = margin});
        },
        [&] {
          mlp.backward(
              mlp_saved, dy,
              {.grad_input = dx, .defer_weight_grads = true, .deferred_sm_margin = margin});
        },
        [&] {
          seq.backward(tape, dy, {.defer_weight_grads = true, .deferred_sm_margin = margin});
        }};
    for (size_t i = 0; i < calls.size(); ++i) {
      const char* const names[] = {"GroupedLinear", "GroupedMLP", "Sequential"};
      SCOPED_TRACE(names[i]);
      auto e = caught(calls[i]);
      ASSERT_TRUE(e);
      EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
      EXPECT_THAT(e->what(), ::testing::AllOf(::testing::HasSubstr("'deferred_sm_margin'"),
                                              ::testing::HasSubstr(str("got ", margin))));
    }
    EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, dx), 0, d.c.T, d.c.H, DType::BF16))
        << "dx written";
    EXPECT_TRUE(rows_hold_sentinel(bytes_of(ctx_, dz), 0, d.c.T, d.c.F, DType::BF16))
        << "dz written";
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, Deferred, ::testing::ValuesIn(device_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace moekit::test
