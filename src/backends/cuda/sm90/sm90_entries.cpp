// The "sm90" backend entries (sm90_entries.h): primitive arguments → sm90 problems, counts where
// the kernels read them (device splits as they are, host splits copied in stream order), the
// workspace from the context's stream-ordered allocator, launches on the context's stream.
#include "backends/cuda/sm90/sm90_entries.h"

#include <cstdint>
#include <vector>

#include "backends/cuda/resources.h"
#include "backends/contract/quant_args.h"
#include "backends/cuda/sm90/device/fp8_gemm_sm90.h"
#include "backends/cuda/sm90/device/grouped_gemm_sm90.h"
#include "backends/cuda/sm90/heuristics.h"
#include "moekit/core/error.h"

namespace moekit::cuda {
namespace {

// For rejects(): the counts as run() will present them. Host counts are moved to the device by
// run() (int64), so they are checked as if they were there already.
DeviceCounts counts_for_check(const Splits& splits, int64_t groups, int64_t rows) {
  DeviceCounts c;
  c.groups = groups;
  c.rows = rows;
  if (splits.on_host()) {
    alignas(8) static constexpr int64_t kMovedByRun = 0;
    c.counts = &kMovedByRun;
    c.i64 = true;
  } else {
    c.counts = splits.device_counts().data();
    c.i64 = splits.device_counts().dtype() == DType::I64;
  }
  return c;
}

sm90::GroupMProblem problem_of(const detail::GroupMArgs& args, const DeviceCounts& counts) {
  sm90::GroupMProblem p;
  p.a = args.a.data();
  p.b = args.b.data();
  p.b_transposed = args.op == BOp::Transposed;
  p.bias = args.bias.defined() ? args.bias.data() : nullptr;
  p.out = args.out.data();
  p.counts = counts;
  p.k = args.k;
  p.n = args.n;
  p.dtype = args.a.dtype();
  p.sms = gemm_sm_target(args.ctx);  // Context::with_sm_margin
  return p;
}

// fc1 + SwiGLU: the group-M fprop problem of its GEMM, plus the SwiGLU epilogue's outputs.
sm90::GroupMProblem problem_of(const detail::GemmSwigluArgs& args, const DeviceCounts& counts) {
  sm90::GroupMProblem p =
      problem_of(detail::GroupMArgs{args.ctx, args.x, args.w, BOp::Transposed, args.splits, args.h,
                                    args.bias, args.groups, args.rows, args.k, 2 * args.f},
                 counts);
  p.glu_z = args.z.data();
  p.glu_probs = args.probs.defined() ? static_cast<const float*>(args.probs.data()) : nullptr;
  return p;
}

// fc2 dgrad + SwiGLU backward: the group-M dgrad problem of its GEMM with no output (dz is formed
// in registers only), plus the SwiGLU backward epilogue's inputs and outputs.
sm90::GroupMProblem problem_of(const detail::GemmDSwigluArgs& args, const DeviceCounts& counts) {
  const Tensor none;  // no dz, no bias
  sm90::GroupMProblem p =
      problem_of(detail::GroupMArgs{args.ctx, args.dy, args.w, BOp::Plain, args.splits, none,
                                    none, args.groups, args.rows, args.k, args.f},
                 counts);
  p.glu_probs = args.probs.defined() ? static_cast<const float*>(args.probs.data()) : nullptr;
  p.dglu_h = args.h.data();
  p.dglu_dh = args.dh.data();
  p.dglu_dprobs = args.dprobs.defined() ? static_cast<float*>(args.dprobs.data()) : nullptr;
  p.dglu_accumulate = args.accumulate_dprobs;
  return p;
}

sm90::GroupKProblem problem_of(const detail::GroupKArgs& args, const DeviceCounts& counts) {
  sm90::GroupKProblem p;
  p.dy = args.dy.data();
  p.x = args.x.data();
  p.dw = args.dw.data();
  p.counts = counts;
  p.k = args.k;
  p.n = args.n;
  p.dtype = args.dy.dtype();
  p.dw_dtype = args.dw.dtype();
  p.accumulate = args.accumulate;
  p.sms = gemm_sm_target(args.ctx);
  return p;
}

// ---- the native FP8 GEMMs of fp8-current and fp8-block (fp8_gemm_sm90.h) ----
sm90::Fp8Code code_of(const QuantSpec& s) {
  return s.format == QuantFormat::E5M2 ? sm90::Fp8Code::E5M2 : sm90::Fp8Code::E4M3;
}
sm90::Fp8Scaling scaling_of(const QuantizedTensor& q) {
  return q.spec.scaling == Scaling::PerGroup ? sm90::Fp8Scaling::PerGroup : sm90::Fp8Scaling::Block;
}
// The scales a GEMM reads of one copy, in place (SPEC §6b): per-group and 128×128 ones are shared
// by both copies (whichever the tensor holds); 1×128 ones are the copy's own.
const float* scales_of(const QuantizedTensor& q, QuantUsage copy) {
  const bool shared = q.spec.scaling == Scaling::PerGroup || q.spec.scaling == Scaling::Block2D;
  const Tensor& s = shared ? (q.rowwise_scale_inv.defined() ? q.rowwise_scale_inv : q.columnwise_scale_inv)
                    : copy == QuantUsage::Rowwise ? q.rowwise_scale_inv
                                                  : q.columnwise_scale_inv;
  return s.defined() ? static_cast<const float*>(s.data()) : nullptr;
}
int64_t blocks_of(int64_t n) { return (n + 127) / 128; }

// fprop: out = dq(a.rowwise) · dq(W.rowwise)ᵀ, B_g = W's rows of group g ([N, K], stride K);
// dgrad: out = dq(dy.rowwise) · dq(W.columnwise)ᵀ-as-[G, N, K], B_g = the columnwise copy
// [K, G·N]'s columns of group g ([K, N] with row stride G·N, K-major in the reduction N).
sm90::Fp8GroupMProblem problem_of(const detail::QuantGroupMArgs& args, const DeviceCounts& counts) {
  sm90::Fp8GroupMProblem p;
  const bool fprop = args.op == BOp::Transposed;
  const Tensor& w = fprop ? args.b.rowwise : args.b.columnwise;
  const int64_t per_group = args.groups > 0 ? args.b.rows / args.groups : 0;  // the weight's N
  p.a = args.a.rowwise.defined() ? args.a.rowwise.data() : nullptr;
  p.b = w.defined() ? w.data() : nullptr;
  p.a_code = code_of(args.a.spec);
  p.b_code = code_of(args.b.spec);
  p.scale_a = scales_of(args.a, QuantUsage::Rowwise);
  p.scale_b = scales_of(args.b, fprop ? QuantUsage::Rowwise : QuantUsage::Columnwise);
  p.b_group_stride = fprop ? per_group * args.k : per_group;
  p.ldb = fprop ? args.k : args.b.rows;
  p.scaling = scaling_of(args.a);
  if (p.scaling == sm90::Fp8Scaling::Block) {  // W_g's 128×128 tiles: ⌈N/128⌉ x ⌈K/128⌉
    p.fast_accumulation = false;
    p.b_scale_group_stride = blocks_of(per_group) * blocks_of(args.b.cols);
    p.b_scales_mn_major = !fprop;
  } else {
    p.fast_accumulation = fprop;  // TE: the forward without, dgrad with the split accumulator
  }
  p.bias = args.bias.defined() ? args.bias.data() : nullptr;
  p.out = args.out.data();
  p.counts = counts;
  p.k = args.k;
  p.n = args.n;
  p.dtype = args.out.dtype();
  p.sms = gemm_sm_target(args.ctx);
  return p;
}

// dw[g] (+)= dq(dy.columnwise)_g · dq(x.columnwise)_gᵀ: both copies [·, T], a group's columns.
sm90::Fp8GroupKProblem problem_of(const detail::QuantGroupKArgs& args, const DeviceCounts& counts) {
  sm90::Fp8GroupKProblem p;
  p.dy = args.dy.columnwise.defined() ? args.dy.columnwise.data() : nullptr;
  p.x = args.x.columnwise.defined() ? args.x.columnwise.data() : nullptr;
  p.dy_code = code_of(args.dy.spec);
  p.x_code = code_of(args.x.spec);
  p.scale_dy = scales_of(args.dy, QuantUsage::Columnwise);
  p.scale_x = scales_of(args.x, QuantUsage::Columnwise);
  p.scaling = scaling_of(args.dy);
  p.ld = p.dy ? args.dy.columnwise.size(1) : 0;  // the copies' row length (QuantizedTensor)
  p.dw = args.dw.data();
  p.counts = counts;
  p.k = args.k;
  p.n = args.n;
  p.dw_dtype = args.dw.dtype();
  p.accumulate = args.accumulate;
  p.sms = gemm_sm_target(args.ctx);
  return p;
}

// What the kernels need of each operand's quantization: e4m3 / e5m2 codes with fp32 scales per
// group (one per expert: fp8-current) or per 128-block (fp8-block: 1×128 activations and
// gradients, a 128×128 weight), and the copy the GEMM reads.
std::string fp8_operand_rejects(const QuantizedTensor& q, const char* operand, QuantUsage copy,
                                bool weight) {
  const Scaling block = weight ? Scaling::Block2D : Scaling::Block1D;
  if (q.spec.scaling != Scaling::PerGroup && !(q.spec.scaling == block && q.spec.block == 128)) {
    return str("recipe ", Recipe{q.spec.recipe}.name(), ": ", operand,
               " has 1x", q.spec.block, " block scales; the native FP8 GEMMs take per-group scales "
               "(fp8-current) or 1x128 / 128x128 fp32 block scales (fp8-block)");
  }
  if (q.spec.format == QuantFormat::E2M1) return str(operand, " is e2m1: the FP8 GEMMs take e4m3 / e5m2");
  if (!has(q.usage, copy)) {
    return str(operand, " has no ", copy == QuantUsage::Rowwise ? "rowwise" : "columnwise",
               " copy (the one this GEMM reads)");
  }
  return "";
}

std::string fp8_group_m_rejects(const detail::QuantGroupMArgs& args) {
  if (std::string why = reject_unless_cuda(args.ctx); !why.empty()) return why;
  const QuantUsage w_copy = args.op == BOp::Transposed ? QuantUsage::Rowwise : QuantUsage::Columnwise;
  if (std::string why = fp8_operand_rejects(args.a, "a", QuantUsage::Rowwise, false); !why.empty()) return why;
  if (std::string why = fp8_operand_rejects(args.b, "the weight", w_copy, true); !why.empty()) return why;
  if (scaling_of(args.a) != scaling_of(args.b)) {
    return "a and the weight are scaled differently (one per group, the other per block)";
  }
  return sm90::rejects(problem_of(args, counts_for_check(args.splits, args.groups, args.rows)),
                       args.ctx.device().index);
}

std::string fp8_group_k_rejects(const detail::QuantGroupKArgs& args) {
  if (std::string why = reject_unless_cuda(args.ctx); !why.empty()) return why;
  if (std::string why = fp8_operand_rejects(args.dy, "dy", QuantUsage::Columnwise, false); !why.empty()) return why;
  if (std::string why = fp8_operand_rejects(args.x, "x", QuantUsage::Columnwise, false); !why.empty()) return why;
  if (scaling_of(args.dy) != scaling_of(args.x)) {
    return "dy and x are scaled differently (one per group, the other per block)";
  }
  return sm90::rejects(problem_of(args, counts_for_check(args.splits, args.groups, args.rows)),
                       args.ctx.device().index);
}

// One entry pair for every form (Args: GroupMArgs, GroupKArgs or GemmSwigluArgs; problem_of above).
template <class Args>
std::string rejects_of(const Args& args) {
  std::string reason = reject_unless_cuda(args.ctx);
  if (!reason.empty()) return reason;
  return sm90::rejects(problem_of(args, counts_for_check(args.splits, args.groups, args.rows)),
                       args.ctx.device().index);
}

// Counts where the kernels read them, the workspace (stream-ordered: released after the
// kernels), the launch.
template <class Args>
void run_of(const Args& args) {
  CudaResources& res = resources(args.ctx);
  DeviceGuard guard(res.device);
  const CountsOnDevice counts = counts_on_device(args.ctx, args.splits, args.rows);
  const auto p = problem_of(args, counts.view);
  const size_t bytes = sm90::workspace_bytes(p);
  Tensor workspace;
  if (bytes > 0) workspace = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, args.ctx);
  sm90::run(p, bytes > 0 ? workspace.data() : nullptr, res.stream);
}

// The automatic choice's exceptions (backend_table.h, declines): heuristics.h says which and why.
const std::vector<int64_t>* host_counts_of(const Splits& splits) {
  return splits.on_host() ? &splits.host_counts() : nullptr;
}
std::string declines_for_cublas(const Splits& splits, int64_t groups, int64_t rows) {
  return sm90::declines_for_cublas(host_counts_of(splits), groups, rows);
}

}  // namespace

