// test_sm90 — the Hopper grouped GEMM backend ("sm90", src/cuda/sm90/) through the public API.
//
// Every case forces the backend (Context::with_backend("sm90")) so that a silent fallback to
// cuBLAS cannot pass for it, and skips with the reason when this build has no sm90 kernels, no
// GPU, or a GPU that is not sm_90. Checks: fp64 reference of the stored inputs (tolerance rule of
// support/reference.h), outputs as views between sentinel-filled guard bands (nothing outside the
// valid rows [0, S) may change: not the tail [S, T), not the guards), zero-row groups, int32 and
// int64 device counts, bf16 and f16, fprop and dgrad, with and without bias, and a CUDA graph that
// captures GroupedLinear::forward once and replays it with new device counts.
//
// The graph case needs a few CUDA runtime calls (stream, capture, launch). This file is built in
// CPU-only builds too, without CUDA headers, so it reaches the runtime that libmoekit already
// loaded (libcudart.so, shared) through dlopen(RTLD_NOLOAD) — the same runtime instance as the
// library's, which graph capture requires.
#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "moekit/moekit.h"
#include "support/reference.h"
#include "support/test_util.h"

namespace moekit {
namespace {

using test::caught;

// ---------------------------------------------------------------- availability

// nullopt when the sm90 backend can run here; else the reason to skip.
std::optional<std::string> sm90_unavailable() {
  if (!Context::built_with_cuda()) return "built without the CUDA backend";
  if (Context::cuda_device_count() == 0) return "no usable CUDA device";
  const Context ctx = Context::cuda(0).with_backend("sm90");
  // A tiny legal call: the backend either runs it or says why it cannot.
  Tensor a = Tensor::empty({8, 8}, DType::BF16, ctx);
  Tensor b = Tensor::empty({1, 8, 8}, DType::BF16, ctx);
  Tensor out = Tensor::empty({8, 8}, DType::BF16, ctx);
  fill(ctx, a, 1.0);
  fill(ctx, b, 1.0);
  auto e = caught([&] { grouped_gemm_group_m(ctx, a, b, BOp::Transposed, Splits::host({8}), out); });
  ctx.synchronize();
  if (!e) return std::nullopt;
  if (e->kind() == ErrorKind::InvalidArgument) return "this build has no sm90 kernels";
  return std::string("the sm90 backend cannot run here: ") + e->what();
}

#define MOEKIT_REQUIRE_SM90()                                               \
  do {                                                                      \
    static const std::optional<std::string> why = sm90_unavailable();       \
    if (why) GTEST_SKIP() << *why;                                          \
  } while (0)

const Context& sm90() {
  static const Context ctx = Context::cuda(0).with_backend("sm90");
  return ctx;
}

std::vector<double> doubles_of(const Tensor& host_tensor) {
  std::vector<double> v(static_cast<size_t>(host_tensor.numel()));
  to_f64(host_tensor.data(), host_tensor.dtype(), v.data(), v.size());
  return v;
}

using test::sum_of;

// A guarded [rows, cols] view on ctx's device (see test::GuardedBuffer).
struct Guarded : test::GuardedBuffer {
  Guarded(const Context& ctx, int64_t rows, int64_t cols, DType dt)
      : GuardedBuffer(ctx, {rows, cols}, dt) {}
};

// ---------------------------------------------------------------- cases

struct Sm90Case {
  const char* name;
  DType dtype;
  bool dgrad;
  bool bias;
  DType counts_dtype;
  int64_t T, K, N;  // layer sizes: x [T, K], W [G, N, K]
  std::vector<int64_t> counts;
};

std::string case_name(const ::testing::TestParamInfo<Sm90Case>& info) { return info.param.name; }
// Readable parameter in ctest's listing (instead of gtest's byte dump).
void PrintTo(const Sm90Case& c, std::ostream* os) { *os << c.name; }

const Sm90Case kCases[] = {
    // name, dtype, dgrad, bias, counts dtype, T, K, N, counts (zero-row groups and tails)
    {"Bf16FpropBiasI32ZeroGroupsTail", DType::BF16, false, true, DType::I32, 1100, 256, 136,
     {0, 300, 0, 1, 512, 0, 17, 0}},
    {"Bf16FpropI64OneGroup", DType::BF16, false, false, DType::I64, 777, 512, 64, {777}},
    {"Bf16DgradI32Skewed", DType::BF16, true, false, DType::I32, 2048, 200, 264,
     {1500, 0, 3, 400, 0, 100, 45, 0}},
    {"F16FpropBiasI64ManyGroups", DType::F16, false, true, DType::I64, 640, 128, 1024,
     {9, 0, 0, 40, 1, 1, 1, 200, 7, 0, 63, 64, 65, 0, 100, 3, 30, 0, 0, 50}},
    {"F16DgradI64Tail", DType::F16, true, false, DType::I64, 3000, 1024, 72, {1024, 0, 1000, 3}},
    {"Bf16FpropSmallGroupsManyExperts", DType::BF16, false, false, DType::I32, 4096, 512, 256,
     std::vector<int64_t>(64, 60)},
};

class CudaSm90Gemm : public ::testing::TestWithParam<Sm90Case> {};

// grouped_gemm_group_m through the sm90 backend with device counts, against the fp64 reference.
TEST_P(CudaSm90Gemm, MatchesFp64ReferenceAndWritesOnlyValidRows) {
  MOEKIT_REQUIRE_SM90();
  const Sm90Case& c = GetParam();
  const Context& ctx = sm90();
  const int64_t G = static_cast<int64_t>(c.counts.size()), S = sum_of(c.counts);
  // fprop: out [T, N] = x · W_gᵀ (+ b_g);  dgrad: out [T, K] = dy [T, N] · W_g.
  const int64_t in_cols = c.dgrad ? c.N : c.K, out_cols = c.dgrad ? c.K : c.N;
  Tensor a_h = test::random_normal({c.T, in_cols}, c.dtype, 11);
  Tensor w_h = test::random_normal({G, c.N, c.K}, c.dtype, 12, 1.0 / std::sqrt(double(in_cols)));
  Tensor b_h = c.bias ? test::random_normal({G, c.N}, c.dtype, 13) : Tensor();
  Tensor a = to_device(ctx, a_h), w = to_device(ctx, w_h);
  Tensor bias = c.bias ? to_device(ctx, b_h) : Tensor();
  Tensor counts = to_device(ctx, test::counts_tensor(c.counts, c.counts_dtype));
  Guarded out(ctx, c.T, out_cols, c.dtype);

  grouped_gemm_group_m(ctx, a, w, c.dgrad ? BOp::Plain : BOp::Transposed, Splits::device(counts),
                       out.view, bias);

  const test::Reference ref =
      c.dgrad ? test::reference_dgrad(doubles_of(a_h), doubles_of(w_h), c.counts, c.K, c.N)
              : test::reference_forward(doubles_of(a_h), doubles_of(w_h),
                                        c.bias ? doubles_of(b_h) : std::vector<double>{}, c.counts,
                                        c.K, c.N);
  EXPECT_TRUE(test::matches_reference(c.name, out.values(), ref, c.dtype));
  EXPECT_TRUE(out.untouched_outside(S));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaSm90Gemm, ::testing::ValuesIn(kCases), case_name);

TEST(CudaSm90, HostAndDeviceCountsGiveIdenticalBitsRunToRun) {
  MOEKIT_REQUIRE_SM90();
  const Context& ctx = sm90();
  const std::vector<int64_t> counts{120, 0, 333, 1, 0, 600};
  const int64_t T = 1200, K = 384, N = 200, G = 6;
  Tensor x = to_device(ctx, test::random_normal({T, K}, DType::BF16, 21));
  Tensor w = to_device(ctx, test::random_normal({G, N, K}, DType::BF16, 22, 0.05));
  Tensor d = to_device(ctx, test::counts_tensor(counts, DType::I32));
  std::vector<std::vector<uint8_t>> images;
  for (int run = 0; run < 3; ++run) {
    Guarded out(ctx, T, N, DType::BF16);
    grouped_gemm_group_m(ctx, x, w, BOp::Transposed,
                         run == 0 ? Splits::host(counts) : Splits::device(d), out.view);
    images.push_back(test::bytes_of(ctx, out.buffer));
  }
  EXPECT_TRUE(test::bit_identical(images[1], images[0], DType::BF16)) << "device vs host counts";
  EXPECT_TRUE(test::bit_identical(images[2], images[1], DType::BF16)) << "run to run";
}

TEST(CudaSm90, RejectsWhatTmaCannotAddressAndNamesTheReason) {
  MOEKIT_REQUIRE_SM90();
  const Context& ctx = sm90();
  Tensor a = Tensor::empty({16, 12}, DType::BF16, ctx);  // K = 12: not a multiple of 8
  Tensor w = Tensor::empty({2, 16, 12}, DType::BF16, ctx);
  Tensor out = Tensor::empty({16, 16}, DType::BF16, ctx);
  auto e = caught([&] { grouped_gemm_group_m(ctx, a, w, BOp::Transposed, Splits::host({8, 8}), out); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind(), ErrorKind::Unsupported);
  EXPECT_THAT(e->what(), ::testing::HasSubstr("K = 12 is not a multiple of 8"));
  // f32 is not a dtype of these kernels (without forcing, cuBLAS takes such calls).
  Tensor a32 = Tensor::empty({16, 16}, DType::F32, ctx);
  Tensor w32 = Tensor::empty({2, 16, 16}, DType::F32, ctx);
  Tensor o32 = Tensor::empty({16, 16}, DType::F32, ctx);
  e = caught([&] { grouped_gemm_group_m(ctx, a32, w32, BOp::Transposed, Splits::host({8, 8}), o32); });
  ASSERT_TRUE(e.has_value());
  EXPECT_THAT(e->what(), ::testing::HasSubstr("dtype bf16 or f16 only, got f32"));
}

// ---------------------------------------------------------------- graph capture

// The CUDA runtime entry points this test needs, from the libcudart that libmoekit loaded.
struct CudaGraphApi {
  using Stream = void*;
  int (*stream_create)(Stream*, unsigned) = nullptr;          // cudaStreamCreateWithFlags
  int (*stream_destroy)(Stream) = nullptr;                    // cudaStreamDestroy
  int (*stream_sync)(Stream) = nullptr;                       // cudaStreamSynchronize
  int (*begin_capture)(Stream, int) = nullptr;                // cudaStreamBeginCapture
  int (*end_capture)(Stream, void**) = nullptr;               // cudaStreamEndCapture
  int (*instantiate)(void**, void*, unsigned long long) = nullptr;  // cudaGraphInstantiate
  int (*launch)(void*, Stream) = nullptr;                     // cudaGraphLaunch
  int (*exec_destroy)(void*) = nullptr;                       // cudaGraphExecDestroy
  int (*graph_destroy)(void*) = nullptr;                      // cudaGraphDestroy
  int (*get_nodes)(void*, void**, size_t*) = nullptr;         // cudaGraphGetNodes
  bool ok = false;

  CudaGraphApi() {
    void* lib = nullptr;
    for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
      if ((lib = dlopen(name, RTLD_NOW | RTLD_NOLOAD))) break;
    }
    if (!lib) return;
    auto get = [&](auto& fn, const char* sym) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, sym));
      return fn != nullptr;
    };
    ok = get(stream_create, "cudaStreamCreateWithFlags") && get(stream_destroy, "cudaStreamDestroy") &&
         get(stream_sync, "cudaStreamSynchronize") && get(begin_capture, "cudaStreamBeginCapture") &&
         get(end_capture, "cudaStreamEndCapture") && get(instantiate, "cudaGraphInstantiate") &&
         get(launch, "cudaGraphLaunch") && get(exec_destroy, "cudaGraphExecDestroy") &&
         get(graph_destroy, "cudaGraphDestroy") && get(get_nodes, "cudaGraphGetNodes");
  }
};

