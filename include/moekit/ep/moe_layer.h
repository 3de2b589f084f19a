// moekit/ep/moe_layer.h — a Mixture-of-Experts layer end to end: router → dispatch → fused grouped
// MLP → combine, forward and backward (SPEC §7).
//
// Math, per token t of a rank (x [T, H]; E = W·L experts, this rank's L of them local):
//   logits  l = x_t · Wgᵀ                       Wg [E, H] (the gate; the same on every rank)
//   scores  s = softmax(l) or sigmoid(l)        (RouterScore)
//   topk    the k largest s_e (ties: the lower e), weights w_j = s_{e_j}, or s_{e_j} / Σ_i s_{e_i}
//           with normalize_topk
//   y_t     = Σ_j MLP_{e_j}(x_t; w_j)           MLP of SPEC §5 with p = w_j: the weight is applied
//                                               inside the MLP, the combine sums unweighted
// The router is the router primitive (moekit/primitives/router.h: fp64 on every device, the
// weights rounded to f32, the same routing on CPU and CUDA ranks); dispatch / combine are
// ExpertParallel's (moekit/ep/expert_parallel.h), the experts a GroupedMLP of the L
// local experts writing its output straight into ExpertParallel::combine_input() and, in backward,
// its input gradient into dispatch_backward_input() (zero copy).
// Backward from dy [T, H]: dY = combine_backward(dy); the MLP's backward gives dX [R, H] (into the
// EP buffer), dprobs [R] and the experts' weight gradients; dispatch_backward gives dx_e [T, H] and
// d(topk weights) [T, k]; the router's backward (fp64, router_topk_backward) gives dWg [E, H] (this rank's tokens only:
// a data-parallel caller all-reduces it) and dx_r; dx = round(dx_e + dx_r) once.
// One backward per forward (SPEC §1a) unless retain_saved. Every call is collective. The layer is
// written once for every device: on CudaRanks (one GPU per rank) every phase runs on the GPU with
// no host synchronisation (unless time_phases).
//
//   CpuRanks ranks(4);
//   ranks.run([&](Communicator& comm) {
//     MoELayer moe(comm, {.ep = {.experts_per_rank = 2, .hidden = H, .dtype = DType::BF16,
//                                .topk = 2, .max_tokens = T, .receive_capacity = 2 * T},
//                         .ffn = F});
//     copy(comm.context(), gate_host, moe.gate_weight());          // [E, H], same on every rank
//     copy(comm.context(), w1_host, moe.experts().fc1()->linear().weight());   // local experts
//     MoELayer::Saved saved;
//     Tensor y = moe.forward(x, &saved);                             // [T, H]
//     MoELayer::Grads g = moe.backward(saved, dy);                   // g.input [T, H], g.gate
//   });
#pragma once

#include <memory>

#include "moekit/ep/expert_parallel.h"
#include "moekit/ops/grouped_mlp.h"
#include "moekit/primitives/router.h"

namespace moekit {

struct MoELayerBackwardOptions {
  bool retain_saved = false;  // the saved context stays usable (PyTorch's retain_graph)
};

struct MoELayerConfig {
  ExpertParallelConfig ep;  // experts per rank, hidden, dtype, top-k, capacity, alignment, overflow
  int64_t ffn = 0;          // F of each expert's MLP
  RouterScore score = RouterScore::Softmax;
  bool normalize_topk = false;  // weights divided by the sum of the k chosen scores
  bool fc1_bias = false, fc2_bias = false;
  GluLayout layout = GluLayout::Halves;
  // Quantized recipe of the experts' fc1 and fc2 (GroupedMLPConfig::recipe: each GEMM on
  // quantized operands; SPEC §6d). ep.alignment must be a multiple of the recipe's
  // group_rows_multiple() (every expert's rows padded to it), else InvalidArgument.
  Recipe recipe = {};
  // Synchronise the context after each phase, so that MoEPhases' host clock measures each phase's
  // device work (moekit run). Off (default): no host synchronisation; on a CUDA context the phase
  // times are then the host's enqueue times.
  bool time_phases = false;
};

/// Wall time of each phase of the last forward / backward (ms, host clock; on CUDA device time
/// only with MoELayerConfig::time_phases).
struct MoEPhases {
  double router_ms = 0, dispatch_ms = 0, mlp_ms = 0, combine_ms = 0;
  EpTraffic dispatch_traffic, combine_traffic;  // bytes each EP call stored
};

class MoELayer {
 public:
  /// Collective. The gate and the experts' parameters are allocated uninitialised (set them).
  MoELayer(Communicator& comm, const MoELayerConfig& config);
  ~MoELayer();

  const MoELayerConfig& config() const { return config_; }
  const Tensor& gate_weight() const { return gate_; }  // [E, H] dtype
  GroupedMLP& experts() { return *mlp_; }              // the L local experts
  ExpertParallel& ep() { return *ep_; }

  struct Saved {
    Tensor input;         // x [T, H]
    Tensor topk_idx;      // [T, k] i64
    Tensor topk_weights;  // [T, k] f32
    ExpertParallel::Handle handle;
    GroupedMLP::Saved mlp;
    Tensor expert_out;  // the MLP's output: combine_input() itself (zero copy)
    Tensor scores;        // [T, E] fp64 bytes in an i64 tensor (router_topk), for the backward
    bool valid = false;
    std::shared_ptr<bool> used;
  };
  /// y [T, H] of x [T, H] (T ≤ max_tokens). Pass `saved` to train.
  Tensor forward(const Tensor& x, Saved* saved = nullptr);

  struct Grads {
    Tensor input;               // dx [T, H]
    Tensor gate;                // dWg [E, H] (this rank's tokens)
    GroupedMLP::Grads experts;  // the local experts' gradients; experts.input is
                                // dispatch_backward_input() itself (zero copy)
  };
  using BackwardOptions = MoELayerBackwardOptions;
  Grads backward(Saved& saved, const Tensor& dy, const BackwardOptions& options = {});

  const MoEPhases& last_forward() const { return forward_phases_; }
  const MoEPhases& last_backward() const { return backward_phases_; }

 private:
  MoELayerConfig config_;
  Communicator* comm_;
  std::unique_ptr<ExpertParallel> ep_;
  std::unique_ptr<GroupedMLP> mlp_;
  Tensor gate_;
  MoEPhases forward_phases_, backward_phases_;
  RouterOptions router_options() const;
  void end_phase() const;  // synchronises when config_.time_phases
};

}  // namespace moekit
