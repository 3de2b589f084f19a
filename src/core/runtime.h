// Internal: the hooks through which core reaches a device runtime. Implemented by
// src/backends/cuda/runtime.cu when CUDA is built, and by core/no_cuda.cpp otherwise (every call throws
// ErrorKind::Unsupported and cuda_device_count() returns 0). Core never includes CUDA headers.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "moekit/core/context.h"

namespace moekit {
class Splits;
namespace detail {
/// Which backend ran each primitive last (moekit::last_backend): shared by a context, its copies
/// and its side stream's contexts.
struct BackendLog {
  std::mutex mutex;
  std::map<std::string, std::string, std::less<>> last;  // primitive → backend name
};
}  // namespace detail

struct Context::Impl {
  Device device;
  void* stream = nullptr;                // cudaStream_t for CUDA contexts
  std::shared_ptr<Allocator> allocator;
  int threads = 1;                       // CPU worker threads
  std::string backend;                   // forced backend name, "" = automatic
  std::shared_ptr<void> cuda;            // CUDA resources (stream ownership, cuBLAS handle, ...)
  int sm_margin = 0;                     // SMs the persistent GEMMs leave free (with_sm_margin)
  std::shared_ptr<detail::BackendLog> log = std::make_shared<detail::BackendLog>();
};

namespace detail {

/// The library's access to a context's state (Context::Impl is private to users).
struct ContextAccess {
  using Impl = Context::Impl;
  static const std::shared_ptr<Impl>& impl(const Context& ctx) { return ctx.impl_; }
  static Context make(std::shared_ptr<Impl> impl) { return Context(std::move(impl)); }
};
using ContextImpl = ContextAccess::Impl;

int cuda_device_count();
/// Fills impl->stream, impl->allocator and impl->cuda for a CUDA context.
void init_cuda_context(ContextImpl& impl, int device, void* stream);
/// Copies `bytes` between any two devices, ordered on ctx's stream; a copy that ends on the host
/// waits for it.
void cuda_copy(const Context& ctx, void* dst, Device dst_device, const void* src,
               Device src_device, size_t bytes);
void cuda_fill(const Context& ctx, const Tensor& t, double value);
/// zero_tail's GPU part: rows [S, T) of the `rows` rows of `row_bytes` bytes at data set to zero
/// on ctx's stream (splits validated; device counts read by a kernel).
void cuda_zero_tail(const Context& ctx, void* data, size_t row_bytes, int64_t rows,
                    const Splits& splits);
void cuda_synchronize(const Context& ctx);
/// Context::release_cached_memory's CUDA part (the side stream's allocator, the pool's trim).
void cuda_release_cached_memory(const Context& ctx);
/// Context::memory_reserved on a CUDA context: the device pool's reserved bytes.
size_t cuda_memory_reserved(const Context& ctx);
/// Reads and clears the CUDA context's device error word (synchronises its stream).
uint32_t cuda_take_error_bits(const Context& ctx);
/// The SM count of a CUDA context's device.
int cuda_sm_count(const Context& ctx);
/// The side stream of a CUDA context (core/side_stream.h): the Impl of a context on a second
/// stream of ctx's device, created on first use and owned by ctx's resources, with ctx's forced
/// backend and error word and its own stream-ordered allocator and library handles. Null when
/// it does not exist yet and cannot be made now: ctx's stream is capturing a CUDA graph
/// (creating it allocates).
std::shared_ptr<ContextImpl> cuda_side_context(const Context& ctx);
/// `to`'s stream waits for everything queued so far on `from`'s stream (an event record and a
/// stream wait: capturable). Nothing when both are the same stream.
void cuda_order_after(const Context& to, const Context& from);
/// Host counts written to a new int64 tensor on ctx's device by a kernel from its parameters
/// (stream-ordered, capturable; resolve_splits).
Tensor cuda_counts_to_device(const Context& ctx, const std::vector<int64_t>& counts);
/// Whether ctx's stream is capturing a CUDA graph (false for a CPU context).
bool cuda_stream_capturing(const Context& ctx);

}  // namespace detail
}  // namespace moekit
