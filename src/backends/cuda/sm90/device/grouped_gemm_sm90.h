// Internal: moekit's ahead-of-time compiled Hopper (sm_90a) grouped GEMMs, group-M (below) and group-K
// (the weight gradient, further down), behind a raw-pointer interface (no moekit::Tensor, no
// CUTLASS types: this header is cheap to include).
//
// Math (one launch for all G groups; m_g = counts[g] read FROM DEVICE MEMORY, off_g = sum_{j<g} m_j):
//   b_transposed (fprop, b = weight [G, N, K]):  out[off_g : off_g+m_g] = a[off_g : off_g+m_g] · b[g]ᵀ (+ bias[g])
//   plain        (dgrad, b = weight [G, K, N]):  out[off_g : off_g+m_g] = a[off_g : off_g+m_g] · b[g]   (+ bias[g])
// a [T, K], out [T, N], bias [G, N]: row-major, dense, 16-byte aligned; bf16 or f16 in and out,
// fp32 accumulation, the bias added in fp32 before the one rounding to the output dtype.
//
// Promises:
//  - No host synchronisation and no host read of the counts: a small setup kernel turns the
//    counts into per-group problem shapes, pointers and strides inside `workspace`, then the
//    CUTLASS 3.x ptr-array grouped kernel (TMA + wgmma, warp-specialised, persistent) runs over
//    them. Both launches go on `stream`: the pair is capturable in a CUDA graph and replays with
//    whatever counts the device holds at replay time.
//  - Rows [S, T) of `out` are never written (TMA stores are clipped at each group's m_g rows);
//    a zero-row group produces no tiles (the persistent scheduler skips it; no CTA is spent).
//  - Invalid device counts (a negative count, or S > T) make every group empty — nothing is read
//    out of bounds and nothing is written — and OR the reason into counts.error_word when it is
//    given (device_counts.h), for the caller to query later.
//  - Deterministic: no split-K, no atomics; same inputs → same bits.
//
// Use:  std::string why = rejects(p, device);  if (why.empty()) {
//         void* ws = <stream-ordered allocation of workspace_bytes(p) bytes>;
//         run(p, ws, stream); }
// Kernels: kernel/group_m_kernel.cuh (the CUTLASS configuration + setup kernel + launcher),
// instances in instances/; the choice of instance: heuristics.h / heuristics.cpp; the checks:
// grouped_gemm_sm90.cpp. Every field below left automatic (-1) is heuristics.h's; the study
// override (bench/studies/sm90_study_settings.h, MOEKIT_SM90_STUDY) may fix it for A/B runs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "backends/cuda/device_counts.h"
#include "moekit/core/dtype.h"

