// Internal: the GPU engine's kernels of expert parallelism (SPEC §7; design/ARCHITECTURE.md
// "Expert parallelism"), as ExpertParallel (src/ep/expert_parallel.cpp) calls them. Defined in
// src/backends/cuda/ep/ (one idea per file); a build without CUDA gets src/ep/ep_no_cuda.cpp,
// whose functions throw Unsupported. No CUDA header here: the op layer stays backend-free.
//
// Every function queues work on ctx's stream and returns: no host synchronisation, so a whole
// layer step captures in a CUDA graph (the peer bases are kernel parameters, fixed at
// construction). The CPU reference of each kernel is the loop of the same name in
// expert_parallel.cpp (send_rows, expand_rows, reduce_and_return, sum_returned; count/plan are
// dispatch's phases 2a/2b) — the GPU results are bit-identical to it.
//
// Symmetric layout (every rank, W ranks, Tm = max_tokens, k, L): as the CPU engine's, except
//   counts [W dst][L + 1] i64 — PULL style: a source writes its counts for every destination into
//            its OWN block and every rank reads every source's block (peer loads) after the
//            barrier; so a refused call stores nothing into any peer.
//   status [16] u32 — word 0: this rank's verdict on its topk_idx (0 or kEpInvalidRouting);
//            words 1, 2 (in-band agreement, Communicator::Agreement::InBand): this rank's verdict
//            on its host-checked arguments of a call (0: accepted), the call's slot alternating
//            call by call (a rank rewrites a slot only after every rank passed the first barrier
//            of the call in between, so no rank still reads it).
//   meta_q [W src][Tm][k] i32 — the entry's rank among its source's entries of that expert
//            (token order), from which the destination computes its row without atomics.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "moekit/core/context.h"
#include "moekit/core/tensor.h"

