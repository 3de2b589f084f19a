// moekit/core/context.h — where an op runs: device, stream, allocator, backend choice.
//
// Cheap to copy (shared state). There is no hidden global state beyond Context::cpu()'s default
// allocator. A CUDA context owns (or borrows) a stream, a stream-ordered allocator and library
// handles; building without CUDA makes Context::cuda() throw ErrorKind::Unsupported.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "moekit/core/device.h"
#include "moekit/core/tensor.h"

namespace moekit {

namespace detail {
struct ContextAccess;  // internal (src/core/runtime.h): the library's view of a context's state
}

class Context {
 public:
  /// CPU context; `threads` = 0 uses every core.
  static Context cpu(int threads = 0);
  /// CUDA context on `device`; `stream` is a cudaStream_t (nullptr: the context creates one).
  static Context cuda(int device = 0, void* stream = nullptr);
  /// The best available: CUDA device 0 when a GPU is usable, else the CPU.
  static Context best_available();
  /// Number of usable CUDA devices (0 when built without CUDA or no driver/GPU).
  static int cuda_device_count();
  /// Whether this build contains the CUDA backend.
  static bool built_with_cuda();

  const Device& device() const;
  void* stream() const;
  Allocator& allocator() const;
  int threads() const;
  /// A copy of this context that allocates through `allocator` (e.g. a counting allocator).
  Context with_allocator(std::shared_ptr<Allocator> allocator) const;
  /// Forces primitives to use the backend named `name` ("" = automatic). The environment variable
  /// MOEKIT_BACKEND does the same for every context that forces nothing.
  Context with_backend(std::string name) const;
  const std::string& forced_backend() const;
  /// A copy of this context whose persistent GEMM kernels (the sm90 grouped kernels' grids, cuBLAS
  /// through its SM-count target) leave `sms` of the device's SMs to work the caller runs beside
  /// them: an expert-parallel all-to-all on another stream while deferred weight gradients run
  /// (SPEC §1b). Such a kernel holds its SMs until it ends, so a kernel queued after it starts
  /// only on SMs it leaves. 0 (the default) uses every SM. The side stream's work (the weight
  /// gradients) keeps the margin. InvalidArgument naming 'sms' unless 0 <= sms < the device's SM
  /// count; CPU contexts take any sms >= 0 and ignore it. The sm90 kernels write the same bits
  /// whatever sms; cuBLAS may choose another algorithm for fewer SMs (SPEC §1b).
  Context with_sm_margin(int sms) const;
  int sm_margin() const;
  /// Waits for all work queued on the context's stream.
  void synchronize() const;
  /// Gives back the memory moekit keeps for reuse on this context's device (SPEC §1b, Memory):
  /// the blocks this context's allocator keeps (and its side stream's), then, once the context's
  /// streams have finished their queued work (a host sync), every byte of the device's pool that
  /// no tensor uses. For a caller whose other allocator (e.g. torch's) runs out of memory. CPU
  /// contexts: nothing to give back.
  void release_cached_memory() const;
  /// The bytes moekit's memory pool for this context's device holds from the driver: what tensors
  /// use, what allocators keep for reuse and what the pool caches (every moekit context of the
  /// device shares the pool; SPEC §1b, Memory). release_cached_memory brings it down to what
  /// tensors use. 0 for CPU contexts.
  size_t memory_reserved() const;

  /// Device-side argument errors (SPEC §1). Kernels that read device split counts without a host
  /// round trip (graph-capturable paths) check them where they read them: an invalid count makes
  /// the call write nothing and ORs a bit into the context's error word. CPU contexts, and paths
  /// that read counts to the host, raise the error at the call instead, so for them the word stays
  /// clear. device_error_bits() reads the word (synchronising the stream) and clears it;
  /// check_device_errors() does the same and throws InvalidArgument naming 'splits' and what was
  /// wrong when a bit was set.
  static constexpr uint32_t kNegativeCount = 1;     // some device count was < 0
  static constexpr uint32_t kCountsExceedRows = 2;  // S = sum of the counts > T rows presented
  static constexpr uint32_t kCountsMisaligned = 4;  // a count not a multiple its format needs
                                                    // (NVFP4's columnwise copy: even rows)
  // Expert parallelism on a GPU engine (SPEC §7): ExpertParallel::dispatch checks topk_idx and
  // the receive capacity on the device; a refused call stores nothing and sets, on every rank:
  static constexpr uint32_t kEpInvalidRouting = 8;     // some rank's topk_idx had an expert out
                                                       // of [0, E) or the same expert twice
  static constexpr uint32_t kEpCapacityExceeded = 16;  // OverflowPolicy::Error and some rank
                                                       // needed more than receive_capacity rows
  static constexpr uint32_t kEpPeerRefused = 32;       // in-band agreement (Communicator::
                                                       // Agreement::InBand): another rank refused
                                                       // its arguments; this rank stored nothing
  uint32_t device_error_bits() const;
  void check_device_errors() const;

  /// Whether `other` is this context or a copy of it (shares its state); with_* make new ones.
  bool same_context(const Context& other) const { return impl_ == other.impl_; }

 private:
  friend struct detail::ContextAccess;
  struct Impl;
  explicit Context(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

/// The backend that ran the last call of `primitive` on ctx (or a copy of it, or its side
/// stream): "sm90", "cublas", "cuda" or "cpu"; "" when none ran yet. Primitives:
/// "grouped_gemm_group_m" (forward and input gradients), "grouped_gemm_group_k" (weight
/// gradients), "grouped_gemm_swiglu" / "grouped_gemm_dswiglu" (the fused kernels, when they ran),
/// "swiglu_forward", "swiglu_backward", "grouped_bias_add", "grouped_bias_grad",
/// "grouped_scaled_bias_grad".
std::string last_backend(const Context& ctx, std::string_view primitive);

}  // namespace moekit