namespace moekit::cuda::sm90 {

struct GroupMProblem {
  const void* a = nullptr;     // [rows, k] row-major (x for fprop, dy for dgrad)
  const void* b = nullptr;     // [groups, n, k] when b_transposed, else [groups, k, n]
  bool b_transposed = true;    // true: out = a·bᵀ (fprop); false: out = a·b (dgrad)
  const void* bias = nullptr;  // [groups, n] or nullptr
  void* out = nullptr;         // [rows, n] row-major; rows [S, rows) untouched
  DeviceCounts counts;         // m_g in device memory; counts.groups = G, counts.rows = T
  int64_t k = 0, n = 0;
  DType dtype = DType::BF16;   // of a, b, bias and out: BF16 or F16
  int config = -1;             // kernel configuration: -1 = automatic; else an index (below)
  // Tile order of the persistent scheduler: raster 0 walks M first (CTAs in flight share weight
  // tiles), 1 walks N first; swizzle 1, 2, 4, 8 or 16: with raster 0, a group's tiles in stripes that
  // many cluster units wide across N, N fastest inside a stripe (blocked_scheduler.cuh, `stripe`:
  // fewer operand rows in flight, so fewer DRAM reads); with raster 1, CUTLASS's own swizzle, which
  // its grouped scheduler caps at 2. A width | kStripeMFirst (tile_units.h): M fastest inside each
  // stripe (raster 0). -1: automatic — raster 0, and per group the width (1, 4, 8 or 16) with the
  // fewest estimated DRAM reads for its rows on the chosen tile, written by the setup kernel
  // (heuristics.h, choose_stripe; kernel_common.cuh, group_stripe). The same apply to
  // GroupKProblem.
  int raster = -1;
  int swizzle = -1;
  // Tile order (blocked_scheduler.cuh): -1 automatic (CUTLASS's: heuristics.h, tile orders), 0
  // CUTLASS's, 1 blocked, c >= 2 chunks of c (1 and c only with raster 0).
  int order = -1;
  // Programmatic dependent launch of the GEMM after its setup kernel (kernel_common.cuh,
  // run_gemm): -1 automatic (on: heuristics.h, kPdl), 0 off, 1 on.
  int pdl = -1;
  // How a CTA's tiles walk K (k_order.cuh): -1 automatic (forward: heuristics.h, kKOrder), 0
  // forward, 1 alternating (a CTA's odd-numbered tiles walk K backwards, so a wave starts on the K
  // blocks the wave before read last, still in L2). The same applies to GroupKProblem (K = the
  // group's rows).
  int k_order = -1;
  // SMs the persistent grid may use (Context::with_sm_margin; kernel_common.cuh, limit_sms): 0 all
  // of the device's, else at most this many, rounded down to whole clusters (at least one). The
  // same applies to GroupKProblem.
  int sms = 0;
  // Fused SwiGLU (fc1 of a grouped MLP; swiglu_epilogue.cuh): when glu_z is set, the epilogue also
  // writes glu_z [rows, n/2] = p_t · silu(a) · b of `out` (= h) in the Interleaved32 layout, with
  // p_t = glu_probs[t] (nullptr: 1). Needs b_transposed and n % 64 == 0; bit-identical to running
  // swiglu_forward on `out` afterwards.
  void* glu_z = nullptr;
  const float* glu_probs = nullptr;
  // Fused SwiGLU backward (fc2 dgrad; swiglu_epilogue.cuh): when dglu_dh is set, the product
  // (dz, [rows, n]; not stored: `out` must be null) becomes dh [rows, 2n] (Interleaved32) from
  // dglu_h and glu_probs, and
  // dglu_dprobs [rows] (or null) gets dp_t = Σ_j dz·silu(a)·b, written or added (dglu_accumulate).
  const void* dglu_h = nullptr;
  void* dglu_dh = nullptr;
  float* dglu_dprobs = nullptr;
  bool dglu_accumulate = false;
};

/// Kernel configurations (GroupMProblem::config): tile shape and schedule. Automatic choice:
/// kSmallM when the mean rows per group is below kSmallMRows (heuristics.h), else kLarge.
inline constexpr int kLarge = 0;   // cluster 1x2 (A multicast); fprop: ping-pong 128x128x64,
                                   // dgrad: cooperative 128x256x64 (kernel_common.cuh)
inline constexpr int kSmallM = 1;  // ping-pong, 64x128x64 tile, cluster 1x1 (deep pipeline)
inline constexpr int kConfigCount = 2;

/// "" when the kernels can run `p` on CUDA device `device`, else why not (one sentence naming
/// the value seen): not an sm_90 device, dtype, k or n not a multiple of 8 (TMA needs 16-byte
/// aligned rows), k = 0, a pointer not 16-byte aligned, sizes beyond 32-bit problem extents.
std::string rejects(const GroupMProblem& p, int device);

/// Bytes of device workspace run() needs for `p` on the current device (per-group arrays and
/// the grouped kernel's TMA-descriptor workspace; a few KiB plus ~100 bytes per group).
size_t workspace_bytes(const GroupMProblem& p);

/// Queues the setup kernel and the grouped GEMM on `stream` (current device = the data's).
/// `workspace` holds workspace_bytes(p) bytes, 256-byte aligned, reserved until the work is done
/// (stream order). Throws moekit::Error(Runtime) if a launch fails.
void run(const GroupMProblem& p, void* workspace, cudaStream_t stream);

/// The kernel configuration run() picks for `p` (benchmarks and tests print it), e.g.
/// "bf16 b:k-major pingpong 128x128x64 cluster 1x2".
std::string config_name(const GroupMProblem& p);

// ---- group-K (the weight gradient) ----
//
// Math (one launch for all G groups; m_g from device memory as above):
//   dw[g] = dy[off_g : off_g+m_g]ᵀ · x[off_g : off_g+m_g]        (accumulate = false)
//   dw[g] = dw[g] + (same)                                         (accumulate = true; dw f32)
// dy [T, N], x [T, K] row-major, dense, 16-byte aligned, bf16 or f16; dw [G, N, K] dense in f32
// or the input dtype; fp32 accumulation, one rounding to dw's dtype.
//
// Promises, beyond group-M's (no host sync, graph-capturable, invalid counts write nothing):
//  - The per-group reduction runs over the rows of the group only (TMA zero-fills the K tail of
//    a group: rows of the next group are never read into it); deterministic, no split-K.
//  - A group with m_g = 0 gets exactly 0 (the setup kernel's other blocks; the GEMM gives it no tiles), or is
//    left unchanged when accumulating. With beta = 0 the old dw is never read (NaN stays out).
struct GroupKProblem {
  const void* dy = nullptr;    // [rows, n]
  const void* x = nullptr;     // [rows, k]
  void* dw = nullptr;          // [groups, n, k]
  DeviceCounts counts;
  int64_t k = 0, n = 0;
  DType dtype = DType::BF16;   // of dy and x: BF16 or F16
  DType dw_dtype = DType::F32; // F32, or = dtype
  bool accumulate = false;     // dw += (needs dw_dtype F32)
  // Tile order (blocked_scheduler.cuh): -1 automatic (heuristics.h, tile orders: chunks of 4 when
  // a group has fewer tiles than the device has SMs, else the balanced order), 0 CUTLASS's, 1
  // blocked, c >= 2 chunks of c, kSnakeOrder (-2, tile_units.h) the balanced order (the snake walk
  // over the groups laid out largest first). Orders other than CUTLASS's need raster 0.
  int order = -1;
  int pdl = -1;  // as GroupMProblem::pdl
  int k_order = -1;  // as GroupMProblem::k_order
  int sms = 0;       // as GroupMProblem::sms
  // Raster and swizzle of the [n, k] output tiles (M = n, N = k), as GroupMProblem's.
  int raster = -1;
  int swizzle = -1;
};

std::string rejects(const GroupKProblem& p, int device);
size_t workspace_bytes(const GroupKProblem& p);
/// Queues the setup kernel (which also zeroes the empty groups' dw unless accumulating) and the
/// grouped GEMM on `stream`: two kernels.
void run(const GroupKProblem& p, void* workspace, cudaStream_t stream);
std::string config_name(const GroupKProblem& p);

/// Whether the setup kernels build every group's TMA descriptors (collective/prebuilt_tensormaps.cuh;
/// heuristics.h, kPrebuiltTensormaps), else CUTLASS's per-SM copy rewritten on each group change
/// (the study override's prebuilt_tensormaps=0). heuristics.cpp.
bool prebuilt_tensormaps_setting();

}  // namespace moekit::cuda::sm90
