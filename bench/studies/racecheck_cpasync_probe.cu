// bench/studies/racecheck_cpasync_probe.cu — does compute-sanitizer racecheck model cp.async whose
// completion a thread hands to an mbarrier (cp.async.mbarrier.arrive.noinc)? CUTLASS's sm90
// blockwise-FP8 mainloop loads its scale factors that way (32 producer lanes, the stage's full
// barrier counting 33 arrivals) and racecheck reports read-after-write hazards between those
// LDGSTS and the consumers' LDS. Three correct kernels, the same hand-off each:
//   noinc    32 lanes cp.async 4 B each, cp.async.mbarrier.arrive.noinc; a consumer warp waits on
//            the barrier's phase, then reads (CUTLASS's pattern)
//   wait_all the same, but cp.async.wait_all then a plain mbarrier.arrive (release)
//   plain    st.shared then mbarrier.arrive
// and one with a real race (racy: the consumer reads without waiting), so the probe shows the
// tool catches a race here; a buffer reused for a second round after a release (reuse_*), the
// full barrier exactly as CUTLASS's (mixed*), and its phases completed by the other CTA of the
// cluster — a multicast bulk copy, releases to both CTAs (multicast*: not yet run), and a stage read
// by a whole consumer warpgroup but released by one thread of it (split*: CUTLASS's consumer_release,
// one signalling thread per warpgroup and destination CTA). The numbers are checked (correct kernels
// only): exit 1 on a wrong value.
//   nvcc -std=c++17 -gencode arch=compute_90a,code=sm_90a -o racecheck_cpasync_probe racecheck_cpasync_probe.cu
//   compute-sanitizer --tool racecheck ./racecheck_cpasync_probe MODE
// Measured (bench/results/2026-12-04-nvidia-h200-*-fp8-block.md): see there.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

enum Mode { kNoinc, kWaitAll, kPlain, kRacy };

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void bar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void bar_wait(unsigned long long* bar, unsigned parity) {
  unsigned done = 0;
  while (!done) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done)
                 : "r"(smem_addr(bar)), "r"(parity));
  }
}
// CUTLASS's ClusterBarrier::arrive(cta_id): the barrier mapped to a CTA of the cluster (its own).
__device__ __forceinline__ void bar_arrive_cluster(unsigned long long* bar) {
  unsigned rank, remote;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(bar)), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;");
}

__global__ void probe(const float* in, float* out, int mode) {
  __shared__ alignas(16) float buf[32];
  __shared__ alignas(8) unsigned long long bar;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    bar_init(&bar, 32);
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  if (warp == 0) {  // producer
    if (mode == kPlain) {
      buf[lane] = in[lane];
    } else {
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(&buf[lane])), "l"(in + lane));
    }
    if (mode == kNoinc || mode == kRacy) {
      asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" ::"r"(smem_addr(&bar)));
    } else {
      if (mode == kWaitAll) asm volatile("cp.async.wait_all;");
      asm volatile("mbarrier.arrive.shared.b64 _, [%0];" ::"r"(smem_addr(&bar)));
    }
  } else {  // consumer
    if (mode != kRacy) bar_wait(&bar, 0);
    out[lane] = buf[31 - lane];
  }
  if (mode == kRacy && warp == 0) bar_wait(&bar, 0);  // the arrivals complete before the CTA exits
}

// Two rounds through one buffer (a 2-stage pipeline of depth 1), as CUTLASS's mainloop reuses a
// stage: round 0 filled by cp.async + arrive.noinc on `full`, read by the consumer warp, released
// on `empty`; the producer waits on `empty`, refills by cp.async, arrives on `full` again; the
// consumer reads round 1. The release is CUTLASS's ClusterBarrier::arrive(cta_id): `mapa` of the
// barrier to a CTA of the cluster (here its own) and mbarrier.arrive.shared::cluster
// (mode reuse_cluster), or a CTA-local mbarrier.arrive (reuse_cta). Launched as clusters of 2 CTAs,
// each with its own buffer and barriers. Both are correct programs.
__global__ void __cluster_dims__(2, 1, 1) reuse(const float* in, float* out, bool cluster_release) {
  __shared__ alignas(16) float buf[32];
  __shared__ alignas(8) unsigned long long full, empty;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    bar_init(&full, 32);
    bar_init(&empty, 32);
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  cluster_sync();
  const float* src = in + blockIdx.x * 64;
  if (warp == 0) {  // producer
    for (int round = 0; round < 2; ++round) {
      if (round == 1) bar_wait(&empty, 0);
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(&buf[lane])), "l"(src + 32 * round + lane));
      asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" ::"r"(smem_addr(&full)));
    }
    bar_wait(&full, 1);  // the last arrivals done before the CTA exits
  } else {  // consumer
    for (int round = 0; round < 2; ++round) {
      bar_wait(&full, round);
      out[blockIdx.x * 64 + 32 * round + lane] = buf[31 - lane];
      if (round == 0) {
        if (cluster_release) {
          bar_arrive_cluster(&empty);
        } else {
          asm volatile("mbarrier.arrive.shared.b64 _, [%0];" ::"r"(smem_addr(&empty)) : "memory");
        }
      }
    }
  }
  cluster_sync();
}

