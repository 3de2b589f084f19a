// tests/support/cuda_graph.h — the CUDA runtime entry points the graph-capture tests need.
//
// The tests are built without CUDA headers (also in CPU-only builds), so they reach the runtime
// that libmoekit already loaded (libcudart.so, shared) through dlopen(RTLD_NOLOAD): the library's
// own runtime instance, which capture requires. `ok` is false when that runtime is not loaded
// (CPU-only builds): the tests then skip.
#pragma once

#include <dlfcn.h>

#include <cstddef>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "moekit/moekit.h"

namespace moekit::test {

struct CudaGraphApi {
  using Stream = void*;
  static constexpr unsigned kNonBlocking = 1;  // cudaStreamNonBlocking
  static constexpr int kCaptureGlobal = 0;     // cudaStreamCaptureModeGlobal
  int (*stream_create)(Stream*, unsigned) = nullptr;                // cudaStreamCreateWithFlags
  int (*stream_destroy)(Stream) = nullptr;                          // cudaStreamDestroy
  int (*stream_sync)(Stream) = nullptr;                             // cudaStreamSynchronize
  int (*begin_capture)(Stream, int) = nullptr;                      // cudaStreamBeginCapture
  int (*end_capture)(Stream, void**) = nullptr;                     // cudaStreamEndCapture
  int (*instantiate)(void**, void*, unsigned long long) = nullptr;  // cudaGraphInstantiate
  int (*launch)(void*, Stream) = nullptr;                           // cudaGraphLaunch
  int (*exec_destroy)(void*) = nullptr;                             // cudaGraphExecDestroy
  int (*graph_destroy)(void*) = nullptr;                            // cudaGraphDestroy
  int (*get_nodes)(void*, void**, size_t*) = nullptr;               // cudaGraphGetNodes
  int (*node_type)(void*, int*) = nullptr;                          // cudaGraphNodeGetType
  static constexpr int kKernelNode = 0;                             // cudaGraphNodeTypeKernel
  // cudaKernelNodeParams, as driver_types.h lays it out.
  struct KernelParams {
    void* func;
    unsigned grid[3], block[3];
    unsigned shared_bytes;
    void** args;
    void** extra;
  };
  int (*kernel_params)(void*, KernelParams*) = nullptr;  // cudaGraphKernelNodeGetParams
  int (*device_attribute)(int*, int, int) = nullptr;     // cudaDeviceGetAttribute
  static constexpr int kSmCountAttribute = 16;           // cudaDevAttrMultiProcessorCount
  // Events (a caller's stream-ordered barrier across streams, tests/test_ep_cuda.cpp).
  static constexpr unsigned kDisableTiming = 2;            // cudaEventDisableTiming
  int (*event_create)(void**, unsigned) = nullptr;         // cudaEventCreateWithFlags
  int (*event_destroy)(void*) = nullptr;                   // cudaEventDestroy
  int (*event_record)(void*, Stream) = nullptr;            // cudaEventRecord
  int (*stream_wait_event)(Stream, void*, unsigned) = nullptr;  // cudaStreamWaitEvent
  int (*set_device)(int) = nullptr;                        // cudaSetDevice
  bool ok = false;

