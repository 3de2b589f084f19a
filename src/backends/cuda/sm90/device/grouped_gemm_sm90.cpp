// Host side of the sm90 grouped GEMMs (grouped_gemm_sm90.h, and the FP8 ones: fp8_gemm_sm90.h): the checks that decide whether the
// kernels can run a call, and its launch on the instance heuristics.cpp chooses. No CUTLASS here:
// the kernels live in instances/.
#include "backends/cuda/sm90/device/grouped_gemm_sm90.h"

#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "backends/cuda/sm90/device/fp8_gemm_sm90.h"
#include "backends/cuda/sm90/heuristics.h"
#include "backends/cuda/sm90/instances/fp8_instances.h"
#include "backends/cuda/sm90/instances/group_k_instances.h"
#include "backends/cuda/sm90/instances/group_m_instances.h"
#include "backends/cuda/sm90/scheduler/tile_units.h"
#include "../../../../../bench/studies/sm90_study_settings.h"  // study_settings(): every field -1 in the product
#if MOEKIT_SM90_STUDY_OVERRIDE
#include "../../../../../bench/studies/sm90_fp8_fast_study.h"  // a study build's FP8 fprop tiles
#endif
#include "moekit/core/error.h"

namespace moekit::cuda::sm90 {
namespace {

// A problem's automatic settings resolved (heuristics.cpp): what the kernels and their cached
// Params see.
template <class Problem>
Problem resolved(Problem q) {
  resolve_settings(q);
  return q;
}

// The raster, swizzle and K order a problem names: -1 (automatic) or a value the kernels take.
template <class Problem>
std::string rejects_schedule(const Problem& p) {
  if (p.raster < -1 || p.raster > 1) return str("raster -1, 0 or 1, got ", p.raster);
  if (p.k_order < -1 || p.k_order > 1) return str("k_order -1, 0 or 1, got ", p.k_order);
  const int m_first = static_cast<int>(kStripeMFirst);
  const int width = p.swizzle > 0 ? p.swizzle & ~m_first : p.swizzle;
  if (width != -1 && width != 1 && width != 2 && width != 4 && width != 8 && width != 16) {
    return str("swizzle -1, 1, 2, 4, 8 or 16, got ", p.swizzle);
  }
  if (p.swizzle > 0 && (p.swizzle & m_first) != 0 && (width == 1 || p.raster == 1)) {
    return str("swizzle ", width,
               " with M first inside the stripes needs raster 0 and a width > 1");
  }
  return {};
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// What both forms check: an sm_90 device, 16-bit inputs, K and N multiples of 8 (TMA rows of 16
// bytes), 32-bit extents, counts in device memory, 16-byte aligned pointers.
std::string rejects_common(int device, DType dtype, const DeviceCounts& counts, int64_t k,
                           int64_t n, std::initializer_list<std::pair<const char*, const void*>> ptrs) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return str("cannot query CUDA device ", device);
  }
  if (major != 9 || minor != 0) {
    return str("needs an sm_90 (Hopper) device; cuda:", device, " is sm_", major, minor);
  }
  if (dtype != DType::BF16 && dtype != DType::F16) {
    return str("dtype bf16 or f16 only, got ", name(dtype));
  }
  if (k % 8 != 0) return str("K = ", k, " is not a multiple of 8 (TMA needs 16-byte rows)");
  if (n % 8 != 0) return str("N = ", n, " is not a multiple of 8 (TMA needs 16-byte rows)");
  for (const auto& [label, v] : {std::pair{"T (rows)", counts.rows}, std::pair{"K", k},
                                  std::pair{"N", n}, std::pair{"G (groups)", counts.groups}}) {
    if (v > INT_MAX) return str(label, " = ", v, " exceeds the kernels' 32-bit extents");
  }
  if (!counts.counts) return "the counts must be in device memory (got none)";
  if (reinterpret_cast<uintptr_t>(counts.counts) % (counts.i64 ? 8 : 4) != 0) {
    return "the counts are not aligned to their element size";
  }
  for (const auto& [label, ptr] : ptrs) {
    if (ptr && !aligned16(ptr)) return str(label, " is not 16-byte aligned (TMA)");
  }
  return "";
}

}  // namespace

