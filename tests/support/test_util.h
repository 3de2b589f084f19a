// tests/support/test_util.h — data, devices and bitwise checks shared by every test binary.
//
// How the suites use it: data is generated on the host (seeded, random normal, rounded to the
// tensor's dtype), moved to the device under test with moekit::to_device / moekit::copy, and
// results are copied back (to_doubles / bytes_of) before anything reads them. Device pointers are
// never dereferenced here.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "moekit/moekit.h"

namespace moekit::test {

/// The CPU context that owns host-side test tensors.
const Context& host();

/// Host tensor of independent normal(0, stddev) draws rounded to `dtype` (floating dtypes).
/// The generator is our own Box–Muller over std::mt19937_64, so a seed gives the same values on
/// every platform and standard library. Exact zeros do not occur in practice (never zeros).
Tensor random_normal(const Shape& shape, DType dtype, uint64_t seed, double stddev = 1.0);

/// Host i32 or i64 tensor [G] holding `counts` (device-split tests move it with to_device).
Tensor counts_tensor(const std::vector<int64_t>& counts, DType dtype);

/// The value caller buffers are pre-filled with: exact in f32, f16 and bf16, and far from
/// nothing special, so an unwritten row fails the reference check and an overwritten tail row
/// fails the bitwise tail check.
inline constexpr double kSentinel = 7.0;

/// Host tensor of `shape` with every element `value`.
Tensor host_filled(const Shape& shape, DType dtype, double value);
/// Tensor on ctx's device with every element `value` (filled on the host, then copied).
Tensor filled(const Context& ctx, const Shape& shape, DType dtype, double value);

/// A host copy of a contiguous tensor that lives on ctx's device or on the host.
Tensor to_host(const Context& ctx, const Tensor& t);
/// Every element as fp64 (floating and integer dtypes), copied to the host first when needed.
std::vector<double> to_doubles(const Context& ctx, const Tensor& t);
/// The tensor's raw bytes (for bit-for-bit comparisons), copied to the host first when needed.
std::vector<uint8_t> bytes_of(const Context& ctx, const Tensor& t);
/// The stored bytes of one value in `dtype`.
std::vector<uint8_t> encode(double value, DType dtype);
/// Decodes element `i` of raw bytes in `dtype` (messages).
double decode(const std::vector<uint8_t>& bytes, size_t i, DType dtype);

/// Bit-for-bit equality of two byte images of `dtype` elements; on failure names the first
/// differing element, both values and how many elements differ.
::testing::AssertionResult bit_identical(const std::vector<uint8_t>& got,
                                         const std::vector<uint8_t>& want, DType dtype);

/// Rows [row_begin, row_end) of a row-major [*, cols] byte image all hold `sentinel` exactly
/// (bit for bit); on failure names the first element (row, col) that does not and its value.
::testing::AssertionResult rows_hold_sentinel(const std::vector<uint8_t>& bytes, int64_t row_begin,
                                              int64_t row_end, int64_t cols, DType dtype,
                                              double sentinel = kSentinel);

/// An allocator that takes memory from `base`'s allocator and fills every new block with 0xFF
/// bytes (NaN in f32, f16 and bf16) on base's stream: an internally allocated output whose valid
/// rows were not written then fails the reference check instead of passing on stale memory.
/// Its stats() count like any Allocator (the "no copy" tests read them).
class PoisoningAllocator final : public Allocator {
 public:
  explicit PoisoningAllocator(Context base) : base_(std::move(base)) {}
  Device device() const override { return base_.device(); }

 protected:
  void* do_allocate(size_t bytes) override;
  void do_deallocate(void* p, size_t bytes) noexcept override;

