// test_contract — the guarantees every call keeps (SPEC §1, §3, §4): bind once, run below (a
// call that fails anywhere writes nothing, also a Sequential's unfused backward), one backward
// per forward, moekit::last_backend, and on a GPU the no-host-sync rule of device splits: each
// reason the graph-safe kernels refuse a call is an error naming it — never a silent cuBLAS
// fallback that synchronises — and a forced cuBLAS inside a graph capture is an error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "moekit/moekit.h"
#include "support/cuda_graph.h"
#include "support/test_util.h"

namespace moekit {
namespace {

using ::testing::HasSubstr;
using test::bytes_of;
using test::caught;
using test::filled;
using test::random_normal;

class Contract : public test::DeviceTest {};

const std::vector<int64_t> kCounts{40, 0, 24, 56};  // S = 120 of T = 128, a zero-row group
constexpr int64_t kT = 128, kK = 64, kN = 96;

Tensor dev_normal(const Context& ctx, const Shape& shape, DType dt, uint64_t seed) {
  return to_device(ctx, random_normal(shape, dt, seed));
}

GroupedLinear make_linear(const Context& ctx, DType dt, int64_t K, int64_t N, uint64_t seed) {
  GroupedLinear fc({.groups = 4, .in = K, .out = N, .dtype = dt, .bias = true}, ctx);
  copy(ctx, random_normal(fc.weight().shape(), dt, seed), fc.weight());
  copy(ctx, random_normal(fc.bias().shape(), dt, seed + 1), fc.bias());
  return fc;
}

Splits device_splits(const Context& ctx) {
  return Splits::device(to_device(ctx, test::counts_tensor(kCounts, DType::I32)));
}

// The backend each primitive of a GroupedLinear step ran, read back through last_backend.
TEST_P(Contract, LastBackendNamesWhatRan) {
  const bool gpu = ctx_.device().is_cuda();
  const DType dt = gpu ? DType::BF16 : DType::F32;
  GroupedLinear fc = make_linear(ctx_, dt, kK, kN, 11);
  const Tensor x = dev_normal(ctx_, {kT, kK}, dt, 12);
  const Tensor dy = dev_normal(ctx_, {kT, kN}, dt, 13);
  GroupedLinear::Saved saved;
  fc.forward(x, gpu ? device_splits(ctx_) : Splits::host(kCounts), {}, &saved);
  const std::string want = gpu ? "sm90" : "cpu";  // CUDA suites run on the H200 (sm_90)
  EXPECT_EQ(last_backend(ctx_, "grouped_gemm_group_m"), want);
  fc.backward(saved, dy);
  EXPECT_EQ(last_backend(ctx_, "grouped_gemm_group_k"), want) << "the side stream shares the log";
  EXPECT_EQ(last_backend(ctx_, "grouped_bias_grad"), gpu ? "cuda" : "cpu");
  EXPECT_EQ(last_backend(ctx_, "no_such_primitive"), "");
  // Copies of a context share the log.
  EXPECT_EQ(last_backend(ctx_.with_sm_margin(0), "grouped_gemm_group_m"), want);
}

// A second backward of one forward would add dW into main_grad twice: an error, unless the
// caller retains the context (PyTorch's retain_graph).
TEST_P(Contract, OneBackwardPerForwardUnlessRetained) {
  const DType dt = DType::F32;
  GroupedLinear fc = make_linear(ctx_, dt, kK, kN, 21);
  const Tensor mg = filled(ctx_, fc.weight().shape(), DType::F32, 0.5);
  fc.set_main_grad(mg);
  const Tensor x = dev_normal(ctx_, {kT, kK}, dt, 22);
  const Tensor dy = dev_normal(ctx_, {kT, kN}, dt, 23);
  GroupedLinear::Saved saved;
  fc.forward(x, Splits::host(kCounts), {}, &saved);
  fc.backward(saved, dy, {.retain_saved = true});
  fc.backward(saved, dy);
  const std::vector<uint8_t> after = bytes_of(ctx_, mg);
  auto e = caught([&] { fc.backward(saved, dy); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("'saved'"));
  EXPECT_THAT(e->what(), HasSubstr("already used by a backward"));
  EXPECT_TRUE(test::bit_identical(bytes_of(ctx_, mg), after, DType::F32));
  // A copy of the saved context is the same context.
  const GroupedLinear::Saved copy_of = saved;
  EXPECT_TRUE(caught([&] { fc.backward(copy_of, dy); }));
  // A failed backward does not use the context up.
  GroupedLinear::Saved fresh;
  fc.forward(x, Splits::host(kCounts), {}, &fresh);
  EXPECT_TRUE(caught([&] { fc.backward(fresh, dy.rows(0, kT - 1)); }));
  EXPECT_FALSE(caught([&] { fc.backward(fresh, dy); }));
}

// The unfused grouped MLP as a Sequential: fc1 → ScaledSwiGLU → fc2 (fusion off), fp32.
struct UnfusedMlp {
  std::shared_ptr<GroupedLinearOp> fc1, fc2;
  std::shared_ptr<ScaledSwiGLU> act;
  std::unique_ptr<Sequential> seq;
  static constexpr int64_t H = 32, F = 64;
  UnfusedMlp(const Context& ctx, uint64_t seed) {
    fc1 = std::make_shared<GroupedLinearOp>(
        GroupedLinearConfig{.groups = 4, .in = H, .out = 2 * F, .dtype = DType::F32}, ctx);
    act = std::make_shared<ScaledSwiGLU>(SwiGLUConfig{}, ctx);
    fc2 = std::make_shared<GroupedLinearOp>(
        GroupedLinearConfig{.groups = 4, .in = F, .out = H, .dtype = DType::F32}, ctx);
    copy(ctx, random_normal(fc1->linear().weight().shape(), DType::F32, seed), fc1->linear().weight());
    copy(ctx, random_normal(fc2->linear().weight().shape(), DType::F32, seed + 1),
         fc2->linear().weight());
    seq = std::make_unique<Sequential>(std::vector<OpHandle>{fc1, act, fc2},
                                       SequentialOptions{.fuse = false});
  }
};

TEST_P(Contract, SequentialTapeTakesOneBackwardUnlessRetained) {
  UnfusedMlp m(ctx_, 31);
  for (bool fuse : {false, true}) {
    SCOPED_TRACE(fuse ? "fused" : "unfused");
    m.seq->set_fusion(fuse);
    const Tensor x = dev_normal(ctx_, {kT, UnfusedMlp::H}, DType::F32, 32);
    const Tensor probs = dev_normal(ctx_, {kT}, DType::F32, 33);
    const Tensor dy = dev_normal(ctx_, {kT, UnfusedMlp::H}, DType::F32, 34);
    auto [y, tape] = m.seq->forward(x, {.splits = Splits::host(kCounts), .probs = probs});
    m.seq->backward(tape, dy, {.retain_tape = true});
    m.seq->backward(tape, dy);
    auto e = caught([&] { m.seq->backward(tape, dy); });
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), HasSubstr("'tape'"));
    EXPECT_THAT(e->what(), HasSubstr("already used by a backward"));
  }
}

// Every stage is bound before any runs: when fc1's backward is refused (its main_grad overlaps
// its saved input), fc2's main_grad — whose backward comes first — is still untouched.
TEST_P(Contract, FailedUnfusedBackwardWritesNothing) {
  UnfusedMlp m(ctx_, 41);
  const int64_t H = UnfusedMlp::H, F = UnfusedMlp::F;
  const Tensor mg2 = filled(ctx_, {4, H, F}, DType::F32, 0.25);
  m.fc2->linear().set_main_grad(mg2);
  // fc1's main_grad [4, 2F, H] shares its first rows with x [T, H] (one fp32 arena).
  const Tensor arena = filled(ctx_, {4 * 2 * F * H}, DType::F32, 0.0);
  const Tensor x = Tensor::wrap(arena.data(), {kT, H}, DType::F32, ctx_.device());
  copy(ctx_, random_normal({kT, H}, DType::F32, 42), x);
  m.fc1->linear().set_main_grad(Tensor::wrap(arena.data(), {4, 2 * F, H}, DType::F32, ctx_.device()));
  const Tensor probs = dev_normal(ctx_, {kT}, DType::F32, 43);
  const Tensor dy = dev_normal(ctx_, {kT, H}, DType::F32, 44);
  auto [y, tape] = m.seq->forward(x, {.splits = Splits::host(kCounts), .probs = probs});
  const std::vector<uint8_t> mg2_before = bytes_of(ctx_, mg2), arena_before = bytes_of(ctx_, arena);
  const std::vector<uint8_t> probs_before = bytes_of(ctx_, probs), dy_before = bytes_of(ctx_, dy);
  auto e = caught([&] { m.seq->backward(tape, dy); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), HasSubstr("op 0 (GroupedLinear)"));
  EXPECT_THAT(e->what(), HasSubstr("'main_grad'"));
  EXPECT_THAT(e->what(), HasSubstr("'input'"));
  ctx_.synchronize();
  EXPECT_TRUE(test::bit_identical(bytes_of(ctx_, mg2), mg2_before, DType::F32)) << "fc2's main_grad";
  EXPECT_TRUE(test::bit_identical(bytes_of(ctx_, arena), arena_before, DType::F32));
  EXPECT_TRUE(test::bit_identical(bytes_of(ctx_, probs), probs_before, DType::F32));
  EXPECT_TRUE(test::bit_identical(bytes_of(ctx_, dy), dy_before, DType::F32));
  // The refused backward did not use the tape up.
  m.fc1->linear().set_main_grad(Tensor());
  EXPECT_FALSE(caught([&] { m.seq->backward(tape, dy); }));
}

// The unfused backward refuses a main_grad that overlaps what it reads (dy, the probs), fused or
// not, before any op runs.
TEST_P(Contract, MainGradOverlappingDyOrProbsIsRefusedOnEveryPath) {
  const int64_t H = UnfusedMlp::H, F = UnfusedMlp::F;
  for (bool fuse : {false, true}) {
    for (bool on_probs : {false, true}) {
      SCOPED_TRACE(str(fuse ? "fused" : "unfused", on_probs ? ", probs" : ", dy"));
      UnfusedMlp m(ctx_, 51);
      m.seq->set_fusion(fuse);
      const Tensor mg1 = filled(ctx_, {4, 2 * F, H}, DType::F32, 0.75);
      m.fc1->linear().set_main_grad(mg1);
      // fc2's main_grad [4, H, F] is an arena whose first elements are dy [T, H] or probs [T].
      const Tensor arena = filled(ctx_, {4 * H * F}, DType::F32, 0.5);
      const Tensor x = dev_normal(ctx_, {kT, H}, DType::F32, 52);
      Tensor probs = dev_normal(ctx_, {kT}, DType::F32, 53);
      Tensor dy = dev_normal(ctx_, {kT, H}, DType::F32, 54);
      Tensor& shared = on_probs ? probs : dy;
      const Tensor view = Tensor::wrap(arena.data(), shared.shape(), DType::F32, ctx_.device());
      copy(ctx_, shared, view);
      shared = view;
      m.fc2->linear().set_main_grad(Tensor::wrap(arena.data(), {4, H, F}, DType::F32, ctx_.device()));
      auto [y, tape] = m.seq->forward(x, {.splits = Splits::host(kCounts), .probs = probs});
      const std::vector<uint8_t> arena_before = bytes_of(ctx_, arena), mg1_before = bytes_of(ctx_, mg1);
      auto e = caught([&] { m.seq->backward(tape, dy); });
      ASSERT_TRUE(e);
      EXPECT_THAT(e->what(), HasSubstr("main_grad"));
      EXPECT_THAT(e->what(), HasSubstr(on_probs ? "'probs'" : "'grad_output'"));
      ctx_.synchronize();
      EXPECT_TRUE(test::bit_identical(bytes_of(ctx_, arena), arena_before, DType::F32));
      EXPECT_TRUE(test::bit_identical(bytes_of(ctx_, mg1), mg1_before, DType::F32));
    }
  }
}

// zero_tail: rows [S, T) of a tensor set to zero, nothing else written — host counts, device
// counts of both dtypes, S = T, S = 0, rows of an odd byte length (the GPU kernel's unaligned head
// and tail bytes), a 1-D tensor — and bad arguments refused before any write.
TEST_P(Contract, ZeroTailZeroesTheTailRowsAndNothingElse) {
  struct Case {
    std::vector<int64_t> counts;
    int64_t cols;  // 0: a 1-D tensor
  };
  const Case cases[] = {{{5, 0, 7, 1}, 7}, {{13, 0, 0, 0}, 7}, {{0, 0, 0, 0}, 9}, {{3, 4, 0, 2}, 64},
                        {{2, 0, 3, 1}, 0}};
  const int64_t T = 13;
  uint64_t seed = 300;
  for (const Case& c : cases) {
    for (int form = 0; form < 3; ++form) {  // host counts, i32 device counts, i64 device counts
      SCOPED_TRACE(str("counts ", c.counts[0], ",", c.counts[1], ",", c.counts[2], ",", c.counts[3],
                       " cols ", c.cols, " form ", form));
      const Shape shape = c.cols ? Shape{T, c.cols} : Shape{T};
      const test::GuardedBuffer buf(ctx_, shape, DType::BF16);
      const Tensor data = random_normal(shape, DType::BF16, ++seed);
      copy(ctx_, to_device(ctx_, data), buf.view);
      const Splits splits =
          form == 0 ? Splits::host(c.counts)
                    : Splits::device(to_device(ctx_, test::counts_tensor(c.counts, form == 1 ? DType::I32 : DType::I64)));
      zero_tail(ctx_, buf.view, splits);
      ctx_.check_device_errors();
      int64_t S = 0;
      for (int64_t m : c.counts) S += m;
      const std::vector<double> got = buf.values(), want = test::to_doubles(test::host(), data);
      const int64_t per_row = c.cols ? c.cols : 1;
      for (int64_t i = 0; i < T * per_row; ++i) {
        const bool tail = i / per_row >= S;
        ASSERT_EQ(got[static_cast<size_t>(i)], tail ? 0.0 : want[static_cast<size_t>(i)]) << "element " << i;
      }
      EXPECT_TRUE(buf.untouched_outside(T)) << "zero_tail wrote outside the tensor";
    }
  }
  // Refused before any write, naming the argument: S > T, a wrong device, a non-contiguous tensor.
  const test::GuardedBuffer buf(ctx_, {T, 4}, DType::BF16);
  auto e = caught([&] { zero_tail(ctx_, buf.view, Splits::host({10, 4})); });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'splits'"), HasSubstr("S <= T = 13"), HasSubstr("S = 14")));
  EXPECT_TRUE(buf.untouched_outside(0));
  if (ctx_.device().is_cuda()) {
    const Tensor host = Tensor::empty({T, 4}, DType::BF16, test::host());
    e = caught([&] { zero_tail(ctx_, host, Splits::host({1})); });
    ASSERT_TRUE(e);
    EXPECT_THAT(e->what(), AllOf(HasSubstr("'t'"), HasSubstr("cuda:0")));
    // Invalid device counts: nothing written, the reason in the error word.
    zero_tail(ctx_, buf.view, Splits::device(to_device(ctx_, test::counts_tensor({9, 6}, DType::I32))));
    e = caught([&] { ctx_.check_device_errors(); });
    ASSERT_TRUE(e) << "invalid device counts went unreported";
    EXPECT_THAT(e->what(), HasSubstr("larger than the T rows"));
    EXPECT_TRUE(buf.untouched_outside(0));
  }
  e = caught([&] {
    zero_tail(ctx_, Tensor::wrap(buf.view.data(), {T, 2}, {4, 1}, DType::BF16, buf.view.device()),
              Splits::host({1}));
  });
  ASSERT_TRUE(e);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("'t'"), HasSubstr("contiguous")));
  EXPECT_TRUE(buf.untouched_outside(0));
  if (!ctx_.device().is_cuda()) return;
  // Device counts: captured once in a CUDA graph (no host sync), replayed with new counts.
  const test::CudaGraphApi& api = test::CudaGraphApi::get();
  ASSERT_TRUE(api.ok) << "libcudart entry points not found through dlopen";
  const test::OwnedStream owned(api);
  ASSERT_NE(owned.get(), nullptr);
  {
    const Context ctx = Context::cuda(0, owned.get());
    const Tensor counts = to_device(ctx, test::counts_tensor({0, 0}, DType::I64));
    const test::GuardedBuffer out(ctx, {T, 5}, DType::BF16);
    ctx.synchronize();
    void* graph = nullptr;
    ASSERT_EQ(api.capture(owned.get(), [&] { zero_tail(ctx, out.view, Splits::device(counts)); }, &graph), "");
    void* exec = nullptr;
    ASSERT_EQ(api.instantiate(&exec, graph, 0), 0);
    for (const std::vector<int64_t>& m : {std::vector<int64_t>{4, 3}, {13, 0}, {0, 1}}) {
      const Tensor data = random_normal({T, 5}, DType::BF16, ++seed);
      copy(ctx, to_device(ctx, data), out.view);
      copy(ctx, test::counts_tensor(m, DType::I64), counts);
      ASSERT_EQ(api.launch(exec, owned.get()), 0);
      ctx.synchronize();
      const std::vector<double> got = out.values(), want = test::to_doubles(test::host(), data);
      for (int64_t i = 0; i < T * 5; ++i) {
        ASSERT_EQ(got[static_cast<size_t>(i)], i / 5 >= m[0] + m[1] ? 0.0 : want[static_cast<size_t>(i)])
            << "replay with counts " << m[0] << "," << m[1] << ", element " << i;
      }
      EXPECT_TRUE(out.untouched_outside(T));
    }
    api.exec_destroy(exec);
    api.graph_destroy(graph);
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, Contract, ::testing::ValuesIn(test::device_names()), test::device_name);

