// test_cuda_runtime — the CUDA backend below the ops: runtime hooks (device count, context,
// stream-ordered allocator, copy, fill, errors) and the cuBLAS / kernel primitives checked with
// guard bands (outputs are views in the middle of larger sentinel-filled buffers: nothing
// outside the view, and nothing in rows [S, T), may change), skewed large shapes against the fp64
// reference, bitwise run-to-run determinism and device-split validation. moekit's own kernels
// (SwiGLU, grouped bias add / gradients) read device counts on the device: one case captures them
// all in a CUDA graph and replays it with new counts, another feeds them invalid counts (nothing
// written, the context's error word set), a third runs thousands of groups (their row-offset
// table spans several scan chunks and, above 48 KB, opted-in shared memory).
//
// Every case that needs a GPU skips with the reason when Context::cuda_device_count() == 0 (CI);
// the cases named ...WithoutGpu run everywhere. Suite names start with "Cuda" so that
// --gtest_filter='Cuda*' selects them (tools/gpu-check runs compute-sanitizer that way).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "core/side_stream.h"  // internal: the side stream's ordering (its tests below)
#include "moekit/moekit.h"
#include "support/mlp_reference.h"
#include "support/cuda_graph.h"
#include "support/reference.h"
#include "support/test_util.h"

namespace moekit {
namespace {

using ::testing::HasSubstr;
using test::caught;

// ================================================================ helpers

#define MOEKIT_REQUIRE_GPU()                                                                \
  do {                                                                                      \
    if (!Context::built_with_cuda()) GTEST_SKIP() << "built without the CUDA backend";      \
    if (Context::cuda_device_count() == 0) {                                                \
      GTEST_SKIP() << "no usable CUDA device (Context::cuda_device_count() == 0)";           \
    }                                                                                       \
  } while (0)

const Context& gpu() {
  static const Context ctx = Context::cuda(0);
  return ctx;
}

std::vector<uint8_t> host_bytes(const Tensor& host_tensor) {
  const auto* p = static_cast<const uint8_t*>(host_tensor.data());
  return {p, p + host_tensor.nbytes()};
}

std::vector<double> host_doubles(const Tensor& host_tensor) {
  std::vector<double> v(static_cast<size_t>(host_tensor.numel()));
  to_f64(host_tensor.data(), host_tensor.dtype(), v.data(), v.size());
  return v;
}

// Skewed group sizes: a Dirichlet(1) split of `total` rows (normalised exponentials, largest
// remainder rounding) with the groups listed in `empty` forced to zero rows.
std::vector<int64_t> skewed_counts(int64_t groups, int64_t total, uint64_t seed,
                                   std::vector<int64_t> empty = {}) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> e(1.0);
  std::vector<double> w(static_cast<size_t>(groups));
  double sum = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const bool is_empty = std::find(empty.begin(), empty.end(), g) != empty.end();
    w[static_cast<size_t>(g)] = is_empty ? 0.0 : e(rng);
    sum += w[static_cast<size_t>(g)];
  }
  std::vector<int64_t> counts(static_cast<size_t>(groups));
  int64_t assigned = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    counts[g] = static_cast<int64_t>(std::floor(w[g] / sum * static_cast<double>(total)));
    assigned += counts[g];
  }
  for (size_t g = 0; assigned < total; g = (g + 1) % counts.size()) {
    if (w[g] > 0) {
      ++counts[g];
      ++assigned;
    }
  }
  return counts;
}

using test::sum_of;

// A guarded view on the GPU (see test::GuardedBuffer).
struct Guarded : test::GuardedBuffer {
  Guarded(const Shape& shape, DType dt, int64_t guard_rows = 3)
      : GuardedBuffer(gpu(), shape, dt, guard_rows) {}
};

// ================================================================ runtime

TEST(CudaRuntime, DeviceCountIsNonNegativeWithoutGpu) {
  // Must never throw, also with no driver / no GPU (CI).
  int n = -1;
  EXPECT_NO_THROW(n = Context::cuda_device_count());
  EXPECT_GE(n, 0);
  if (!Context::built_with_cuda()) {
    EXPECT_EQ(n, 0);
    auto e = caught([] { Context::cuda(0); });
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->kind(), ErrorKind::Unsupported);
  } else if (n == 0) {
    auto e = caught([] { Context::cuda(0); });
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->kind(), ErrorKind::Unsupported);
    EXPECT_THAT(e->what(), HasSubstr("no CUDA device"));
  }
}

TEST(CudaRuntime, CublasBackendRejectsCpuContextWithoutGpu) {
  // Forcing the CUDA entries on a CPU context names the reason.
  if (!Context::built_with_cuda()) GTEST_SKIP() << "built without the CUDA backend";
  const Context cpu = Context::cpu(1).with_backend("cublas");
  Tensor a = test::random_normal({4, 8}, DType::F32, 1);
  Tensor b = test::random_normal({2, 6, 8}, DType::F32, 2);
  Tensor out = Tensor::empty({4, 6}, DType::F32, cpu);
  auto e = caught([&] { grouped_gemm_group_m(cpu, a, b, BOp::Transposed, Splits::host({1, 3}), out); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind(), ErrorKind::Unsupported);
  EXPECT_THAT(e->what(), HasSubstr("the context's device is cpu"));
}

TEST(CudaRuntime, ContextOwnsOrBorrowsStream) {
  MOEKIT_REQUIRE_GPU();
  const Context owner = Context::cuda(0);
  ASSERT_NE(owner.stream(), nullptr);
  EXPECT_EQ(owner.device(), Device::cuda(0));
  {
    const Context borrower = Context::cuda(0, owner.stream());
    EXPECT_EQ(borrower.stream(), owner.stream());
    Tensor t = Tensor::empty({1000}, DType::F32, borrower);
    fill(borrower, t, 3.0);
    borrower.synchronize();
  }  // destroying the borrower must leave the stream usable
  Tensor t = Tensor::empty({1000}, DType::F32, owner);
  fill(owner, t, 2.5);
  const auto v = test::to_doubles(owner, t);
  EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](double x) { return x == 2.5; }));
}

// The side stream (src/core/side_stream.h) of a CPU context is the context itself: side work
// runs in order, join() has nothing to wait for.
TEST(SideStream, OnACpuContextForkReturnsTheContextItself) {
  const Context cpu = Context::cpu(1);
  detail::SideStream side(cpu);
  EXPECT_TRUE(side.fork().same_context(cpu));
  side.join();
  detail::SideStream unwanted(cpu, /*wanted=*/false);
  EXPECT_TRUE(unwanted.fork().same_context(cpu));
}

// A CUDA context's side stream is a second stream (one per context, kept), and its work sits
// between fork() and join() in the context's stream order: each round fills a 256 MB source
// several times on the context's stream (the last value differs per round), copies it on the
// side stream, then reads the copy back on the context's stream. A fork that did not wait would
// copy a partly filled source; a join that did not wait would read a partly written copy.
TEST(SideStream, CudaSideWorkIsOrderedBetweenForkAndJoin) {
  MOEKIT_REQUIRE_GPU();
  if (const char* v = std::getenv("MOEKIT_SIDE_STREAM"); v && std::string(v) == "0") {
    GTEST_SKIP() << "MOEKIT_SIDE_STREAM=0: no side stream in this process";
  }
  const Context ctx = Context::cuda(0);
  constexpr int64_t kElems = int64_t{64} << 20;  // f32: 256 MB
  const Tensor src = Tensor::empty({kElems}, DType::F32, ctx), dst = Tensor::empty({kElems}, DType::F32, ctx);
  const void* side_stream = nullptr;
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    fill(ctx, dst, -1.0);
    for (int i = 0; i < 6; ++i) fill(ctx, src, i == 5 ? 10.0 + round : static_cast<double>(i));
    detail::SideStream side(ctx);
    const Context& s = side.fork();
    ASSERT_NE(s.stream(), ctx.stream()) << "a CUDA context's side work runs on a second stream";
    if (round == 0) side_stream = s.stream();
    EXPECT_EQ(s.stream(), side_stream) << "one side stream per context";
    EXPECT_EQ(s.device(), ctx.device());
    copy(s, src, dst);
    side.join();
    const Tensor host = Tensor::empty({kElems}, DType::F32, Context::cpu(1));
    copy(ctx, dst, host);  // on ctx's stream, after the join
    const float* v = host.data_as<float>();
    const float want = static_cast<float>(10 + round);
    int64_t wrong = 0;
    for (int64_t i = 0; i < kElems; ++i) wrong += v[i] != want;
    EXPECT_EQ(wrong, 0) << "elements of the side stream's copy that are not the last fill's value";
  }
}

