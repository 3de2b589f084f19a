// moekit_bandwidth_probe: what the GPU's memory sustains for streams of one direction — the
// ceilings a memory-bound grouped GEMM is judged against (design/PERFORMANCE.md: small_E64 reads
// its experts' weights once per call in fprop and dgrad, and writes as many bytes of dW in
// wgrad). The spec sheet's 4.8 TB/s on the H200 counts neither direction's overheads.
//
// For each size (default: small_E64's weights, 64 x 1024 x 2048 bf16 = 268 MB, and 2 GB) it
// times, each as one kernel, median of --iters after --warmup-ms of the same kernel:
//   read    every 16-byte vector loaded once (grid-stride, 4 in flight per thread), XOR-reduced
//           into one word per block so the loads cannot be dropped;
//   write   every 16-byte vector stored once (a pattern that depends on the index);
//   copy    read one buffer, write another (bytes counted: read + written);
//   memset  cudaMemsetAsync (the driver's own write kernel).
// Then (--tiles 1, the default) the write pattern of a group-K epilogue: small_E64's dW, 64 groups
// of 1024 x 2048 bf16, written as 128 x 128 output tiles by a persistent grid, each CTA taking
// every gridDim-th tile in CUTLASS's raster (M fastest inside a group, or N fastest):
//   tiles st.global   256 threads per CTA store each tile row by row, 16 bytes each (4 CTAs/SM);
//   tiles TMA         one warpgroup per CTA stages each 64 x 128 half tile (16 KB) in shared
//                     memory and one thread stores it with a TMA bulk tensor store, as CUTLASS's
//                     TMA epilogue does (a barrier, a proxy fence, the store, a commit; a buffer is
//                     reused after `wait_group.read`): 1 or 2 CTAs per SM, 1, 2 or 4 buffers, and
//                     with an L2 evict-first hint on the stores;
//   ping-pong         two warpgroups per CTA, one CTA per SM, alternate tiles, each after a wait
//                     standing for its tile's MMA: in CUTLASS's ping-pong order (turns for the
//                     MMA and the epilogue, shared D buffers drained before each hand-over), with
//                     turns but own buffers and no drain, and with no turns; with more cycles of
//                     epilogue work per half tile.
//   ping-pong with operand loads  the no-turns schedule with each tile's two 16 KB operand blocks
//                     loaded into stages by a loader warp first (small_E64 wgrad's operands,
//                     L2-resident) — by TMA tensor loads as the GEMM does, by bulk copies, or by
//                     the loader warp's per-lane cp.async (not through the TMA unit) — with and
//                     without the stores; the loads' mean issue-to-arrival time (the 268 MB of
//                     rows are the tiles' operand bytes too); also with A's block only (16 KB per
//                     tile: the bytes of a kernel that reuses B's block across the tiles sharing
//                     it), with L2 cache hints or a prefetch of the operands, with the tile's MMA
//                     as wgmma (the GEMM's tensor-active clock); and the cooperative 128 x 256 tile
//                     (cuBLAS's shape for small_E64 wgrad: both warpgroups on every tile, each
//                     storing its 64 x 256 half through its own buffer), its loads 48 KB or — the
//                     L2 bytes of a 2 x 1 cluster's multicast — 32 KB per 64 KB of dW. Each row
//                     prints the SM clock it ran at. `--tiles loads` runs these rows only,
//                     `--load-case N` row #N alone (to run under a profiler).
// So the GEMM's write stream can be judged against the same bytes written in its own pattern by
// an SM that does nothing else, and beside its operand loads.
// Prints a table row per (stream, size): MB moved, median µs, TB/s (10^12 bytes per second).
// Exit status 1 on any CUDA error, 2 on a bad argument.
// Usage: moekit_bandwidth_probe [--mb N[,N...]] [--iters N] [--warmup-ms MS] [--tiles 0|1|loads]
//                               [--load-case N]
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "bench_common.cuh"

namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // vectors in flight per thread per step

// Every 16-byte vector of `in` loaded once, grid-stride, kUnroll loads in flight per thread
// before `use(index, vector)` sees them.
template <class Use>
__device__ void stream_in(const uint4* __restrict__ in, size_t n, Use use) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(in + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) use(i + u * stride, v[u]);
  }
  for (; i < n; i += stride) use(i, __ldcs(in + i));
}

__global__ void read_kernel(const uint4* __restrict__ in, size_t n, uint32_t* __restrict__ sink) {
  uint32_t acc = 0;
  stream_in(in, n, [&](size_t, uint4 v) { acc ^= v.x ^ v.y ^ v.z ^ v.w; });
  // One word per block: the loads feed a store the compiler cannot prove dead.
  acc = __reduce_xor_sync(0xffffffffu, acc);
  if (threadIdx.x % 32 == 0) atomicXor(sink + blockIdx.x, acc);
}

__global__ void write_kernel(uint4* __restrict__ out, size_t n, uint32_t seed) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint32_t x = static_cast<uint32_t>(i) * 2654435761u + seed;
    __stcs(out + i, make_uint4(x, x ^ 1u, x ^ 2u, x ^ 3u));
  }
}

__global__ void copy_kernel(const uint4* __restrict__ in, uint4* __restrict__ out, size_t n) {
  stream_in(in, n, [&](size_t i, uint4 v) { __stcs(out + i, v); });
}

// small_E64's dW as row-major [kTileGroups * kTileRows, kTileCols] bf16, in 128 x 128 tiles.
constexpr int kTileGroups = 64, kTileRows = 1024, kTileCols = 2048;
constexpr int kTileM = 128, kTileN = 128, kHalfM = 64;  // a TMA store writes kHalfM x kTileN
constexpr int kTilesM = kTileRows / kTileM, kTilesN = kTileCols / kTileN;
constexpr int kTiles = kTileGroups * kTilesM * kTilesN;
constexpr int kTileVectors = kTileN * 2 / 16;  // 16-byte vectors per tile row

// Tile t's first row and column in the raster: 0 M fastest inside a group (CUTLASS's AlongM), 1 N.
__device__ int2 tile_origin(int t, int raster) {
  const int g = t / (kTilesM * kTilesN), r = t % (kTilesM * kTilesN);
  const int m = raster == 0 ? r % kTilesM : r / kTilesN;
  const int n = raster == 0 ? r / kTilesM : r % kTilesN;
  return make_int2(g * kTileRows + m * kTileM, n * kTileN);
}