  CudaGraphApi() {
    void* lib = nullptr;
    for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
      if ((lib = dlopen(name, RTLD_NOW | RTLD_NOLOAD))) break;
    }
    if (!lib) return;
    auto get = [&](auto& fn, const char* sym) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, sym));
      return fn != nullptr;
    };
    ok = get(stream_create, "cudaStreamCreateWithFlags") &&
         get(stream_destroy, "cudaStreamDestroy") && get(stream_sync, "cudaStreamSynchronize") &&
         get(begin_capture, "cudaStreamBeginCapture") && get(end_capture, "cudaStreamEndCapture") &&
         get(instantiate, "cudaGraphInstantiate") && get(launch, "cudaGraphLaunch") &&
         get(exec_destroy, "cudaGraphExecDestroy") && get(graph_destroy, "cudaGraphDestroy") &&
         get(get_nodes, "cudaGraphGetNodes") && get(node_type, "cudaGraphNodeGetType") &&
         get(kernel_params, "cudaGraphKernelNodeGetParams") &&
         get(device_attribute, "cudaDeviceGetAttribute") &&
         get(event_create, "cudaEventCreateWithFlags") && get(event_destroy, "cudaEventDestroy") &&
         get(event_record, "cudaEventRecord") && get(stream_wait_event, "cudaStreamWaitEvent") &&
         get(set_device, "cudaSetDevice");
  }

  /// Each kernel node's launch of a captured graph, in the graph's node order (empty on error).
  std::vector<KernelParams> kernels(void* graph) const {
    size_t n = 0;
    if (get_nodes(graph, nullptr, &n) != 0) return {};
    std::vector<void*> nodes(n);
    if (n > 0 && get_nodes(graph, nodes.data(), &n) != 0) return {};
    std::vector<KernelParams> out;
    for (void* node : nodes) {
      int type = -1;
      if (node_type(node, &type) != 0) return {};
      if (type != kKernelNode) continue;
      KernelParams p{};
      if (kernel_params(node, &p) != 0) return {};
      out.push_back(p);
    }
    return out;
  }

  /// The SM count of CUDA device `device` (0 on error).
  int sm_count(int device) const {
    int n = 0;
    return device_attribute(&n, kSmCountAttribute, device) == 0 ? n : 0;
  }

  /// Kernel nodes of a captured graph (allocation, memset and copy nodes not counted); -1 on error.
  int kernel_nodes(void* graph) const {
    size_t n = 0;
    if (get_nodes(graph, nullptr, &n) != 0) return -1;
    std::vector<void*> nodes(n);
    if (n > 0 && get_nodes(graph, nodes.data(), &n) != 0) return -1;
    int kernels = 0;
    for (void* node : nodes) {
      int type = -1;
      if (node_type(node, &type) != 0) return -1;
      kernels += type == kKernelNode ? 1 : 0;
    }
    return kernels;
  }

  /// fn() captured on `stream` into a new graph (*graph, which the caller destroys): "" or why
  /// the capture failed — fn threw, or the capture was invalidated (a host synchronisation).
  std::string capture(Stream stream, const std::function<void()>& fn, void** graph) const {
    if (begin_capture(stream, kCaptureGlobal) != 0) return "cudaStreamBeginCapture failed";
    std::string thrown;
    try {
      fn();
    } catch (const Error& e) {
      thrown = e.what();
    }
    if (end_capture(stream, graph) != 0) {
      return "capture was invalidated (a host sync?)" + (thrown.empty() ? "" : "; " + thrown);
    }
    return thrown;
  }

  static const CudaGraphApi& get() {
    static const CudaGraphApi api;
    return api;
  }
};

/// Whether a captured launch of a 16-bit step is one of the sm90 persistent GEMMs: the only kernels
/// of such a step that take more than 96 KiB of dynamic shared memory (their pipeline stages; the
/// largest other, the bias kernels' offset table, is 64 KiB at most). Not for quantized steps: the
/// fp8-block quantize of f32 data stages 128 KiB.
inline bool is_gemm_launch(const CudaGraphApi::KernelParams& k) {
  return k.shared_bytes > 96 * 1024;
}

/// A non-blocking stream of one test, destroyed with it; get() is nullptr if creation failed.
class OwnedStream {
 public:
  explicit OwnedStream(const CudaGraphApi& api) : api_(api) {
    if (api_.stream_create(&stream_, CudaGraphApi::kNonBlocking) != 0) stream_ = nullptr;
  }
  ~OwnedStream() {
    if (stream_) api_.stream_destroy(stream_);
  }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  void* get() const { return stream_; }

 private:
  const CudaGraphApi& api_;
  void* stream_ = nullptr;
};

}  // namespace moekit::test