std::string rejects(const GroupMProblem& p, int device) {
  (void)study_settings();  // a wrong MOEKIT_SM90_STUDY throws here, before anything is queued
  if (p.k <= 0) return str("K = ", p.k, ": the product is empty (K must be > 0)");
  if (std::string why = rejects_schedule(p); !why.empty()) return why;
  if (p.glu_z) {
    if (!p.b_transposed) return "the SwiGLU epilogue is built for fprop (b transposed) only";
    if (p.n % 64 != 0) {
      return str("N = 2F = ", p.n, " is not a multiple of 64 (the SwiGLU epilogue's pairs)");
    }
    if (reinterpret_cast<uintptr_t>(p.glu_z) % 4 != 0) return "z is not 4-byte aligned";
  }
  if (p.dglu_dh) {
    if (p.glu_z) return "SwiGLU forward and backward epilogues cannot be combined";
    if (p.out) return "the SwiGLU backward epilogue stores no product (out must be null)";
    if (p.b_transposed) return "the SwiGLU backward epilogue is built for dgrad (b plain) only";
    if (p.n % 32 != 0) return str("N = F = ", p.n, " is not a multiple of 32 (Interleaved32)");
    for (const void* ptr : {p.dglu_h, static_cast<const void*>(p.dglu_dh)}) {
      if (!aligned16(ptr)) return "h or dh is not 16-byte aligned (the epilogue's 16-byte accesses)";
    }
  }
  return rejects_common(device, p.dtype, p.counts, p.k, p.n,
                        {{"a", p.a}, {"b", p.b}, {"out", p.out}, {"bias", p.bias}});
}

size_t workspace_bytes(const GroupMProblem& p) {
  if (p.counts.groups <= 0 || p.n == 0) return 0;
  const GroupMProblem q = resolved(p);
  return choose_instance(q).workspace_bytes(q);
}

void run(const GroupMProblem& p, void* workspace, cudaStream_t stream) {
  if (p.counts.groups <= 0 || p.n == 0) return;  // out [T, 0]: nothing to write
  const GroupMProblem q = resolved(p);
  choose_instance(q).run(q, workspace, stream);
}

std::string config_name(const GroupMProblem& p) { return choose_instance(p).name; }

std::string rejects(const GroupKProblem& p, int device) {
  (void)study_settings();
  if (p.dw_dtype != DType::F32 && p.dw_dtype != p.dtype) {
    return str("dw dtype f32 or ", name(p.dtype), ", got ", name(p.dw_dtype));
  }
  if (p.accumulate && p.dw_dtype != DType::F32) return "accumulating needs an f32 dw";
  if (std::string why = rejects_schedule(p); !why.empty()) return why;
  return rejects_common(device, p.dtype, p.counts, p.k, p.n,
                        {{"dy", p.dy}, {"x", p.x}, {"dw", p.dw}});
}

size_t workspace_bytes(const GroupKProblem& p) {
  if (p.counts.groups <= 0 || p.n == 0 || p.k == 0) return 0;
  const GroupKProblem q = resolved(p);
  return choose_instance(q).workspace_bytes(q);
}

void run(const GroupKProblem& p, void* workspace, cudaStream_t stream) {
  if (p.counts.groups <= 0 || p.n == 0 || p.k == 0) return;  // dw [G, 0, *] or [G, *, 0]
  const GroupKProblem q = resolved(p);
  choose_instance(q).run(q, workspace, stream);
}

std::string config_name(const GroupKProblem& p) { return choose_instance(p).name; }

