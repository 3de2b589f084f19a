// moekit/ep/expert_parallel.h — dispatch / combine of expert parallelism (SPEC §7).
//
// W ranks (a Communicator), L experts each: rank d owns global experts [d·L, (d+1)·L) (E = W·L).
// Every call is collective: every rank calls it, with its own tokens (T ≤ max_tokens, T may differ
// per rank).
//
// dispatch(tokens x [T, H], topk_idx [T, k] (i64|i32, k distinct experts in [0, E) per token),
//          topk_weights w [T, k] f32) → on each rank d:
//   recv [R, H]     expert-major: local expert e's rows at [off_e, off_e + c_e) in order of
//                   (source rank, source token) ascending; row of (s, t, e) = x_s[t];
//                   rows [off_e + c_e, off_e + pad(c_e)) are zero padding (pad = round up to
//                   `alignment`); rows [S, R) are never written, S = Σ pad(c_e)
//   splits          device-style counts [L] i64 holding pad(c_e): the grouped MLP's Splits as is
//   tokens_per_expert [L] i64: c_e (rows actually received)
//   weights [R] f32 the routing weight of each row: w_s[t, j] where topk_idx_s[t, j] = d·L + e;
//                   0 in padding rows (the grouped MLP's probs)
//   handle          the routing, for combine and both backward passes
// Transport: a token goes to each destination rank once, however many of its k experts that rank
// owns, and the destination expands it into its experts' rows (the GPU engine's design: at top-8
// over 2 ranks, ~1 row per token crosses instead of ~4 of a per-slot all-to-all).
//
// combine(handle, y [R, H]) → out [T, H] on each source rank:
//   out_s[t] = round( Σ_{d} Σ_{e} y_d[row(s, t, e)] )   in fp32, rounded once to the dtype,
//   summed as a binary tree: on rank d a pairwise tree over its local expert ids (leaves of a
//   tree over [0, 2^⌈log2 L⌉), absent leaves skipped, no addition of zeros), sent back once per
//   (token, rank) — as fp32, or as the row itself in the dtype when the rank holds one row of the
//   token (exact either way); on the source the same tree over ranks. When L is a power of two this
//   is the pairwise tree over global expert ids, so the result is bit-identical for every world
//   size. The routing weights are not applied (the MLP applied them, SPEC §5). A token whose rows
//   were all dropped gets a zero row.
// combine_backward(handle, dy [T, H]) → dY [R, H]: dY_d[row(s, t, e)] = dy_s[t] (a dispatch of
//   dy by the handle's routing; padding rows zero, rows [S, R) not written).
// dispatch_backward(handle, dX [R, H], dw_rows [R] f32 (the MLP's dprobs; optional)) →
//   grad_tokens [T, H]: the combine of dX (same tree, fp32, one rounding);
//   grad_topk_weights [T, k] f32: dw_rows[row(s, t, topk_idx[t, j])] (0 for a dropped row).
//
// Capacity: S ≤ R (receive_capacity). Overflow policy Error (default): dispatch throws
// InvalidArgument on every rank naming the overflowing rank, the rows needed and the capacity;
// nothing is sent. Drop: rows are kept in expert-major order while they fit (expert e keeps
// min(c_e, ⌊(R − off_e)/A⌋·A) rows, first sources/tokens first); the rest are dropped — they get
// no row, add nothing to the combine, get zero weight gradients — and counted
// (Dispatched::dropped). Validation (host metadata and, on CPU ranks, the index values) happens
// before anything is sent; every rank agrees on it: the rank at fault throws InvalidArgument naming
// the argument, expected and seen values, the others InvalidArgument naming that rank. Nothing is
// written then. Under in-band agreement (Communicator::Agreement::InBand: nccl_communicator, caller
// groups on GPUs — no host collective per call, so a step captures in a CUDA graph) only the rank
// at fault throws; the others return, store nothing for the call (nor, after a refused dispatch,
// for its handle's calls) and find Context::kEpPeerRefused in their error word.
//
// Zero copy: combine_input() [R, H] and dispatch_backward_input() [R, H] are buffers of the
// engine's memory (symmetric) that the EP object owns; give them to the grouped MLP as fc2's
// `output` and fc1's `grad_input` (SPEC §3) and pass them back to combine / dispatch_backward,
// which read them in place. One layer step in flight per ExpertParallel: the next dispatch reuses
// the buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "moekit/core/splits.h"
#include "moekit/core/tensor.h"
#include "moekit/ep/communicator.h"