std::string sm90_group_m_declines(const detail::GroupMArgs& args) {
  return declines_for_cublas(args.splits, args.groups, args.rows);
}

std::string sm90_group_k_declines(const detail::GroupKArgs& args) {
  return declines_for_cublas(args.splits, args.groups, args.rows);
}

// The fused forward (fc1 + SwiGLU in its epilogue): heuristics.h, kFuseForward; declined, the
// plain fc1 GEMM then the SwiGLU kernel run.
std::string sm90_gemm_swiglu_declines(const detail::GemmSwigluArgs& args) {
  if (std::string why = sm90::declines_fused_forward(); !why.empty()) return why;
  return declines_for_cublas(args.splits, args.groups, args.rows);
}

std::string sm90_group_m_rejects(const detail::GroupMArgs& args) { return rejects_of(args); }
void sm90_group_m_run(const detail::GroupMArgs& args) { run_of(args); }
std::string sm90_group_k_rejects(const detail::GroupKArgs& args) { return rejects_of(args); }
void sm90_group_k_run(const detail::GroupKArgs& args) { run_of(args); }
std::string sm90_gemm_swiglu_rejects(const detail::GemmSwigluArgs& args) {
  if (args.layout != GluLayout::Interleaved32) {
    return str("SwiGLU is fused into the GEMM epilogue for the interleaved32 GLU layout only, got ",
               name(args.layout));
  }
  return rejects_of(args);
}
void sm90_gemm_swiglu_run(const detail::GemmSwigluArgs& args) { run_of(args); }
std::string sm90_gemm_dswiglu_rejects(const detail::GemmDSwigluArgs& args) {
  if (args.layout != GluLayout::Interleaved32) {
    return str("the SwiGLU backward is fused into the dgrad epilogue for the interleaved32 GLU "
               "layout only, got ",
               name(args.layout));
  }
  return rejects_of(args);
}
void sm90_gemm_dswiglu_run(const detail::GemmDSwigluArgs& args) { run_of(args); }
// The fused backward (dgrad + SwiGLU backward + dprobs in one kernel): heuristics.h,
// kFuseBackward; declined, grouped_gemm_dswiglu runs the plain dgrad, then the SwiGLU backward
// kernel. Forcing "sm90" (Context::with_backend) runs it whatever this says, as every forced entry
// does.
std::string sm90_gemm_dswiglu_declines(const detail::GemmDSwigluArgs& args) {
  if (std::string why = sm90::declines_fused_backward(); !why.empty()) return why;
  return declines_for_cublas(args.splits, args.groups, args.rows);
}

