#include "moekit/core/context.h"

#include <algorithm>
#include <cstdlib>
#include <new>
#include <thread>

#include "core/runtime.h"
#include "core/checks.h"
#include "moekit/core/error.h"

namespace moekit {
namespace {

class CpuAllocator final : public Allocator {
 public:
  Device device() const override { return Device::cpu(); }

 protected:
  void* do_allocate(size_t bytes) override {
    constexpr size_t kAlign = 64;
    void* p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
    if (!p) throw_error(ErrorKind::Runtime, str("out of host memory allocating ", bytes, " bytes"));
    return p;
  }
  void do_deallocate(void* p, size_t) noexcept override { std::free(p); }
};

}  // namespace

Context Context::cpu(int threads) {
  auto impl = std::make_shared<Impl>();
  impl->device = Device::cpu();
  impl->allocator = std::make_shared<CpuAllocator>();
  impl->threads = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return Context(std::move(impl));
}

Context Context::cuda(int device, void* stream) {
  const int n = detail::cuda_device_count();
  if (!built_with_cuda()) {
    throw_error(ErrorKind::Unsupported,
                "this moekit was built without CUDA (MOEKIT_WITH_CUDA=OFF or nvcc not found)");
  }
  if (n == 0) {
    throw_error(ErrorKind::Unsupported,
                "no CUDA device is usable (no GPU, or no driver): use Context::cpu()");
  }
  if (device < 0 || device >= n) {
    throw_invalid("device", str("a CUDA device index in [0, ", n, ")"), std::to_string(device));
  }
  auto impl = std::make_shared<Impl>();
  impl->device = Device::cuda(device);
  impl->threads = 1;
  detail::init_cuda_context(*impl, device, stream);
  return Context(std::move(impl));
}

Context Context::best_available() {
  return cuda_device_count() > 0 ? cuda(0) : cpu();
}

int Context::cuda_device_count() { return detail::cuda_device_count(); }

bool Context::built_with_cuda() {
#ifdef MOEKIT_HAS_CUDA
  return true;
#else
  return false;
#endif
}

const Device& Context::device() const { return impl_->device; }
void* Context::stream() const { return impl_->stream; }
Allocator& Context::allocator() const { return *impl_->allocator; }
int Context::threads() const { return impl_->threads; }

Context Context::with_allocator(std::shared_ptr<Allocator> allocator) const {
  if (!allocator) throw_invalid("allocator", "a non-null allocator", "nullptr");
  if (!(allocator->device() == device())) {
    throw_invalid("allocator", str("an allocator for ", device().to_string()),
                  allocator->device().to_string());
  }
  auto impl = std::make_shared<Impl>(*impl_);
  impl->allocator = std::move(allocator);
  return Context(std::move(impl));
}

Context Context::with_backend(std::string name) const {
  auto impl = std::make_shared<Impl>(*impl_);
  impl->backend = std::move(name);
  return Context(std::move(impl));
}

const std::string& Context::forced_backend() const { return impl_->backend; }

Context Context::with_sm_margin(int sms) const {
  check_sm_margin("sms", sms, *this);
  auto impl = std::make_shared<Impl>(*impl_);
  impl->sm_margin = sms;
  return Context(std::move(impl));
}

int Context::sm_margin() const {
  return impl_->sm_margin;
}

std::string last_backend(const Context& ctx, std::string_view primitive) {
  auto& log = *detail::ContextAccess::impl(ctx)->log;
  std::lock_guard lock(log.mutex);
  auto it = log.last.find(primitive);
  return it == log.last.end() ? std::string() : it->second;
}

void Context::synchronize() const {
  if (device().is_cuda()) detail::cuda_synchronize(*this);
}

void Context::release_cached_memory() const {
  if (device().is_cuda()) {
    detail::cuda_release_cached_memory(*this);  // the allocator's too, after its checks
  } else {
    impl_->allocator->release_cached();
  }
}

size_t Context::memory_reserved() const {
  return device().is_cuda() ? detail::cuda_memory_reserved(*this) : 0;
}

uint32_t Context::device_error_bits() const {
  return device().is_cuda() ? detail::cuda_take_error_bits(*this) : 0;
}

void Context::check_device_errors() const {
  const uint32_t bits = device_error_bits();
  if (bits == 0) return;
  constexpr uint32_t kEp = kEpInvalidRouting | kEpCapacityExceeded | kEpPeerRefused;
  if (bits & kEp) {
    std::string what;
    if (bits & kEpInvalidRouting) {
      what += " a rank's topk_idx had an expert out of [0, E) or the same expert twice;";
    }
    if (bits & kEpCapacityExceeded) {
      what += " a rank needed more padded rows than receive_capacity (OverflowPolicy::Error);";
    }
    if (bits & kEpPeerRefused) {
      what += " another rank refused its arguments (it threw at the call; in-band agreement);";
    }
    what.pop_back();
    throw_invalid(bits & kEpInvalidRouting    ? "topk_idx"
                  : bits & kEpCapacityExceeded ? "receive_capacity"
                                               : "arguments",
                  "an expert-parallel call every rank accepts (SPEC §7; nothing was stored)",
                  str("the device checks of an expert-parallel call refused it:", what,
                      (bits & ~kEp) ? str(" (other error bits ", bits, ")") : std::string()));
  }
  std::string seen = "device counts that the kernel found invalid (nothing was written):";
  if (bits & kNegativeCount) seen += " a negative count;";
  if (bits & kCountsExceedRows) seen += " a total S larger than the T rows presented;";
  if (bits & kCountsMisaligned) seen += " a count that is not a multiple its quantized format needs;";
  if (bits & ~(kNegativeCount | kCountsExceedRows | kCountsMisaligned)) {
    seen += str(" unknown error bits ", bits, ";");
  }
  seen.pop_back();
  throw_invalid("splits",
                "every count >= 0, S = sum of counts <= T, and each count a multiple of what its "
                "quantized format needs (SPEC §6c)",
                seen);
}

}  // namespace moekit
