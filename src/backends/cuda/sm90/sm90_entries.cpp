// The "sm90" backend entries (sm90_entries.h): primitive arguments → sm90 problems, counts where
// the kernels read them (device splits as they are, host splits copied in stream order), the
// workspace from the context's stream-ordered allocator, launches on the context's stream.
#include "backends/cuda/sm90/sm90_entries.h"

#include <cstdint>
#include <vector>

#include "backends/cuda/resources.h"
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

// This backend's entries in the primitives' tables (declared in its header).
constexpr detail::Backend<detail::GroupMArgs> kSm90GroupM{
    "sm90", sm90_group_m_rejects, sm90_group_m_run, sm90_group_m_declines};
constexpr detail::Backend<detail::GroupKArgs> kSm90GroupK{
    "sm90", sm90_group_k_rejects, sm90_group_k_run, sm90_group_k_declines};
constexpr detail::Backend<detail::GemmSwigluArgs> kSm90GemmSwiglu{
    "sm90", sm90_gemm_swiglu_rejects, sm90_gemm_swiglu_run, sm90_gemm_swiglu_declines};
constexpr detail::Backend<detail::GemmDSwigluArgs> kSm90GemmDSwiglu{
    "sm90", sm90_gemm_dswiglu_rejects, sm90_gemm_dswiglu_run, sm90_gemm_dswiglu_declines};

}  // namespace moekit::cuda
