#include "support/test_util.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numbers>
#include <random>
#include <sstream>
#include <string_view>

namespace moekit::test {

const Context& host() {
  static const Context ctx = Context::cpu();
  return ctx;
}

Tensor random_normal(const Shape& shape, DType dtype, uint64_t seed, double stddev) {
  if (!is_floating(dtype)) throw std::invalid_argument("random_normal: floating dtypes only");
  Tensor t = Tensor::empty(shape, dtype, host());
  const auto n = static_cast<size_t>(t.numel());
  std::vector<double> v(n);
  std::mt19937_64 rng(seed);
  // Uniform in (0, 1]: 53 random bits, never 0 (log below).
  auto uniform = [&rng] { return (static_cast<double>(rng() >> 11) + 1.0) * 0x1p-53; };
  for (size_t i = 0; i < n; i += 2) {
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    const double phi = 2.0 * std::numbers::pi * uniform();
    v[i] = stddev * r * std::cos(phi);
    if (i + 1 < n) v[i + 1] = stddev * r * std::sin(phi);
  }
  from_f64(v.data(), t.data(), dtype, n);
  return t;
}

Tensor counts_tensor(const std::vector<int64_t>& counts, DType dtype) {
  Tensor t = Tensor::empty({static_cast<int64_t>(counts.size())}, dtype, host());
  for (size_t i = 0; i < counts.size(); ++i) {
    if (dtype == DType::I32) {
      t.data_as<int32_t>()[i] = static_cast<int32_t>(counts[i]);
    } else if (dtype == DType::I64) {
      t.data_as<int64_t>()[i] = counts[i];
    } else {
      throw std::invalid_argument("counts_tensor: i32 or i64");
    }
  }
  return t;
}

Tensor host_filled(const Shape& shape, DType dtype, double value) {
  Tensor t = Tensor::empty(shape, dtype, host());
  fill(host(), t, value);
  return t;
}

Tensor filled(const Context& ctx, const Shape& shape, DType dtype, double value) {
  return to_device(ctx, host_filled(shape, dtype, value));
}

Tensor to_host(const Context& ctx, const Tensor& t) {
  Tensor h = Tensor::empty(t.shape(), t.dtype(), host());
  copy(ctx, t, h);
  ctx.synchronize();
  return h;
}

std::vector<double> to_doubles(const Context& ctx, const Tensor& t) {
  const Tensor h = to_host(ctx, t);
  const auto n = static_cast<size_t>(h.numel());
  std::vector<double> out(n);
  switch (h.dtype()) {
    case DType::I32:
      for (size_t i = 0; i < n; ++i) out[i] = h.data_as<const int32_t>()[i];
      break;
    case DType::I64:
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<double>(h.data_as<const int64_t>()[i]);
      break;
    case DType::U8:
      for (size_t i = 0; i < n; ++i) out[i] = h.data_as<const uint8_t>()[i];
      break;
    default:
      to_f64(h.data(), h.dtype(), out.data(), n);
  }
  return out;
}

std::vector<uint8_t> bytes_of(const Context& ctx, const Tensor& t) {
  const Tensor h = to_host(ctx, t);
  const auto* p = h.data_as<const uint8_t>();
  return std::vector<uint8_t>(p, p + h.nbytes());
}

std::vector<uint8_t> encode(double value, DType dtype) {
  std::vector<uint8_t> out(size_of(dtype));
  from_f64(&value, out.data(), dtype, 1);
  return out;
}

double decode(const std::vector<uint8_t>& bytes, size_t i, DType dtype) {
  const size_t es = size_of(dtype);
  switch (dtype) {
    case DType::I32: {
      int32_t v;
      std::memcpy(&v, bytes.data() + i * es, es);
      return v;
    }
    case DType::I64: {
      int64_t v;
      std::memcpy(&v, bytes.data() + i * es, es);
      return static_cast<double>(v);
    }
    case DType::U8:
      return bytes[i];
    default: {
      double v;
      to_f64(bytes.data() + i * es, dtype, &v, 1);
      return v;
    }
  }
}

namespace {
std::string hex(const std::vector<uint8_t>& bytes, size_t i, size_t es) {
  std::ostringstream os;
  os << "0x" << std::hex;
  for (size_t b = es; b-- > 0;) {  // little-endian storage, most significant byte first
    os << (bytes[i * es + b] < 16 ? "0" : "") << static_cast<int>(bytes[i * es + b]);
  }
  return os.str();
}
}  // namespace

::testing::AssertionResult bit_identical(const std::vector<uint8_t>& got,
                                         const std::vector<uint8_t>& want, DType dtype) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << "byte sizes differ: got " << got.size() << ", want " << want.size();
  }
  const size_t es = size_of(dtype), n = got.size() / es;
  size_t first = n, bad = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(got.data() + i * es, want.data() + i * es, es) != 0) {
      if (first == n) first = i;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << n << " " << name(dtype) << " elements differ; first at index " << first
         << ": got " << decode(got, first, dtype) << " (" << hex(got, first, es) << "), want "
         << decode(want, first, dtype) << " (" << hex(want, first, es) << ")";
}