namespace moekit::detail {

inline constexpr int kEpMaxRanks = 8;   // one NVLink domain of a node (CUDA engines)
inline constexpr int kEpMaxTopk = 32;   // per-token entries kept in registers by the kernels
inline constexpr uint32_t kEpInvalidRoutingBit = Context::kEpInvalidRouting;
inline constexpr uint32_t kEpCapacityExceededBit = Context::kEpCapacityExceeded;
inline constexpr uint32_t kEpPeerRefusedBit = Context::kEpPeerRefused;

struct EpPeers {
  void* p[kEpMaxRanks] = {};  // base of each rank's block of one symmetric allocation
};

struct EpDeviceArgs {
  int W = 1, r = 0;
  int64_t L = 0, H = 0, k = 0, Tm = 0, R = 0, A = 1;
  int dtype = 0;      // DType as int (F32, F16, BF16)
  bool drop = false;  // OverflowPolicy::Drop
  int verdict = -1;   // in-band agreement: the call's verdict word of every status block (1, 2);
                      // -1: agreed on the host (nothing to read)
  EpPeers stage_x, meta_e, meta_j, meta_w, meta_q, counts, status, ret, ret_flag, ret_w;
  uint32_t* error_word = nullptr;  // the context's device error word
};

// A dispatch's device routing (allocated per dispatch on the rank's context, kept by the handle).
//   plan i64: [0] go (1: the call was accepted by every rank), [1, L+2) off[L+1], [L+2, 2L+2)
//             kept[L], [2L+2, 2L+2+W·L) base[src][e] (first row of src's rows of e), then sent[W]
//   src_pos [Tm][W] i32 (slot of token t at rank d, -1), src_topk [Tm][k] i32, src_q [Tm][k] i32
//   dst_e, dst_j, dst_row [W src][Tm][k] i32 (entries in ascending local expert; row -1: dropped)
struct EpDeviceRouting {
  Tensor plan, src_pos, src_topk, src_q, dst_e, dst_j, dst_row;
};
inline int64_t ep_plan_words(int64_t W, int64_t L) { return 2 * L + 2 + W * L + W; }
inline constexpr int kEpVerdictWords[2] = {1, 2};  // status words of the in-band verdicts

EpDeviceArgs ep_device_args(const Context& ctx);  // fills error_word (the rest: the caller)

/// ep_runtime.cpp: in-band agreement — this rank's verdict (0: accepted, 1: refused) into word
/// `word` of its own status block (a 4-byte memset on ctx's stream: capturable).
void ep_store_verdict(const Context& ctx, void* status_local, int word, bool refused);
/// Every kernel below first reads the call's verdicts (EpDeviceArgs::verdict, every rank's status
/// block) and, if a rank refused, stores nothing and ORs Context::kEpPeerRefused into the error
/// word (ep_plan also refuses the dispatch: plan[0] = 0, zero splits).
/// ep_count.cu: validates topk_idx [T, k] (i32|i64) on the device (range, duplicates: status and
/// nothing else written when bad); per token its destination ranks, its slot at each (a scan in
/// token order) and each entry's rank within its expert; this rank's counts block.
void ep_count(const Context& ctx, const EpDeviceArgs& a, const Tensor& topk_idx, int64_t T,
              const EpDeviceRouting& rt);
/// ep_plan.cu: reads every rank's status and counts (peer loads); the verdict (the same on every
/// rank) into plan[0] and the error word; this rank's offsets / kept / bases; splits [L] i64
/// (padded counts) and tokens_per_expert [L] i64 (zero when refused).
void ep_plan(const Context& ctx, const EpDeviceArgs& a, const EpDeviceRouting& rt,
             const Tensor& splits, const Tensor& tokens_per_expert);
/// ep_send.cu: each token's row [H] once into each destination's stage_x (16-byte stores when
/// rows allow), with its entries into meta_* when weights is defined (dispatch). Nothing when
/// refused.
void ep_send(const Context& ctx, const EpDeviceArgs& a, const EpDeviceRouting& rt,
             const Tensor& rows, int64_t T, const Tensor& topk_weights);
/// ep_expand.cu: the own staging into recv [R, H] (rows by the routing, padding rows zero);
/// with `first` (dispatch) the routing's destination entries are computed from meta first and
/// weights [R] f32 written. Nothing when refused.
void ep_expand(const Context& ctx, const EpDeviceArgs& a, const EpDeviceRouting& rt,
               const Tensor& recv, const Tensor& weights, bool first);
/// ep_reduce.cu: per received (source, slot) the fp32 tree over local experts of its rows of
/// in [R, H], stored into the source's ret (+ flag; + ret_w from dw_rows [R] f32 when defined).
void ep_reduce(const Context& ctx, const EpDeviceArgs& a, const EpDeviceRouting& rt,
               const Tensor& in, const Tensor& dw_rows);
/// ep_sum.cu: out [T, H] = the tree over ranks of what was returned, rounded once; with gw
/// defined also gw [T, k] f32 = ret_w of each column.
void ep_sum(const Context& ctx, const EpDeviceArgs& a, const EpDeviceRouting& rt, int64_t T,
            const Tensor& out, const Tensor& gw);

/// ep_runtime.cpp: single-process CUDA ranks. Peer access between every pair of the ranks' devices
/// (cudaDeviceEnablePeerAccess, and the devices' memory pools opened to each other so blocks
/// from the contexts' allocators are loadable / storable by peers).
void ep_enable_peer_access(const std::vector<Context>& ranks);
/// A stream-ordered barrier of W contexts in one process, in two host steps between which the
/// host threads must meet: arrive() records an event on ctx's stream; wait() makes ctx's stream
/// wait for every rank's event. Opaque per-rank event state.
struct EpStreamEvent;
std::shared_ptr<EpStreamEvent> ep_make_event(const Context& ctx);
void ep_event_record(const Context& ctx, EpStreamEvent& e);
void ep_event_wait(const Context& ctx, EpStreamEvent& e);

}  // namespace moekit::detail
