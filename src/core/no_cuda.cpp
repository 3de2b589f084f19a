// Built instead of src/backends/cuda/ when moekit has no CUDA backend.
#include "core/runtime.h"
#include "moekit/core/error.h"

namespace moekit::detail {
namespace {
[[noreturn]] void no_cuda() {
  throw_error(ErrorKind::Unsupported,
              "this moekit was built without CUDA (MOEKIT_WITH_CUDA=OFF or nvcc not found)");
}
}  // namespace

int cuda_device_count() { return 0; }
void init_cuda_context(ContextImpl&, int, void*) { no_cuda(); }
void cuda_copy(const Context&, void*, Device, const void*, Device, size_t) { no_cuda(); }
void cuda_fill(const Context&, const Tensor&, double) { no_cuda(); }
void cuda_zero_tail(const Context&, void*, size_t, int64_t, const Splits&) { no_cuda(); }
void cuda_synchronize(const Context&) { no_cuda(); }
void cuda_release_cached_memory(const Context&) { no_cuda(); }
size_t cuda_memory_reserved(const Context&) { no_cuda(); }
uint32_t cuda_take_error_bits(const Context&) { no_cuda(); }
int cuda_sm_count(const Context&) { no_cuda(); }
std::shared_ptr<ContextImpl> cuda_side_context(const Context&) { no_cuda(); }
void cuda_order_after(const Context&, const Context&) { no_cuda(); }
bool cuda_stream_capturing(const Context&) { return false; }
Tensor cuda_counts_to_device(const Context&, const std::vector<int64_t>&) { no_cuda(); }

}  // namespace moekit::detail
