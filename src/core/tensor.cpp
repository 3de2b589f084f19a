#include "moekit/core/tensor.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/runtime.h"
#include "moekit/core/context.h"
#include "moekit/core/error.h"

namespace moekit {

std::string to_string(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Element and byte counts are checked before anything is allocated or viewed: a product that
// wrapped around would allocate (or view) fewer bytes than the shape's elements reach.
int64_t numel(const Shape& s) {
  if (std::find(s.begin(), s.end(), int64_t{0}) != s.end()) return 0;  // however large the others
  int64_t n = 1;
  for (int64_t d : s) {
    if (__builtin_mul_overflow(n, d, &n)) {
      throw_invalid("shape", "a shape of at most 2^63 - 1 elements", to_string(s));
    }
  }
  return n;
}

// ---- Allocator ----
void* Allocator::allocate(size_t bytes) {
  void* p = bytes ? do_allocate(bytes) : nullptr;
  // An allocator that returns null instead of throwing must not yield a null-data tensor.
  if (bytes && !p) {
    throw_error(ErrorKind::Runtime, str("out of memory: the allocator of ", device().to_string(),
                                        " returned no memory for ", bytes, " bytes"));
  }
  count_.fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  int64_t prev = largest_.load(std::memory_order_relaxed);
  while (prev < static_cast<int64_t>(bytes) &&
         !largest_.compare_exchange_weak(prev, static_cast<int64_t>(bytes))) {
  }
  return p;
}
void Allocator::deallocate(void* p, size_t bytes) noexcept {
  if (p) do_deallocate(p, bytes);
}
Allocator::Stats Allocator::stats() const {
  return {count_.load(), bytes_.load(), largest_.load()};
}
void Allocator::reset_stats() {
  count_ = 0;
  bytes_ = 0;
  largest_ = 0;
}

// ---- Tensor ----
struct Tensor::Storage {
  std::shared_ptr<Allocator> allocator;
  void* ptr = nullptr;
  size_t bytes = 0;
  ~Storage() { allocator->deallocate(ptr, bytes); }
};

namespace {
// The strides of a row-major tensor of a valid shape (check_shape): they fit in int64 when the
// element count does, except past a zero size ({0, 2^62, 4}), which is refused.
Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    if (i > 0 && __builtin_mul_overflow(s, shape[i], &s)) {
      throw_invalid("shape", "row-major strides that fit in int64", to_string(shape));
    }
  }
  return strides;
}
// Non-negative sizes whose elements, and their bytes in `dtype`, count to at most 2^63 - 1
// (numel() and nbytes() of every tensor then fit, and so do pointer offsets into it).
void check_shape(const Shape& shape, DType dtype) {
  for (int64_t d : shape) {
    if (d < 0) throw_invalid("shape", "non-negative sizes", to_string(shape));
  }
  const int64_t n = moekit::numel(shape);
  const auto es = static_cast<int64_t>(size_of(dtype));
  if (n > std::numeric_limits<int64_t>::max() / es) {
    throw_invalid("shape",
                  str("a shape of at most 2^63 - 1 bytes (",
                      std::numeric_limits<int64_t>::max() / es, " elements of ", name(dtype), ")"),
                  to_string(shape));
  }
}
// The element offsets a strided view reaches, and their bytes, fit in int64 (byte_extent()).
void check_strided_extent(const Shape& shape, const Shape& strides, DType dtype) {
  if (moekit::numel(shape) == 0) return;
  int64_t reach = 1;  // 1 + Σ (size - 1) · |stride|: elements from the lowest to the highest
  bool ok = true;
  for (size_t i = 0; i < shape.size() && ok; ++i) {
    int64_t span = 0;
    ok = strides[i] != std::numeric_limits<int64_t>::min() &&
         !__builtin_mul_overflow(shape[i] - 1, strides[i] < 0 ? -strides[i] : strides[i], &span) &&
         !__builtin_add_overflow(reach, span, &reach);
  }
  int64_t bytes = 0;
  if (!ok || __builtin_mul_overflow(reach, static_cast<int64_t>(size_of(dtype)), &bytes)) {
    throw_invalid(
        "strides",
        str("strides whose reach over shape ", to_string(shape), " fits in 2^63 - 1 bytes"),
        to_string(strides));
  }
}
}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, const Context& ctx) {
  check_shape(shape, dtype);
  Shape strides = contiguous_strides(shape);  // before allocating: it may refuse the shape
  Tensor t;
  auto storage = std::make_shared<Storage>();
  storage->allocator = detail::ContextAccess::impl(ctx)->allocator;
  storage->bytes = static_cast<size_t>(moekit::numel(shape)) * size_of(dtype);
  storage->ptr = storage->allocator->allocate(storage->bytes);  // throws rather than return null
  t.storage_ = std::move(storage);
  t.data_ = t.storage_->ptr;
  t.shape_ = shape;
  t.strides_ = std::move(strides);
  t.dtype_ = dtype;
  t.device_ = ctx.device();
  t.defined_ = true;
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, Device device) {
  check_shape(shape, dtype);  // before the strides: a negative size is named as such
  return wrap(data, shape, contiguous_strides(shape), dtype, device);
}