// ---- GPU: device splits never synchronise silently.
class DeviceSplitsRule : public test::DeviceTest {};

struct Refusal {
  std::string name;
  DType dt;
  int64_t K, N;
  bool unaligned_output;
  std::string reason;  // what the sm90 entry says
};

const std::vector<Refusal>& refusals() {
  static const std::vector<Refusal> r{
      {"fp32", DType::F32, 64, 96, false, "sm90"},
      {"K not a multiple of 8", DType::BF16, 60, 96, false, "K = 60 is not a multiple of 8"},
      {"N not a multiple of 8", DType::BF16, 64, 90, false, "N = 90 is not a multiple of 8"},
      {"output not 16-byte aligned", DType::BF16, 64, 96, true, "not 16-byte aligned"},
  };
  return r;
}

TEST_P(DeviceSplitsRule, EachRefusalOfTheGraphSafeKernelsIsAnErrorNamingIt) {
  for (const Refusal& r : refusals()) {
    SCOPED_TRACE(r.name);
    GroupedLinear fc = make_linear(ctx_, r.dt, r.K, r.N, 61);
    const Tensor x = dev_normal(ctx_, {kT, r.K}, r.dt, 62);
    // A caller buffer, offset by one element when the case wants it unaligned.
    const Tensor arena = filled(ctx_, {kT * r.N + 8}, r.dt, test::kSentinel);
    const int64_t off = r.unaligned_output ? 1 : 0;
    const Tensor out = Tensor::wrap(static_cast<char*>(arena.data()) + off * size_of(r.dt),
                                    {kT, r.N}, r.dt, ctx_.device());
    const std::vector<uint8_t> before = bytes_of(ctx_, arena);
    const Splits splits = device_splits(ctx_);
    auto e = caught([&] { fc.forward(x, splits, {.output = out}); });
    ASSERT_TRUE(e) << "the automatic choice ran a call no graph-safe backend accepts";
    EXPECT_EQ(e->kind(), ErrorKind::Unsupported);
    EXPECT_THAT(e->what(), HasSubstr(r.reason));
    EXPECT_THAT(e->what(), HasSubstr("synchronises"));
    ctx_.synchronize();
    EXPECT_TRUE(test::bit_identical(bytes_of(ctx_, arena), before, r.dt)) << "a refused call wrote";
    // Forced, cuBLAS runs it (reading the counts on the host, as asked)...
    const Context forced = ctx_.with_backend("cublas");
    GroupedLinear fc_forced = make_linear(forced, r.dt, r.K, r.N, 61);
    EXPECT_FALSE(caught([&] { fc_forced.forward(x, splits, {.output = out}); }));
    EXPECT_EQ(last_backend(forced, "grouped_gemm_group_m"), "cublas");
    // ... and the same call with host splits runs automatically (no sync needed).
    EXPECT_FALSE(caught([&] { fc.forward(x, Splits::host(kCounts), {.output = out}); }));
  }
}