TEST(CudaRuntime, AllocatorCountsAndFreesInStreamOrder) {
  MOEKIT_REQUIRE_GPU();
  const Context ctx = Context::cuda(0);
  ctx.allocator().reset_stats();
  for (int i = 0; i < 50; ++i) {
    Tensor t = Tensor::empty({1 << 20}, DType::BF16, ctx);
    fill(ctx, t, static_cast<double>(i));
  }  // each freed right after its fill was queued; the pool reuses the block
  ctx.synchronize();
  const auto s = ctx.allocator().stats();
  EXPECT_EQ(s.count, 50);
  EXPECT_EQ(s.largest, int64_t{2} << 20);
  Tensor empty = Tensor::empty({0, 7}, DType::F32, ctx);
  EXPECT_EQ(empty.numel(), 0);
}

// Large blocks (>= 1 MiB) freed on a context's stream are kept for the next allocation of about
// their size there (runtime.cpp, CudaAllocator; sizes rounded up to 2 MiB): the same block for the
// same size and for a request up to an eighth smaller, not for one smaller still (the pool cannot
// hand out its address either while the cache holds it); a reused block holds what its new owner
// writes.
TEST(CudaRuntime, AllocatorReusesALargeFreedBlockOnItsStream) {
  MOEKIT_REQUIRE_GPU();
  const Context ctx = Context::cuda(0);
  const int64_t mib = int64_t{1} << 20, n = 9 * mib;  // 18 MiB of bf16
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({n}, DType::BF16, ctx);
    first = t.data();
    fill(ctx, t, 3.0);
  }
  {
    Tensor t = Tensor::empty({n}, DType::BF16, ctx);
    EXPECT_EQ(t.data(), first) << "the freed 18 MiB block was not reused for the same size";
    fill(ctx, t, -2.0);
    const std::vector<double> v = test::to_doubles(ctx, t);
    EXPECT_EQ(std::count(v.begin(), v.end(), -2.0), n);
  }
  {
    Tensor t = Tensor::empty({16 * mib}, DType::U8, ctx);  // 18 <= 16 + 16 / 8
    EXPECT_EQ(t.data(), first) << "a 16 MiB request did not take the cached 18 MiB block";
  }
  {
    Tensor smaller = Tensor::empty({14 * mib}, DType::U8, ctx);  // 18 > 14 + 14 / 8
    EXPECT_NE(smaller.data(), first);
    Tensor t = Tensor::empty({n}, DType::BF16, ctx);
    EXPECT_EQ(t.data(), first);
  }
  ctx.synchronize();
}

// Stream capture bypasses the cache: a capture never takes a cached block (the graph would write
// it at every replay while its next owner uses it); after the capture the cached block is reused.
// (A block the capture allocated and freed is the graph's, and goes back to the pool.)
TEST(CudaRuntime, AllocatorCacheIsBypassedUnderStreamCapture) {
  MOEKIT_REQUIRE_GPU();
  const test::CudaGraphApi& api = test::CudaGraphApi::get();
  ASSERT_TRUE(api.ok) << "libcudart entry points not found through dlopen (the runtime libmoekit loaded)";
  const test::OwnedStream owned(api);  // outlives the context (which borrows it) and its tensors
  void* stream = owned.get();
  ASSERT_NE(stream, nullptr);
  {
    const Context ctx = Context::cuda(0, stream);
    const int64_t n = int64_t{4} << 20;
    void* cached = nullptr;
    {
      Tensor t = Tensor::empty({n}, DType::BF16, ctx);
      cached = t.data();
    }
    void* graph = nullptr;
    void* in_graph = nullptr;
    const std::string why = api.capture(stream, [&] {
      Tensor t = Tensor::empty({n}, DType::BF16, ctx);
      in_graph = t.data();
      fill(ctx, t, 1.0);
    }, &graph);
    ASSERT_EQ(why, "");
    EXPECT_NE(in_graph, cached) << "the capture took the cached block";
    api.graph_destroy(graph);
    Tensor after = Tensor::empty({n}, DType::BF16, ctx);
    EXPECT_EQ(after.data(), cached) << "the block cached before the capture was not reused after it";
    ctx.synchronize();
  }
}

// Context::release_cached_memory gives the kept blocks and the pool's unused memory back to the
// driver: the pool's reserved memory (Context::memory_reserved, this process's own: the device's
// free memory moves with the other test processes) falls by at least the kept block; the next
// allocation still works. Under stream capture it refuses (it would wait for the stream) and the
// capture holds.
TEST(CudaRuntime, ReleaseCachedMemoryGivesKeptBlocksBackAndRefusesUnderCapture) {
  MOEKIT_REQUIRE_GPU();
  const test::CudaGraphApi& api = test::CudaGraphApi::get();
  ASSERT_TRUE(api.ok) << "libcudart entry points not found through dlopen (the runtime libmoekit loaded)";
  const test::OwnedStream owned(api);  // outlives the context (which borrows it) and its tensors
  ASSERT_NE(owned.get(), nullptr);
  {
    const Context ctx = Context::cuda(0, owned.get());
    const size_t bytes = size_t{64} << 20;
    size_t reserved_in_use = 0;
    {
      Tensor t = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, ctx);
      reserved_in_use = ctx.memory_reserved();
    }  // kept by the allocator
    ctx.synchronize();
    // (How much the pool grows for it is the pool's choice: under racecheck it placed half of the
    // block in memory it had reserved before, H100, 2026-12-06.)
    EXPECT_GE(reserved_in_use, bytes) << "the pool reserved the block";
    const size_t reserved_kept = ctx.memory_reserved();
    EXPECT_EQ(reserved_kept, reserved_in_use) << "a kept block stays reserved";
    ctx.release_cached_memory();
    const size_t reserved_after = ctx.memory_reserved();
    EXPECT_LE(reserved_after + bytes, reserved_kept)
        << "reserved with the block kept " << reserved_kept << ", after the release " << reserved_after;
    const int64_t n = static_cast<int64_t>(bytes / 2);  // bf16 elements
    Tensor again = Tensor::empty({n}, DType::BF16, ctx);
    fill(ctx, again, 5.0);
    EXPECT_EQ(test::to_doubles(ctx, again.rows(n - 1, n))[0], 5.0);
    void* graph = nullptr;
    const std::string why = api.capture(owned.get(), [&] { ctx.release_cached_memory(); }, &graph);
    EXPECT_THAT(why, HasSubstr("being captured")) << "the refusal's message";
    EXPECT_THAT(why, ::testing::Not(HasSubstr("invalidated"))) << "the capture was broken";
    if (graph) api.graph_destroy(graph);
    ctx.synchronize();
  }
  EXPECT_EQ(Context::cpu().memory_reserved(), 0u);
}

