// CudaRanks: the single-process GPU engine of expert parallelism (moekit/ep/communicator.h).
//
// The host side — threads, all_gather, the host meeting of a barrier, aborting the group when a
// rank throws — is a CpuRanks group (each rank's CPU context there is never used for data); each
// rank's CUDA context holds its memory and runs its kernels. The CUDA calls (peer access, events)
// are the backend's (src/ep/ep_device.h): no CUDA header here.
#include <cstring>

#include "ep/ep_device.h"
#include "ep/rank_collectives.h"
#include "moekit/core/error.h"
#include "moekit/ep/communicator.h"

namespace moekit {

namespace {

class CudaRankCommunicator final : public Communicator {
 public:
  CudaRankCommunicator(Context ctx, std::vector<std::shared_ptr<detail::EpStreamEvent>> events)
      : ctx_(std::move(ctx)), events_(std::move(events)) {}
  void bind(Communicator* host) { host_ = host; }

  int rank() const override { return host_->rank(); }
  int world_size() const override { return host_->world_size(); }
  const Context& context() const override { return ctx_; }
  std::string engine() const override { return "cuda-ranks"; }
  std::vector<std::string> all_gather(std::string_view bytes) override {
    return host_->all_gather(bytes);
  }

  SymmetricMemory allocate(size_t bytes) override {
    detail::agree_allocation_size(*host_, bytes);
    SymmetricMemory m;
    m.local = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, ctx_);
    void* base = m.local.data();
    const std::vector<std::string> bases =
        host_->all_gather(std::string_view(reinterpret_cast<const char*>(&base), sizeof base));
    for (const std::string& b : bases) {
      void* p = nullptr;
      std::memcpy(&p, b.data(), sizeof p);
      m.peers.push_back(p);
    }
    // The block is stream-ordered memory of this rank's stream: make it ready for the peers'.
    barrier();
    return m;
  }

  void barrier() override {
    if (world_size() == 1) return;  // one stream: its order is the barrier (capturable)
    detail::ep_event_record(ctx_, *events_[static_cast<size_t>(rank())]);
    host_->barrier();  // every rank recorded
    for (int r = 0; r < world_size(); ++r) {
      if (r != rank()) detail::ep_event_wait(ctx_, *events_[static_cast<size_t>(r)]);
    }
    host_->barrier();  // every rank queued its waits before any rank records again
  }

 private:
  Context ctx_;
  std::vector<std::shared_ptr<detail::EpStreamEvent>> events_;
  Communicator* host_ = nullptr;
};

}  // namespace

struct CudaRanks::Impl {
  CpuRanks host;
  std::vector<std::unique_ptr<CudaRankCommunicator>> comms;
  explicit Impl(int n) : host(n) {}
};

CudaRanks::CudaRanks(const std::vector<int>& devices) : CudaRanks(detail::gpu_rank_contexts(devices)) {}

CudaRanks::CudaRanks(const std::vector<Context>& contexts) {
  detail::check_gpu_rank_contexts(contexts);
  const int n = static_cast<int>(contexts.size());
  if (n > 1) detail::ep_enable_peer_access(contexts);
  std::vector<std::shared_ptr<detail::EpStreamEvent>> events;
  if (n > 1) {
    for (const Context& c : contexts) events.push_back(detail::ep_make_event(c));
  }
  impl_ = std::make_unique<Impl>(n);
  for (int r = 0; r < n; ++r) {
    impl_->comms.push_back(std::make_unique<CudaRankCommunicator>(contexts[static_cast<size_t>(r)], events));
    impl_->comms.back()->bind(&impl_->host.communicator(r));
  }
}

CudaRanks::~CudaRanks() = default;

int CudaRanks::world_size() const {
  return impl_->host.world_size();
}

Communicator& CudaRanks::communicator(int rank) {
  impl_->host.communicator(rank);  // checks the rank
  return *impl_->comms[static_cast<size_t>(rank)];
}

void CudaRanks::run(const std::function<void(Communicator&)>& fn) {
  impl_->host.run([&](Communicator& host) { fn(*impl_->comms[static_cast<size_t>(host.rank())]); });
}

}  // namespace moekit
