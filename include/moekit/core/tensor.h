// moekit/core/tensor.h — a typed, shaped, strided view of memory, owning or not.
//
// A Tensor is a cheap handle (copying it copies the handle, not the data). It either shares
// ownership of storage allocated through a Context's allocator (Tensor::empty) or views caller
// memory it does not own (Tensor::wrap). Views (rows, view, index) share the storage of their
// source. `const Tensor&` means the handle is not reseated; the elements may still be written
// (like std::span). There is no autograd inside Tensor.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moekit/core/device.h"
#include "moekit/core/dtype.h"

namespace moekit {

class Context;
using Shape = std::vector<int64_t>;
std::string to_string(const Shape& s);  // "[96, 64]"
/// Product of the sizes (0 when any is 0). Throws InvalidArgument naming the shape when the
/// product does not fit in int64; Tensor::empty / wrap / view also refuse shapes whose bytes
/// do not (so numel() and nbytes() of a tensor never overflow).
int64_t numel(const Shape& s);

/// Memory source of a Context. Every allocation is counted (tests use the counts to prove that
/// caller buffers are written in place, with no temporary of the output's size).
class Allocator {
 public:
  struct Stats {
    int64_t count = 0;          // allocations since the last reset
    int64_t bytes = 0;          // bytes allocated since the last reset
    int64_t largest = 0;        // largest single allocation since the last reset
  };
  virtual ~Allocator() = default;
  void* allocate(size_t bytes);
  void deallocate(void* p, size_t bytes) noexcept;
  Stats stats() const;
  void reset_stats();
  virtual Device device() const = 0;
  /// Frees the memory the allocator keeps for reuse, if any (Context::release_cached_memory).
  virtual void release_cached() {}

 protected:
  virtual void* do_allocate(size_t bytes) = 0;
  virtual void do_deallocate(void* p, size_t bytes) noexcept = 0;

 private:
  std::atomic<int64_t> count_{0}, bytes_{0}, largest_{0};
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor (defined() == false): "not given" / "not computed"

  /// Allocates a contiguous tensor on ctx's device through ctx's allocator (uninitialised).
  /// A shape whose elements or bytes overflow int64 is an InvalidArgument before anything is
  /// allocated; an allocation that fails is a Runtime error (never a tensor with null data).
  static Tensor empty(const Shape& shape, DType dtype, const Context& ctx);
  /// Views caller memory (row-major contiguous, or with explicit element strides). No ownership.
  static Tensor wrap(void* data, const Shape& shape, DType dtype, Device device);
  static Tensor wrap(void* data, const Shape& shape, const Shape& strides, DType dtype,
                     Device device);

  bool defined() const { return defined_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }  // in elements
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return moekit::numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * size_of(dtype_); }
  void* data() const { return data_; }
  template <class T>
  T* data_as() const { return static_cast<T*>(data_); }
  bool is_contiguous() const;  // row-major dense (size-1 dims ignored)
  bool owns_memory() const { return storage_ != nullptr; }

  /// Rows [begin, end) along dim 0, sharing storage.
  Tensor rows(int64_t begin, int64_t end) const;
  /// Element i along dim 0 with that dim removed (e.g. expert g's [N, K] of a [G, N, K] weight).
  Tensor index(int64_t i) const;
  /// Same elements, new shape (contiguous tensors only).
  Tensor view(const Shape& shape) const;

  /// Byte range [first, last) that the tensor's elements can touch (empty tensors: empty range).
  std::pair<uintptr_t, uintptr_t> byte_extent() const;

  std::string describe() const;  // "bf16[96, 64] on cpu"

 private:
  struct Storage;
  std::shared_ptr<Storage> storage_;
  void* data_ = nullptr;
  Shape shape_, strides_;
  DType dtype_ = DType::F32;
  Device device_{};
  bool defined_ = false;
};

/// True when a and b are on the same device and their byte extents intersect.
bool overlaps(const Tensor& a, const Tensor& b);

/// Copies src into dst (same shape and dtype, both contiguous), across devices when needed,
/// ordered on ctx's stream.
void copy(const Context& ctx, const Tensor& src, const Tensor& dst);
/// A new contiguous tensor on ctx's device holding src's elements.
Tensor to_device(const Context& ctx, const Tensor& src);
/// Sets every element of a floating or integer tensor to `value` (on ctx's stream).
void fill(const Context& ctx, const Tensor& t, double value);

}  // namespace moekit