namespace moekit {

enum class OverflowPolicy { Error, Drop };

struct EpRouting;  // a dispatch's routing (src/ep/expert_parallel.cpp)

struct ExpertParallelConfig {
  int64_t experts_per_rank = 0;  // L
  int64_t hidden = 0;            // H
  DType dtype = DType::BF16;     // tokens, recv, expert outputs, gradients
  int64_t topk = 0;              // k (1 ≤ k ≤ E)
  int64_t max_tokens = 0;        // most tokens a rank dispatches in one call (T ≤ max_tokens)
  int64_t receive_capacity = 0;  // R: rows of each rank's expert-major receive buffer
  int64_t alignment = 1;         // A: each expert's rows padded to a multiple of A
  OverflowPolicy overflow = OverflowPolicy::Error;
};

/// Bytes the last call stored (what the transport moved), per rank.
struct EpTraffic {
  int64_t remote_bytes = 0;    // into other ranks' memory (cross-rank links)
  int64_t local_bytes = 0;     // into this rank's own staging (self)
  int64_t per_slot_bytes = 0;  // what a per-slot (one row per (token, expert)) all-to-all in
                               // the dtype would store into other ranks (the comparison)
};

class ExpertParallel {
 public:
  /// Collective. Allocates the staging buffers and the two zero-copy buffers on the engine's
  /// memory. Throws InvalidArgument naming the field when the config is inconsistent (every
  /// rank must pass the same config).
  ExpertParallel(Communicator& comm, const ExpertParallelConfig& config);
  ~ExpertParallel();
  /// The symmetric memory one ExpertParallel of `config` allocates on `world_size` ranks of
  /// `device` (each block rounded up to kSymmetricAlignment): what a caller group's region
  /// (caller_communicator) must hold per ExpertParallel.
  static size_t symmetric_bytes(const ExpertParallelConfig& config, int world_size,
                                const Device& device);
  ExpertParallel(const ExpertParallel&) = delete;
  ExpertParallel& operator=(const ExpertParallel&) = delete;

  const ExpertParallelConfig& config() const;
  int rank() const;
  int world_size() const;
  int64_t experts() const;  // E = W·L
  const Context& context() const;

  /// The combine's input [R, H] (fc2's `output`) and dispatch_backward's input [R, H] (fc1's
  /// `grad_input`), owned by this object, in the engine's memory.
  const Tensor& combine_input() const;
  const Tensor& dispatch_backward_input() const;

  struct Handle {
    std::shared_ptr<const EpRouting> routing;
    bool defined() const { return routing != nullptr; }
  };
  struct Dispatched {
    Tensor recv;               // [R, H] dtype, expert-major, rows [S, R) not written
    Splits splits;             // device-style counts [L] i64 (padded): the MLP's splits
    Tensor tokens_per_expert;  // [L] i64, rows received per expert (before padding)
    Tensor weights;            // [R] f32 routing weight per row (0 in padding; [S, R) unwritten)
    int64_t rows = 0;          // S = Σ padded counts (CPU ranks: known on the host)
    int64_t dropped = 0;       // rows dropped on this rank by the Drop policy
    Handle handle;
  };
  /// Optional caller buffers (SPEC §3 style: shape, dtype, device, contiguous, overlapping no
  /// input of the call nor another buffer; returned aliased; rows [S, R) keep their contents).
  struct DispatchBuffers {
    Tensor recv;     // [R, H] dtype
    Tensor weights;  // [R] f32
  };
  Dispatched dispatch(const Tensor& tokens, const Tensor& topk_idx, const Tensor& topk_weights,
                      const DispatchBuffers& buffers = {});
  /// `output`: an optional caller buffer [T, H] dtype.
  Tensor combine(const Handle& handle, const Tensor& expert_out, const Tensor& output = {});
  /// `output`: an optional caller buffer [R, H] dtype (rows [S, R) keep their contents).
  Tensor combine_backward(const Handle& handle, const Tensor& grad_output,
                          const Tensor& output = {});
  struct DispatchGrads {
    Tensor tokens;        // [T, H] dtype
    Tensor topk_weights;  // [T, k] f32 (undefined when grad_weights was not given)
  };
  struct DispatchGradBuffers {
    Tensor tokens;        // [T, H] dtype
    Tensor topk_weights;  // [T, k] f32 (only with grad_weights)
  };
  DispatchGrads dispatch_backward(const Handle& handle, const Tensor& grad_recv,
                                  const Tensor& grad_weights = {},
                                  const DispatchGradBuffers& buffers = {});

  /// What the last call stored.
  EpTraffic last_traffic() const;

  struct State;  // src/ep/expert_parallel.cpp

 private:
  std::unique_ptr<State> s_;
};

}  // namespace moekit
