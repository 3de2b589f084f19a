// moekit_tma_view_probe — whether TMA clips a tile at its group's end through one descriptor built on
// the host (PERFORMANCE.md, Next 1 (i): a grouped GEMM that needs no per-call setup). The packed rows
// [T, N] (row-major bf16) are described as an overlapping 3-D view of L-row windows: window v, row r
// is row v - L + r (dims {N, L, T + L}, both row strides N·2 bytes, the base L rows before the
// buffer). A box of kBox rows [a, a + kBox) of a group ending at e is taken at window v, row r0:
//   - box view (L = kBox): v = e and r0 = a - e + kBox for a group's last box (its rows at or past e
//     fall outside the window: stores skip them, loads read zeros), v = a + kBox and r0 = 0 for a box
//     inside the group;
//   - group view (L = T): every box of the group at v = e and r0 = a - e + T — one affine map per
//     group (what a CuTe coordinate tensor with a per-group offset expresses), valid while e - a <= T.
// The view's geometry and each box's coordinates are the library's (bench/studies/group_view.h,
// whose arithmetic the CPU test GroupView.EveryBoxClipsAtItsGroupsEnd checks against TMA's bounds
// rule; this probe checks the hardware keeps that rule).
// For each view and case the probe stores a box into a sentinel-filled buffer and checks every row
// (the box's rows before e written, every other row untouched), then loads the same box from a
// buffer of row ids and checks the zeros past e. Prints one line per case and exits 0 only when the
// encoder took both descriptors and every case held; 77 without an sm_90 device.
//
//   moekit_tma_view_probe
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <vector>

#include "bench_common.cuh"  // MOEKIT_BENCH_CHECK
#include "group_view.h"  // the view and its coordinates, as the library computes them

namespace {

constexpr int kBox = 64;      // rows of a tile
constexpr int kCols = 64;     // N (one box wide)
constexpr uint16_t kSentinel = 0x7fc1;  // a bf16 NaN no store writes

// value of a stored tile's row j: j + 1 (exact in bf16); of the load source's row t: t + 1.
__global__ void store_box(const __grid_constant__ CUtensorMap map, int r0, int v) {
  __shared__ alignas(128) __nv_bfloat16 box[kBox * kCols];
  for (int i = threadIdx.x; i < kBox * kCols; i += blockDim.x) box[i] = __float2bfloat16(float(i / kCols + 1));
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t smem = static_cast<uint32_t>(__cvta_generic_to_shared(box));
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];" ::"l"(&map),
                 "r"(0), "r"(r0), "r"(v), "r"(smem)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
}

__global__ void load_box(const __grid_constant__ CUtensorMap map, int r0, int v, __nv_bfloat16* out) {
  __shared__ alignas(128) __nv_bfloat16 box[kBox * kCols];
  __shared__ alignas(8) uint64_t barrier;
  const uint32_t smem = static_cast<uint32_t>(__cvta_generic_to_shared(box));
  const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(&barrier));
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(kBox * kCols * 2) : "memory");
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::
            "r"(smem),
        "l"(&map), "r"(0), "r"(r0), "r"(v), "r"(bar)
        : "memory");
  }
  asm volatile(
      "{\n .reg .pred p;\n wait: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n @!p bra wait;\n}" ::"r"(bar)
      : "memory");
  for (int i = threadIdx.x; i < kBox * kCols; i += blockDim.x) out[i] = box[i];
}

using Encode = moekit_bench::TensorMapEncode;