// CUTLASS's full barrier exactly: 33 arrivals — the elected lane's arrive.expect_tx for a bulk
// (TMA-engine) copy that completes the transaction bytes, then 32 lanes' cp.async with
// arrive.noinc — consumed after one wait; `rounds` 2 reuses both buffers after a release.
// Clusters of 2 CTAs, each its own buffers. `multicast` false (modes mixed, mixed_reuse): each CTA
// copies its own bulk bytes and releases its own `empty`. `multicast` true (modes multicast,
// multicast_reuse): the way CUTLASS's 1x2-cluster kernels get their A tiles — CTA 0 issues one
// multicast bulk copy into both CTAs' `bulk` (completing the bytes on each CTA's own `full` at the
// same offset, so a phase may be completed by the *other* CTA's copy), and consumers release the
// stage on both CTAs' `empty` (64 arrivals each: the multicast writer waits for both CTAs'
// readers), as CUTLASS's consumer_release does with a multicast operand. Correct programs.
// Data: mixed, CTA b's round r: buf from in[128b + 64r + ·], bulk from in[128b + 64r + 32 + ·];
// multicast: buf from in[128 + 64b + 32r + ·], bulk (shared) from in[64r + ·].
__global__ void __cluster_dims__(2, 1, 1) mixed(const float* in, float* out, int rounds, bool multicast) {
  __shared__ alignas(128) float bulk[32];
  __shared__ alignas(16) float buf[32];
  __shared__ alignas(8) unsigned long long full, empty;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  if (threadIdx.x == 0) {
    bar_init(&full, 33);
    bar_init(&empty, multicast ? 64 : 32);
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  cluster_sync();
  if (warp == 0) {  // producer
    for (int round = 0; round < rounds; ++round) {
      if (round == 1) bar_wait(&empty, 0);
      const float* local = multicast ? in + 128 + blockIdx.x * 64 + 32 * round : in + blockIdx.x * 128 + 64 * round;
      if (lane == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(smem_addr(&full)), "r"(128));
        if (!multicast) {
          asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 128, [%2];"
                       ::"r"(smem_addr(bulk)), "l"(local + 32), "r"(smem_addr(&full)) : "memory");
        } else if (rank == 0) {
          asm volatile(
              "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
              " [%0], [%1], 128, [%2], %3;" ::"r"(smem_addr(bulk)),
              "l"(in + 64 * round), "r"(smem_addr(&full)), "h"(static_cast<unsigned short>(3))
              : "memory");
        }
      }
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(&buf[lane])), "l"(local + lane));
      asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" ::"r"(smem_addr(&full)));
    }
    bar_wait(&full, (rounds - 1) & 1);
  } else {  // consumer
    for (int round = 0; round < rounds; ++round) {
      bar_wait(&full, round);
      out[blockIdx.x * 128 + 64 * round + lane] = buf[31 - lane];
      out[blockIdx.x * 128 + 64 * round + 32 + lane] = bulk[31 - lane];
      if (round + 1 < rounds) {
        for (unsigned cta = 0; cta < 2; ++cta) {  // ClusterBarrier::arrive(cta_id)
          if (!multicast && cta != rank) continue;
          unsigned remote;
          asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(&empty)), "r"(cta));
          asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
        }
      }
    }
  }
  cluster_sync();
}