Tensor Tensor::wrap(void* data, const Shape& shape, const Shape& strides, DType dtype,
                    Device device) {
  check_shape(shape, dtype);
  if (strides.size() != shape.size()) {
    throw_invalid("strides", str(shape.size(), " entries"), to_string(strides));
  }
  check_strided_extent(shape, strides, dtype);
  if (data == nullptr && moekit::numel(shape) != 0) {
    throw_invalid("data", "a non-null pointer for a non-empty tensor", "nullptr");
  }
  Tensor t;
  t.data_ = data;
  t.shape_ = shape;
  t.strides_ = strides;
  t.dtype_ = dtype;
  t.device_ = device;
  t.defined_ = true;
  return t;
}

int64_t Tensor::size(int64_t d) const {
  const int64_t n = dim();
  if (d < 0) d += n;
  if (d < 0 || d >= n) throw_invalid("dim", str("in [", -n, ", ", n, ")"), std::to_string(d));
  return shape_[static_cast<size_t>(d)];
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  if (dim() < 1) throw_invalid("rows", "a tensor with at least 1 dimension", describe());
  if (begin < 0 || end < begin || end > shape_[0]) {
    throw_invalid("rows", str("0 <= begin <= end <= ", shape_[0]), str("[", begin, ", ", end, ")"));
  }
  Tensor t = *this;
  t.data_ = static_cast<char*>(data_) + begin * strides_[0] * static_cast<int64_t>(size_of(dtype_));
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::index(int64_t i) const {
  if (dim() < 1) throw_invalid("index", "a tensor with at least 1 dimension", describe());
  if (i < 0 || i >= shape_[0]) throw_invalid("index", str("in [0, ", shape_[0], ")"), std::to_string(i));
  Tensor t = *this;
  t.data_ = static_cast<char*>(data_) + i * strides_[0] * static_cast<int64_t>(size_of(dtype_));
  t.shape_.erase(t.shape_.begin());
  t.strides_.erase(t.strides_.begin());
  return t;
}

Tensor Tensor::view(const Shape& shape) const {
  check_shape(shape, dtype_);
  if (!is_contiguous()) throw_invalid("view", "a contiguous tensor", describe());
  if (moekit::numel(shape) != numel()) {
    throw_invalid("view shape", str(numel(), " elements"), to_string(shape));
  }
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

std::pair<uintptr_t, uintptr_t> Tensor::byte_extent() const {
  const auto base = reinterpret_cast<uintptr_t>(data_);
  if (numel() == 0) return {base, base};
  int64_t lo = 0, hi = 0;  // element offsets
  for (size_t i = 0; i < shape_.size(); ++i) {
    const int64_t span = (shape_[i] - 1) * strides_[i];
    (span < 0 ? lo : hi) += span;
  }
  const auto es = static_cast<int64_t>(size_of(dtype_));
  return {base + static_cast<uintptr_t>(lo * es), base + static_cast<uintptr_t>((hi + 1) * es)};
}

std::string Tensor::describe() const {
  if (!defined_) return "undefined tensor";
  return str(name(dtype_), to_string(shape_), " on ", device_.to_string(),
             is_contiguous() ? "" : " (non-contiguous)");
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || !(a.device() == b.device())) return false;
  auto [a0, a1] = a.byte_extent();
  auto [b0, b1] = b.byte_extent();
  return a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1;
}

void copy(const Context& ctx, const Tensor& src, const Tensor& dst) {
  if (src.shape() != dst.shape()) throw_invalid("dst", str("shape ", to_string(src.shape())), to_string(dst.shape()));
  if (src.dtype() != dst.dtype()) throw_invalid("dst", str("dtype ", name(src.dtype())), name(dst.dtype()));
  if (!src.is_contiguous()) throw_invalid("src", "a contiguous tensor", src.describe());
  if (!dst.is_contiguous()) throw_invalid("dst", "a contiguous tensor", dst.describe());
  if (src.nbytes() == 0) return;
  if (src.device().is_cpu() && dst.device().is_cpu()) {
    std::memmove(dst.data(), src.data(), src.nbytes());
  } else {
    detail::cuda_copy(ctx, dst.data(), dst.device(), src.data(), src.device(), src.nbytes());
  }
}

Tensor to_device(const Context& ctx, const Tensor& src) {
  Tensor out = Tensor::empty(src.shape(), src.dtype(), ctx);
  copy(ctx, src, out);
  return out;
}

void fill(const Context& ctx, const Tensor& t, double value) {
  if (!t.is_contiguous()) throw_invalid("t", "a contiguous tensor", t.describe());
  if (t.device().is_cuda()) return detail::cuda_fill(ctx, t, value);
  const auto n = static_cast<size_t>(t.numel());
  switch (t.dtype()) {
    case DType::I32: std::fill_n(t.data_as<int32_t>(), n, static_cast<int32_t>(value)); return;
    case DType::I64: std::fill_n(t.data_as<int64_t>(), n, static_cast<int64_t>(value)); return;
    case DType::U8: std::fill_n(t.data_as<uint8_t>(), n, static_cast<uint8_t>(value)); return;
    default: {
      char one[8];
      from_f64(&value, one, t.dtype(), 1);
      const size_t es = size_of(t.dtype());
      for (size_t i = 0; i < n; ++i) std::memcpy(static_cast<char*>(t.data()) + i * es, one, es);
    }
  }
}

std::string Device::to_string() const {
  return is_cpu() ? "cpu" : "cuda:" + std::to_string(index);
}

}  // namespace moekit
