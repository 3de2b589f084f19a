// NcclRanks and nccl_communicator: the NCCL symmetric-memory engine of expert parallelism
// (moekit/ep/nccl.h). The NCCL calls are the CUDA backend's (src/ep/ep_nccl.h, defined in
// src/backends/cuda/ep/ep_nccl.cu): no NCCL or CUDA header here. For NcclRanks the host side —
// threads, all_gather, aborting the group when a rank throws — is a CpuRanks group, as for
// CudaRanks (each rank's CPU context there is never used for data).
#include "moekit/ep/nccl.h"


#include "ep/ep_device.h"
#include "ep/ep_nccl.h"
#include "ep/rank_collectives.h"
#include "moekit/core/error.h"

namespace moekit {

namespace {

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(std::shared_ptr<detail::NcclRank> rank) : rank_(std::move(rank)) {}
  /// NcclRanks: the host group's communicator of this rank (all_gather, the abort meeting).
  void bind(Communicator* host) { host_ = host; }

  int rank() const override { return detail::nccl_rank(*rank_); }
  int world_size() const override { return detail::nccl_world_size(*rank_); }
  const Context& context() const override { return detail::nccl_context(*rank_); }
  std::string engine() const override { return "nccl-symmetric"; }

  std::vector<std::string> all_gather(std::string_view bytes) override {
    return host_ ? host_->all_gather(bytes) : detail::nccl_all_gather(*rank_, bytes);
  }

  SymmetricMemory allocate(size_t bytes) override {
    detail::agree_allocation_size(*this, bytes);  // a mismatch throws before NCCL sees it
    return detail::nccl_allocate(rank_, bytes);
  }

  void barrier() override {
    // The host threads meet first (a rank that failed throws here on the others, instead of
    // leaving their GPUs in a barrier it never joins); nothing of it is on the device.
    if (host_) host_->barrier();
    detail::nccl_barrier(*rank_);
  }

  // nccl_communicator's all_gather synchronises the stream (an ncclAllGather read back): its
  // calls agree in band. NcclRanks' host threads share one process: its all_gather is host memory.
  Agreement agreement() const override { return host_ ? Agreement::Host : Agreement::InBand; }

 private:
  std::shared_ptr<detail::NcclRank> rank_;
  Communicator* host_ = nullptr;
};

}  // namespace

struct NcclRanks::Impl {
  CpuRanks host;
  std::vector<std::unique_ptr<NcclCommunicator>> comms;
  explicit Impl(int n) : host(n) {}
};

bool NcclRanks::built() {
  return detail::nccl_built();
}

NcclRanks::NcclRanks(const std::vector<int>& devices) : NcclRanks(detail::gpu_rank_contexts(devices)) {}

NcclRanks::NcclRanks(const std::vector<Context>& contexts) {
  detail::check_gpu_rank_contexts(contexts);
  const int n = static_cast<int>(contexts.size());
  std::vector<std::shared_ptr<detail::NcclRank>> ranks = detail::nccl_init_all(contexts);
  impl_ = std::make_unique<Impl>(n);
  for (int r = 0; r < n; ++r) {
    impl_->comms.push_back(std::make_unique<NcclCommunicator>(ranks[static_cast<size_t>(r)]));
    impl_->comms.back()->bind(&impl_->host.communicator(r));
  }
  // The device communicators: collective, one host thread per rank.
  impl_->host.run([&](Communicator& host) { detail::nccl_init_rank(*ranks[static_cast<size_t>(host.rank())]); });
}

NcclRanks::~NcclRanks() = default;

int NcclRanks::world_size() const {
  return impl_->host.world_size();
}

Communicator& NcclRanks::communicator(int rank) {
  impl_->host.communicator(rank);  // checks the rank
  return *impl_->comms[static_cast<size_t>(rank)];
}

void NcclRanks::run(const std::function<void(Communicator&)>& fn) {
  impl_->host.run([&](Communicator& host) { fn(*impl_->comms[static_cast<size_t>(host.rank())]); });
}

std::unique_ptr<Communicator> nccl_communicator(void* nccl_comm, Context ctx) {
  if (nccl_comm == nullptr) throw_invalid("nccl_comm", "an ncclComm_t", "null");
  if (!ctx.device().is_cuda()) {
    throw_invalid("ctx", "a CUDA context on the communicator's GPU", ctx.device().to_string());
  }
  std::shared_ptr<detail::NcclRank> rank = detail::nccl_split(nccl_comm, ctx);
  detail::nccl_init_rank(*rank);
  return std::make_unique<NcclCommunicator>(std::move(rank));
}

}  // namespace moekit