TEST(CudaRuntime, RuntimeErrorNamesCallAndStatus) {
  MOEKIT_REQUIRE_GPU();
  auto e = caught([] { Tensor::empty({int64_t{1} << 50}, DType::U8, gpu()); });  // 1 PiB
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind(), ErrorKind::Runtime);
  EXPECT_THAT(e->what(), HasSubstr("cudaMallocFromPoolAsync"));
  EXPECT_THAT(e->what(), HasSubstr("cudaError"));  // the status name, e.g. ...MemoryAllocation
  // The context stays usable after the failure.
  Tensor t = Tensor::empty({16}, DType::F32, gpu());
  fill(gpu(), t, 1.0);
  EXPECT_EQ(test::to_doubles(gpu(), t)[15], 1.0);
}

TEST(CudaRuntime, CopyRoundTripsEveryDtype) {
  MOEKIT_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::F8E4M3, DType::F8E5M2, DType::I32,
                   DType::I64, DType::U8}) {
    SCOPED_TRACE(std::string(name(dt)));
    for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{100003}}) {
      Tensor host = Tensor::empty({n}, dt, test::host());
      auto* p = static_cast<uint8_t*>(host.data());
      std::mt19937 rng(static_cast<unsigned>(n));
      for (size_t i = 0; i < host.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng());
      Tensor d1 = to_device(gpu(), host);                  // H2D
      Tensor d2 = Tensor::empty({n}, dt, gpu());
      copy(gpu(), d1, d2);                                 // D2D
      Tensor back = Tensor::empty({n}, dt, test::host());
      copy(gpu(), d2, back);                               // D2H (synchronises)
      EXPECT_EQ(host_bytes(back), host_bytes(host));
    }
  }
}

TEST(CudaRuntime, CopyFromCpuContextIsSynchronous) {
  MOEKIT_REQUIRE_GPU();
  Tensor host = test::random_normal({513}, DType::F32, 9);
  Tensor dev = Tensor::empty({513}, DType::F32, gpu());
  copy(test::host(), host, dev);
  Tensor back = Tensor::empty({513}, DType::F32, test::host());
  copy(test::host(), dev, back);
  EXPECT_EQ(host_bytes(back), host_bytes(host));
}

// The stored bytes of `value` in `dt`: integers by conversion, floating types by core's rounding.
std::vector<uint8_t> encoded(double value, DType dt) {
  std::vector<uint8_t> out(size_of(dt));
  switch (dt) {
    case DType::I32: { const auto v = static_cast<int32_t>(value); std::memcpy(out.data(), &v, 4); break; }
    case DType::I64: { const auto v = static_cast<int64_t>(value); std::memcpy(out.data(), &v, 8); break; }
    case DType::U8: out[0] = static_cast<uint8_t>(value); break;
    default: from_f64(&value, out.data(), dt, 1);
  }
  return out;
}

TEST(CudaRuntime, FillMatchesHostEncodingEveryDtypeInsideGuardBands) {
  MOEKIT_REQUIRE_GPU();
  constexpr int64_t kPad = 3, kRows = 1001, kCols = 3;
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::F8E4M3, DType::F8E5M2, DType::I32,
                   DType::I64, DType::U8}) {
    for (double value : {0.0, 1.0, -1.5, 3.14159, 1000.25}) {
      if (!is_floating(dt) && value < 0 && dt == DType::U8) continue;
      SCOPED_TRACE(str(name(dt), " value ", value));
      Tensor buffer = Tensor::empty({kPad + kRows + kPad, kCols}, dt, gpu());
      fill(gpu(), buffer, test::kSentinel);
      fill(gpu(), buffer.rows(kPad, kPad + kRows), value);
      const auto bytes = test::bytes_of(gpu(), buffer);
      const auto sentinel = encoded(test::kSentinel, dt), want = encoded(value, dt);
      const size_t es = size_of(dt);
      int64_t bad_inside = 0, bad_outside = 0;
      for (int64_t r = 0; r < kPad + kRows + kPad; ++r) {
        const bool inside = r >= kPad && r < kPad + kRows;
        for (int64_t c = 0; c < kCols; ++c) {
          const uint8_t* e = bytes.data() + static_cast<size_t>(r * kCols + c) * es;
          if (std::memcmp(e, (inside ? want : sentinel).data(), es) != 0) ++(inside ? bad_inside : bad_outside);
        }
      }
      EXPECT_EQ(bad_inside, 0) << "elements of the view not set to the value";
      EXPECT_EQ(bad_outside, 0) << "guard-band elements changed";
    }
  }
}

// A fill of a 16-bit tensor at an odd byte address cannot use 2-byte stores: refused cleanly.
TEST(CudaRuntime, FillRefusesMisalignedElements) {
  MOEKIT_REQUIRE_GPU();
  Tensor bytes = Tensor::empty({64}, DType::U8, gpu());
  Tensor odd = Tensor::wrap(static_cast<char*>(bytes.data()) + 1, {8}, DType::BF16, gpu().device());
  auto e = caught([&] { fill(gpu(), odd, 1.5); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
}

// ================================================================ primitives with guard bands

struct GemmCase {
  DType dtype;
  int64_t T, K, N;
  std::vector<int64_t> counts;  // S = sum <= T
  bool bias;
};

std::string label(const GemmCase& c) {
  return str(name(c.dtype), " T=", c.T, " K=", c.K, " N=", c.N, " S=", sum_of(c.counts),
             " G=", c.counts.size(), c.bias ? " +bias" : "");
}

std::vector<GemmCase> gemm_cases() {
  return {
      {DType::BF16, 64, 32, 48, {10, 0, 31, 7, 0}, false},
      {DType::BF16, 64, 32, 48, {10, 0, 31, 7, 0}, true},
      {DType::F16, 50, 40, 24, {0, 25, 0, 20}, true},
      {DType::F32, 77, 19, 13, {5, 0, 1, 60}, true},   // odd sizes: misaligned group starts
      {DType::F32, 77, 19, 13, {5, 0, 1, 60}, false},
      {DType::BF16, 9, 8, 8, {0, 0, 0}, false},         // every group empty: nothing written
      {DType::BF16, 2048, 384, 640, skewed_counts(8, 1900, 11, {2, 5}), true},  // skewed, large
      {DType::BF16, 2048, 640, 384, skewed_counts(8, 2048, 12, {0}), false},
      // Many small groups: one grouped-batched cuBLAS call instead of a loop.
      {DType::BF16, 700, 64, 96, skewed_counts(40, 650, 13, {3, 7, 8}), true},
      {DType::BF16, 700, 64, 96, skewed_counts(40, 650, 13, {3, 7, 8}), false},
      {DType::F16, 520, 40, 56, skewed_counts(24, 520, 15, {0}), false},
      {DType::F32, 300, 24, 40, skewed_counts(16, 300, 14), false},
      // Many small equal groups (uniform routing): cuBLAS strided-batched runs, also split by
      // empty groups into several runs; tails past S.
      {DType::BF16, 645, 64, 96, std::vector<int64_t>(10, 64), false},
      {DType::BF16, 645, 64, 96, std::vector<int64_t>(10, 64), true},
      {DType::F16, 581, 40, 56, {48, 48, 48, 0, 48, 48, 48, 48, 0, 48, 48, 48, 48, 48}, false},
      {DType::F32, 520, 24, 40, std::vector<int64_t>(16, 32), false},
  };
}

TEST(CudaGroupedGemm, GroupMForwardMatchesReferenceInsideGuardBands) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 100;
  for (const GemmCase& c : gemm_cases()) {
    SCOPED_TRACE(label(c));
    const int64_t G = static_cast<int64_t>(c.counts.size()), S = sum_of(c.counts);
    Tensor x = test::random_normal({c.T, c.K}, c.dtype, ++seed);
    Tensor w = test::random_normal({G, c.N, c.K}, c.dtype, ++seed);
    Tensor b = c.bias ? test::random_normal({G, c.N}, c.dtype, ++seed) : Tensor();
    Guarded out({c.T, c.N}, c.dtype);
    grouped_gemm_group_m(gpu(), to_device(gpu(), x), to_device(gpu(), w), BOp::Transposed,
                         Splits::host(c.counts), out.view,
                         c.bias ? to_device(gpu(), b) : Tensor());
    EXPECT_TRUE(out.untouched_outside(S));
    const auto ref = test::reference_forward(host_doubles(x), host_doubles(w),
                                             c.bias ? host_doubles(b) : std::vector<double>{},
                                             c.counts, c.K, c.N);
    EXPECT_TRUE(test::matches_reference("y", out.values(), ref, c.dtype));
  }
}

TEST(CudaGroupedGemm, GroupMDgradMatchesReferenceInsideGuardBands) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 200;
  for (const GemmCase& c : gemm_cases()) {
    if (c.bias) continue;
    SCOPED_TRACE(label(c));
    const int64_t G = static_cast<int64_t>(c.counts.size()), S = sum_of(c.counts);
    Tensor dy = test::random_normal({c.T, c.N}, c.dtype, ++seed);
    Tensor w = test::random_normal({G, c.N, c.K}, c.dtype, ++seed);
    Guarded dx({c.T, c.K}, c.dtype);
    grouped_gemm_group_m(gpu(), to_device(gpu(), dy), to_device(gpu(), w), BOp::Plain,
                         Splits::host(c.counts), dx.view);
    EXPECT_TRUE(dx.untouched_outside(S));
    const auto ref = test::reference_dgrad(host_doubles(dy), host_doubles(w), c.counts, c.K, c.N);
    EXPECT_TRUE(test::matches_reference("dx", dx.values(), ref, c.dtype));
  }
}