__global__ void tile_store_kernel(uint4* __restrict__ out, int raster) {
  for (int t = blockIdx.x; t < kTiles; t += gridDim.x) {
    const int2 o = tile_origin(t, raster);
    for (int v = threadIdx.x; v < kTileM * kTileVectors; v += blockDim.x) {
      const int row = o.x + v / kTileVectors;
      const uint32_t x = static_cast<uint32_t>(t * 7919 + v);
      out[(size_t(row) * kTileCols + o.y) / 8 + v % kTileVectors] =
          make_uint4(x, x ^ 1u, x ^ 2u, x ^ 3u);
    }
  }
}

// Until at most `pending` (0, 1 or 3) of this thread's TMA store groups still read shared memory.
__device__ void wait_store_reads(int pending) {
  if (pending == 0) {
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  } else if (pending == 1) {
    asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
  } else {
    asm volatile("cp.async.bulk.wait_group.read 3;" ::: "memory");
  }
}
// The box of the 2-D `map` at (`col`, `row`) from shared memory at `smem` by a TMA store, in a bulk
// group of its own; `evict_first`: with an L2 evict-first hint.
__device__ void tma_store_box(const CUtensorMap& map, uint32_t smem, int col, int row,
                              bool evict_first) {
  if (evict_first) {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%1, %2}], "
        "[%3], %4;" ::"l"(&map),
        "r"(col), "r"(row), "r"(smem), "l"(policy)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(&map),
        "r"(col), "r"(row), "r"(smem)
        : "memory");
  }
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// One warpgroup per CTA; `buffers` half tiles of kHalfM x kTileN bf16 in dynamic shared memory.
__global__ void __launch_bounds__(128) tile_tma_kernel(const __grid_constant__ CUtensorMap map,
                                                       int raster, int buffers, int evict_first) {
  extern __shared__ __align__(1024) uint4 stage[];
  constexpr int kHalfVectors = kHalfM * kTileVectors;
  int issued = 0;
  for (int t = blockIdx.x; t < kTiles; t += gridDim.x) {
    const int2 o = tile_origin(t, raster);
    for (int half = 0; half < kTileM / kHalfM; ++half, ++issued) {
      const int b = issued % buffers;
      // The buffer's last store has read it (CUTLASS: wait_group.read<StagesD - 1>, a barrier).
      if (threadIdx.x == 0 && issued >= buffers) wait_store_reads(buffers - 1);
      __syncthreads();
      uint4* buf = stage + b * kHalfVectors;
      for (int v = threadIdx.x; v < kHalfVectors; v += blockDim.x) {
        const uint32_t x = static_cast<uint32_t>(t * 7919 + half * kHalfVectors + v);
        buf[v] = make_uint4(x, x ^ 1u, x ^ 2u, x ^ 3u);
      }
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      __syncthreads();
      if (threadIdx.x == 0)
        tma_store_box(map, static_cast<uint32_t>(__cvta_generic_to_shared(buf)), o.y,
                      o.x + half * kHalfM, evict_first);
    }
  }
  if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// A named barrier of one warpgroup (ids 1 and 2; 0 is __syncthreads').
__device__ void warpgroup_sync(int wg) {
  asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
}

// One warpgroup's piece of a tile through its buffer `buf` (`vectors` 16-byte vectors, the box of
// `map` at column `col`, row `row`): the warpgroup's 128 threads write it (a pattern that depends
// on `seed`, the piece's position), the proxy fence makes the writes visible to the TMA unit, and
// thread lt == 0 stores it by TMA and commits the bulk group. The caller waits for the buffer's
// previous store to have read it first (wait_group.read).
__device__ void store_piece(const CUtensorMap& map, uint4* buf, uint32_t seed, int vectors, int col,
                            int row, int wg, int lt, int evict_first = 0) {
  warpgroup_sync(wg);
  for (int v = lt; v < vectors; v += 128) {
    const uint32_t x = seed + static_cast<uint32_t>(v);
    buf[v] = make_uint4(x, x ^ 1u, x ^ 2u, x ^ 3u);
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  warpgroup_sync(wg);
  if (lt == 0)
    tma_store_box(map, static_cast<uint32_t>(__cvta_generic_to_shared(buf)), col, row, evict_first);
}
// The 64 x 128 half `half` of tile t at `o` (the tiled dW map's box).
__device__ void store_half(const CUtensorMap& map, uint4* buf, int t, int half, int2 o, int wg,
                           int lt, int evict_first = 0) {
  constexpr int kHalfVectors = kHalfM * kTileVectors;
  store_piece(map, buf, static_cast<uint32_t>(t * 7919 + half * kHalfVectors), kHalfVectors, o.y,
              o.x + half * kHalfM, wg, lt, evict_first);
}

// The ping-pong GEMM's epilogue schedule without the GEMM: two warpgroups per CTA, one CTA per SM,
// take a CTA's tiles alternately; each waits `mma_cycles` for its tile's MMA and then stores the
// tile as tile_tma_kernel does (two 64 x 128 halves). mode 0 — CUTLASS's ping-pong: the
// warpgroups take turns for the MMA and then for the epilogue (one token, passed MMA 0, MMA 1,
// epilogue 0, epilogue 1, ...), both stage in the same two buffers, so each drains its stores
// (wait_group.read 0) before it passes the token; mode 1: the same turns, each warpgroup with its
// own two buffers and no drain; mode 2: no turns, own buffers (the epilogues overlap).
// `epi_cycles` more per half tile stand for the epilogue's own work before its shared stores
// (the accumulator's conversion, the fragment stores' latency, the fence).
__global__ void __launch_bounds__(256, 1)
    pingpong_store_kernel(const __grid_constant__ CUtensorMap map, int mode, int mma_cycles,
                          int epi_cycles) {
  extern __shared__ __align__(1024) uint4 stage[];
  __shared__ volatile int token;  // turns taken so far in the CTA
  constexpr int kHalfVectors = kHalfM * kTileVectors;
  const int wg = static_cast<int>(threadIdx.x / 128), lt = static_cast<int>(threadIdx.x % 128);
  if (threadIdx.x == 0) token = 0;
  __syncthreads();
  uint4* buffers = stage + (mode == 0 ? 0 : wg * 2 * kHalfVectors);
  int turns = 0;  // this warpgroup's k-th turn is the CTA's turn 2k + wg
  const auto wait_turn = [&] {
    if (mode != 2 && lt == 0) {
      while (token != 2 * turns + wg) {
      }
    }
    warpgroup_sync(wg);
  };
  const auto pass_turn = [&] {
    warpgroup_sync(wg);
    if (mode != 2 && lt == 0) {
      __threadfence_block();
      token = token + 1;
    }
    ++turns;
  };
  const int count = (kTiles - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) /
                    static_cast<int>(gridDim.x);
  int issued = 0;
  for (int pair = 0; 2 * pair < count; ++pair) {
    const int j = 2 * pair + wg;
    const bool mine = j < count;  // without a tile a warpgroup still takes its turns
    wait_turn();
    const long long start = clock64();
    pass_turn();
    if (lt == 0 && mine) {
      while (clock64() - start < mma_cycles) {
      }
    }
    wait_turn();
    if (mine) {
      const int t = static_cast<int>(blockIdx.x) + j * static_cast<int>(gridDim.x);
      const int2 o = tile_origin(t, 0);
      for (int half = 0; half < kTileM / kHalfM; ++half, ++issued) {
        if (lt == 0 && issued >= 2) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
        if (lt == 0) {
          const long long work = clock64();
          while (clock64() - work < epi_cycles) {
          }
        }
        store_half(map, buffers + (issued % 2) * kHalfVectors, t, half, o, wg, lt);
      }
      if (mode == 0) {  // the other warpgroup stages in these buffers next
        if (lt == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
        issued = 0;
      }
    }
    pass_turn();
  }
  if (lt == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// The ping-pong schedule with its operand loads (no turns, own buffers, as the own group-K kernel):
// warp 0 of a first warpgroup loads each tile's two operand blocks (128 x 64 bf16 of A and of B,
// 2 x 16 KB, small_E64 wgrad's) into `stages` stages of 32 KB in the CTA's order — path 0 by TMA
// tensor loads, 1 by bulk copies, 2 by the warp's per-lane cp.async (not through the TMA unit),
// -1 not at all; the two other warpgroups take the tiles alternately, each waiting for its tile's
// stage, holding it `mma_cycles` (standing for the MMA), releasing it, and — with `store` —
// writing the tile's 64 x 128 halves through its own `dbuf` D buffers by TMA as
// pingpong_store_kernel does (with `quarters`, as 64 x 64 pieces through a ring of 2 * dbuf 8 KB
// slots, each written again once its store has read it: a finer-grained overlap in the same
// shared memory). The loads' issue-to-arrival times (%globaltimer, ns) are summed into `latency`
// [sum, count], and the first consumer warpgroup's clock cycles and nanoseconds into latency[2],
// [3] (the SM clock the row ran at).
constexpr int kOperandK = 64;  // one K block: small_E64's 64 rows per group
constexpr int kStageBytes = 2 * kTileM * kOperandK * 2;

__device__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n wait_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra wait_%=;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ void mbar_init(uint32_t bar, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(arrivals) : "memory");
}
__device__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ void mbar_expect_bytes(uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
// The box of the 2-D `map` at row `row`, column 0 into shared memory at `dst` by TMA, completing
// on `bar`; `keep`: with an L2 evict-last hint.
__device__ void tma_load_rows(uint32_t dst, const CUtensorMap& map, int row, uint32_t bar,
                              bool keep = false) {
  if (keep) {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::"
        "cache_hint [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
        "l"(&map), "r"(0), "r"(row), "r"(bar), "l"(policy)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
        "{%2, %3}], [%4];" ::"r"(dst),
        "l"(&map), "r"(0), "r"(row), "r"(bar)
        : "memory");
  }
}
// The CTA's stage barriers, initialised by thread 0 before any thread uses them.
__device__ void init_stages(uint64_t* full, uint64_t* empty, int stages, int full_arrivals,
                            int empty_arrivals) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(smem_address(&full[s]), full_arrivals);
      mbar_init(smem_address(&empty[s]), empty_arrivals);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}
// The persistent grid's tiles: this CTA takes tiles blockIdx.x, + gridDim.x, ...: how many of
// `tiles`, and its j-th.
__device__ int cta_tile_count(int tiles) {
  return (tiles - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) /
         static_cast<int>(gridDim.x);
}
__device__ int cta_tile(int j) {
  return static_cast<int>(blockIdx.x) + j * static_cast<int>(gridDim.x);
}
// A consumer warpgroup's measurements, added into `latency` at its end (thread 0 of the
// warpgroup): the loads' issue-to-arrival ns and their count; for the first consumer warpgroup
// also its clock cycles and ns (the SM clock the row ran at).
struct LoadStats {
  unsigned long long waited = 0, arrived = 0;
  long long clock_start = 0;
  uint64_t time_start = 0;
  __device__ void start() {
    clock_start = clock64();
    time_start = globaltimer();
  }
  __device__ void arrival(uint64_t issued_at) {
    waited += globaltimer() - issued_at;
    ++arrived;
  }
  __device__ void add_to(unsigned long long* latency, bool clock) const {
    atomicAdd(latency, waited);
    atomicAdd(latency + 1, arrived);
    if (clock) {
      atomicAdd(latency + 2, static_cast<unsigned long long>(clock64() - clock_start));
      atomicAdd(latency + 3, globaltimer() - time_start);
    }
  }
};

// A warpgroup's MMA over one 64-deep K block as the GEMM issues it: for each of two (A, B) pairs
// of 64 x 64 and 128 x 64 bf16 blocks in shared memory (K-major, 128-byte swizzle), 4 wgmma
// m64n128k16 with fp32 accumulators — a ping-pong consumer's 128 x 128 tile is A's two 64-row
// halves against one B block, a cooperative 128 x 256 tile's warpgroup its 64-row half against
// two B blocks. The values are whatever the stage holds. Rows with it run the SMs at the clock the
// GPU allows while its tensor cores work (the GEMM's), which a spin does not. Built for sm_90a
// only (wgmma_built says whether it was).
__device__ uint64_t smem_descriptor(uint32_t address) {  // 128B swizzle, 8 rows of 128 B apart
  return uint64_t((address >> 4) & 0x3FFF) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}
__device__ void warpgroup_mma(uint32_t a0, uint32_t b0, uint32_t a1, uint32_t b1) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  float d[64];
  for (int i = 0; i < 64; ++i) d[i] = 0.0f;
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
  for (int half = 0; half < 2; ++half) {
    for (int k = 0; k < 4; ++k) {
      const uint64_t a = smem_descriptor((half ? a1 : a0) + k * 32);
      const uint64_t b = smem_descriptor((half ? b1 : b0) + k * 32);
      asm volatile(
          "{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
          " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
          "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
          "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
          "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "
          "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
            "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
            "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
            "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
            "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
            "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]),
            "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
            "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
            "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
            "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]),
            "+f"(d[62]), "+f"(d[63])
          : "l"(a), "l"(b), "r"(half + k));
    }
  }
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#else
  (void)a0, (void)b0, (void)a1, (void)b1;
#endif
}
// A ping-pong consumer's 128 x 128 tile from a stage of A (128 x 64) then B (128 x 64).
__device__ void tile_mma(uint32_t stage_address) {
  warpgroup_mma(stage_address, stage_address + kStageBytes / 2, stage_address + 64 * 128,
                stage_address + kStageBytes / 2);
}
__global__ void wgmma_built(int* built) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *built = 1;
#else
  *built = 0;
#endif
}

__global__ void __launch_bounds__(384, 1)
    pingpong_load_kernel(const __grid_constant__ CUtensorMap out_map,
                         const __grid_constant__ CUtensorMap quarter_map, int quarters,
                         const __grid_constant__ CUtensorMap a_map,
                         const __grid_constant__ CUtensorMap b_map, const uint4* a_ptr,
                         const uint4* b_ptr, int path, int b_loads, int residency, int stages,
                         int dbuf, int store, int mma_cycles, unsigned long long* latency) {
  extern __shared__ __align__(1024) uint4 stage[];
  __shared__ __align__(8) uint64_t full[8], empty[8];
  __shared__ uint64_t issued_at[8];
  constexpr int kHalfVectors = kHalfM * kTileVectors;
  const int wg = static_cast<int>(threadIdx.x / 128), lt = static_cast<int>(threadIdx.x % 128);
  // cp.async (path 2): each of the loader warp's 32 lanes arrives when its copies land.
  init_stages(full, empty, stages, path == 2 ? 32 : 1, 1);
  const int count = cta_tile_count(kTiles);
  uint4* operands = stage;
  uint4* dbuffers = stage + stages * kStageBytes / 16;
  if (wg == 0) {
    if ((residency & 1) && threadIdx.x / 32 == 1) {
      // Warp 1 asks the L2 for the CTA's 1 / gridDim of both operands at once (4 KB per bulk
      // prefetch), so their DRAM reads happen before the store stream instead of inside it.
      constexpr size_t kABytes = size_t{kTileGroups} * kTileRows * kOperandK * 2;
      constexpr size_t kBBytes = size_t{kTileGroups} * kTileCols * kOperandK * 2;
      const auto prefetch = [&](const uint4* base, size_t bytes) {
        const size_t share = (bytes / gridDim.x + 4095) / 4096 * 4096;
        const size_t begin = share * blockIdx.x,
                     end = begin + share < bytes ? begin + share : bytes;
        for (size_t at = begin + 4096 * (threadIdx.x % 32); at < end; at += 4096 * 32)
          asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(
                           reinterpret_cast<const char*>(base) + at),
                       "r"(static_cast<uint32_t>(end - at < 4096 ? end - at : 4096))
                       : "memory");
      };
      prefetch(a_ptr, kABytes);
      prefetch(b_ptr, kBBytes);
      return;
    }
    if (threadIdx.x >= 32 || path < 0) return;  // warp 0 loads (one lane, or all 32 with cp.async)
    const int lane = static_cast<int>(threadIdx.x);
    constexpr int kBlockVectors = kTileM * kOperandK * 2 / 16;  // one operand block, contiguous
    for (int j = 0; j < count; ++j) {
      const int s = j % stages, round = j / stages;
      if (lane == 0)
        mbar_wait(smem_address(&empty[s]), (round & 1) ^ 1);  // the first round's completes at once
      __syncwarp();
      const int2 o = tile_origin(cta_tile(j), 0);
      const int group = o.x / kTileRows;
      const int a_row = o.x, b_row = group * kTileCols + o.y;
      const uint32_t bar = smem_address(&full[s]);
      const uint32_t dst = smem_address(operands + s * kStageBytes / 16);
      if (lane == 0) issued_at[s] = globaltimer();
      if (path == 2) {  // per-lane 16-byte cp.async, through the SM's load path, not the TMA unit
        const uint4* a_src = a_ptr + size_t(a_row) * kOperandK * 2 / 16;
        const uint4* b_src = b_ptr + size_t(b_row) * kOperandK * 2 / 16;
        for (int v = lane; v < kBlockVectors; v += 32) {
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + 16 * v),
                       "l"(a_src + v)
                       : "memory");
          if (b_loads)
            asm volatile(
                "cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + kStageBytes / 2 + 16 * v),
                "l"(b_src + v)
                : "memory");
        }
        asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
        continue;
      }
      if (lane != 0) continue;
      mbar_expect_bytes(bar, b_loads ? kStageBytes : kStageBytes / 2);
      if (path == 1) {  // one bulk copy per block (a block's 128 rows of 64 are contiguous)
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
            "[%3];" ::"r"(dst),
            "l"(a_ptr + size_t(a_row) * kOperandK * 2 / 16), "r"(kStageBytes / 2), "r"(bar)
            : "memory");
        if (b_loads)
          asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
            "[%3];" ::"r"(dst + kStageBytes / 2),
            "l"(b_ptr + size_t(b_row) * kOperandK * 2 / 16), "r"(kStageBytes / 2), "r"(bar)
            : "memory");
        continue;
      }
      tma_load_rows(dst, a_map, a_row, bar, residency & 2);  // residency 2: evict-last
      if (b_loads) tma_load_rows(dst + kStageBytes / 2, b_map, b_row, bar, residency & 2);
    }
    return;
  }
  const int consumer = wg - 1;
  uint4* buffers = dbuffers + consumer * dbuf * kHalfVectors;
  LoadStats stats;
  stats.start();
  int issued = 0;
  for (int j = consumer; j < count; j += 2) {
    const int s = j % stages, round = j / stages;
    if (mma_cycles < 0) {  // the tile's wgmma: the whole warpgroup waits for the stage
      if (path >= 0) {
        mbar_wait(smem_address(&full[s]), round & 1);
        if (lt == 0) stats.arrival(issued_at[s]);
      }
      tile_mma(smem_address(operands + s * kStageBytes / 16));
      warpgroup_sync(wg);
      if (lt == 0 && path >= 0) mbar_arrive(smem_address(&empty[s]));
    } else if (lt == 0) {
      if (path >= 0) {
        mbar_wait(smem_address(&full[s]), round & 1);
        stats.arrival(issued_at[s]);
      }
      const long long start = clock64();
      while (clock64() - start < mma_cycles) {
      }
      if (path >= 0) mbar_arrive(smem_address(&empty[s]));
    }
    if (!store) continue;
    const int t = cta_tile(j);
    const int2 o = tile_origin(t, 0);
    if (quarters) {  // 64 x 64 pieces through a ring of 2 * dbuf 8 KB slots, each reused once its
                     // store read it
      constexpr int kQuarterVectors = kHalfM * 64 * 2 / 16;
      const int slots = 2 * dbuf;
      for (int q = 0; q < 4; ++q, ++issued) {
        if (lt == 0 && issued >= slots) wait_store_reads(slots - 1);
        store_piece(quarter_map, buffers + (issued % slots) * kQuarterVectors,
                    static_cast<uint32_t>(t * 7919 + q * kQuarterVectors), kQuarterVectors,
                    o.y + (q % 2) * 64, o.x + (q / 2) * kHalfM, wg, lt);
      }
      continue;
    }
    for (int half = 0; half < kTileM / kHalfM; ++half, ++issued) {
      if (lt == 0 && issued >= dbuf) wait_store_reads(dbuf - 1);
      store_half(out_map, buffers + (issued % dbuf) * kHalfVectors, t, half, o, wg, lt,
                 residency & 4);
    }
  }
  if (lt == 0) {
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    stats.add_to(latency, consumer == 0);
  }
}
// The cooperative 128 x 256 tile in the same setting (the shape of cuBLAS's small_E64 wgrad
// kernel) with per-warpgroup stores: both consumer warpgroups take every tile, each its 64-row half
// (wgmma against the tile's two B blocks), then store that half — two 64 x 128 pieces — through
// `dbuf` 16 KB buffers of its own (no drain before the next tile: a buffer is written again once
// its store has read it). The loader thread brings A's 128 x 64 block and `b_boxes` of B's two
// 128 x 64 blocks by TMA into `stages` stages of 48 KB (b_boxes 2: 48 KB per 64 KB of dW; 1: 32 KB,
// the L2 bytes of a 2 x 1 cluster multicasting B to an M pair); `loads` 0: none. The same
// measurements into `latency` as pingpong_load_kernel.
constexpr int kWideN = 256, kBlockBytes = kTileM * kOperandK * 2;
constexpr int kWideStageBytes = 3 * kBlockBytes;  // A and two B blocks
constexpr int kWideTilesN = kTileCols / kWideN, kWideTiles = kTileGroups * kTilesM * kWideTilesN;
__device__ int2 wide_tile_origin(int t) {  // M fastest inside a group
  const int g = t / (kTilesM * kWideTilesN), r = t % (kTilesM * kWideTilesN);
  return make_int2(g * kTileRows + (r % kTilesM) * kTileM, (r / kTilesM) * kWideN);
}

