// Internal: moekit's native FP8 grouped GEMMs on Hopper (sm_90a), for per-group ("current",
// per-tensor per expert) scaling — one fp32 scale_inv per group of each operand (SPEC §6b,
// fp8-current) — and for block scaling (fp8-block: 1×128 activation / gradient blocks, 128×128
// weight tiles, fp32 scale_inv each). Raw-pointer interface, no CUTLASS types
// (kernel/fp8_kernel.cuh holds them).
//
// Math (one launch for all G groups, m_g read FROM DEVICE MEMORY, off_g = Σ_{j<g} m_j):
//   group-M: out[off_g : off_g+m_g] = sa[g]·sb[g] · (A_g · B_gᵀ) (+ bias[g])
//            A_g = a + off_g·k (codes [m_g, k], row-major), B_g = b + g·b_group_stride
//            (codes [n, k] with row stride ldb: K-major, as Hopper's FP8 wgmma reads 8-bit
//            operands): fprop B = W's rowwise copy (stride n·k, ldb k); dgrad B = W's columnwise
//            copy [K, G·N] (stride N, ldb G·N, its `k` the layer's N).
//   group-K: dw[g] (+)= sa[g]·sb[g] · (dyᵀ_g · x_g), both from their columnwise copies
//            [n, T] and [k, T] (row stride ld = the copies' row length, T rounded up to 16; the group's columns off_g .. off_g+m_g: K-major
//            along the group's rows). Empty groups: dw[g] = 0 (or unchanged when accumulating).
// The codes' products are accumulated by the tensor cores (fp32 registers; fprop with CUTLASS's
// fast accumulation as TransformerEngine's forward, dgrad and wgrad with the accumulators promoted
// to fp32 every four MMA k-blocks, as TE's split accumulator), scaled once by sa·sb (fp32),
// bias added in fp32, rounded once to the output's bf16 or f16 (or written / added in fp32 for an
// f32 dw).
//
// Block scaling (Fp8Scaling::Block): the same products, each 128-deep K block of the reduction
// scaled by its own sa·sb in fp32 as it is added (CUTLASS's FP8 blockwise mainloop: every K
// block promoted out of the tensor cores' accumulators), no alpha in the epilogue. The scales are
// read in place in the layouts the quantize writes (SPEC §6b):
//   group-M  scale_a: A's 1×128 scale_inv [rows, ⌈k/128⌉] (group g's from row off_g);
//            scale_b: the weight's 128×128 scale_inv [G·⌈N/128⌉, ⌈K/128⌉], group g's from
//            scale_b + g·b_scale_group_stride — fprop reads it K-major, dgrad (B = Wᵀ) MN-major
//            (b_scales_mn_major);
//   group-K  scale_dy, scale_x: the columnwise 1×128 scale_inv [RB, n] and [RB, k], group g's
//            from row block Σ_{j<g} ⌈m_j/128⌉.
// Rows of a group not a multiple of 128: its last block is short (TMA zero-fills the codes past
// it; its scale is the short block's).
//
// Promises as the 16-bit kernels' (grouped_gemm_sm90.h): no host sync, graph-capturable, rows
// [S, T) never written, invalid device counts write nothing and set the error word. group-K also
// needs every count a multiple of 16 (a group's first row is a 16-byte TMA address in the
// columnwise copies): a count that is not makes the call write nothing and sets
// kDeviceCountsMisaligned.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "backends/cuda/sm90/device/grouped_gemm_sm90.h"

namespace moekit::cuda::sm90 {

/// How the operands are scaled: one scale per group (fp8-current), or per block (fp8-block).
enum class Fp8Scaling : uint8_t { PerGroup, Block };

/// The 8-bit formats of an FP8 operand.
enum class Fp8Code : uint8_t { E4M3, E5M2 };

/// The base's a, b, bias, out, counts, k, n and schedule fields (raster, swizzle, order, pdl,
/// k_order, sms) as GroupMProblem's; `dtype` is the output's (BF16 or F16); b_transposed, config and the
/// fused-SwiGLU fields are unused.
struct Fp8GroupMProblem : GroupMProblem {
  Fp8Code a_code = Fp8Code::E4M3, b_code = Fp8Code::E4M3;
  const float* scale_a = nullptr;  // [groups] scale_inv of A's groups (Block: see above)
  const float* scale_b = nullptr;  // [groups] scale_inv of B's groups (Block: see above)
  int64_t b_group_stride = 0;      // elements from B_g to B_{g+1}
  int64_t ldb = 0;                 // B's row stride (elements)
  bool fast_accumulation = true;   // fprop: true (TE's forward); dgrad: false (per group only)
  Fp8Scaling scaling = Fp8Scaling::PerGroup;
  int64_t b_scale_group_stride = 0;  // Block: elements from W_g's scales to W_{g+1}'s
  bool b_scales_mn_major = false;    // Block: dgrad's Wᵀ (see above)
};

/// dy and x: the columnwise copies [n, ld] and [k, ld] (ld: their row length, T rounded up to 16 bytes); dw, counts, k, n,
/// dw_dtype (F32, BF16 or F16), accumulate and the schedule fields as GroupKProblem's.
struct Fp8GroupKProblem : GroupKProblem {
  Fp8Code dy_code = Fp8Code::E5M2, x_code = Fp8Code::E4M3;
  const float* scale_dy = nullptr;  // [groups] (Block: see above)
  const float* scale_x = nullptr;   // [groups] (Block: see above)
  int64_t ld = 0;                   // the copies' row stride (elements): T
  Fp8Scaling scaling = Fp8Scaling::PerGroup;
};

/// Rows per group the FP8 group-K kernels need (see above).
inline constexpr int64_t kFp8GroupKRowMultiple = 16;

/// "" when the FP8 kernels can run p on `device`, else why not: not sm_90, a code pair with no
/// instance (A e4m3 or e5m2, B e4m3), an output other than bf16 / f16 (group-M) or f32 / bf16 / f16 (group-K),
/// k, n or the strides not multiples of 16, a pointer not 16-byte aligned, 32-bit extents.
std::string rejects(const Fp8GroupMProblem& p, int device);
size_t workspace_bytes(const Fp8GroupMProblem& p);
void run(const Fp8GroupMProblem& p, void* workspace, cudaStream_t stream);
std::string config_name(const Fp8GroupMProblem& p);

std::string rejects(const Fp8GroupKProblem& p, int device);
size_t workspace_bytes(const Fp8GroupKProblem& p);
void run(const Fp8GroupKProblem& p, void* workspace, cudaStream_t stream);
std::string config_name(const Fp8GroupKProblem& p);

}  // namespace moekit::cuda::sm90