TEST(CudaGroupedGemm, GroupKWgradMatchesReferenceInsideGuardBands) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 300;
  for (const GemmCase& c : gemm_cases()) {
    for (bool accumulate : {false, true}) {
      const DType dw_type = accumulate ? DType::F32 : c.dtype;
      SCOPED_TRACE(label(c) + (accumulate ? " accumulate into f32" : ""));
      const int64_t G = static_cast<int64_t>(c.counts.size());
      Tensor dy = test::random_normal({c.T, c.N}, c.dtype, ++seed);
      Tensor x = test::random_normal({c.T, c.K}, c.dtype, ++seed);
      // dw: a [G, N, K] view in the middle of a flat sentinel buffer (rows of one element).
      Guarded dw({G * c.N * c.K}, dw_type, 5);
      Tensor dw_view = dw.view.view({G, c.N, c.K});
      std::vector<double> start;
      if (accumulate) {
        Tensor s = test::random_normal({G, c.N, c.K}, DType::F32, ++seed);
        copy(gpu(), s, dw_view);
        start = host_doubles(s);
      }
      grouped_gemm_group_k(gpu(), to_device(gpu(), dy), to_device(gpu(), x),
                           Splits::host(c.counts), dw_view, accumulate);
      EXPECT_TRUE(dw.untouched_outside(G * c.N * c.K));
      const auto got = dw.values();
      const auto ref = test::reference_wgrad(host_doubles(dy), host_doubles(x), c.counts, c.K,
                                             c.N, start);
      EXPECT_TRUE(test::matches_reference("dw", got, ref, dw_type));
      // Empty groups: exactly 0, or exactly unchanged when accumulating.
      for (int64_t g = 0; g < G; ++g) {
        if (c.counts[static_cast<size_t>(g)] != 0) continue;
        for (int64_t i = g * c.N * c.K; i < (g + 1) * c.N * c.K; ++i) {
          const double want = accumulate ? start[static_cast<size_t>(i)] : 0.0;
          ASSERT_EQ(got[static_cast<size_t>(i)], want) << "group " << g << " element " << i;
        }
      }
    }
  }
}

TEST(CudaGroupedGemm, BiasGradMatchesReferenceInsideGuardBands) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 400;
  for (const GemmCase& c : gemm_cases()) {
    for (bool accumulate : {false, true}) {
      const DType db_type = accumulate ? DType::F32 : c.dtype;
      SCOPED_TRACE(label(c) + (accumulate ? " accumulate into f32" : ""));
      const int64_t G = static_cast<int64_t>(c.counts.size());
      Tensor dy = test::random_normal({c.T, c.N}, c.dtype, ++seed);
      Guarded db({G, c.N}, db_type);
      std::vector<double> start(static_cast<size_t>(G * c.N), 0.0);
      if (accumulate) {
        Tensor s = test::random_normal({G, c.N}, DType::F32, ++seed);
        copy(gpu(), s, db.view);
        start = host_doubles(s);
      }
      grouped_bias_grad(gpu(), to_device(gpu(), dy), Splits::host(c.counts), db.view, accumulate);
      EXPECT_TRUE(db.untouched_outside(G));
      auto ref = test::reference_dbias(host_doubles(dy), c.counts, c.N);
      if (accumulate) {
        for (size_t i = 0; i < start.size(); ++i) {
          ref.value[i] += start[i];
          ref.magnitude[i] += std::abs(start[i]);
          ref.length[i] += 1;
        }
      }
      EXPECT_TRUE(test::matches_reference("db", db.values(), ref, db_type));
    }
  }
}

// The bias must be added to the fp32 product before the one rounding into the output dtype. With
// every row of x equal, y[r, n] = c_n + bias_n for all r; choosing bias_n ≈ -c_n makes the result
// small while the product is large, so a kernel that rounds the product to 16 bits before adding
// the bias is off by many ulps of the result (the fp64 reference rule then fails). cuBLAS does
// this differently for aligned and misaligned operands (see grouped_gemm_cublas.cpp), so the
// cases cover: 16-byte aligned operands, a K that misaligns every row, operands at an odd
// element offset with aligned leading dimensions, and a bias alone at an odd offset.
TEST(CudaGroupedGemm, BiasIsAddedBeforeTheOneRounding) {
  MOEKIT_REQUIRE_GPU();
  enum class Offset { None, Operands, BiasOnly };
  struct Case3 {
    int64_t K, N;
    Offset offset;
  };
  // Copies host tensor `t` to the GPU, at an odd element offset when `shifted`.
  auto upload = [](const Tensor& t, bool shifted, std::vector<Tensor>& keep) {
    if (!shifted) return to_device(gpu(), t);
    Tensor flat = Tensor::empty({t.numel() + 1}, t.dtype(), gpu());
    keep.push_back(flat);
    Tensor view = flat.rows(1, 1 + t.numel()).view(t.shape());
    copy(gpu(), t, view);
    return view;
  };
  for (DType dt : {DType::BF16, DType::F16}) {
    for (Case3 c : {Case3{64, 128, Offset::None}, Case3{256, 96, Offset::None},
                    Case3{19, 70, Offset::None}, Case3{64, 128, Offset::Operands},
                    Case3{64, 128, Offset::BiasOnly}}) {
      SCOPED_TRACE(str(name(dt), " K=", c.K, " N=", c.N, " offset ", static_cast<int>(c.offset)));
      const std::vector<int64_t> counts{64, 0, 40};
      const int64_t G = 3, T = 110, K = c.K, N = c.N;
      Tensor row = test::random_normal({1, K}, dt, 7 + static_cast<uint64_t>(K));
      Tensor x = Tensor::empty({T, K}, dt, test::host());
      for (int64_t r = 0; r < T; ++r) std::memcpy(x.rows(r, r + 1).data(), row.data(), row.nbytes());
      Tensor w = test::random_normal({G, N, K}, dt, 8 + static_cast<uint64_t>(N));
      const auto xd = host_doubles(x), wd = host_doubles(w);
      std::vector<double> bias_d(static_cast<size_t>(G * N));
      std::mt19937_64 rng(9);
      std::uniform_real_distribution<double> small(-1.0 / 64, 1.0 / 64);
      for (int64_t g = 0; g < G; ++g) {
        for (int64_t n = 0; n < N; ++n) {
          double prod = 0;
          for (int64_t k = 0; k < K; ++k) {
            prod += xd[static_cast<size_t>(k)] * wd[static_cast<size_t>((g * N + n) * K + k)];
          }
          bias_d[static_cast<size_t>(g * N + n)] = -prod + small(rng);
        }
      }
      Tensor bias = Tensor::empty({G, N}, dt, test::host());
      from_f64(bias_d.data(), bias.data(), dt, bias_d.size());
      std::vector<Tensor> keep;
      const bool shift_operands = c.offset == Offset::Operands;
      // y: a flat guarded buffer whose view starts 5 elements in (10 bytes: misaligned) when the
      // operands are shifted, else 3 aligned rows in.
      Guarded y_flat({T * N}, dt, shift_operands ? 5 : 3 * N);
      const Tensor y = y_flat.view.view({T, N});
      grouped_gemm_group_m(gpu(), upload(x, shift_operands, keep), upload(w, false, keep),
                           BOp::Transposed, Splits::host(counts), y,
                           upload(bias, c.offset == Offset::BiasOnly, keep));
      EXPECT_TRUE(y_flat.untouched_outside(104 * N));
      const auto ref = test::reference_forward(xd, wd, host_doubles(bias), counts, K, N);
      EXPECT_TRUE(test::matches_reference("y", y_flat.values(), ref, dt));
    }
  }
}