__global__ void __launch_bounds__(384, 1)
    coop_load_kernel(const __grid_constant__ CUtensorMap out_map,
                     const __grid_constant__ CUtensorMap a_map,
                     const __grid_constant__ CUtensorMap b_map, int loads, int b_boxes, int stages,
                     int dbuf, int evict_first, unsigned long long* latency) {
  extern __shared__ __align__(1024) uint4 stage[];
  __shared__ __align__(8) uint64_t full[8], empty[8];
  __shared__ uint64_t issued_at[8];
  constexpr int kHalfVectors = kHalfM * kTileVectors;
  const int wg = static_cast<int>(threadIdx.x / 128), lt = static_cast<int>(threadIdx.x % 128);
  init_stages(full, empty, stages, 1, 2);  // both consumer warpgroups release a stage
  const int count = cta_tile_count(kWideTiles);
  uint4* operands = stage;
  uint4* dbuffers = stage + stages * kWideStageBytes / 16;
  if (wg == 0) {
    if (threadIdx.x != 0 || !loads) return;
    for (int j = 0; j < count; ++j) {
      const int s = j % stages, round = j / stages;
      mbar_wait(smem_address(&empty[s]), (round & 1) ^ 1);  // the first round's completes at once
      const int2 o = wide_tile_origin(cta_tile(j));
      const int a_row = o.x, b_row = o.x / kTileRows * kTileCols + o.y;
      const uint32_t bar = smem_address(&full[s]);
      const uint32_t dst = smem_address(operands + s * kWideStageBytes / 16);
      issued_at[s] = globaltimer();
      mbar_expect_bytes(bar, (1 + b_boxes) * kBlockBytes);
      tma_load_rows(dst, a_map, a_row, bar);
      for (int box = 0; box < b_boxes; ++box)
        tma_load_rows(dst + (1 + box) * kBlockBytes, b_map, b_row + box * kTileN, bar);
    }
    return;
  }
  const int consumer = wg - 1;
  uint4* buffers = dbuffers + consumer * dbuf * kHalfVectors;
  LoadStats stats;
  stats.start();
  int issued = 0;
  for (int j = 0; j < count; ++j) {
    const int s = j % stages, round = j / stages;
    if (loads) {
      mbar_wait(smem_address(&full[s]), round & 1);
      if (lt == 0) stats.arrival(issued_at[s]);
    }
    const uint32_t base = smem_address(operands + s * kWideStageBytes / 16);
    const uint32_t a = base + consumer * kHalfM * kOperandK * 2;  // this warpgroup's 64 rows
    warpgroup_mma(a, base + kBlockBytes, a, base + 2 * kBlockBytes);
    warpgroup_sync(wg);
    if (lt == 0 && loads) mbar_arrive(smem_address(&empty[s]));
    const int t = cta_tile(j);
    const int2 o = wide_tile_origin(t);
    for (int piece = 0; piece < kWideN / kTileN; ++piece, ++issued) {
      if (lt == 0 && issued >= dbuf) wait_store_reads(dbuf - 1);
      store_piece(out_map, buffers + (issued % dbuf) * kHalfVectors,
                  static_cast<uint32_t>(t * 7919 + (2 * consumer + piece) * kHalfVectors),
                  kHalfVectors, o.y + piece * kTileN, o.x + consumer * kHalfM, wg, lt, evict_first);
    }
  }
  if (lt == 0) {
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    stats.add_to(latency, consumer == 0);
  }
}

