// fill(): sets every element of a CUDA tensor to one value, for any dtype. The value is encoded
// on the host (core's rounding rules: round-to-nearest-even, saturating fp8), then written as a
// 1/2/4/8-byte pattern; patterns whose bytes are all equal become a cudaMemsetAsync.
// zero_tail(): rows [S, T) set to zero — host counts: one cudaMemsetAsync of those bytes; device
// counts: a kernel whose every block sums them (block_valid_rows) and zeroes the tail's bytes,
// 16 at a time where aligned.
#include <cstdint>
#include <cstring>

#include "core/runtime.h"
#include "moekit/core/splits.h"
#include "backends/cuda/check.h"
#include "backends/cuda/device_counts.cuh"
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

__global__ void zero_tail_kernel(DeviceCounts c, unsigned char* data, size_t row_bytes) {
  const int64_t S = block_valid_rows(c);
  if (S < 0) return;  // invalid counts: nothing written, the reason in the error word
  unsigned char* p = data + static_cast<size_t>(S) * row_bytes;
  const size_t n = static_cast<size_t>(c.rows - S) * row_bytes;
  const size_t tid = size_t{blockIdx.x} * blockDim.x + threadIdx.x, stride = size_t{gridDim.x} * blockDim.x;
  const size_t mis = (16 - (reinterpret_cast<uintptr_t>(p) & 15)) & 15;
  const size_t head = mis < n ? mis : n, words = (n - head) / 16, done = head + words * 16;
  if (tid < head) p[tid] = 0;
  auto* w = reinterpret_cast<uint4*>(p + head);
  for (size_t i = tid; i < words; i += stride) w[i] = make_uint4(0, 0, 0, 0);
  if (tid < n - done) p[done + tid] = 0;  // fewer than 16 bytes
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

void cuda_zero_tail(const Context& ctx, void* data, size_t row_bytes, int64_t rows,
                    const Splits& splits) {
  if (rows == 0 || row_bytes == 0) return;
  auto& res = cuda::resources(ctx);
  cuda::DeviceGuard guard(res.device);
  auto* bytes = static_cast<unsigned char*>(data);
  if (splits.on_host()) {
    int64_t total = 0;
    for (int64_t c : splits.host_counts()) total += c;  // validated: S <= T
    if (total < rows) {
      MOEKIT_CUDA_CHECK(cudaMemsetAsync(bytes + static_cast<size_t>(total) * row_bytes, 0,
                                        static_cast<size_t>(rows - total) * row_bytes, res.stream));
    }
    return;
  }
  const cuda::CountsOnDevice counts = cuda::counts_on_device(ctx, splits, rows);
  constexpr int kThreads = 256;
  const size_t most = static_cast<size_t>(rows) * row_bytes / 16 + 1;  // words if S were 0
  const size_t want = (most + kThreads - 1) / kThreads, cap = static_cast<size_t>(res.sm_count) * 4;
  cuda::zero_tail_kernel<<<static_cast<unsigned>(want < cap ? want : cap), kThreads, 0, res.stream>>>(
      counts.view, bytes, row_bytes);
  MOEKIT_CUDA_CHECK_LAUNCH();
}

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