// ================================================================ determinism

TEST(CudaGroupedGemm, BitwiseReproducibleRunToRun) {
  MOEKIT_REQUIRE_GPU();
  const DType dt = DType::BF16;
  const int64_t T = 3000, K = 512, N = 768;
  // 8 large groups (a loop of GEMMs) and 48 small ones (one grouped-batched call).
  for (int64_t G : {8, 48}) {
    SCOPED_TRACE(str(G, " groups"));
    const auto counts = skewed_counts(G, 2900, 21, {3});
    Tensor x = to_device(gpu(), test::random_normal({T, K}, dt, 1));
    Tensor dy = to_device(gpu(), test::random_normal({T, N}, dt, 2));
    Tensor w = to_device(gpu(), test::random_normal({G, N, K}, dt, 3));
    Tensor b = to_device(gpu(), test::random_normal({G, N}, dt, 4));
    const Splits splits = Splits::host(counts);
    auto run = [&] {
      std::vector<std::vector<uint8_t>> r;
      Tensor y = test::filled(gpu(), {T, N}, dt, test::kSentinel);
      Tensor yb = test::filled(gpu(), {T, N}, dt, test::kSentinel);
      Tensor dx = test::filled(gpu(), {T, K}, dt, test::kSentinel);
      Tensor dw = Tensor::empty({G, N, K}, dt, gpu());
      Tensor main_grad = test::filled(gpu(), {G, N, K}, DType::F32, 0.5);
      Tensor db = Tensor::empty({G, N}, dt, gpu());
      grouped_gemm_group_m(gpu(), x, w, BOp::Transposed, splits, y);
      grouped_gemm_group_m(gpu(), x, w, BOp::Transposed, splits, yb, b);
      grouped_gemm_group_m(gpu(), dy, w, BOp::Plain, splits, dx);
      grouped_gemm_group_k(gpu(), dy, x, splits, dw, false);
      grouped_gemm_group_k(gpu(), dy, x, splits, main_grad, true);
      grouped_bias_grad(gpu(), dy, splits, db, false);
      for (const Tensor* t : {&y, &yb, &dx, &dw, &main_grad, &db}) r.push_back(test::bytes_of(gpu(), *t));
      return r;
    };
    const auto first = run();
    const auto second = run();
    const char* names[] = {"y", "y+bias", "dx", "dw", "main_grad", "db"};
    const DType types[] = {dt, dt, dt, dt, DType::F32, dt};
    for (size_t i = 0; i < first.size(); ++i) {
      EXPECT_TRUE(test::bit_identical(second[i], first[i], types[i])) << names[i];
    }
  }
}

// Context::with_sm_margin on the cuBLAS backend: its handle's (and cuBLASLt's) SM-count target.
// cuBLAS may pick another algorithm for fewer SMs, so the results are checked against the fp64
// reference (not bit for bit against a run on every SM): group-M with and without bias (cuBLASLt's
// bias epilogue), dgrad, wgrad, through the per-group loop (8 groups) and one grouped-batched call
// (48).
TEST(CudaGroupedGemm, SmMarginOnCublasMatchesReferenceInsideGuardBands) {
  MOEKIT_REQUIRE_GPU();
  const test::CudaGraphApi& api = test::CudaGraphApi::get();
  ASSERT_TRUE(api.ok) << "libcudart entry points not found through dlopen (the runtime libmoekit loaded)";
  const int sms = api.sm_count(0);
  ASSERT_GT(sms, 17);
  const DType dt = DType::BF16;
  const int64_t T = 1100, K = 256, N = 384;
  uint64_t seed = 700;
  for (int margin : {16, sms - 1}) {
    const Context ctx = gpu().with_backend("cublas").with_sm_margin(margin);
    for (int64_t G : {8, 48}) {
      SCOPED_TRACE(str("margin ", margin, ", ", G, " groups"));
      const auto counts = skewed_counts(G, 1090, seed, {2});
      const int64_t S = sum_of(counts);
      const Tensor x = test::random_normal({T, K}, dt, ++seed),
                   dy = test::random_normal({T, N}, dt, ++seed);
      const Tensor w = test::random_normal({G, N, K}, dt, ++seed, 1.0 / 16);
      const Tensor b = test::random_normal({G, N}, dt, ++seed);
      const Splits splits = Splits::host(counts);
      Guarded y({T, N}, dt), dx({T, K}, dt), dw({G * N * K}, dt, 5);
      grouped_gemm_group_m(ctx, to_device(ctx, x), to_device(ctx, w), BOp::Transposed, splits,
                           y.view, to_device(ctx, b));
      grouped_gemm_group_m(ctx, to_device(ctx, dy), to_device(ctx, w), BOp::Plain, splits, dx.view);
      grouped_gemm_group_k(ctx, to_device(ctx, dy), to_device(ctx, x), splits,
                           dw.view.view({G, N, K}), false);
      EXPECT_TRUE(y.untouched_outside(S));
      EXPECT_TRUE(dx.untouched_outside(S));
      EXPECT_TRUE(dw.untouched_outside(G * N * K));
      EXPECT_TRUE(test::matches_reference(
          "y", y.values(),
          test::reference_forward(host_doubles(x), host_doubles(w), host_doubles(b), counts, K, N),
          dt));
      EXPECT_TRUE(test::matches_reference(
          "dx", dx.values(), test::reference_dgrad(host_doubles(dy), host_doubles(w), counts, K, N),
          dt));
      EXPECT_TRUE(test::matches_reference(
          "dw", dw.values(),
          test::reference_wgrad(host_doubles(dy), host_doubles(x), counts, K, N, {}), dt));
    }
  }
}

// ================================================================ device splits

