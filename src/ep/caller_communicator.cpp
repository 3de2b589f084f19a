// caller_communicator: a rank of a group the caller runs, over symmetric memory the caller
// brings (moekit/ep/communicator.h, CallerGroup). allocate() is a bump allocator over the region
// at offsets every rank computes alike (the same calls in the same order, sizes agreed first).
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "ep/rank_collectives.h"
#include "moekit/core/error.h"
#include "moekit/ep/communicator.h"

namespace moekit {
namespace {

// The EP kernels' widest access is 16 bytes; blocks start at kSymmetricAlignment offsets.
constexpr size_t kBaseAlignment = 16;
bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kBaseAlignment == 0; }

void check_group(const CallerGroup& g) {
  if (g.world_size < 1) throw_invalid("world_size", "at least 1 rank", std::to_string(g.world_size));
  if (g.rank < 0 || g.rank >= g.world_size) {
    throw_invalid("rank", str("a rank in [0, ", g.world_size, ")"), std::to_string(g.rank));
  }
  if (!g.region.defined() || g.region.dtype() != DType::U8 || g.region.dim() != 1 ||
      !g.region.is_contiguous()) {
    throw_invalid("region", "a contiguous u8 tensor [bytes]",
                  g.region.defined() ? str(name(g.region.dtype()), " of ", g.region.dim(), " dims")
                                     : std::string("undefined"));
  }
  if (g.region.device() != g.context.device()) {
    throw_invalid("region", str("a tensor on the context's device ", g.context.device().to_string()),
                  g.region.device().to_string());
  }
  if (g.peer_bases.size() != static_cast<size_t>(g.world_size)) {
    throw_invalid("peer_bases", str(g.world_size, " base addresses (one per rank)"),
                  std::to_string(g.peer_bases.size()));
  }
  if (g.peer_bases[static_cast<size_t>(g.rank)] != g.region.data()) {
    throw_invalid("peer_bases", str("peer_bases[", g.rank, "] (this rank's) == region.data()"),
                  "another address");
  }
  for (size_t r = 0; r < g.peer_bases.size(); ++r) {
    if (!aligned(g.peer_bases[r])) {
      throw_invalid("peer_bases", str(kBaseAlignment, "-byte aligned bases"),
                    str("peer_bases[", r, "] misaligned"));
    }
  }
  if (!g.barrier) throw_invalid("barrier", "a callable", "none");
  if (!g.all_gather) throw_invalid("all_gather", "a callable", "none");
}

class CallerCommunicator final : public Communicator {
 public:
  explicit CallerCommunicator(CallerGroup g) : g_(std::move(g)) {}
  int rank() const override { return g_.rank; }
  int world_size() const override { return g_.world_size; }
  const Context& context() const override { return g_.context; }
  std::string engine() const override { return g_.engine; }

  std::vector<std::string> all_gather(std::string_view bytes) override {
    std::vector<std::string> all = g_.all_gather(bytes);
    if (all.size() != static_cast<size_t>(g_.world_size)) {
      throw_error(ErrorKind::Communication,
                  str("caller group: all_gather returned ", all.size(), " entries for ",
                      g_.world_size, " ranks"));
    }
    return all;
  }

  SymmetricMemory allocate(size_t bytes) override {
    detail::agree_allocation_size(*this, bytes);  // every rank, the same size: the same offset
    const auto size = static_cast<size_t>(g_.region.numel());
    if (bytes > size - used_) {
      throw_invalid("bytes",
                    str("at most the ", size - used_, " bytes left of the caller's ", size,
                        "-byte region (ExpertParallel::symmetric_bytes sizes it)"),
                    std::to_string(bytes));
    }
    SymmetricMemory m;
    m.local = g_.region.rows(static_cast<int64_t>(used_), static_cast<int64_t>(used_ + bytes));
    m.peers.resize(g_.peer_bases.size());
    for (size_t r = 0; r < m.peers.size(); ++r) {
      m.peers[r] = static_cast<char*>(g_.peer_bases[r]) + used_;
    }
    used_ += (bytes + kSymmetricAlignment - 1) / kSymmetricAlignment * kSymmetricAlignment;
    if (used_ > size) used_ = size;
    return m;
  }

  void barrier() override { g_.barrier(); }

  // On a GPU the caller's all_gather is a host round trip (a capture could not contain it): the
  // calls agree in band. The CPU engine's loops read host metadata, so CPU groups keep the host's.
  Agreement agreement() const override {
    return g_.context.device().is_cuda() ? Agreement::InBand : Agreement::Host;
  }

 private:
  CallerGroup g_;
  size_t used_ = 0;  // bytes of the region handed out (rounded up to the alignment)
};

}  // namespace

std::unique_ptr<Communicator> caller_communicator(CallerGroup group) {
  check_group(group);
  return std::make_unique<CallerCommunicator>(std::move(group));
}

}  // namespace moekit
