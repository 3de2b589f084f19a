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

namespace {

constexpr int kBox = 64;      // rows of a tile
constexpr int kCols = 64;     // N (one box wide)
constexpr int kRows = 300;    // T
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

using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                            const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                            CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The overlapping view of L-row windows over `rows` x kCols bf16 at `data` (see the top). Returns the
// encoder's result.
CUresult view_map(Encode encode, CUtensorMap* map, __nv_bfloat16* data, int rows, int L) {
  const cuuint64_t dims[3] = {kCols, static_cast<cuuint64_t>(L), static_cast<cuuint64_t>(rows) + L};
  const cuuint64_t strides[2] = {kCols * 2, kCols * 2};  // both in bytes: a window's row, the next window
  const cuuint32_t box[3] = {kCols, kBox, 1}, elem_strides[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, data - int64_t{L} * kCols, dims, strides, box,
                elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

float bf16_value(uint16_t bits) {
  const uint32_t f = uint32_t{bits} << 16;
  float x;
  std::memcpy(&x, &f, 4);
  return x;
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
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  MOEKIT_BENCH_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
  if (fn == nullptr || found != cudaDriverEntryPointSuccess) {
    std::printf("moekit_tma_view_probe: cuTensorMapEncodeTiled not found\n");
    return 1;
  }
  const size_t elems = size_t{kRows} * kCols;
  __nv_bfloat16 *d = nullptr, *src = nullptr, *loaded = nullptr;
  MOEKIT_BENCH_CHECK(cudaMalloc(&d, elems * 2));
  MOEKIT_BENCH_CHECK(cudaMalloc(&src, elems * 2));
  MOEKIT_BENCH_CHECK(cudaMalloc(&loaded, kBox * kCols * 2));
  struct View {
    int L;
    const char* name;
    CUtensorMap store, load;
  } views[] = {{kBox, "box view", {}, {}}, {kRows, "group view", {}, {}}};
  for (View& w : views) {
    const CUresult rs = view_map(reinterpret_cast<Encode>(fn), &w.store, d, kRows, w.L);
    const CUresult rl = view_map(reinterpret_cast<Encode>(fn), &w.load, src, kRows, w.L);
    std::printf("encoder, %s: dims {%d, %d, %d}, strides {%d, %d} bytes, base %d rows before the buffer: %s\n", w.name,
                kCols, w.L, kRows + w.L, kCols * 2, kCols * 2, w.L,
                rs == CUDA_SUCCESS && rl == CUDA_SUCCESS ? "accepted" : "REJECTED");
    if (rs != CUDA_SUCCESS || rl != CUDA_SUCCESS) {
      std::printf("encoder results %d / %d\n", int(rs), int(rl));
      return 1;
    }
  }
  std::vector<uint16_t> ids(elems);
  for (size_t i = 0; i < elems; ++i) {
    const float row = float(i / kCols + 1);
    uint32_t bits;
    std::memcpy(&bits, &row, 4);
    ids[i] = static_cast<uint16_t>(bits >> 16);  // row + 1 <= 300: exact in bf16 up to 256, then even
  }
  MOEKIT_BENCH_CHECK(cudaMemcpy(src, ids.data(), elems * 2, cudaMemcpyHostToDevice));

  struct Case {
    int a, e;  // the tile's first row, the group's end
    const char* what;
  };
  const Case cases[] = {
      {0, 10, "first group, 10 rows (the view starts before the buffer)"},
      {0, 64, "first group, exactly one tile"},
      {100, 101, "one row"},
      {100, 163, "63 rows"},
      {100, 164, "64 rows: a full tile ending at e"},
      {100, 230, "a full tile inside a group"},
      {236, 300, "the last rows of the buffer"},
      {250, 300, "a partial tile at the buffer's end"},
      {0, 300, "the first box of one group of every row"},
      {160, 300, "a box inside one group of every row"},
  };
  int failures = 0, runs = 0;
  std::vector<uint16_t> host(elems), box(kBox * kCols);
  for (const View& w : views) {
    for (const Case& c : cases) {
      const bool last = c.a + kBox > c.e;
      const int v = w.L == kBox && !last ? c.a + kBox : c.e;
      const int r0 = w.L == kBox && !last ? 0 : c.a - c.e + w.L;
      std::vector<uint16_t> sentinel(elems, kSentinel);
      MOEKIT_BENCH_CHECK(cudaMemcpy(d, sentinel.data(), elems * 2, cudaMemcpyHostToDevice));
      store_box<<<1, 128>>>(w.store, r0, v);
      load_box<<<1, 128>>>(w.load, r0, v, loaded);
      MOEKIT_BENCH_CHECK(cudaGetLastError());
      MOEKIT_BENCH_CHECK(cudaDeviceSynchronize());
      MOEKIT_BENCH_CHECK(cudaMemcpy(host.data(), d, elems * 2, cudaMemcpyDeviceToHost));
      MOEKIT_BENCH_CHECK(cudaMemcpy(box.data(), loaded, box.size() * 2, cudaMemcpyDeviceToHost));
      const int end = std::min(c.a + kBox, c.e);
      int wrong_stored = 0, written_outside = 0, wrong_loaded = 0;
      for (int t = 0; t < kRows; ++t) {
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
      ++runs;
      std::printf("%-4s %s: rows [%3d, %3d) of a group ending at %3d (window %3d, row %3d; %s): stored %d wrong, %d "
                  "written outside; loaded %d wrong\n",
                  ok ? "ok" : "FAIL", w.name, c.a, c.a + kBox, c.e, v, r0, c.what, wrong_stored, written_outside,
                  wrong_loaded);
    }
  }
  std::printf("moekit_tma_view_probe: %d of %d cases held\n", runs - failures, runs);
  MOEKIT_BENCH_CHECK(cudaFree(d));
  MOEKIT_BENCH_CHECK(cudaFree(src));
  MOEKIT_BENCH_CHECK(cudaFree(loaded));
  return failures ? 1 : 0;
}