// The view of L-row windows over `rows` x kCols bf16 at `data` (moekit::cuda::sm90::group_view).
// Returns the encoder's result.
CUresult view_map(Encode encode, CUtensorMap* map, __nv_bfloat16* data, int64_t rows, int64_t L) {
  const auto v = moekit::cuda::sm90::group_view(data, rows, kCols, 2, L);
  const cuuint64_t dims[3] = {v.dims[0], v.dims[1], v.dims[2]};
  const cuuint64_t strides[2] = {v.strides[0], v.strides[1]};
  const cuuint32_t box[3] = {kCols, kBox, 1}, elem_strides[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(v.base), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

float bf16_value(uint16_t bits) {
  const uint32_t f = uint32_t{bits} << 16;
  float x;
  std::memcpy(&x, &f, 4);
  return x;
}

struct Case {
  int64_t a, e;  // the box's first row, its group's end
  const char* what;
};

// One view of L-row windows over a fresh buffer of `rows` rows: every case stored into a
// sentinel-filled buffer and loaded from a buffer of row ids (see the top). Returns the failures.
int run_view(Encode encode, const char* name, int64_t rows, int64_t L, const std::vector<Case>& cases, int* runs) {
  const size_t elems = size_t(rows) * kCols;
  __nv_bfloat16 *d = nullptr, *src = nullptr, *loaded = nullptr;
  MOEKIT_BENCH_CHECK(cudaMalloc(&d, elems * 2));
  MOEKIT_BENCH_CHECK(cudaMalloc(&src, elems * 2));
  MOEKIT_BENCH_CHECK(cudaMalloc(&loaded, kBox * kCols * 2));
  CUtensorMap store{}, load{};
  const CUresult rs = view_map(encode, &store, d, rows, L), rl = view_map(encode, &load, src, rows, L);
  std::printf("encoder, %s: dims {%d, %lld, %lld}, strides {%d, %d} bytes, base %lld rows (%.1f MB) before the buffer: %s\n",
              name, kCols, (long long)L, (long long)(rows + L), kCols * 2, kCols * 2, (long long)L, L * kCols * 2 / 1e6,
              rs == CUDA_SUCCESS && rl == CUDA_SUCCESS ? "accepted" : "REJECTED");
  if (rs != CUDA_SUCCESS || rl != CUDA_SUCCESS) {
    std::printf("encoder results %d / %d\n", int(rs), int(rl));
    return 1;
  }
  std::vector<uint16_t> ids(elems), sentinel(elems, kSentinel), host(elems), box(kBox * kCols);
  for (size_t i = 0; i < elems; ++i) {
    const float row = float(i / kCols + 1);  // row + 1, rounded to bf16 past 256
    uint32_t bits;
    std::memcpy(&bits, &row, 4);
    ids[i] = static_cast<uint16_t>(bits >> 16);
  }
  MOEKIT_BENCH_CHECK(cudaMemcpy(src, ids.data(), elems * 2, cudaMemcpyHostToDevice));
  int failures = 0;
  for (const Case& c : cases) {
    // In the box view a box inside its group is taken as if the group ended with it.
    const bool last = c.a + kBox > c.e;
    const auto at = moekit::cuda::sm90::group_view_coord(c.a, L == kBox && !last ? c.a + kBox : c.e, L);
    const int64_t v = at.window_index, r0 = at.row;
    MOEKIT_BENCH_CHECK(cudaMemcpy(d, sentinel.data(), elems * 2, cudaMemcpyHostToDevice));
    store_box<<<1, 128>>>(store, int(r0), int(v));
    load_box<<<1, 128>>>(load, int(r0), int(v), loaded);
    MOEKIT_BENCH_CHECK(cudaGetLastError());
    MOEKIT_BENCH_CHECK(cudaDeviceSynchronize());
    MOEKIT_BENCH_CHECK(cudaMemcpy(host.data(), d, elems * 2, cudaMemcpyDeviceToHost));
    MOEKIT_BENCH_CHECK(cudaMemcpy(box.data(), loaded, box.size() * 2, cudaMemcpyDeviceToHost));
    const int64_t end = std::min(c.a + kBox, c.e);
    int64_t wrong_stored = 0, written_outside = 0, wrong_loaded = 0;
    for (int64_t t = 0; t < rows; ++t) {
      for (int n = 0; n < kCols; ++n) {
        const uint16_t got = host[size_t(t) * kCols + n];
        if (t >= c.a && t < end) {
          wrong_stored += bf16_value(got) != float(t - c.a + 1);
        } else {
          written_outside += got != kSentinel;
        }
      }
    }
    for (int j = 0; j < kBox; ++j) {
      for (int n = 0; n < kCols; ++n) {
        const float got = bf16_value(box[size_t(j) * kCols + n]);
        const float want = c.a + j < c.e ? bf16_value(ids[size_t(c.a + j) * kCols]) : 0.0f;
        wrong_loaded += got != want;
      }
    }
    const bool ok = wrong_stored == 0 && written_outside == 0 && wrong_loaded == 0;
    failures += !ok;
    ++*runs;
    std::printf("%-4s %s: rows [%lld, %lld) of a group ending at %lld (window %lld, row %lld; %s): stored %lld wrong, "
                "%lld written outside; loaded %lld wrong\n",
                ok ? "ok" : "FAIL", name, (long long)c.a, (long long)(c.a + kBox), (long long)c.e, (long long)v,
                (long long)r0, c.what, (long long)wrong_stored, (long long)written_outside, (long long)wrong_loaded);
  }
  MOEKIT_BENCH_CHECK(cudaFree(d));
  MOEKIT_BENCH_CHECK(cudaFree(src));
  MOEKIT_BENCH_CHECK(cudaFree(loaded));
  return failures;
}

}  // namespace

int main() {
  int count = 0, major = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("moekit_tma_view_probe: no CUDA device\n");
    return 77;
  }
  MOEKIT_BENCH_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major != 9) {
    std::printf("moekit_tma_view_probe: needs an sm_90 device\n");
    return 77;
  }
  const Encode encode = moekit_bench::tensor_map_encoder();
  const std::vector<Case> small = {
      {0, 10, "first group, 10 rows (the view starts before the buffer)"},
      {0, 64, "first group, exactly one box"},
      {100, 101, "one row"},
      {100, 163, "63 rows"},
      {100, 164, "64 rows: a full box ending at e"},
      {100, 230, "a full box inside a group"},
      {236, 300, "the last rows of the buffer"},
      {250, 300, "a partial box at the buffer's end"},
      {0, 300, "the first box of one group of every row"},
      {160, 300, "a box inside one group of every row"},
  };
  // A buffer of 1 Mi rows (128 MiB): the group view's base 128 MiB before it, as a GEMM's x or dy.
  constexpr int64_t kBig = int64_t{1} << 20;
  const std::vector<Case> big = {
      {0, 10, "first group, 10 rows"},
      {500000, 500030, "30 rows in the middle"},
      {kBig - 100, kBig, "the buffer's last group, a full box"},
      {kBig - 30, kBig, "the buffer's last rows, a partial box"},
      {0, kBig, "the first box of one group of every row"},
  };
  int runs = 0;
  const int failures = run_view(encode, "box view", 300, kBox, small, &runs) +
                       run_view(encode, "group view", 300, 300, small, &runs) +
                       run_view(encode, "group view, 128 MiB", kBig, kBig, big, &runs);
  std::printf("moekit_tma_view_probe: %d of %d cases held\n", runs - failures, runs);
  return failures ? 1 : 0;
}
