// The "sm90" backend entries (sm90_entries.h): GroupMArgs → sm90::GroupMProblem, workspace from
// the context's stream-ordered allocator, launch on the context's stream.
#include "cuda/sm90/sm90_entries.h"

#include <cstdint>
#include <vector>

#include "cuda/resources.h"
#include "cuda/sm90/grouped_gemm_sm90.h"
#include "moekit/core/error.h"

namespace moekit::cuda {
namespace {

sm90::GroupMProblem problem_of(const detail::GroupMArgs& args, const Tensor& counts) {
  sm90::GroupMProblem p;
  p.a = args.a.data();
  p.b = args.b.data();
  p.b_transposed = args.op == BOp::Transposed;
  p.bias = args.bias.defined() ? args.bias.data() : nullptr;
  p.out = args.out.data();
  p.counts = counts.defined() ? counts.data() : nullptr;
  p.counts_i64 = counts.defined() && counts.dtype() == DType::I64;
  p.groups = args.groups;
  p.rows = args.rows;
  p.k = args.k;
  p.n = args.n;
  p.dtype = args.a.dtype();
  // The context's device error word (Context::device_error_bits); the bit values agree.
  static_assert(sm90::kCountNegative == Context::kNegativeCount &&
                sm90::kCountsExceedRows == Context::kCountsExceedRows);
  p.error_flag = reject_unless_cuda(args.ctx).empty()
                     ? reinterpret_cast<int*>(resources(args.ctx).error_word)
                     : nullptr;
  return p;
}

}  // namespace

std::string sm90_group_m_rejects(const detail::GroupMArgs& args) {
  std::string reason = reject_unless_cuda(args.ctx);
  if (!reason.empty()) return reason;
  const bool host = args.splits.on_host();
  sm90::GroupMProblem p = problem_of(args, host ? Tensor() : args.splits.device_counts());
  if (host) {  // run() moves host counts to the device (int64): check as if they were there
    alignas(8) static constexpr int64_t kMovedByRun = 0;
    p.counts = &kMovedByRun;
    p.counts_i64 = true;
  }
  return sm90::rejects(p, args.ctx.device().index);
}

void sm90_group_m_run(const detail::GroupMArgs& args) {
  CudaResources& res = resources(args.ctx);
  DeviceGuard guard(res.device);
  Tensor counts;
  if (args.splits.on_host()) {
    // Host counts (validated by the primitive) go to the device in stream order; the staging of
    // a pageable source completes before cudaMemcpyAsync returns, so the vector may die after.
    std::vector<int64_t> host = args.splits.host_counts();
    counts = to_device(args.ctx, Tensor::wrap(host.data(), {args.groups}, DType::I64, Device::cpu()));
  } else {
    counts = args.splits.device_counts();
  }
  const sm90::GroupMProblem p = problem_of(args, counts);
  const size_t bytes = sm90::workspace_bytes(p);
  Tensor workspace;
  if (bytes > 0) workspace = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, args.ctx);
  sm90::run(p, bytes > 0 ? workspace.data() : nullptr, res.stream);
  // `workspace` (and host-split `counts`) are released in stream order after the kernels.
}

}  // namespace moekit::cuda