// GroupedLinear::forward with device splits and a caller output buffer is captured once; the
// graph is replayed after the counts tensor (and nothing else) changes: uniform, zero-row groups
// with a tail, everything in one group, nothing at all. Each replay matches the fp64 reference
// of ITS counts and leaves the tail and guard bands untouched.
TEST(CudaSm90, GraphCapturedForwardReplaysWithNewDeviceCounts) {
  MOEKIT_REQUIRE_SM90();
  static const CudaGraphApi api;
  if (!api.ok) GTEST_SKIP() << "libcudart entry points not found through dlopen";
  constexpr int kNonBlocking = 1, kCaptureGlobal = 0;
  void* stream = nullptr;
  ASSERT_EQ(api.stream_create(&stream, kNonBlocking), 0);
  {
    const Context ctx = Context::cuda(0, stream).with_backend("sm90");
    const int64_t G = 8, T = 2048, K = 256, N = 192;
    GroupedLinear fc({.groups = G, .in = K, .out = N, .dtype = DType::BF16, .bias = true}, ctx);
    Tensor w_h = test::random_normal({G, N, K}, DType::BF16, 31, 1.0 / 16);
    Tensor b_h = test::random_normal({G, N}, DType::BF16, 32);
    Tensor x_h = test::random_normal({T, K}, DType::BF16, 33);
    copy(ctx, w_h, fc.weight());
    copy(ctx, b_h, fc.bias());
    Tensor x = to_device(ctx, x_h);
    Tensor counts = to_device(ctx, test::counts_tensor(std::vector<int64_t>(G, T / G), DType::I64));
    Guarded y(ctx, T, N, DType::BF16);
    ctx.synchronize();

    void* graph = nullptr;
    void* exec = nullptr;
    ASSERT_EQ(api.begin_capture(stream, kCaptureGlobal), 0);
    Tensor result;
    auto err = caught([&] {
      result = fc.forward(x, Splits::device(counts), {.output = y.view, .input_requires_grad = false});
    });
    ASSERT_EQ(api.end_capture(stream, &graph), 0) << "capture was invalidated (a host sync?)";
    ASSERT_FALSE(err.has_value()) << err->what();
    EXPECT_EQ(result.data(), y.view.data()) << "the output is the caller's buffer";
    size_t nodes = 0;
    ASSERT_EQ(api.get_nodes(graph, nullptr, &nodes), 0);
    EXPECT_GE(nodes, 2u) << "setup kernel + grouped GEMM";
    ASSERT_EQ(api.instantiate(&exec, graph, 0), 0);

    const std::vector<std::vector<int64_t>> scenarios = {
        {256, 256, 256, 256, 256, 256, 256, 256},
        {0, 700, 0, 1, 1000, 0, 33, 7},
        {0, 0, 0, 0, 0, 0, 0, 2000},
        {0, 0, 0, 0, 0, 0, 0, 0},
    };
    for (const auto& cnt : scenarios) {
      copy(ctx, test::counts_tensor(cnt, DType::I64), counts);
      y.refill();
      ASSERT_EQ(api.launch(exec, stream), 0);
      ASSERT_EQ(api.stream_sync(stream), 0);
      const test::Reference ref =
          test::reference_forward(doubles_of(x_h), doubles_of(w_h), doubles_of(b_h), cnt, K, N);
      EXPECT_TRUE(test::matches_reference("graph replay", y.values(), ref, DType::BF16))
          << "counts " << ::testing::PrintToString(cnt);
      EXPECT_TRUE(y.untouched_outside(sum_of(cnt))) << "counts " << ::testing::PrintToString(cnt);
    }
    api.exec_destroy(exec);
    api.graph_destroy(graph);
    ctx.synchronize();
  }
  api.stream_destroy(stream);
}

}  // namespace
}  // namespace moekit