TEST(CudaDeviceSplits, MatchHostSplitsBitwise) {
  MOEKIT_REQUIRE_GPU();
  const DType dt = DType::BF16;
  const int64_t T = 300, K = 64, N = 96, G = 6;
  const std::vector<int64_t> counts{40, 0, 100, 13, 0, 120};  // S = 273 < T
  Tensor x = to_device(gpu(), test::random_normal({T, K}, dt, 5));
  Tensor w = to_device(gpu(), test::random_normal({G, N, K}, dt, 6));
  Tensor dy = to_device(gpu(), test::random_normal({T, N}, dt, 7));
  Tensor y_host = test::filled(gpu(), {T, N}, dt, test::kSentinel);
  Tensor dw_host = Tensor::empty({G, N, K}, DType::F32, gpu());
  Tensor db_host = Tensor::empty({G, N}, DType::F32, gpu());
  grouped_gemm_group_m(gpu(), x, w, BOp::Transposed, Splits::host(counts), y_host);
  grouped_gemm_group_k(gpu(), dy, x, Splits::host(counts), dw_host, false);
  grouped_bias_grad(gpu(), dy, Splits::host(counts), db_host, false);
  for (DType ct : {DType::I32, DType::I64}) {
    SCOPED_TRACE(std::string("counts ") + std::string(name(ct)));
    const Splits dsplits = Splits::device(to_device(gpu(), test::counts_tensor(counts, ct)));
    Tensor y = test::filled(gpu(), {T, N}, dt, test::kSentinel);
    Tensor dw = Tensor::empty({G, N, K}, DType::F32, gpu());
    Tensor db = Tensor::empty({G, N}, DType::F32, gpu());
    grouped_gemm_group_m(gpu(), x, w, BOp::Transposed, dsplits, y);
    grouped_gemm_group_k(gpu(), dy, x, dsplits, dw, false);
    grouped_bias_grad(gpu(), dy, dsplits, db, false);
    EXPECT_TRUE(test::bit_identical(test::bytes_of(gpu(), y), test::bytes_of(gpu(), y_host), dt));
    EXPECT_TRUE(test::bit_identical(test::bytes_of(gpu(), dw), test::bytes_of(gpu(), dw_host), DType::F32));
    EXPECT_TRUE(test::bit_identical(test::bytes_of(gpu(), db), test::bytes_of(gpu(), db_host), DType::F32));
  }
}

TEST(CudaDeviceSplits, InvalidCountsAreRejectedBeforeAnyWrite) {
  MOEKIT_REQUIRE_GPU();
  const DType dt = DType::BF16;
  const int64_t T = 100, K = 32, N = 48, G = 4;
  Tensor x = to_device(gpu(), test::random_normal({T, K}, dt, 8));
  Tensor w = to_device(gpu(), test::random_normal({G, N, K}, dt, 9));
  Tensor dy = to_device(gpu(), test::random_normal({T, N}, dt, 10));
  struct Bad {
    std::vector<int64_t> counts;
    const char* names;  // what the message must mention
  };
  const Bad bad[] = {{{10, -3, 20, 5}, "count -3 for group 1"}, {{50, 30, 20, 1}, "S = 101"}};
  for (const Bad& b : bad) {
    for (DType ct : {DType::I32, DType::I64}) {
      SCOPED_TRACE(str(b.names, " counts ", name(ct)));
      const Splits s = Splits::device(to_device(gpu(), test::counts_tensor(b.counts, ct)));
      // Group-M on each GPU backend: "cublas" reads the counts to the host and raises at the
      // call; "sm90" never leaves the device (graph-safe): it writes nothing and sets the
      // context's error word, which check_device_errors() turns into the same kind of error.
      for (const char* backend : {"cublas", "sm90"}) {
        SCOPED_TRACE(backend);
        const Context ctx = gpu().with_backend(backend);
        Guarded y({T, N}, dt);
        auto e = caught([&] { grouped_gemm_group_m(ctx, x, w, BOp::Transposed, s, y.view); });
        if (e && e->kind() == ErrorKind::Unsupported) continue;  // backend not in this build/GPU
        if (e) {
          EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
          EXPECT_THAT(e->what(), HasSubstr("splits"));
          EXPECT_THAT(e->what(), HasSubstr(b.names));
          EXPECT_EQ(ctx.device_error_bits(), 0u);
        } else {
          EXPECT_STREQ(backend, "sm90") << "only the graph-safe backend may defer the error";
          auto flagged = caught([&] { ctx.check_device_errors(); });
          ASSERT_TRUE(flagged.has_value()) << "invalid device counts went unreported";
          EXPECT_EQ(flagged->kind(), ErrorKind::InvalidArgument);
          EXPECT_THAT(flagged->what(), HasSubstr("splits"));
          EXPECT_THAT(flagged->what(),
                      HasSubstr(b.counts[1] < 0 ? "a negative count" : "larger than the T rows"));
          EXPECT_EQ(ctx.device_error_bits(), 0u) << "reading the error word clears it";
        }
        EXPECT_TRUE(y.untouched_outside(0)) << "a rejected call wrote its output";
      }

      // dw in a guarded (unaligned) view: the sm90 group-K refuses it, so cuBLAS, forced (device
      // splits never choose it automatically), reads the counts on the host and raises at the call.
      Guarded dw({G * N * K}, DType::F32);
      auto e = caught([&] {
        grouped_gemm_group_k(gpu().with_backend("cublas"), dy, x, s, dw.view.view({G, N, K}), true);
      });
      ASSERT_TRUE(e.has_value());
      EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
      EXPECT_THAT(e->what(), HasSubstr(b.names));
      EXPECT_TRUE(dw.untouched_outside(0));

      // The bias gradient is moekit's own kernel, graph-safe: it checks the counts on the device
      // and defers the error like sm90 (more such kernels: InvalidCountsMakeActivationAnd...).
      Guarded db({G, N}, DType::F32);
      e = caught([&] { grouped_bias_grad(gpu(), dy, s, db.view, false); });
      EXPECT_FALSE(e.has_value()) << "the bias gradient read the device counts on the host";
      auto flagged = caught([&] { gpu().check_device_errors(); });
      ASSERT_TRUE(flagged.has_value()) << "invalid device counts went unreported";
      EXPECT_EQ(flagged->kind(), ErrorKind::InvalidArgument);
      EXPECT_THAT(flagged->what(), HasSubstr("splits"));
      EXPECT_THAT(flagged->what(),
                  HasSubstr(b.counts[1] < 0 ? "a negative count" : "larger than the T rows"));
      EXPECT_TRUE(db.untouched_outside(0));
    }
  }
}

// ================================================================ kernels reading device counts
// SwiGLU and the grouped bias kernels take device counts on the device (no host synchronisation):
// capturable in a CUDA graph, invalid counts reported through the context's error word.

