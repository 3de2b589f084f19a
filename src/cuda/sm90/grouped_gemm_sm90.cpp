// Host side of the sm90 group-M grouped GEMM (grouped_gemm_sm90.h): the checks that decide
// whether the kernels can run a call, and the choice of compiled instance. No CUTLASS here: the
// kernels live in group_m_bf16.cu and group_m_f16.cu.
#include "cuda/sm90/grouped_gemm_sm90.h"

#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>

#include "cuda/check.h"
#include "cuda/sm90/group_m_instances.h"
#include "moekit/core/error.h"

namespace moekit::cuda::sm90 {
namespace {

// [dtype: 0 bf16, 1 f16][b: 0 K-major, 1 N-major][config]
const GroupMInstance* const kInstances[2][2][kConfigCount] = {
    {{&group_m_bf16_kmajor_large, &group_m_bf16_kmajor_small},
     {&group_m_bf16_nmajor_large, &group_m_bf16_nmajor_small}},
    {{&group_m_f16_kmajor_large, &group_m_f16_kmajor_small},
     {&group_m_f16_nmajor_large, &group_m_f16_nmajor_small}},
};

int choose_config(const GroupMProblem& p) {
  if (p.config >= 0 && p.config < kConfigCount) return p.config;
  // Few rows per group: the GEMM streams weights (memory bound); 64-row tiles waste less of the
  // tensor cores on rows past m_g than 256-row tiles, and a deep pipeline keeps loads in flight.
  // The mean is all the host knows (the counts are on the device).
  return p.rows < 128 * p.groups ? kSmallM : kLarge;
}

const GroupMInstance& instance(const GroupMProblem& p) {
  return *kInstances[p.dtype == DType::F16 ? 1 : 0][p.b_transposed ? 0 : 1][choose_config(p)];
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

std::string rejects(const GroupMProblem& p, int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return str("cannot query CUDA device ", device);
  }
  if (major != 9 || minor != 0) {
    return str("needs an sm_90 (Hopper) device; cuda:", device, " is sm_", major, minor);
  }
  if (p.dtype != DType::BF16 && p.dtype != DType::F16) {
    return str("dtype bf16 or f16 only, got ", name(p.dtype));
  }
  if (p.k <= 0) return str("K = ", p.k, ": the product is empty (K must be > 0)");
  if (p.k % 8 != 0) return str("K = ", p.k, " is not a multiple of 8 (TMA needs 16-byte rows)");
  if (p.n % 8 != 0) return str("N = ", p.n, " is not a multiple of 8 (TMA needs 16-byte rows)");
  for (const auto& [label, v] : {std::pair{"T (rows)", p.rows}, std::pair{"K", p.k},
                                  std::pair{"N", p.n}, std::pair{"G (groups)", p.groups}}) {
    if (v > INT_MAX) return str(label, " = ", v, " exceeds the kernels' 32-bit extents");
  }
  if (!p.counts) return "the counts must be in device memory (got none)";
  if (reinterpret_cast<uintptr_t>(p.counts) % (p.counts_i64 ? 8 : 4) != 0) {
    return "the counts are not aligned to their element size";
  }
  for (const auto& [label, ptr] : {std::pair{"a", p.a}, std::pair{"b", p.b},
                                   std::pair{"out", static_cast<const void*>(p.out)},
                                   std::pair{"bias", p.bias}}) {
    if (ptr && !aligned16(ptr)) return str(label, " is not 16-byte aligned (TMA)");
  }
  return "";
}

size_t workspace_bytes(const GroupMProblem& p) {
  if (p.groups <= 0 || p.n == 0) return 0;
  return instance(p).workspace_bytes(p);
}

void run(const GroupMProblem& p, void* workspace, cudaStream_t stream) {
  if (p.groups <= 0 || p.n == 0) return;  // out [T, 0]: nothing to write
  instance(p).run(p, workspace, stream);
}

std::string config_name(const GroupMProblem& p) { return instance(p).name; }

}  // namespace moekit::cuda::sm90