// A 2-D bf16 map of `rows` x `cols` (row-major), boxes of box_rows x box_cols, no swizzle.
CUtensorMap bf16_map(void* base, uint64_t rows, uint64_t cols, uint32_t box_rows,
                     uint32_t box_cols) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {cols * 2};
  const cuuint32_t box[2] = {box_cols, box_rows}, elem_strides[2] = {1, 1};
  const CUresult r = moekit_bench::tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, elem_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "moekit_bandwidth_probe: cuTensorMapEncodeTiled failed (%d)\n", int(r));
    std::exit(1);
  }
  return map;
}
// The TMA map of the tiled dW (tile_tma_kernel, the ping-pong kernels): 64 x 128 halves.
CUtensorMap tile_map(void* base) {
  return bf16_map(base, uint64_t{kTileGroups} * kTileRows, kTileCols, kHalfM, kTileN);
}

struct Options {
  std::vector<double> mb{268.435456, 2147.483648};
  int iters = 20;
  double warmup_ms = 500;
  int tiles = 1;  // 0: none, 1: every tile row, 2: the operand-load rows only (no streams either)
  int load_case = -1;  // >= 0: that operand-load row alone (for a profiler), implies tiles = 2
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "moekit_bandwidth_probe: %s\nusage: moekit_bandwidth_probe [--mb N[,N...]] "
               "[--iters N] [--warmup-ms MS] [--tiles 0|1|loads] [--load-case N]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + a).c_str());
    const std::string v = argv[++i];
    if (a == "--mb") {
      o.mb.clear();
      for (size_t s = 0; s <= v.size();) {
        const size_t e = std::min(v.find(',', s), v.size());
        const double mb = std::atof(v.substr(s, e - s).c_str());
        if (mb <= 0) usage(("--mb: expected positive sizes in MB, got '" + v + "'").c_str());
        o.mb.push_back(mb);
        s = e + 1;
      }
    } else if (a == "--iters") {
      o.iters = std::atoi(v.c_str());
      if (o.iters < 1) usage(("--iters: expected >= 1, got '" + v + "'").c_str());
    } else if (a == "--warmup-ms") {
      o.warmup_ms = std::atof(v.c_str());
      if (o.warmup_ms < 0) usage(("--warmup-ms: expected >= 0, got '" + v + "'").c_str());
    } else if (a == "--tiles") {
      if (v != "0" && v != "1" && v != "loads")
        usage(("--tiles: expected 0, 1 or loads, got '" + v + "'").c_str());
      o.tiles = v == "loads" ? 2 : v == "1" ? 1 : 0;
    } else if (a == "--load-case") {
      o.load_case = std::atoi(v.c_str());
      if (o.load_case < 0 || v.find_first_not_of("0123456789") != std::string::npos)
        usage(("--load-case: expected a row number >= 0, got '" + v + "'").c_str());
      o.tiles = 2;
    } else {
      usage(("unknown option " + a).c_str());
    }
  }
  return o;
}