// ---- FP8 (fp8_gemm_sm90.h) ----
namespace {

// 16-byte rows and group starts of 8-bit codes; each extent named as the problem's field.
std::string rejects_fp8_extents(std::initializer_list<std::pair<const char*, int64_t>> extents) {
  for (const auto& [label, v] : extents) {
    if (v % 16 != 0) return str(label, " = ", v, " is not a multiple of 16 (TMA rows of 8-bit codes)");
  }
  return "";
}

// The instance of the output dtype: group-M bf16 or f16; group-K f32 (main_grad), bf16 or f16.
template <class I>
const I& of_dtype(DType dtype, const I& bf16, const I& f16) {
  return dtype == DType::F16 ? f16 : bf16;
}
template <class I>
const I& of_dtype(DType dtype, const I& f32, const I& bf16, const I& f16) {
  return dtype == DType::F32 ? f32 : of_dtype(dtype, bf16, f16);
}

const Fp8GroupMInstance& choose_fp8(const Fp8GroupMProblem& p) {
  const DType d = p.dtype;
  if (p.scaling == Fp8Scaling::Block) {
    if (!p.b_scales_mn_major) return of_dtype(d, fp8_block_group_m_fprop, fp8_block_group_m_fprop_f16);
    if (p.a_code == Fp8Code::E5M2) return of_dtype(d, fp8_block_group_m_dgrad_e5m2, fp8_block_group_m_dgrad_e5m2_f16);
    return of_dtype(d, fp8_block_group_m_dgrad_e4m3, fp8_block_group_m_dgrad_e4m3_f16);
  }
  if (p.a_code == Fp8Code::E5M2) return of_dtype(d, fp8_group_m_e5m2_promoted, fp8_group_m_e5m2_promoted_f16);
  if (p.fast_accumulation) {
    const int study = study_settings().fp8_fast;  // pingpong12 | pingpong21 | coop256; -1: the rule
#if MOEKIT_SM90_STUDY_OVERRIDE
    if (study == 1 && d == DType::BF16) return fp8_group_m_e4m3_fast_pingpong21;
#endif
    const bool coop256 = study < 0 ? takes_fp8_fast_coop256(p.counts.rows, p.counts.groups) : study == 2;
    if (coop256) return of_dtype(d, fp8_group_m_e4m3_fast_coop256, fp8_group_m_e4m3_fast_coop256_f16);
    return of_dtype(d, fp8_group_m_e4m3_fast, fp8_group_m_e4m3_fast_f16);
  }
  return of_dtype(d, fp8_group_m_e4m3_promoted, fp8_group_m_e4m3_promoted_f16);
}
const Fp8GroupKInstance& choose_fp8(const Fp8GroupKProblem& p) {
  const DType d = p.dw_dtype;
  if (p.scaling == Fp8Scaling::Block) {
    if (p.dy_code == Fp8Code::E5M2) {
      return of_dtype(d, fp8_block_group_k_e5m2_f32, fp8_block_group_k_e5m2_bf16, fp8_block_group_k_e5m2_f16);
    }
    return of_dtype(d, fp8_block_group_k_e4m3_f32, fp8_block_group_k_e4m3_bf16, fp8_block_group_k_e4m3_f16);
  }
  if (p.dy_code == Fp8Code::E5M2) return of_dtype(d, fp8_group_k_e5m2_f32, fp8_group_k_e5m2_bf16, fp8_group_k_e5m2_f16);
  return of_dtype(d, fp8_group_k_e4m3_f32, fp8_group_k_e4m3_bf16, fp8_group_k_e4m3_f16);
}

}  // namespace

