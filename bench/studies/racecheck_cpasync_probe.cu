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
// cluster — a multicast bulk copy, releases to both CTAs (multicast*: not yet run). The numbers are checked (correct kernels only): exit 1 on a wrong value.
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

int main(int argc, char** argv) {
  const char* names[] = {"noinc", "wait_all", "plain", "racy", "reuse_cluster", "reuse_cta", "mixed", "mixed_reuse",
                         "multicast", "multicast_reuse"};
  int mode = -1;
  for (int m = 0; m < 10; ++m) {
    if (argc > 1 && std::strcmp(argv[1], names[m]) == 0) mode = m;
  }
  if (mode < 0) {
    std::fprintf(stderr, "usage: %s noinc|wait_all|plain|racy|reuse_cluster|reuse_cta|mixed|mixed_reuse|multicast|multicast_reuse\n", argv[0]);
    return 2;
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