// SwiGLU forward and backward (probs, dprobs written), the prob-scaled bias add, its gradient (db,
// and dprobs accumulated onto what the buffer holds) and the plain bias gradient, all with device
// counts, are captured once in a CUDA graph — a host synchronisation would invalidate the capture.
// The graph is replayed after only the counts tensor changed: zero-row groups with a tail, every
// row in one group, a few rows, no rows at all. Each replay matches the fp64 reference of ITS
// counts, and nothing changes outside the valid rows (tails and guard bands keep the sentinel;
// db's rows are all valid, zero-row groups exactly 0).
TEST(CudaDeviceSplits, GraphCapturedActivationAndBiasKernelsReplayWithNewCounts) {
  MOEKIT_REQUIRE_GPU();
  const test::CudaGraphApi& api = test::CudaGraphApi::get();
  ASSERT_TRUE(api.ok) << "libcudart entry points not found through dlopen (the runtime libmoekit loaded)";
  const test::OwnedStream owned(api);
  void* const stream = owned.get();
  ASSERT_NE(stream, nullptr);
  {
    const Context ctx = Context::cuda(0, stream);
    const DType dt = DType::BF16;
    const int64_t G = 5, T = 96, F = 160, N = 136;  // N: a full and a partial 128-column tile
    const GluLayout layout = GluLayout::Halves;
    const Tensor h_h = test::random_normal({T, 2 * F}, dt, 81, 2.0);
    const Tensor dz_h = test::random_normal({T, F}, dt, 82);
    const Tensor p_h = test::random_normal({T}, DType::F32, 83);
    const Tensor x_h = test::random_normal({T, N}, dt, 84);
    const Tensor b_h = test::random_normal({G, N}, dt, 85);
    const Tensor dy_h = test::random_normal({T, N}, dt, 86);
    const Tensor h = to_device(ctx, h_h), dz = to_device(ctx, dz_h), probs = to_device(ctx, p_h);
    const Tensor x = to_device(ctx, x_h), bias = to_device(ctx, b_h), dy = to_device(ctx, dy_h);
    const Tensor counts =
        to_device(ctx, test::counts_tensor(std::vector<int64_t>(G, 0), DType::I32));
    const Splits splits = Splits::device(counts);
    const test::GuardedBuffer z(ctx, {T, F}, dt), dh(ctx, {T, 2 * F}, dt);
    const test::GuardedBuffer dp_act(ctx, {T}, DType::F32), y(ctx, {T, N}, dt);
    const test::GuardedBuffer db_scaled(ctx, {G, N}, DType::F32), dp_bias(ctx, {T}, DType::F32);
    const test::GuardedBuffer db(ctx, {G, N}, dt);
    const test::GuardedBuffer* row_outputs[] = {&z, &dh, &dp_act, &y, &dp_bias};
    const test::GuardedBuffer* group_outputs[] = {&db_scaled, &db};
    ctx.synchronize();

    void* graph = nullptr;
    void* exec = nullptr;
    ASSERT_EQ(api.capture(stream, [&] {
      swiglu_forward(ctx, h, probs, splits, layout, z.view);
      swiglu_backward(ctx, h, probs, dz, splits, layout, dh.view, dp_act.view, false);
      grouped_bias_add(ctx, x, bias, probs, splits, y.view);
      grouped_scaled_bias_grad(ctx, dy, probs, bias, splits, db_scaled.view, dp_bias.view, true);
      grouped_bias_grad(ctx, dy, splits, db.view, false);
    }, &graph), "");
    size_t nodes = 0;
    ASSERT_EQ(api.get_nodes(graph, nullptr, &nodes), 0);
    EXPECT_GE(nodes, 6u) << "a kernel per call, two for the scaled bias gradient";
    ASSERT_EQ(api.instantiate(&exec, graph, 0), 0);

    const auto hd = host_doubles(h_h), dzd = host_doubles(dz_h), pd = host_doubles(p_h);
    const auto xd = host_doubles(x_h), bd = host_doubles(b_h), dyd = host_doubles(dy_h);
    // dp_bias accumulates onto its refilled contents: the sentinel.
    const std::vector<double> dp_start(static_cast<size_t>(T), test::kSentinel);
    const std::vector<std::vector<int64_t>> scenarios = {
        {20, 0, 33, 0, 18},  // zero-row groups, S = 71 < T
        {0, 0, 96, 0, 0},    // every row in one group, S = T
        {1, 0, 0, 2, 0},     // a few rows
        {0, 0, 0, 0, 0},     // none: db exactly 0, every row-grouped output untouched
    };
    for (const auto& cnt : scenarios) {
      SCOPED_TRACE("counts " + ::testing::PrintToString(cnt));
      const int64_t S = sum_of(cnt);
      copy(ctx, test::counts_tensor(cnt, DType::I32), counts);
      for (const auto* b : row_outputs) b->refill();
      for (const auto* b : group_outputs) b->refill();
      ASSERT_EQ(api.launch(exec, stream), 0);
      ASSERT_EQ(api.stream_sync(stream), 0);

      EXPECT_TRUE(test::matches_expected("z", z.values(),
                                         test::swiglu_forward_ref(hd, pd, S, F, layout, dt)));
      const test::SwigluGradExpected act = test::swiglu_backward_ref(hd, pd, dzd, S, F, layout, dt);
      EXPECT_TRUE(test::matches_expected("dh", dh.values(), act.dh));
      EXPECT_TRUE(test::matches_expected("dprobs of SwiGLU", dp_act.values(), act.dprobs));
      EXPECT_TRUE(
          test::matches_expected("y", y.values(), test::bias_add_ref(xd, bd, pd, cnt, N, dt)));
      const test::ScaledBiasGradExpected sb =
          test::scaled_bias_grad_ref(dyd, pd, bd, cnt, N, DType::F32, dp_start);
      EXPECT_TRUE(test::matches_expected("db (scaled)", db_scaled.values(), sb.db));
      EXPECT_TRUE(test::matches_expected("dprobs of the bias", dp_bias.values(), sb.dprobs));
      EXPECT_TRUE(
          test::matches_reference("db", db.values(), test::reference_dbias(dyd, cnt, N), dt));
      for (const auto* b : row_outputs) EXPECT_TRUE(b->untouched_outside(S));
      for (const auto* b : group_outputs) EXPECT_TRUE(b->untouched_outside(G));
    }
    EXPECT_EQ(ctx.device_error_bits(), 0u) << "valid counts flagged as invalid";
    api.exec_destroy(exec);
    api.graph_destroy(graph);
    ctx.synchronize();
  }
}