std::string rejects(const Fp8GroupMProblem& p, int device) {
  (void)study_settings();
  if (p.k <= 0) return str("K = ", p.k, ": the product is empty (K must be > 0)");
  if (p.b_code != Fp8Code::E4M3) return "B (the weight) must be e4m3 (the compiled FP8 instances)";
  if (p.scaling == Fp8Scaling::Block) {
    if (p.fast_accumulation) return "block scales are promoted every K block: no fast accumulation";
    if (p.a_code == Fp8Code::E5M2 && !p.b_scales_mn_major) {
      return "an e5m2 A (a gradient) with block scales runs as dgrad only (the weight's scales MN-major)";
    }
    if (p.b_scale_group_stride <= 0) return "block scales need the weight's scale group stride";
  } else if (p.a_code == Fp8Code::E5M2 && p.fast_accumulation) {
    return "an e5m2 A (a gradient) runs with promoted accumulation only (dgrad)";
  }
  if (p.dtype != DType::BF16 && p.dtype != DType::F16) {
    return str("the FP8 GEMMs write bf16 or f16, got ", name(p.dtype));
  }
  if (!p.scale_a || !p.scale_b) return "the scales of A and B must be given";
  if (p.glu_z || p.dglu_dh) return "the FP8 GEMMs fuse no SwiGLU";
  if (std::string why = rejects_schedule(p); !why.empty()) return why;
  if (std::string why = rejects_fp8_extents({{"K", p.k}, {"N", p.n}, {"ldb", p.ldb},
                                             {"the weight's group stride", p.b_group_stride}});
      !why.empty()) {
    return why;
  }
  if (p.ldb < p.k) return str("ldb = ", p.ldb, " is below K = ", p.k);
  return rejects_common(device, p.dtype, p.counts, p.k, p.n,
                        {{"a", p.a}, {"b", p.b}, {"out", p.out}, {"bias", p.bias}});
}

size_t workspace_bytes(const Fp8GroupMProblem& p) {
  if (p.counts.groups <= 0 || p.n == 0) return 0;
  const Fp8GroupMProblem q = resolved(p);
  return choose_fp8(q).workspace_bytes(q);
}

void run(const Fp8GroupMProblem& p, void* workspace, cudaStream_t stream) {
  if (p.counts.groups <= 0 || p.n == 0) return;
  const Fp8GroupMProblem q = resolved(p);
  choose_fp8(q).run(q, workspace, stream);
}

std::string config_name(const Fp8GroupMProblem& p) { return choose_fp8(p).name; }

std::string rejects(const Fp8GroupKProblem& p, int device) {
  (void)study_settings();
  if (p.x_code != Fp8Code::E4M3) return "x must be e4m3 (the compiled FP8 instances)";
  if (p.dw_dtype != DType::F32 && p.dw_dtype != DType::BF16 && p.dw_dtype != DType::F16) {
    return str("dw dtype f32, bf16 or f16, got ", name(p.dw_dtype));
  }
  if (p.accumulate && p.dw_dtype != DType::F32) return "accumulating needs an f32 dw";
  if (!p.scale_dy || !p.scale_x) return "the scales of dy and x must be given";
  if (std::string why = rejects_schedule(p); !why.empty()) return why;
  if (std::string why = rejects_fp8_extents({{"K", p.k}, {"N", p.n}, {"ld", p.ld}}); !why.empty()) {
    return why;
  }
  if (p.ld < p.counts.rows) return str("ld = ", p.ld, " is below T = ", p.counts.rows);
  return rejects_common(device, DType::BF16, p.counts, p.k, p.n,
                        {{"dy", p.dy}, {"x", p.x}, {"dw", p.dw}});
}

size_t workspace_bytes(const Fp8GroupKProblem& p) {
  if (p.counts.groups <= 0 || p.n == 0 || p.k == 0) return 0;
  const Fp8GroupKProblem q = resolved(p);
  return choose_fp8(q).workspace_bytes(q);
}

void run(const Fp8GroupKProblem& p, void* workspace, cudaStream_t stream) {
  if (p.counts.groups <= 0 || p.n == 0 || p.k == 0) return;
  const Fp8GroupKProblem q = resolved(p);
  choose_fp8(q).run(q, workspace, stream);
}

std::string config_name(const Fp8GroupKProblem& p) { return choose_fp8(p).name; }

}  // namespace moekit::cuda::sm90
