// Internal: the policy of a stream-ordered allocator's cache of freed large blocks (the CUDA
// allocator's, backends/cuda/runtime.cpp; design/ARCHITECTURE.md "Context"), and its books of the
// cacheable blocks in use. Pointers and sizes only — the allocator frees what this hands back —
// so the policy is tested on any machine (tests/test_core.cpp, BlockCache.*).
//
//   - allocated(p, bytes): a cacheable block the allocator got from its pool, booked in use;
//   - take(bytes): the smallest kept block of bytes .. bytes + bytes / 8 (a size that moves a little
//     from call to call, e.g. T with dropless routing, still hits), booked in use at its own size
//     (booked at the request's, a larger block came back smaller and the next request of its own
//     size missed it: caught on an H100, 2026-12-06), or null;
//   - freed(p, keep_if): a block handed back. One booked here is kept when keep_if() — asked only
//     for such a block (the allocator's is a driver call: not for every small free) — the caches of
//     a device sharing one cap, their total in `device_total`, each evicting its own oldest blocks
//     past it; otherwise (not kept, or not booked here) the caller frees it;
//   - age: a block not taken within max_age takes (hits or misses) of its cache is evicted, so
//     blocks of sizes no longer asked for go back to the pool, where any size can use them;
//   - release_all(): every kept block (before an allocation is retried, and at the end).
// Every call returns the blocks to free. Not thread-safe: the allocator holds its lock.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace moekit::detail {

class BlockCache {
 public:
  BlockCache(std::atomic<size_t>& device_total, size_t cap, uint64_t max_age)
      : device_total_(device_total), cap_(cap), max_age_(max_age) {}
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  void allocated(void* p, size_t bytes) { live_[p] = bytes; }

  struct Taken {
    void* block = nullptr;       // null: none of that size kept
    size_t bytes = 0;            // the block's own size (as booked)
    std::vector<void*> evicted;  // blocks aged out by this take: to free
  };
  Taken take(size_t bytes) {
    Taken out;
    ++takes_;
    size_t best = kept_.size();
    for (size_t i = 0; i < kept_.size(); ++i) {
      const size_t b = kept_[i].bytes;
      if (b >= bytes && b <= bytes + bytes / 8 && (best == kept_.size() || b < kept_[best].bytes)) {
        best = i;
      }
    }
    if (best != kept_.size()) {
      out.block = kept_[best].p;
      out.bytes = kept_[best].bytes;
      live_[out.block] = out.bytes;
      remove(best);
    }
    for (size_t i = 0; i < kept_.size();) {  // the oldest first: stop at the first young one
      if (takes_ - kept_[i].since <= max_age_) break;
      out.evicted.push_back(kept_[i].p);
      remove(i);
    }
    return out;
  }

  struct Freed {
    bool kept = false;           // false: the caller frees the block
    std::vector<void*> evicted;  // blocks the cap evicted (the freed one among them when the
                                 // device's other caches already hold the cap): to free
  };
  template <class KeepIf>
  Freed freed(void* p, const KeepIf& keep_if) {
    Freed out;
    const auto it = live_.find(p);
    if (it == live_.end()) return out;  // not a cacheable block of this allocator's
    const size_t bytes = it->second;
    live_.erase(it);
    if (!keep_if()) return out;
    out.kept = true;
    kept_.push_back({p, bytes, takes_});
    device_total_ += bytes;
    while (device_total_ > cap_ && !kept_.empty()) {
      out.evicted.push_back(kept_.front().p);
      remove(0);
    }
    return out;
  }

  std::vector<void*> release_all() {
    std::vector<void*> all;
    while (!kept_.empty()) {
      all.push_back(kept_.front().p);
      remove(0);
    }
    return all;
  }

  size_t blocks() const { return kept_.size(); }

 private:
  struct Kept {
    void* p;
    size_t bytes;
    uint64_t since;  // takes_ when it was kept
  };
  void remove(size_t i) {
    device_total_ -= kept_[i].bytes;
    kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(i));
  }

  std::atomic<size_t>& device_total_;
  size_t cap_;
  uint64_t max_age_;
  uint64_t takes_ = 0;
  std::vector<Kept> kept_;                  // oldest first
  std::unordered_map<void*, size_t> live_;  // cacheable blocks in use: their own bytes
};

}  // namespace moekit::detail
