// Built instead of src/backends/cuda/ep/ep_nccl.cu when moekit has no NCCL engine
// (MOEKIT_WITH_NCCL, cmake/nccl.cmake): making an NCCL rank throws Unsupported, so nothing else
// here is reached.
#include "ep/ep_nccl.h"
#include "moekit/core/error.h"

namespace moekit::detail {
namespace {
[[noreturn]] void no_nccl() {
  throw_error(ErrorKind::Unsupported,
              "this moekit was built without NCCL (MOEKIT_WITH_NCCL; it needs the CUDA backend and "
              "NCCL >= 2.28): no nccl-symmetric engine");
}
}  // namespace

struct NcclRank {};

bool nccl_built() { return false; }
std::vector<std::shared_ptr<NcclRank>> nccl_init_all(const std::vector<Context>&) { no_nccl(); }
std::shared_ptr<NcclRank> nccl_split(void*, const Context&) { no_nccl(); }
void nccl_init_rank(NcclRank&) { no_nccl(); }
int nccl_rank(const NcclRank&) { no_nccl(); }
int nccl_world_size(const NcclRank&) { no_nccl(); }
const Context& nccl_context(const NcclRank&) { no_nccl(); }
SymmetricMemory nccl_allocate(const std::shared_ptr<NcclRank>&, size_t) { no_nccl(); }
void nccl_barrier(NcclRank&) { no_nccl(); }
std::vector<std::string> nccl_all_gather(NcclRank&, std::string_view) { no_nccl(); }

}  // namespace moekit::detail