::testing::AssertionResult rows_hold_sentinel(const std::vector<uint8_t>& bytes, int64_t row_begin,
                                              int64_t row_end, int64_t cols, DType dtype,
                                              double sentinel) {
  const std::vector<uint8_t> s = encode(sentinel, dtype);
  const size_t es = s.size();
  if (static_cast<size_t>(row_end * cols) * es > bytes.size()) {
    return ::testing::AssertionFailure() << "rows [" << row_begin << ", " << row_end << ") x "
                                         << cols << " exceed the " << bytes.size() << "-byte image";
  }
  int64_t bad = 0, first = -1;
  for (int64_t i = row_begin * cols; i < row_end * cols; ++i) {
    if (std::memcmp(bytes.data() + static_cast<size_t>(i) * es, s.data(), es) != 0) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " elements of rows [" << row_begin << ", " << row_end << ") lost the sentinel "
         << sentinel << "; first at row " << first / cols << ", col " << first % cols << ": "
         << decode(bytes, static_cast<size_t>(first), dtype) << " ("
         << hex(bytes, static_cast<size_t>(first), es) << ")";
}

void* PoisoningAllocator::do_allocate(size_t bytes) {
  void* p = base_.allocator().allocate(bytes);
  fill(base_, Tensor::wrap(p, {static_cast<int64_t>(bytes)}, DType::U8, base_.device()), 255.0);
  return p;
}

void PoisoningAllocator::do_deallocate(void* p, size_t bytes) noexcept {
  base_.allocator().deallocate(p, bytes);
}

Context poisoned(const Context& base) {
  return base.with_allocator(std::make_shared<PoisoningAllocator>(base));
}

std::optional<Context> make_context(const std::string& device, std::string* why_not) {
  if (device == "cpu") return Context::cpu();
  if (device != "cuda") {
    *why_not = "unknown device name '" + device + "'";
    return std::nullopt;
  }
  if (!Context::built_with_cuda()) {
    *why_not = "this moekit was built without the CUDA backend (MOEKIT_WITH_CUDA=OFF or no nvcc)";
    return std::nullopt;
  }
  if (Context::cuda_device_count() == 0) {
    *why_not = "Context::cuda_device_count() == 0 (no driver or no visible GPU)";
    return std::nullopt;
  }
  return Context::cuda(0);
}

bool side_stream_enabled() {
  const char* v = std::getenv("MOEKIT_SIDE_STREAM");
  return v == nullptr || std::string_view(v) != "0";
}

int64_t sum_of(const std::vector<int64_t>& counts) {
  int64_t s = 0;
  for (int64_t c : counts) s += c;
  return s;
}

GuardedBuffer::GuardedBuffer(const Context& c, const Shape& shape, DType dt, int64_t guard_rows)
    : ctx(c), pad(guard_rows), dtype(dt) {
  rows = shape.empty() ? 0 : shape[0];
  cols = rows == 0 ? 1 : numel(shape) / rows;
  buffer = Tensor::empty({pad + rows + pad, cols}, dt, ctx);
  refill();
  view = buffer.rows(pad, pad + rows).view(shape);
}

void GuardedBuffer::refill() const { fill(ctx, buffer, kSentinel); }

std::vector<uint8_t> GuardedBuffer::all() const { return bytes_of(ctx, buffer); }

::testing::AssertionResult GuardedBuffer::untouched_outside(int64_t valid_rows) const {
  const auto bytes = all();
  auto r = rows_hold_sentinel(bytes, 0, pad, cols, dtype);
  if (!r) return r << " (leading guard band)";
  r = rows_hold_sentinel(bytes, pad + valid_rows, pad + rows + pad, cols, dtype);
  if (!r) return r << " (tail rows [S, T) or trailing guard band)";
  return ::testing::AssertionSuccess();
}

std::vector<double> GuardedBuffer::values() const {
  return to_doubles(ctx, view.view({numel(view.shape())}));
}

Context device_splits_context(const Context& ctx, DType dtype, std::initializer_list<int64_t> dims) {
  if (!ctx.device().is_cuda()) return ctx;
  bool sm90 = dtype == DType::BF16 || dtype == DType::F16;
  for (int64_t d : dims) sm90 = sm90 && d % 8 == 0;
  return sm90 ? ctx : ctx.with_backend("cublas");
}

}  // namespace moekit::test