 private:
  Context base_;
};

/// `base` with a PoisoningAllocator of its own (fresh stats).
Context poisoned(const Context& base);

/// The context of a device under test by name: "cpu" (always) or "cuda" (device 0). Returns
/// nullopt, with the reason in *why_not, when that device is not available in this build/machine.
std::optional<Context> make_context(const std::string& device, std::string* why_not);

/// Whether a CUDA context's backward may run work on a side stream: MOEKIT_SIDE_STREAM is not "0"
/// (src/core/side_stream.h). Deferred weight gradients are pending only then.
bool side_stream_enabled();

/// The context a test runs a call with device splits on: ctx itself where the graph-safe sm90
/// kernels take such a call (a CPU context; bf16/f16 data with every GEMM dimension in `dims` a
/// multiple of 8), else ctx forced to cuBLAS — the documented host-synchronising path, never
/// chosen automatically with device splits (SPEC §1; tests/test_contract.cpp checks the error).
Context device_splits_context(const Context& ctx, DType dtype, std::initializer_list<int64_t> dims);

/// Sum of group counts (S).
int64_t sum_of(const std::vector<int64_t>& counts);

/// A view of `shape` ([rows, ...]) in the middle of a sentinel-filled buffer on ctx's device with
/// `guard_rows` guard rows on either side: untouched_outside(S) checks, bit for bit, that the
/// guard bands and the view's rows [S, rows) still hold the sentinel.
struct GuardedBuffer {
  Context ctx;
  Tensor buffer;  // [pad + rows + pad, cols]
  Tensor view;    // shape
  int64_t pad = 3, rows = 0, cols = 1;
  DType dtype;

  GuardedBuffer(const Context& ctx, const Shape& shape, DType dtype, int64_t guard_rows = 3);
  void refill() const;
  std::vector<uint8_t> all() const;  // byte image of the whole buffer
  ::testing::AssertionResult untouched_outside(int64_t valid_rows) const;
  std::vector<double> values() const;  // the view's elements
};

/// Base fixture of the device-parameterised suites: ctx_ is the context named by GetParam()
/// ("cpu", "cuda"); the test skips, saying why, when that device is unavailable.
class DeviceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    std::optional<Context> c = make_context(GetParam(), &why);
    if (!c) GTEST_SKIP() << why;
    ctx_ = *c;
  }
  Context ctx_ = Context::cpu();
};

/// Runs f and returns the moekit::Error it threw, or nullopt when it returned normally (any
/// other exception propagates and fails the test).
template <class F>
std::optional<Error> caught(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

/// Device names the device-parameterised suites are instantiated with.
inline const std::vector<std::string>& device_names() {
  static const std::vector<std::string> names{"cpu", "cuda"};
  return names;
}

/// A device suite's test-name suffix: the device itself (.../cpu, .../cuda, not /0, /1), which
/// tools/gpu-check's sanitizer filter (*cuda*) selects the GPU cases by.
inline std::string device_name(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

// Overlap tests: a caller buffer and an input of the call carved out of one arena (pre-filled with
// the sentinel, then the input's data copied in), so that a failed call can be shown to leave the
// whole arena unchanged and a passing one could not write outside it.
struct Arena {
  Tensor bytes;  // u8 on the op's device
  Arena(const Context& ctx, int64_t n) : bytes(filled(ctx, {n}, DType::U8, 0)) {}
  Tensor at(int64_t byte_offset, const Shape& shape, DType dtype) const {
    return Tensor::wrap(static_cast<char*>(bytes.data()) + byte_offset, shape, dtype,
                        bytes.device());
  }
};

// Makes an arena holding a `data_shape` tensor (filled with `data`) at offset 0 and a buffer of
// `buf_shape` (sentinel) starting `overlap_elems` elements before the data's end.
struct Overlapping {
  Arena arena;
  Tensor data, buffer;
  std::vector<uint8_t> before;
  Overlapping(const Context& ctx, const Tensor& data_host, const Shape& buf_shape, DType dtype,
              int64_t overlap_elems)
      : arena(ctx, static_cast<int64_t>(data_host.nbytes()) +
                       numel(buf_shape) * static_cast<int64_t>(size_of(dtype))) {
    const auto es = static_cast<int64_t>(size_of(dtype));
    const int64_t buf_off = static_cast<int64_t>(data_host.nbytes()) - overlap_elems * es;
    buffer = arena.at(buf_off, buf_shape, dtype);
    copy(ctx, host_filled(buf_shape, dtype, kSentinel), buffer);
    data = arena.at(0, data_host.shape(), data_host.dtype());
    copy(ctx, data_host, data);  // the data wins where they overlap
    snapshot(ctx);
  }
  // `before` := the arena's bytes now (again after setup that writes into it, e.g. a forward
  // saving into data); unchanged() compares the arena with them.
  void snapshot(const Context& ctx) { before = bytes_of(ctx, arena.bytes); }
  ::testing::AssertionResult unchanged(const Context& ctx) const {
    return bit_identical(bytes_of(ctx, arena.bytes), before, DType::U8);
  }
};

}  // namespace moekit::test
