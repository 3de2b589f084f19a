// fill(): sets every element of a CUDA tensor to one value, for any dtype. The value is encoded
// on the host (core's rounding rules: round-to-nearest-even, saturating fp8), then written as a
// 1/2/4/8-byte pattern; patterns whose bytes are all equal become a cudaMemsetAsync.
#include <cstdint>
#include <cstring>

#include "core/runtime.h"
#include "backends/cuda/check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/resources.h"

namespace moekit {
namespace cuda {
namespace {

template <class W>
__global__ void fill_kernel(W* __restrict__ p, size_t n, W value) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) p[i] = value;
}

template <class W>
void launch(void* data, size_t elems, const void* value, int sm_count, cudaStream_t stream) {
  W v;
  std::memcpy(&v, value, sizeof(W));
  constexpr int kThreads = 256;
  const size_t want = (elems + kThreads - 1) / kThreads;
  const size_t cap = static_cast<size_t>(sm_count > 0 ? sm_count : 132) * 8;
  const unsigned blocks = static_cast<unsigned>(want < cap ? want : cap);
  fill_kernel<W><<<blocks, kThreads, 0, stream>>>(static_cast<W*>(data), elems, v);
  MOEKIT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_fill(void* data, size_t elems, const void* value, size_t elem_bytes, int sm_count,
                 cudaStream_t stream) {
  if (elems == 0) return;
  const auto* b = static_cast<const unsigned char*>(value);
  bool uniform = true;
  for (size_t i = 1; i < elem_bytes; ++i) uniform = uniform && b[i] == b[0];
  if (uniform) {
    MOEKIT_CUDA_CHECK(cudaMemsetAsync(data, b[0], elems * elem_bytes, stream));
    return;
  }
  if (reinterpret_cast<uintptr_t>(data) % elem_bytes != 0) {
    throw_invalid("t", str("data aligned to its ", elem_bytes, "-byte elements"),
                  str("address ", data));
  }
  switch (elem_bytes) {
    case 2: return launch<uint16_t>(data, elems, value, sm_count, stream);
    case 4: return launch<uint32_t>(data, elems, value, sm_count, stream);
    case 8: return launch<uint64_t>(data, elems, value, sm_count, stream);
    default: throw_error(ErrorKind::Runtime, str("fill: unexpected element size ", elem_bytes));
  }
}

}  // namespace cuda

namespace detail {

void cuda_fill(const Context& ctx, const Tensor& t, double value) {
  const size_t n = static_cast<size_t>(t.numel());
  if (n == 0) return;
  unsigned char pattern[8] = {};
  switch (t.dtype()) {
    case DType::I32: { const auto v = static_cast<int32_t>(value); std::memcpy(pattern, &v, 4); break; }
    case DType::I64: { const auto v = static_cast<int64_t>(value); std::memcpy(pattern, &v, 8); break; }
    case DType::U8: pattern[0] = static_cast<uint8_t>(value); break;
    default: from_f64(&value, pattern, t.dtype(), 1);
  }
  const size_t es = size_of(t.dtype());
  if (ctx.device().is_cuda()) {
    auto& res = cuda::resources(ctx);
    cuda::DeviceGuard guard(res.device);
    cuda::launch_fill(t.data(), n, pattern, es, res.sm_count, res.stream);
    return;
  }
  // A CPU context filling CUDA memory: the legacy default stream, then wait.
  cuda::DeviceGuard guard(t.device().index);
  cuda::launch_fill(t.data(), n, pattern, es, 0, nullptr);
  MOEKIT_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

}  // namespace detail
}  // namespace moekit
