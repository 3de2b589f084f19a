// Built instead of src/backends/cuda/ep/ when moekit has no CUDA backend: the GPU engine's entry
// points (src/ep/ep_device.h) throw Unsupported. ExpertParallel never reaches them on a CPU
// context.
#include "ep/ep_device.h"
#include "moekit/core/error.h"

namespace moekit::detail {
namespace {
[[noreturn]] void no_cuda() {
  throw_error(ErrorKind::Unsupported,
              "this moekit was built without CUDA: no GPU engine for expert parallelism");
}
}  // namespace

struct EpStreamEvent {};

EpDeviceArgs ep_device_args(const Context&) { no_cuda(); }
void ep_store_verdict(const Context&, void*, int, bool) { no_cuda(); }
void ep_count(const Context&, const EpDeviceArgs&, const Tensor&, int64_t, const EpDeviceRouting&) {
  no_cuda();
}
void ep_plan(const Context&, const EpDeviceArgs&, const EpDeviceRouting&, const Tensor&,
             const Tensor&) {
  no_cuda();
}
void ep_send(const Context&, const EpDeviceArgs&, const EpDeviceRouting&, const Tensor&, int64_t,
             const Tensor&) {
  no_cuda();
}
void ep_expand(const Context&, const EpDeviceArgs&, const EpDeviceRouting&, const Tensor&,
               const Tensor&, bool) {
  no_cuda();
}
void ep_reduce(const Context&, const EpDeviceArgs&, const EpDeviceRouting&, const Tensor&,
               const Tensor&) {
  no_cuda();
}
void ep_sum(const Context&, const EpDeviceArgs&, const EpDeviceRouting&, int64_t, const Tensor&,
            const Tensor&) {
  no_cuda();
}
void ep_enable_peer_access(const std::vector<Context>&) { no_cuda(); }
std::shared_ptr<EpStreamEvent> ep_make_event(const Context&) { no_cuda(); }
void ep_event_record(const Context&, EpStreamEvent&) { no_cuda(); }
void ep_event_wait(const Context&, EpStreamEvent&) { no_cuda(); }

}  // namespace moekit::detail
