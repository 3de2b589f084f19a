// CpuRanks: the in-process CPU engine of expert parallelism (moekit/ep/communicator.h).
//
// N ranks are N threads of one process; symmetric memory is each rank's own host block, whose
// address every rank learns at the collective allocate. One mutex + condition variable make the
// barrier (the mutex orders every store before it against every load after it). A rank that
// throws aborts the group: every rank blocked in (or later entering) a collective call throws
// ErrorKind::Communication naming it, so no failure leaves the others waiting.
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "ep/rank_collectives.h"
#include "moekit/core/error.h"
#include "moekit/ep/communicator.h"

namespace moekit {

struct CpuRanks::Group {
  int world = 0;
  std::mutex mutex;
  std::condition_variable cv;
  int64_t generation = 0;  // barriers completed
  int arrived = 0;
  int aborted_by = -1;  // the rank whose failure aborted the group, -1 while none
  std::string abort_reason;
  // The values of the collective in progress, one slot per rank (valid between its two barriers).
  std::vector<std::string> gathered;
  std::vector<void*> bases;

  [[noreturn]] void throw_aborted() const {
    throw_error(ErrorKind::Communication, str("the CPU ranks group was aborted: rank ", aborted_by,
                                              " failed (", abort_reason, ")"));
  }
  void barrier() {
    std::unique_lock lock(mutex);
    if (aborted_by >= 0) throw_aborted();
    const int64_t gen = generation;
    if (++arrived == world) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lock, [&] { return generation != gen || aborted_by >= 0; });
    if (generation == gen) throw_aborted();
  }
  void abort(int rank, const std::string& reason) {
    std::lock_guard lock(mutex);
    if (aborted_by < 0) {
      aborted_by = rank;
      abort_reason = reason;
    }
    cv.notify_all();
  }
  void reset() {
    std::lock_guard lock(mutex);
    arrived = 0;
    aborted_by = -1;
    abort_reason.clear();
  }
};

namespace {

class CpuRankCommunicator final : public Communicator {
 public:
  CpuRankCommunicator(std::shared_ptr<CpuRanks::Group> group, int rank, Context ctx)
      : group_(std::move(group)), rank_(rank), ctx_(std::move(ctx)) {}
  int rank() const override { return rank_; }
  int world_size() const override { return group_->world; }
  const Context& context() const override { return ctx_; }
  std::string engine() const override { return "cpu-ranks"; }

  std::vector<std::string> all_gather(std::string_view bytes) override {
    Group& g = *group_;
    g.barrier();  // the previous collective's readers are done with the slots
    {
      std::lock_guard lock(g.mutex);
      g.gathered[static_cast<size_t>(rank_)] = std::string(bytes);
    }
    g.barrier();
    std::vector<std::string> all;
    {
      std::lock_guard lock(g.mutex);
      all = g.gathered;
    }
    return all;
  }

  SymmetricMemory allocate(size_t bytes) override {
    detail::agree_allocation_size(*this, bytes);
    SymmetricMemory m;
    m.local = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, ctx_);
    Group& g = *group_;
    {
      std::lock_guard lock(g.mutex);
      g.bases[static_cast<size_t>(rank_)] = m.local.data();
    }
    g.barrier();
    {
      std::lock_guard lock(g.mutex);
      m.peers = g.bases;
    }
    g.barrier();  // everyone has read the bases before the next allocate writes them
    return m;
  }

  void barrier() override { group_->barrier(); }

 private:
  using Group = CpuRanks::Group;
  std::shared_ptr<Group> group_;
  int rank_;
  Context ctx_;
};

}  // namespace

CpuRanks::CpuRanks(int world_size, int threads_per_rank)
    : CpuRanks(world_size, [threads_per_rank](int) {
        if (threads_per_rank < 1) {
          throw_invalid("threads_per_rank", "at least 1", std::to_string(threads_per_rank));
        }
        return Context::cpu(threads_per_rank);
      }) {}

CpuRanks::CpuRanks(int world_size, const std::function<Context(int rank)>& make_context)
    : group_(std::make_shared<Group>()) {
  if (world_size < 1) throw_invalid("world_size", "at least 1 rank", std::to_string(world_size));
  group_->world = world_size;
  group_->gathered.resize(static_cast<size_t>(world_size));
  group_->bases.resize(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    Context ctx = make_context(r);
    if (!ctx.device().is_cpu()) {
      throw_invalid("make_context", "a CPU context for every rank", ctx.device().to_string());
    }
    comms_.push_back(std::make_unique<CpuRankCommunicator>(group_, r, std::move(ctx)));
  }
}

CpuRanks::~CpuRanks() = default;

int CpuRanks::world_size() const {
  return group_->world;
}

Communicator& CpuRanks::communicator(int rank) {
  if (rank < 0 || rank >= group_->world) {
    throw_invalid("rank", str("a rank in [0, ", group_->world, ")"), std::to_string(rank));
  }
  return *comms_[static_cast<size_t>(rank)];
}

void CpuRanks::run(const std::function<void(Communicator&)>& fn) {
  group_->reset();
  const int n = group_->world;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<char> aborted(static_cast<size_t>(n), 0);
  auto body = [&](int r) {
    try {
      fn(*comms_[static_cast<size_t>(r)]);
    } catch (const Error& e) {
      errors[static_cast<size_t>(r)] = std::current_exception();
      // A rank that only saw the abort is not the cause.
      std::lock_guard lock(group_->mutex);
      aborted[static_cast<size_t>(r)] = group_->aborted_by >= 0 && group_->aborted_by != r &&
                                        e.kind() == ErrorKind::Communication;
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(r)] = std::current_exception();
    } catch (...) {
      errors[static_cast<size_t>(r)] = std::current_exception();
    }
    if (errors[static_cast<size_t>(r)] && !aborted[static_cast<size_t>(r)]) {
      std::string what = "an exception";
      try {
        std::rethrow_exception(errors[static_cast<size_t>(r)]);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      group_->abort(r, what);
    }
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < n; ++r) threads.emplace_back(body, r);
  body(0);
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (errors[static_cast<size_t>(r)] && !aborted[static_cast<size_t>(r)]) {
      std::rethrow_exception(errors[static_cast<size_t>(r)]);
    }
  }
  for (int r = 0; r < n; ++r) {
    if (errors[static_cast<size_t>(r)]) std::rethrow_exception(errors[static_cast<size_t>(r)]);
  }
}

}  // namespace moekit