TEST_P(DeviceSplitsRule, ForcedCublasInsideAGraphCaptureIsAnError) {
  const test::CudaGraphApi api;
  ASSERT_TRUE(api.ok) << "the CUDA runtime moekit loaded was not found";
  // The context borrows the stream: it must outlive the context and every tensor allocated on it
  // (their frees are queued on it), so it is destroyed last.
  const test::OwnedStream owned(api);
  void* stream = owned.get();
  ASSERT_NE(stream, nullptr);
  const Context base = Context::cuda(0, stream);
  const Context forced = base.with_backend("cublas");
  GroupedLinear fc = make_linear(forced, DType::BF16, kK, kN, 71);
  const Tensor x = dev_normal(base, {kT, kK}, DType::BF16, 72);
  const Tensor out = filled(base, {kT, kN}, DType::BF16, test::kSentinel);
  const Splits splits = device_splits(base);
  base.synchronize();
  const std::vector<uint8_t> before = bytes_of(base, out);
  ASSERT_EQ(api.begin_capture(stream, test::CudaGraphApi::kCaptureGlobal), 0);
  auto e = caught([&] { fc.forward(x, splits, {.output = out}); });
  void* graph = nullptr;
  EXPECT_EQ(api.end_capture(stream, &graph), 0) << "the capture was broken";
  if (graph) api.graph_destroy(graph);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::Unsupported);
  EXPECT_THAT(e->what(), HasSubstr("CUDA graph capture"));
  EXPECT_TRUE(test::bit_identical(bytes_of(base, out), before, DType::BF16));
}

// CUDA only: on the CPU the counts are always on the host.
INSTANTIATE_TEST_SUITE_P(Devices, DeviceSplitsRule, ::testing::Values("cuda"), test::device_name);

}  // namespace
}  // namespace moekit