// Invalid device counts — a negative count, S > T, one count above T on its own — given to every
// activation and bias kernel: the call returns (the counts are never read on the host), every
// output byte keeps its sentinel, the context's error word holds the reason's bit (SPEC §1), and
// check_device_errors() raises InvalidArgument naming 'splits' and what was wrong. Also where the
// shape leaves nothing to write (dprobs accumulated over N = 0 columns) the counts are checked.
TEST(CudaDeviceSplits, InvalidCountsMakeActivationAndBiasKernelsWriteNothingAndSetTheErrorBit) {
  MOEKIT_REQUIRE_GPU();
  const Context ctx = Context::cuda(0);  // an error word of its own
  const DType dt = DType::BF16;
  const int64_t G = 4, T = 100, F = 64, N = 48;
  const GluLayout layout = GluLayout::Interleaved32;
  const Tensor h = to_device(ctx, test::random_normal({T, 2 * F}, dt, 91, 2.0));
  const Tensor dz = to_device(ctx, test::random_normal({T, F}, dt, 92));
  const Tensor probs = to_device(ctx, test::random_normal({T}, DType::F32, 93));
  const Tensor x = to_device(ctx, test::random_normal({T, N}, dt, 94));
  const Tensor bias = to_device(ctx, test::random_normal({G, N}, dt, 95));
  const Tensor dy = to_device(ctx, test::random_normal({T, N}, dt, 96));
  const Tensor dy0 = Tensor::empty({T, 0}, dt, ctx), bias0 = Tensor::empty({G, 0}, dt, ctx);
  const test::GuardedBuffer z(ctx, {T, F}, dt), dh(ctx, {T, 2 * F}, dt);
  const test::GuardedBuffer dp(ctx, {T}, DType::F32), y(ctx, {T, N}, dt);
  const test::GuardedBuffer db32(ctx, {G, N}, DType::F32), db(ctx, {G, N}, dt);
  const test::GuardedBuffer* outputs[] = {&z, &dh, &dp, &y, &db32, &db};

  struct Bad {
    std::vector<int64_t> counts;
    uint32_t bit;
    const char* says;  // in check_device_errors()'s message
  };
  const Bad bad[] = {{{10, -3, 20, 5}, Context::kNegativeCount, "a negative count"},
                     {{50, 30, 20, 1}, Context::kCountsExceedRows, "larger than the T rows"},
                     {{10, 101, 0, 0}, Context::kCountsExceedRows, "larger than the T rows"},
                     // counts whose sum wraps in 32 bits: each is caught above T on its own
                     {{2147483647, 2147483647, 5, 0}, Context::kCountsExceedRows,
                      "larger than the T rows"}};
  for (const Bad& b : bad) {
    for (DType ct : {DType::I32, DType::I64}) {
      SCOPED_TRACE(str(::testing::PrintToString(b.counts), " counts ", name(ct)));
      const Splits s = Splits::device(to_device(ctx, test::counts_tensor(b.counts, ct)));
      const std::pair<const char*, std::function<void()>> calls[] = {
          {"swiglu_forward", [&] { swiglu_forward(ctx, h, probs, s, layout, z.view); }},
          {"swiglu_backward",
           [&] { swiglu_backward(ctx, h, probs, dz, s, layout, dh.view, dp.view, false); }},
          {"swiglu_backward, dprobs accumulated",
           [&] { swiglu_backward(ctx, h, probs, dz, s, layout, dh.view, dp.view, true); }},
          {"grouped_bias_add", [&] { grouped_bias_add(ctx, x, bias, probs, s, y.view); }},
          {"grouped_bias_add, plain", [&] { grouped_bias_add(ctx, x, bias, Tensor(), s, y.view); }},
          {"grouped_scaled_bias_grad",
           [&] { grouped_scaled_bias_grad(ctx, dy, probs, bias, s, db32.view, dp.view, false); }},
          {"grouped_scaled_bias_grad, dprobs only, N = 0",
           [&] { grouped_scaled_bias_grad(ctx, dy0, probs, bias0, s, Tensor(), dp.view, true); }},
          {"grouped_bias_grad", [&] { grouped_bias_grad(ctx, dy, s, db.view, false); }},
          {"grouped_bias_grad, accumulated",
           [&] { grouped_bias_grad(ctx, dy, s, db32.view, true); }},
      };
      for (const auto& [what, call] : calls) {
        SCOPED_TRACE(what);
        for (const auto* o : outputs) o->refill();
        const auto e = caught(call);
        EXPECT_FALSE(e.has_value()) << "raised at the call (counts read on the host?): "
                                    << (e ? e->what() : "");
        EXPECT_EQ(ctx.device_error_bits(), b.bit);  // synchronises, then clears the word
        for (const auto* o : outputs) EXPECT_TRUE(o->untouched_outside(0));
      }
      swiglu_forward(ctx, h, probs, s, layout, z.view);
      const auto flagged = caught([&] { ctx.check_device_errors(); });
      ASSERT_TRUE(flagged.has_value()) << "invalid device counts went unreported";
      EXPECT_EQ(flagged->kind(), ErrorKind::InvalidArgument);
      EXPECT_THAT(flagged->what(), HasSubstr("splits"));
      EXPECT_THAT(flagged->what(), HasSubstr(b.says));
      EXPECT_EQ(ctx.device_error_bits(), 0u) << "reading the error word clears it";
    }
  }
}

// Thousands of experts: the bias kernels' table of row offsets spans several 256-group scan
// chunks, and for 7000 groups (56 KB) shared memory beyond the default 48 KB. Results from int64
// device counts (every 7th group empty, a tail) match the fp64 reference; 8192 groups are
// refused with the reason.
TEST(CudaDeviceSplits, ThousandsOfGroupsMatchReference) {
  MOEKIT_REQUIRE_GPU();
  const DType dt = DType::BF16;
  const int64_t N = 24;
  for (int64_t G : {1500, 7000}) {
    SCOPED_TRACE(str(G, " groups"));
    std::vector<int64_t> empty;
    for (int64_t g = 0; g < G; g += 7) empty.push_back(g);
    const std::vector<int64_t> cnt = skewed_counts(G, 3 * G, 97 + static_cast<uint64_t>(G), empty);
    const int64_t S = sum_of(cnt), T = S + 37;
    const Tensor x_h = test::random_normal({T, N}, dt, 98);
    const Tensor dy_h = test::random_normal({T, N}, dt, 99);
    const Tensor b_h = test::random_normal({G, N}, dt, 100);
    const Tensor p_h = test::random_normal({T}, DType::F32, 101);
    const Tensor x = to_device(gpu(), x_h), dy = to_device(gpu(), dy_h);
    const Tensor bias = to_device(gpu(), b_h), probs = to_device(gpu(), p_h);
    const Splits s = Splits::device(to_device(gpu(), test::counts_tensor(cnt, DType::I64)));
    Guarded y({T, N}, dt), db32({G, N}, DType::F32), dp({T}, DType::F32), db({G, N}, dt);
    grouped_bias_add(gpu(), x, bias, probs, s, y.view);
    grouped_scaled_bias_grad(gpu(), dy, probs, bias, s, db32.view, dp.view, false);
    grouped_bias_grad(gpu(), dy, s, db.view, false);
    EXPECT_EQ(gpu().device_error_bits(), 0u) << "valid counts flagged as invalid";

    const auto xd = host_doubles(x_h), dyd = host_doubles(dy_h), bd = host_doubles(b_h);
    const auto pd = host_doubles(p_h);
    EXPECT_TRUE(
        test::matches_expected("y", y.values(), test::bias_add_ref(xd, bd, pd, cnt, N, dt)));
    const test::ScaledBiasGradExpected sb =
        test::scaled_bias_grad_ref(dyd, pd, bd, cnt, N, DType::F32);
    EXPECT_TRUE(test::matches_expected("db (scaled)", db32.values(), sb.db));
    EXPECT_TRUE(test::matches_expected("dprobs", dp.values(), sb.dprobs));
    EXPECT_TRUE(test::matches_reference("db", db.values(), test::reference_dbias(dyd, cnt, N), dt));
    EXPECT_TRUE(y.untouched_outside(S));
    EXPECT_TRUE(dp.untouched_outside(S));
    EXPECT_TRUE(db32.untouched_outside(G));
    EXPECT_TRUE(db.untouched_outside(G));
  }

  const int64_t G = 8192, T = 16;
  const Tensor dy = to_device(gpu(), test::random_normal({T, N}, dt, 102));
  Guarded db({G, N}, DType::F32);
  const auto e = caught([&] {
    grouped_bias_grad(gpu(), dy, Splits::host(std::vector<int64_t>(G, 0)), db.view, false);
  });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind(), ErrorKind::Unsupported);
  EXPECT_THAT(e->what(), HasSubstr("G = 8192 groups"));
  EXPECT_THAT(e->what(), HasSubstr("at most 8191 groups"));
  EXPECT_TRUE(db.untouched_outside(0));
}

TEST(CudaGroupedGemm, ForcingCpuBackendOnGpuContextNamesTheReason) {
  MOEKIT_REQUIRE_GPU();
  const Context ctx = gpu().with_backend("cpu");
  Tensor a = to_device(gpu(), test::random_normal({4, 8}, DType::F32, 1));
  Tensor b = to_device(gpu(), test::random_normal({2, 6, 8}, DType::F32, 2));
  Tensor out = Tensor::empty({4, 6}, DType::F32, gpu());
  auto e = caught([&] { grouped_gemm_group_m(ctx, a, b, BOp::Transposed, Splits::host({1, 3}), out); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind(), ErrorKind::Unsupported);
  EXPECT_THAT(e->what(), HasSubstr("the context's device is cuda:0"));
}

}  // namespace
}  // namespace moekit