// A stage read by all 128 threads of a consumer warpgroup, released by ONE of them — CUTLASS's
// PipelineTmaAsync::consumer_release (sm90_pipeline.hpp: spread_arrivals_to_warpgroup, one signalling
// thread per warpgroup and destination CTA; the empty barrier counts one arrival per warpgroup and
// CTA), as the blockwise-FP8 mainloop does with its scale factors: every consumer thread LDSes its
// scales, the warpgroup's wgmma runs, warpgroup_wait<0>, then thread 0 alone arrives on `empty`
// (sm90_mma_array_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp, mma()). The producer
// (warp 4, 32 lanes) refills the stage by cp.async + arrive.noinc once `empty` completes: two rounds
// through one buffer. Block: warps 0-3 the consumer warpgroup, warp 4 the producer.
// What orders warps 1-3's reads of round 0 before thread 0's release (and so before the refill)
// differs by mode:
//   split       the warpgroup-collective wgmma alone (the kernel's case): warp 0's wait_group 0
//               cannot return before warps 1-3 issued the warpgroup's wgmma, which follows their
//               reads in program order — correct on the hardware, but no synchronisation racecheck
//               knows. Expected: WAR hazards reported (LDS of warps 1-3 vs the producer's LDGSTS).
//   split_bar   + bar.sync 1, 128 by the warpgroup before the release (the proposed fix). Expected 0.
//   split_arrive  warps 1-3 bar.arrive 1, 128 (no wait), warp 0 bar.sync 1, 128 before its
//               release (the cheaper fix: only the signalling warp waits). Expected 0 if racecheck
//               orders bar.arrive before the matching bar.sync.
//   split_warp  no bar: each warp's lane 0 arrives on `empty` (count 4) after __syncwarp — per-warp
//               signalling. Expected 0 if racecheck orders a warp's lanes by __syncwarp.
//   split_all   no bar: every consumer thread arrives on `empty` itself (count 128), after its own
//               read — a release by the reading thread, which racecheck may model where it does
//               not model bar.sync / __syncwarp before another thread's release (split_bar,
//               split_warp: 1 hazard each on the H200, 2026-12-04). If this mode reports 0, the
//               block-scaled consumer loop's fix is a pipeline whose empty barriers count every
//               local consumer thread (plus the peer CTA's one signal per warpgroup), not yet
//               run (added 2026-12-06).
// The wgmma: m64n8k16 bf16 -> f32 on operands in shared memory that nothing writes afterwards (its
// result only kept alive), so its smem reads (async proxy) take no part in the hand-off.
enum SplitOrder { kSplitWgmma, kSplitBar, kSplitArrive, kSplitWarp, kSplitAll };

__device__ __forceinline__ unsigned long long wgmma_desc(const void* p) {
  // No swizzle (interleave), start address >> 4, leading byte offset 128, stride byte offset 256.
  const unsigned long long a = (smem_addr(p) & 0x3FFFF) >> 4;
  return a | (static_cast<unsigned long long>(128 >> 4) << 16) | (static_cast<unsigned long long>(256 >> 4) << 32);
}

__global__ void __launch_bounds__(160) split(const float* in, float* out, float* sink, int order) {
  __shared__ alignas(128) unsigned short a_tile[64 * 16];  // bf16 64x16 (2 KB)
  __shared__ alignas(128) unsigned short b_tile[8 * 16];   // bf16 8x16
  __shared__ alignas(16) float buf[32];
  __shared__ alignas(8) unsigned long long full, empty;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int i = threadIdx.x; i < 64 * 16; i += blockDim.x) a_tile[i] = 0x3f80;  // 1.0
  for (int i = threadIdx.x; i < 8 * 16; i += blockDim.x) b_tile[i] = 0x3f80;
  if (threadIdx.x == 0) {
    bar_init(&full, 32);
    bar_init(&empty, order == kSplitWarp ? 4 : order == kSplitAll ? 128 : 1);
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the operands, for the wgmma
  __syncthreads();
  if (warp == 4) {  // producer
    for (int round = 0; round < 2; ++round) {
      if (round == 1) bar_wait(&empty, 0);
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(&buf[lane])), "l"(in + 32 * round + lane));
      asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" ::"r"(smem_addr(&full)));
    }
    bar_wait(&full, 1);  // the last arrivals done before the CTA exits
    return;
  }
  // consumer warpgroup: threads 0..127
  float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
  for (int round = 0; round < 2; ++round) {
    bar_wait(&full, round);
    const float v = buf[(threadIdx.x * 7 + round) % 32];  // every thread reads (the scales' LDS)
    out[round * 128 + threadIdx.x] = v;
    if (round == 0) {
      const unsigned long long da = wgmma_desc(a_tile), db = wgmma_desc(b_tile);
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
      asm volatile(
          "{\n .reg .pred p;\n setp.ne.b32 p, %6, 0;\n"
          " wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
          : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
          : "l"(da), "l"(db), "r"(1));
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
      if (order == kSplitBar) {
        asm volatile("bar.sync 1, 128;" ::: "memory");
      } else if (order == kSplitArrive) {
        if (warp == 0) asm volatile("bar.sync 1, 128;" ::: "memory");
        else asm volatile("bar.arrive 1, 128;" ::: "memory");
      } else if (order == kSplitWarp) {
        __syncwarp();
      }
      const bool signals = order == kSplitAll ? true : order == kSplitWarp ? lane == 0 : threadIdx.x == 0;
      if (signals) asm volatile("mbarrier.arrive.shared.b64 _, [%0];" ::"r"(smem_addr(&empty)) : "memory");
    }
  }
  sink[threadIdx.x] = d0 + d1 + d2 + d3;  // keeps the wgmma
}