// Median time in µs of `launch` after `warmup_ms` of it.
template <class F>
double time_us(F launch, const Options& o) {
  cudaEvent_t a, b;
  MOEKIT_BENCH_CHECK(cudaEventCreate(&a));
  MOEKIT_BENCH_CHECK(cudaEventCreate(&b));
  float ms = 0;
  for (float spent = 0; spent < o.warmup_ms; spent += ms) {
    MOEKIT_BENCH_CHECK(cudaEventRecord(a));
    launch();
    MOEKIT_BENCH_CHECK(cudaEventRecord(b));
    MOEKIT_BENCH_CHECK(cudaEventSynchronize(b));
    MOEKIT_BENCH_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (ms <= 0) ms = 0.001f;
  }
  std::vector<double> us;
  for (int i = 0; i < o.iters; ++i) {
    MOEKIT_BENCH_CHECK(cudaEventRecord(a));
    launch();
    MOEKIT_BENCH_CHECK(cudaEventRecord(b));
    MOEKIT_BENCH_CHECK(cudaEventSynchronize(b));
    MOEKIT_BENCH_CHECK(cudaEventElapsedTime(&ms, a, b));
    us.push_back(ms * 1e3);
  }
  MOEKIT_BENCH_CHECK(cudaGetLastError());
  MOEKIT_BENCH_CHECK(cudaEventDestroy(a));
  MOEKIT_BENCH_CHECK(cudaEventDestroy(b));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  int device = 0, sms = 0;
  cudaDeviceProp prop{};
  MOEKIT_BENCH_CHECK(cudaGetDevice(&device));
  MOEKIT_BENCH_CHECK(cudaGetDeviceProperties(&prop, device));
  MOEKIT_BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  std::printf("# moekit_bandwidth_probe on %s (%d SMs, L2 %d MB)\n", prop.name, sms,
              prop.l2CacheSize >> 20);
  std::printf("| stream | MB | µs (median of %d) | TB/s |\n|---|---|---|---|\n", o.iters);
  const int blocks = sms * (2048 / kThreads);  // one full wave
  uint32_t* sink = nullptr;
  MOEKIT_BENCH_CHECK(cudaMalloc(&sink, sizeof(uint32_t) * blocks));
  MOEKIT_BENCH_CHECK(cudaMemset(sink, 0, sizeof(uint32_t) * blocks));
  for (double mb : o.tiles == 2 ? std::vector<double>{} : o.mb) {
    const size_t bytes = static_cast<size_t>(mb * 1e6) / 16 * 16;
    const size_t n = bytes / 16;
    uint4 *a = nullptr, *b = nullptr;
    MOEKIT_BENCH_CHECK(cudaMalloc(&a, bytes));
    MOEKIT_BENCH_CHECK(cudaMalloc(&b, bytes));
    write_kernel<<<blocks, kThreads>>>(a, n, 7u);  // defined contents for the reads
    MOEKIT_BENCH_CHECK(cudaGetLastError());
    MOEKIT_BENCH_CHECK(cudaDeviceSynchronize());
    const auto report = [&](const char* what, double moved, double us) {
      std::printf("| %s | %.1f | %.1f | %.3f |\n", what, moved / 1e6, us, moved / us / 1e6);
      std::fflush(stdout);  // each row out before the next kernel (a crash keeps what ran)
    };
    report("read", double(bytes),
           time_us([&] { read_kernel<<<blocks, kThreads>>>(a, n, sink); }, o));
    report("write", double(bytes),
           time_us([&] { write_kernel<<<blocks, kThreads>>>(b, n, 3u); }, o));
    report("copy (read + write)", 2.0 * double(bytes),
           time_us([&] { copy_kernel<<<blocks, kThreads>>>(a, b, n); }, o));
    report("memset", double(bytes),
           time_us([&] { MOEKIT_BENCH_CHECK(cudaMemsetAsync(b, 0, bytes)); }, o));
    MOEKIT_BENCH_CHECK(cudaFree(a));
    MOEKIT_BENCH_CHECK(cudaFree(b));
  }
  if (o.tiles) {
    const size_t bytes = size_t{kTileGroups} * kTileRows * kTileCols * 2;
    uint4* d = nullptr;
    MOEKIT_BENCH_CHECK(cudaMalloc(&d, bytes));
    const CUtensorMap map = tile_map(d);
    const auto report = [&](const std::string& what, double us) {
      std::printf("| %s | %.1f | %.1f | %.3f |\n", what.c_str(), bytes / 1e6, us, bytes / us / 1e6);
      std::fflush(stdout);
    };
    if (o.tiles == 1) {  // every tile row; --tiles loads: the operand-load rows below only
      const char* raster_name[2] = {"M fastest", "N fastest"};
      for (int raster = 0; raster < 2; ++raster) {
        report(std::string("tiles st.global, ") + raster_name[raster] + ", 4 CTAs/SM",
               time_us([&] { tile_store_kernel<<<4 * sms, 256>>>(d, raster); }, o));
      }
      struct TmaCase {
        int ctas, buffers, evict_first, raster;
      };
      const TmaCase cases[] = {{1, 1, 0, 0}, {2, 1, 0, 0}, {1, 2, 0, 0}, {1, 4, 0, 0},
                               {2, 2, 0, 0}, {2, 4, 0, 0}, {1, 2, 1, 0}, {2, 2, 1, 0},
                               {1, 2, 0, 1}, {2, 2, 0, 1}};
      for (const TmaCase& c : cases) {
        const int smem = c.buffers * kHalfM * kTileN * 2;
        MOEKIT_BENCH_CHECK(cudaFuncSetAttribute(tile_tma_kernel,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        char what[160];
        std::snprintf(what, sizeof what, "tiles TMA, %s, %d CTA/SM, %d buffers%s",
                      raster_name[c.raster], c.ctas, c.buffers,
                      c.evict_first ? ", evict-first" : "");
        report(what, time_us(
                         [&] {
                           tile_tma_kernel<<<c.ctas * sms, 128, smem>>>(map, c.raster, c.buffers,
                                                                        c.evict_first);
                         },
                         o));
      }
      const char* mode_name[3] = {"turns, shared buffers, drain", "turns, own buffers",
                                  "no turns, own buffers"};
      const int mode_smem[3] = {2 * kHalfM * kTileN * 2, 4 * kHalfM * kTileN * 2,
                                4 * kHalfM * kTileN * 2};
      MOEKIT_BENCH_CHECK(cudaFuncSetAttribute(
          pingpong_store_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, mode_smem[1]));
      const std::pair<int, int> cycles[] = {{0, 0},     {600, 0},   {1200, 0},
                                            {600, 400}, {600, 800}, {600, 1200}};
      for (const auto& [mma_cycles, epi_cycles] : cycles) {
        for (int mode = 0; mode < 3; ++mode) {
          char what[160];
          std::snprintf(what, sizeof what, "ping-pong epilogues, %s, MMA %d cycles%s",
                        mode_name[mode], mma_cycles,
                        epi_cycles > 0
                            ? (", epilogue +" + std::to_string(epi_cycles) + " per half").c_str()
                            : "");
          report(what, time_us(
                           [&] {
                             pingpong_store_kernel<<<sms, 256, mode_smem[mode]>>>(
                                 map, mode, mma_cycles, epi_cycles);
                           },
                           o));
        }
      }
    }
    // The same schedule with its operand loads: A [64 groups x 1024, 64] and B [64 x 2048, 64]
    // bf16.
    void* a = nullptr;
    void* b = nullptr;
    unsigned long long* latency = nullptr;
    MOEKIT_BENCH_CHECK(cudaMalloc(&a, size_t{kTileGroups} * kTileRows * kOperandK * 2));
    MOEKIT_BENCH_CHECK(cudaMalloc(&b, size_t{kTileGroups} * kTileCols * kOperandK * 2));
    MOEKIT_BENCH_CHECK(cudaMemset(a, 0x3c, size_t{kTileGroups} * kTileRows * kOperandK * 2));
    MOEKIT_BENCH_CHECK(cudaMemset(b, 0x3c, size_t{kTileGroups} * kTileCols * kOperandK * 2));
    MOEKIT_BENCH_CHECK(cudaMalloc(&latency, 4 * sizeof(unsigned long long)));
    const CUtensorMap a_map =
        bf16_map(a, uint64_t{kTileGroups} * kTileRows, kOperandK, kTileM, kOperandK);
    const CUtensorMap b_map =
        bf16_map(b, uint64_t{kTileGroups} * kTileCols, kOperandK, kTileN, kOperandK);
    int smem_optin = 0;
    MOEKIT_BENCH_CHECK(
        cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    const CUtensorMap quarter_map = bf16_map(d, uint64_t{kTileGroups} * kTileRows, kTileCols,
                                             kHalfM, 64);  // 64 x 64 pieces of dW
    struct LoadCase {
      int path, stages, dbuf, store, mma_cycles, quarters = 0, b_loads = 1, residency = 0, coop = 0;
    };
    // Path -1: no loads; b_loads 0: A's block only (16 KB per tile: the bytes of a kernel that
    // reuses B's block across the tiles sharing it); residency 1: the operands prefetched into
    // the L2 at the start (warp 1, each CTA its share), 2: loads evict-last (TMA tensor loads
    // only), 4: stores evict-first; or'ed. mma_cycles -1: the tile's MMA by wgmma (tile_mma).
    // coop 1: coop_load_kernel's cooperative 128 x 256 tile (path 0 or -1, b_loads = B blocks
    // loaded per tile, residency 4 only, always wgmma).
    int built = 0;
    {
      int* flag = nullptr;
      MOEKIT_BENCH_CHECK(cudaMalloc(&flag, sizeof(int)));
      wgmma_built<<<1, 1>>>(flag);
      MOEKIT_BENCH_CHECK(cudaMemcpy(&built, flag, sizeof(int), cudaMemcpyDeviceToHost));
      MOEKIT_BENCH_CHECK(cudaFree(flag));
    }
    const LoadCase load_cases[] = {{0, 6, 1, 0, 600},
                                   {0, 6, 1, 1, 0},
                                   {0, 6, 1, 1, 600},
                                   {0, 5, 2, 1, 600},
                                   {0, 4, 2, 1, 600},
                                   {1, 6, 1, 1, 600},
                                   {2, 6, 1, 0, 600},
                                   {2, 6, 1, 1, 600},
                                   {2, 5, 2, 1, 600},
                                   {-1, 6, 1, 1, 600},
                                   {-1, 6, 1, 1, 600, 1},
                                   {0, 6, 1, 1, 600, 1},
                                   {2, 6, 1, 1, 600, 1},
                                   {0, 6, 1, 0, 600, 0, 0},
                                   {0, 6, 1, 1, 600, 0, 0},
                                   {2, 6, 1, 1, 600, 0, 0},
                                   {0, 6, 1, 1, 600, 0, 1, 1},
                                   {0, 6, 1, 1, 600, 0, 1, 6},
                                   {0, 6, 1, 1, 600, 0, 1, 7},
                                   {0, 6, 1, 1, 600, 0, 0, 7},
                                   {0, 6, 1, 1, 600, 0, 1, 4},
                                   {0, 6, 1, 1, 600, 0, 1, 2},
                                   {-1, 6, 1, 1, 600, 0, 1, 4},
                                   {0, 6, 1, 1, -1},
                                   {-1, 6, 1, 1, -1},
                                   {0, 6, 1, 0, -1},
                                   {0, 6, 1, 1, -1, 0, 0, 7},
                                   {0, 4, 1, 1, -1, 0, 2, 0, 1},
                                   {0, 4, 1, 1, -1, 0, 1, 0, 1},
                                   {-1, 4, 1, 1, -1, 0, 2, 0, 1},
                                   {0, 3, 2, 1, -1, 0, 2, 0, 1},
                                   {0, 3, 2, 1, -1, 0, 1, 0, 1},
                                   {0, 4, 1, 1, -1, 0, 1, 4, 1}};
    constexpr int kLoadCases = sizeof load_cases / sizeof load_cases[0];
    if (o.load_case >= kLoadCases) {
      std::fprintf(stderr, "moekit_bandwidth_probe: --load-case: expected < %d, got %d\n",
                   kLoadCases, o.load_case);
      return 2;
    }
    const char* path_name[4] = {"no loads", "TMA tensor loads", "bulk-copy loads",
                                "cp.async loads (loader warp)"};
    for (int index = 0; index < kLoadCases; ++index) {
      if (o.load_case >= 0 && index != o.load_case) continue;
      const LoadCase& c = load_cases[index];
      if (c.mma_cycles < 0 && !built) {
        std::printf("| #%d ping-pong with wgmma: not built for sm_90a, skipped | | | |\n", index);
        continue;
      }
      const int smem =
          c.stages * (c.coop ? kWideStageBytes : kStageBytes) + 2 * c.dbuf * kHalfM * kTileN * 2;
      const void* kernel = c.coop ? reinterpret_cast<const void*>(coop_load_kernel)
                                  : reinterpret_cast<const void*>(pingpong_load_kernel);
      cudaFuncAttributes attributes{};
      MOEKIT_BENCH_CHECK(cudaFuncGetAttributes(&attributes, kernel));
      if (smem + static_cast<int>(attributes.sharedSizeBytes) > smem_optin) {
        std::printf(
            "| #%d ping-pong with operand loads, %d stages, %d D buffers: needs %d bytes of shared "
            "memory, "
            "the device has %d, skipped | | | |\n",
            index, c.stages, c.dbuf, smem + static_cast<int>(attributes.sharedSizeBytes),
            smem_optin);
        continue;
      }
      MOEKIT_BENCH_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      MOEKIT_BENCH_CHECK(cudaMemset(latency, 0, 4 * sizeof(unsigned long long)));
      const double us = time_us(
          [&] {
            if (c.coop) {
              coop_load_kernel<<<sms, 384, smem>>>(map, a_map, b_map, c.path >= 0, c.b_loads,
                                                   c.stages, c.dbuf, c.residency & 4, latency);
              return;
            }
            pingpong_load_kernel<<<sms, 384, smem>>>(
                map, quarter_map, c.quarters, a_map, b_map, static_cast<const uint4*>(a),
                static_cast<const uint4*>(b), c.path, c.b_loads, c.residency, c.stages, c.dbuf,
                c.store, c.mma_cycles, latency);
          },
          o);
      unsigned long long host[4] = {0, 0, 0, 0};
      MOEKIT_BENCH_CHECK(cudaMemcpy(host, latency, sizeof host, cudaMemcpyDeviceToHost));
      char mma[48];
      if (c.mma_cycles < 0) {
        std::snprintf(mma, sizeof mma, "MMA by wgmma (2 x 4 m64n128k16)");
      } else {
        std::snprintf(mma, sizeof mma, "MMA %d cycles", c.mma_cycles);
      }
      char what[280];
      if (c.coop) {
        std::snprintf(what, sizeof what,
                      "#%d cooperative 128 x 256 tile (%s%s, %d stages), stores%s, %d D buffer%s "
                      "per warpgroup, MMA by wgmma (2 x 4 m64n128k16 per warpgroup): loads' "
                      "issue-to-arrival %.0f ns, SM clock %.0f MHz",
                      index, c.path < 0 ? "no loads" : "TMA loads, ",
                      c.path < 0       ? ""
                      : c.b_loads == 2 ? "A + 2 B blocks = 48 KB per 64 KB of dW"
                                       : "A + 1 B block = 32 KB per 64 KB of dW",
                      c.stages, c.residency & 4 ? " evict-first" : "", c.dbuf,
                      c.dbuf == 1 ? "" : "s", host[1] ? double(host[0]) / double(host[1]) : 0.0,
                      host[3] ? 1e3 * double(host[2]) / double(host[3]) : 0.0);
        report(what, us);
        continue;
      }
      std::snprintf(what, sizeof what,
                    "#%d ping-pong with operand loads (%s, %s per tile, %d stages%s%s%s), %s%s, "
                    "%s: loads' issue-to-arrival %.0f ns, SM clock %.0f MHz",
                    index, path_name[c.path + 1],
                    c.path < 0  ? "nothing"
                    : c.b_loads ? "2 x 16 KB"
                                : "16 KB (A only)",
                    c.stages, c.residency & 1 ? ", operands prefetched into L2" : "",
                    c.residency & 2 ? ", loads evict-last" : "",
                    c.residency & 4 ? ", stores evict-first" : "",
                    c.store ? (c.dbuf == 1 ? "stores, 1 D buffer per warpgroup"
                                           : "stores, 2 D buffers per warpgroup")
                            : "no stores",
                    c.store && c.quarters ? " as a ring of 64 x 64 pieces" : "", mma,
                    host[1] ? double(host[0]) / double(host[1]) : 0.0,
                    host[3] ? 1e3 * double(host[2]) / double(host[3]) : 0.0);
      report(what, us);
    }
    MOEKIT_BENCH_CHECK(cudaFree(latency));
    MOEKIT_BENCH_CHECK(cudaFree(b));
    MOEKIT_BENCH_CHECK(cudaFree(a));
    MOEKIT_BENCH_CHECK(cudaFree(d));
  }
  MOEKIT_BENCH_CHECK(cudaFree(sink));
  return 0;
}