void fp8_group_m_run(const detail::QuantGroupMArgs& args) { run_of(args); }
void fp8_group_k_run(const detail::QuantGroupKArgs& args) { run_of(args); }

// This backend's entries in the primitives' tables (declared in its header).
constexpr detail::Backend<detail::GroupMArgs> kSm90GroupM{
    "sm90", sm90_group_m_rejects, sm90_group_m_run, sm90_group_m_declines};
constexpr detail::Backend<detail::GroupKArgs> kSm90GroupK{
    "sm90", sm90_group_k_rejects, sm90_group_k_run, sm90_group_k_declines};
constexpr detail::Backend<detail::GemmSwigluArgs> kSm90GemmSwiglu{
    "sm90", sm90_gemm_swiglu_rejects, sm90_gemm_swiglu_run, sm90_gemm_swiglu_declines};
constexpr detail::Backend<detail::GemmDSwigluArgs> kSm90GemmDSwiglu{
    "sm90", sm90_gemm_dswiglu_rejects, sm90_gemm_dswiglu_run, sm90_gemm_dswiglu_declines};

// The native FP8 grouped GEMMs (per-group scales) in the quantized-GEMM tables.
constexpr detail::Backend<detail::QuantGroupMArgs> kFp8QuantGroupM{"cuda-fp8", fp8_group_m_rejects,
                                                                   fp8_group_m_run};
constexpr detail::Backend<detail::QuantGroupKArgs> kFp8QuantGroupK{"cuda-fp8", fp8_group_k_rejects,
                                                                   fp8_group_k_run};

}  // namespace moekit::cuda
