// The "sm90" backend entries (sm90_entries.h): primitive arguments → sm90 problems, counts where
// the kernels read them (device splits as they are, host splits copied in stream order), the
// workspace from the context's stream-ordered allocator, launches on the context's stream.
#include "cuda/sm90/sm90_entries.h"

#include <cstdint>
#include <vector>

#include "core/env.h"
#include "cuda/resources.h"
#include "cuda/sm90/device/grouped_gemm_sm90.h"
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

// The automatic choice's measured exceptions (backend_table.h, declines), both for host splits
// only: cuBLAS needs the counts on the host, and with device splits it would synchronise.
// 1. Many equal small groups run faster as cuBLAS strided-batched GEMMs (one call per size).
//    small_E64 uniform, 64 groups of 64 rows (bench/results/2026-11-29-nvidia-h200-197a15b-gpu-check.md):
//    cuBLAS 193.9 vs sm90 181.7 TFLOP/s fprop, 207.9 vs 186.7 dgrad, 174.6 vs 83.7 wgrad (the
//    sm90 group-K kernel is epilogue-bound when each output tile has one K tile). Skewed splits
//    of the same shape go the other way (sm90 1.2x, 2.3x).
// 2. Large groups (a mean of kLargeGroupRows rows or more) run faster as cuBLAS GEMMs per group:
//    under sustained load the H200 holds its clock to the power limit, and cuBLAS's kernels draw
//    less power per cycle, so they run at a higher clock (per cycle sm90 does as much or more).
//    With each backend timed alone, every pass of every suite shape of >= 2048 rows per group,
//    uniform and skewed, is faster on cuBLAS: dsv3_fc1/fc2_E8 and mixtral_fc1_E8, fprop 1.00-1.19x,
//    dgrad 1.03-1.10x, wgrad 1.07-1.17x, wgrad into f32 1.02-1.13x (both at ~690 W of 700; sm90 at
//    1155-1455 MHz, cuBLAS at 1455-1620; bench/results/2026-11-30-nvidia-h200-99bc82c-gpu-check.json);
//    the dsv3 MLP step (E8, 4096 rows per group) with every GEMM on cuBLAS and SwiGLU unfused:
//    13.58 vs 14.57 ms fused on sm90 (…-99bc82c-tile-study.md; 13.69 vs 14.75, …-d47fa32-pp22-study.md).
//    At 1024 rows per group (qwen3_E16, dsv3_fc1_E32) the passes split between the two, so sm90
//    keeps them: it needs no host counts and no sync, and it fuses SwiGLU.
std::string declines_for_cublas(const Splits& splits, int64_t groups, int64_t rows) {
  constexpr int64_t kMinGroups = 8, kSmallGroupRows = 128, kLargeGroupRows = 2048;
  if (!splits.on_host() || groups <= 0) return "";
  const std::vector<int64_t>& counts = splits.host_counts();
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  if (total >= kLargeGroupRows * groups) {
    return str(groups, " groups of ", total / groups, " rows on average (>= ", kLargeGroupRows,
               "), host splits: cuBLAS per group is faster under the power cap");
  }
  if (groups < kMinGroups) return "";
  const int64_t m = counts.front();
  if (m <= 0 || m >= kSmallGroupRows || m * groups > rows) return "";
  for (int64_t c : counts) {
    if (c != m) return "";
  }
  return str(groups, " groups of ", m, " rows each, host splits: cuBLAS strided-batched is faster");
}

}  // namespace

std::string sm90_group_m_declines(const detail::GroupMArgs& args) {
  return declines_for_cublas(args.splits, args.groups, args.rows);
}

std::string sm90_group_k_declines(const detail::GroupKArgs& args) {
  return declines_for_cublas(args.splits, args.groups, args.rows);
}

// Environment MOEKIT_SM90_FUSED_FORWARD=0 makes the automatic choice decline the fused forward
// (fc1 + SwiGLU in its epilogue), so grouped_gemm_swiglu runs the plain fc1 GEMM, then the
// SwiGLU kernel — for A/B runs of whole steps (tools/mlp-bench, MLP_BENCH_AB_ENV). Unset or 1:
// fused. Anything else is an error.
std::string sm90_gemm_swiglu_declines(const detail::GemmSwigluArgs& args) {
  static const int fused = detail::env_choice("MOEKIT_SM90_FUSED_FORWARD", {"0", "1"});
  if (fused == 0) return "MOEKIT_SM90_FUSED_FORWARD=0";
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
// The fused backward (dgrad + SwiGLU backward + dprobs in one kernel) loses to the two calls it
// replaces in whole MLP steps: qwen3 / dsv3 fused-MLP steps, skewed, three pairs in turns
// (f0255f3, bench/results/2026-12-01-nvidia-h200-f0255f3-fused-backward.md): 1.044 / 1.032 longer
// with it; ncu, each kernel alone (dsv3): 1596 µs fused vs 1270 + 197 µs. Its epilogue reads h and
// writes dh, twice the columns of the plain dgrad's output, and the main loop waits on it. So the
// automatic choice declines it and grouped_gemm_dswiglu runs the plain dgrad, then the SwiGLU
// backward kernel. Environment MOEKIT_SM90_FUSED_BACKWARD=1 puts it back in the automatic choice
// (A/B runs: tools/mlp-bench, MLP_BENCH_AB_ENV); unset or 0: declined; anything else is an error.
// Forcing "sm90" (Context::with_backend) runs it whatever this says, as every forced entry does.
std::string sm90_gemm_dswiglu_declines(const detail::GemmDSwigluArgs& args) {
  static const int fused = detail::env_choice("MOEKIT_SM90_FUSED_BACKWARD", {"0", "1"});
  if (fused != 1) {
    return "the plain dgrad + SwiGLU backward kernel are faster in whole MLP steps (measured: "
           "sm90_entries.cpp); MOEKIT_SM90_FUSED_BACKWARD=1 runs the fused kernel";
  }
  return declines_for_cublas(args.splits, args.groups, args.rows);
}

}  // namespace moekit::cuda
