// The CUDA side of the single-process GPU ranks engine (src/ep/ep_device.h): the context's error
// word for the kernels, peer access between the ranks' devices, and the events of the
// stream-ordered barrier.
#include <cuda_runtime_api.h>

#include "backends/cuda/check.h"
#include "backends/cuda/resources.h"
#include "ep/ep_device.h"
#include "moekit/core/error.h"

namespace moekit::detail {

EpDeviceArgs ep_device_args(const Context& ctx) {
  EpDeviceArgs a;
  a.error_word = cuda::resources(ctx).error_word;
  return a;
}

void ep_store_verdict(const Context& ctx, void* status_local, int word, bool refused) {
  cuda::DeviceGuard guard(ctx.device().index);
  // 0x01010101 or 0: a word the kernels read as non-zero or zero.
  MOEKIT_CUDA_CHECK(cudaMemsetAsync(static_cast<uint32_t*>(status_local) + word, refused ? 1 : 0,
                                    sizeof(uint32_t), static_cast<cudaStream_t>(ctx.stream())));
}

void ep_enable_peer_access(const std::vector<Context>& ranks) {
  for (const Context& a : ranks) {
    for (const Context& b : ranks) {
      const int da = a.device().index, db = b.device().index;
      if (da == db) continue;
      int can = 0;
      MOEKIT_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, da, db));
      if (!can) {
        throw_error(ErrorKind::Unsupported,
                    str("CudaRanks: GPU ", da, " cannot access GPU ", db,
                        " (no peer access between them: the single-process engine stores "
                        "through peer pointers)"));
      }
      cuda::DeviceGuard guard(da);
      const cudaError_t e = cudaDeviceEnablePeerAccess(db, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();  // clear it: enabling twice is fine
      } else {
        MOEKIT_CUDA_CHECK(e);
      }
      // Blocks of b's contexts come from b's stream-ordered pool: open it to device a.
      cudaMemAccessDesc desc{};
      desc.location.type = cudaMemLocationTypeDevice;
      desc.location.id = da;
      desc.flags = cudaMemAccessFlagsProtReadWrite;
      MOEKIT_CUDA_CHECK(cudaMemPoolSetAccess(cuda::resources(b).pool, &desc, 1));
    }
  }
}

struct EpStreamEvent {
  int device = 0;
  cudaEvent_t event = nullptr;
  ~EpStreamEvent() {
    if (event) (void)cudaEventDestroy(event);
  }
};

std::shared_ptr<EpStreamEvent> ep_make_event(const Context& ctx) {
  auto e = std::make_shared<EpStreamEvent>();
  e->device = ctx.device().index;
  cuda::DeviceGuard guard(e->device);
  MOEKIT_CUDA_CHECK(cudaEventCreateWithFlags(&e->event, cudaEventDisableTiming));
  return e;
}

void ep_event_record(const Context& ctx, EpStreamEvent& e) {
  cuda::DeviceGuard guard(ctx.device().index);
  MOEKIT_CUDA_CHECK(cudaEventRecord(e.event, static_cast<cudaStream_t>(ctx.stream())));
}

void ep_event_wait(const Context& ctx, EpStreamEvent& e) {
  cuda::DeviceGuard guard(ctx.device().index);
  MOEKIT_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(ctx.stream()), e.event, 0));
}

}  // namespace moekit::detail