int main(int argc, char** argv) {
  const char* names[] = {"noinc", "wait_all", "plain", "racy", "reuse_cluster", "reuse_cta", "mixed", "mixed_reuse",
                         "multicast", "multicast_reuse", "split", "split_bar", "split_arrive", "split_warp",
                         "split_all"};
  int mode = -1;
  for (int m = 0; m < 15; ++m) {
    if (argc > 1 && std::strcmp(argv[1], names[m]) == 0) mode = m;
  }
  if (mode < 0) {
    std::fprintf(stderr, "usage: %s noinc|wait_all|plain|racy|reuse_cluster|reuse_cta|mixed|mixed_reuse|multicast|multicast_reuse|"
                         "split|split_bar|split_arrive|split_warp|split_all\n", argv[0]);
    return 2;
  }
  if (mode >= 10) {  // split*: 2 rounds x 128 consumer threads; thread t of round r reads in[32r + (7t + r) % 32]
    float h2[64], got2[256];
    for (int i = 0; i < 64; ++i) h2[i] = 1.5f * static_cast<float>(i) - 7.0f;
    float *in2 = nullptr, *out2 = nullptr, *sink = nullptr;
    cudaMalloc(&in2, sizeof h2);
    cudaMalloc(&out2, sizeof got2);
    cudaMalloc(&sink, 128 * sizeof(float));
    cudaMemcpy(in2, h2, sizeof h2, cudaMemcpyHostToDevice);
    cudaMemset(out2, 0xFF, sizeof got2);
    split<<<1, 160>>>(in2, out2, sink, mode - 10);
    const cudaError_t e2 = cudaDeviceSynchronize();
    cudaMemcpy(got2, out2, sizeof got2, cudaMemcpyDeviceToHost);
    if (e2 != cudaSuccess) {
      std::printf("%s: %s\n", names[mode], cudaGetErrorString(e2));
      return 1;
    }
    int wrong2 = 0;
    for (int r = 0; r < 2; ++r) {
      for (int t = 0; t < 128; ++t) wrong2 += got2[r * 128 + t] != h2[32 * r + (7 * t + r) % 32];
    }
    std::printf("%s: %d of 256 values wrong\n", names[mode], wrong2);
    return wrong2 != 0;
  }
  const bool two_rounds = mode == 4 || mode == 5;
  const int n = mode >= 6 ? 256 : two_rounds ? 128 : 32;  // CTAs x rounds x 32 (x2 mixed, multicast)
  float h[256], got[256];
  for (int i = 0; i < n; ++i) h[i] = 1.5f * static_cast<float>(i) - 7.0f;
  float *in = nullptr, *out = nullptr;
  cudaMalloc(&in, sizeof h);
  cudaMalloc(&out, sizeof h);
  cudaMemcpy(in, h, sizeof h, cudaMemcpyHostToDevice);
  cudaMemset(out, 0xFF, sizeof h);
  if (mode >= 6) {
    mixed<<<2, 64>>>(in, out, mode == 7 || mode == 9 ? 2 : 1, mode >= 8);
  } else if (two_rounds) {
    reuse<<<2, 64>>>(in, out, mode == 4);
  } else {
    probe<<<1, 64>>>(in, out, mode);
  }
  const cudaError_t e = cudaDeviceSynchronize();
  cudaMemcpy(got, out, sizeof h, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    std::printf("%s: %s\n", names[mode], cudaGetErrorString(e));
    return 1;
  }
  int wrong = 0;
  for (int i = 0; i < n; ++i) {
    if ((mode == 6 || mode == 8) && i % 128 >= 64) continue;  // one round: half written
    int want = i / 32 * 32 + 31 - i % 32;                     // each row of 32 read reversed
    if (mode >= 8) {  // multicast: [cta][round][buf: in[128 + cta·64 + 32·round + ·] | bulk: in[64·round + ·]]
      const int cta = i / 128, round = i % 128 / 64, lane = i % 32;
      want = i % 64 < 32 ? 128 + cta * 64 + 32 * round + 31 - lane : 64 * round + 31 - lane;
    }
    wrong += got[i] != h[want];
  }
  std::printf("%s: %d of %d values wrong%s\n", names[mode], wrong, n, mode == kRacy ? " (racy: any count)" : "");
  return mode != kRacy && wrong != 0;
}
