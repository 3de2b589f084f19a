// `moekit run --ep N`: the MoE layer on N CPU ranks, or N GPUs with --device cuda (one rank per
// GPU: NcclRanks or CudaRanks, EpStepConfig::engine) (moekit/ep/moe_layer.h), checked against the same layer on one rank (of the same
// engine) holding every expert and every rank's tokens.
#include "ep_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

namespace moekit::tools {
namespace {

// Host tensor of normal(0, stddev) values rounded to dtype.
Tensor random_tensor(const Shape& shape, DType dtype, double stddev, std::mt19937_64& rng) {
  Tensor t = Tensor::empty(shape, dtype, Context::cpu(1));
  std::normal_distribution<double> dist(0.0, stddev);
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (double& x : v) x = dist(rng);
  from_f64(v.data(), t.data(), dtype, v.size());
  return t;
}
// t's elements in fp64, copied to the host on ctx's stream first when t is on a GPU.
std::vector<double> f64(const Context& ctx, const Tensor& t) {
  Tensor h = t;
  if (!t.device().is_cpu()) {
    h = Tensor::empty(t.shape(), t.dtype(), Context::cpu(1));
    copy(ctx, t, h);  // ends on the host: waits for ctx's stream
  }
  std::vector<double> v(static_cast<size_t>(h.numel()));
  to_f64(h.data(), h.dtype(), v.data(), v.size());
  return v;
}
Tensor rows_of(const Tensor& t, int64_t begin, int64_t end) {
  return t.rows(begin, end);
}

struct Results {  // one rank's (or the reference's) last step
  std::vector<double> y, dx, dgate, dw1, dw2;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

EpStepReport run_ep_step(const EpStepConfig& cfg, const std::string& preset) {
  const int N = cfg.ranks;
  const int64_t E = cfg.experts, H = cfg.hidden, F = cfg.ffn, T = cfg.tokens, k = cfg.topk;
  if (E % N != 0) {
    throw_invalid("--experts",
                  str("a multiple of --ep (", N, ") so that every rank owns E/N experts"),
                  std::to_string(E));
  }
  if (k > E) throw_invalid("--topk", str("at most --experts (", E, ")"), std::to_string(k));
  // With a recipe every expert's rows are padded to its multiple (as Fp8Padding).
  const int64_t A = cfg.recipe.enabled() ? cfg.recipe.group_rows_multiple() : 1;
  std::mt19937_64 rng(cfg.seed);
  const Tensor gate = random_tensor({E, H}, cfg.dtype, 1.0 / std::sqrt(double(H)), rng);
  const Tensor w1 = random_tensor({E, 2 * F, H}, cfg.dtype, 1.0 / std::sqrt(double(H)), rng);
  const Tensor w2 = random_tensor({E, H, F}, cfg.dtype, 1.0 / std::sqrt(double(F)), rng);
  const Tensor x = random_tensor({N * T, H}, cfg.dtype, 1.0, rng);  // rank r: rows [rT, (r+1)T)
  const Tensor dy = random_tensor({N * T, H}, cfg.dtype, 1.0, rng);

  // One layer on `ranks` ranks over rows [rT', (r+1)T') each (T' = N·T / ranks); steps times.
  struct PerStep {
    std::vector<MoEPhases> fwd, bwd;
    std::vector<double> total;
  };
  double staged_ms = 0, staged_bytes = 0;
  auto run_layer = [&](int ranks, int64_t steps, std::vector<PerStep>* timing, bool* zero_copy) {
    const int64_t L = E / ranks, Tr = N * T / ranks;
    std::vector<Results> res(static_cast<size_t>(ranks));
    if (timing) {
      timing->assign(static_cast<size_t>(steps), PerStep{});
      for (auto& st : *timing) {
        st.fwd.resize(static_cast<size_t>(ranks));
        st.bwd.resize(static_cast<size_t>(ranks));
        st.total.resize(static_cast<size_t>(ranks));
      }
    }
    std::mutex m;
    bool all_zero_copy = true;
    auto body = [&](Communicator& comm) {
      const int r = comm.rank();
      const Context& ctx = comm.context();
      MoELayer moe(comm, {.ep = {.experts_per_rank = L,
                                 .hidden = H,
                                 .dtype = cfg.dtype,
                                 .topk = k,
                                 .max_tokens = Tr,
                                 .receive_capacity = Tr * ranks * std::min(k, L) + L * (A - 1),
                                 .alignment = A},
                          .ffn = F,
                          .recipe = cfg.recipe,
                          .time_phases = cfg.cuda});  // on a GPU: each phase's device time
      copy(ctx, gate, moe.gate_weight());
      copy(ctx, w1.rows(r * L, (r + 1) * L), moe.experts().fc1()->linear().weight());
      copy(ctx, w2.rows(r * L, (r + 1) * L), moe.experts().fc2()->linear().weight());
      const Tensor xr = to_device(ctx, rows_of(x, r * Tr, (r + 1) * Tr));
      const Tensor dyr = to_device(ctx, rows_of(dy, r * Tr, (r + 1) * Tr));
      Tensor y;
      MoELayer::Grads g;
      bool zc = true;
      for (int64_t s = -1; s < steps; ++s) {  // step -1: warm-up
        const auto t0 = std::chrono::steady_clock::now();
        MoELayer::Saved saved;
        y = moe.forward(xr, &saved);
        g = moe.backward(saved, dyr);
        ctx.synchronize();  // the step's device work (a no-op on CPU ranks)
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        zc = zc && saved.expert_out.data() == moe.ep().combine_input().data() &&
             g.experts.input.data() == moe.ep().dispatch_backward_input().data();
        if (timing && s >= 0) {
          PerStep& st = (*timing)[static_cast<size_t>(s)];
          st.fwd[static_cast<size_t>(r)] = moe.last_forward();
          st.bwd[static_cast<size_t>(r)] = moe.last_backward();
          st.total[static_cast<size_t>(r)] = ms;
        }
      }
      if (timing) {
        // What the zero copy saves: the staged copy of an MLP output [R, H] into the combine's
        // buffer (and, in backward, of dx into the dispatch-backward's): timed here.
        const Tensor& buf = moe.ep().combine_input();
        Tensor staged = Tensor::empty(buf.shape(), buf.dtype(), ctx);
        std::vector<double> t;
        for (int i = 0; i < 3; ++i) {
          const auto c0 = std::chrono::steady_clock::now();
          copy(ctx, staged, buf);
          ctx.synchronize();
          t.push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0)
                  .count());
        }
        std::lock_guard lock(m);
        staged_ms = std::max(staged_ms, median(t));
        staged_bytes = static_cast<double>(buf.nbytes());
      }
      Results& out = res[static_cast<size_t>(r)];
      out = {f64(ctx, y), f64(ctx, g.input), f64(ctx, g.gate), f64(ctx, g.experts.fc1.weight),
             f64(ctx, g.experts.fc2.weight)};
      std::lock_guard lock(m);
      all_zero_copy = all_zero_copy && zc;
    };
    if (cfg.cuda) {
      std::vector<int> devices(static_cast<size_t>(ranks));
      for (int r = 0; r < ranks; ++r) devices[static_cast<size_t>(r)] = r;
      if (cfg.engine == "nccl-symmetric") {
        NcclRanks group(devices);
        group.run(body);
      } else {
        CudaRanks group(devices);
        group.run(body);
      }
    } else {
      CpuRanks group(ranks);
      group.run(body);
    }
    if (zero_copy) *zero_copy = all_zero_copy;
    return res;
  };

  EpStepReport rep;
  rep.preset = preset;
  rep.cfg = cfg;
  std::vector<PerStep> timing;
  const std::vector<Results> ep = run_layer(N, cfg.steps, &timing, &rep.zero_copy);
  rep.staged_copy_ms = staged_ms;
  rep.staged_copy_bytes = staged_bytes;
  auto slowest = [&](auto field) {
    std::vector<double> per_step;
    for (const PerStep& st : timing) {
      double m = 0;
      for (int r = 0; r < N; ++r) m = std::max(m, field(st, r));
      per_step.push_back(m);
    }
    return median(per_step);
  };
  const auto R = [](int r) { return static_cast<size_t>(r); };
  rep.fwd_router = slowest([&](const PerStep& s, int r) { return s.fwd[R(r)].router_ms; });
  rep.fwd_dispatch = slowest([&](const PerStep& s, int r) { return s.fwd[R(r)].dispatch_ms; });
  rep.fwd_mlp = slowest([&](const PerStep& s, int r) { return s.fwd[R(r)].mlp_ms; });
  rep.fwd_combine = slowest([&](const PerStep& s, int r) { return s.fwd[R(r)].combine_ms; });
  rep.bwd_combine = slowest([&](const PerStep& s, int r) { return s.bwd[R(r)].combine_ms; });
  rep.bwd_mlp = slowest([&](const PerStep& s, int r) { return s.bwd[R(r)].mlp_ms; });
  rep.bwd_dispatch = slowest([&](const PerStep& s, int r) { return s.bwd[R(r)].dispatch_ms; });
  rep.bwd_router = slowest([&](const PerStep& s, int r) { return s.bwd[R(r)].router_ms; });
  rep.step_ms = slowest([&](const PerStep& s, int r) { return s.total[R(r)]; });
  for (int r = 0; r < N; ++r) {
    const MoEPhases& f = timing.back().fwd[R(r)];
    rep.dispatch_remote += static_cast<double>(f.dispatch_traffic.remote_bytes) / N;
    rep.dispatch_local += static_cast<double>(f.dispatch_traffic.local_bytes) / N;
    rep.dispatch_per_slot += static_cast<double>(f.dispatch_traffic.per_slot_bytes) / N;
    rep.combine_remote += static_cast<double>(f.combine_traffic.remote_bytes) / N;
    rep.combine_local += static_cast<double>(f.combine_traffic.local_bytes) / N;
    rep.combine_per_slot += static_cast<double>(f.combine_traffic.per_slot_bytes) / N;
  }
  if (!cfg.check) return rep;

  // ---- the dense reference: one rank, every expert, every rank's tokens
  const std::vector<Results> ref = run_layer(1, 1, nullptr, nullptr);
  const Results& d = ref[0];
  rep.checked = true;
  rep.tolerance = std::max(4 * epsilon(cfg.dtype), 1e-5);
  rep.bit_identical = true;
  auto meter = [&](const char* what, const std::vector<double>& got,
                   const std::vector<double>& want) {
    double err = 0, mag = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      err = std::max(err, std::isfinite(got[i]) ? std::fabs(got[i] - want[i]) : INFINITY);
      mag = std::max(mag, std::fabs(want[i]));
      rep.bit_identical = rep.bit_identical && got[i] == want[i];
    }
    const double rel = mag > 0 ? err / mag : err;
    if (rel >= rep.max_error) {
      rep.max_error = rel;
      rep.worst = what;
    }
  };
  std::vector<double> y, dx, dgate(static_cast<size_t>(E * H), 0.0), dw1, dw2;
  for (int r = 0; r < N; ++r) {
    const Results& e = ep[R(r)];
    y.insert(y.end(), e.y.begin(), e.y.end());
    dx.insert(dx.end(), e.dx.begin(), e.dx.end());
    for (size_t i = 0; i < dgate.size(); ++i) dgate[i] += e.dgate[i];  // data-parallel all-reduce
    dw1.insert(dw1.end(), e.dw1.begin(), e.dw1.end());
    dw2.insert(dw2.end(), e.dw2.begin(), e.dw2.end());
  }
  meter("y", y, d.y);
  meter("dx", dx, d.dx);
  const bool exact_before_gate = rep.bit_identical;
  meter("dW1", dw1, d.dw1);
  meter("dW2", dw2, d.dw2);
  const bool exact_experts = rep.bit_identical;
  meter("dgate (sum over ranks)", dgate, d.dgate);
  rep.bit_identical = exact_before_gate && exact_experts;  // dgate is summed over ranks here
  rep.passed = rep.max_error <= rep.tolerance;
  return rep;
}

std::string EpStepReport::table() const {
  std::ostringstream o;
  char b[320];
  o << "moekit run --ep " << cfg.ranks << ": MoE layer (preset " << preset << ", " << cfg.experts
    << " experts, " << cfg.experts / cfg.ranks << " per rank, top-" << cfg.topk << ", "
    << name(cfg.dtype) << (cfg.recipe.enabled() ? str(", recipe ", cfg.recipe.name()) : "")
    << ") on " << cfg.ranks
    << (!cfg.cuda ? " CPU ranks (cpu-ranks engine, threads over shared memory)\n"
        : cfg.engine == "nccl-symmetric"
            ? " CUDA ranks (nccl-symmetric engine, one GPU per rank, stores into NCCL windows)\n"
            : " CUDA ranks (cuda-ranks engine, one GPU per rank, peer stores)\n");
  std::snprintf(b, sizeof b,
                "  shapes      x [%lld, %lld] per rank, fc1 [%lld, %lld, %lld], fc2 [%lld, %lld, "
                "%lld] per rank\n",
                static_cast<long long>(cfg.tokens), static_cast<long long>(cfg.hidden),
                static_cast<long long>(cfg.experts / cfg.ranks),
                static_cast<long long>(2 * cfg.ffn), static_cast<long long>(cfg.hidden),
                static_cast<long long>(cfg.experts / cfg.ranks), static_cast<long long>(cfg.hidden),
                static_cast<long long>(cfg.ffn));
  o << b;
  o << "  phase (ms, slowest rank, median; an EP phase includes waiting for the other ranks"
    << (cfg.cuda ? ";\n  each phase ends with a synchronisation on the GPU, so it is device time)\n"
                 : ")\n")
    << "                                       forward   backward\n";
  auto line = [&](const char* n, double f, double bw) {
    std::snprintf(b, sizeof b, "    %-32s %8.3f  %9.3f\n", n, f, bw);
    o << b;
  };
  line("router", fwd_router, bwd_router);
  line("dispatch (backward: dispatch_bwd)", fwd_dispatch, bwd_dispatch);
  line("grouped MLP", fwd_mlp, bwd_mlp);
  line("combine (backward: combine_bwd)", fwd_combine, bwd_combine);
  std::snprintf(b, sizeof b, "  step        %.3f ms forward + backward\n", step_ms);
  o << b;
  auto mb = [](double v) { return v / 1e6; };
  if (cfg.cuda) {
    o << "  bytes/rank  not measured on the GPU engine (ExpertParallel::last_traffic() is zeros "
         "there)\n";
  } else {
    std::snprintf(b, sizeof b,
                  "  bytes/rank  dispatch %.3f MB to other ranks + %.3f MB to self (a per-slot "
                  "all-to-all: %.3f MB to other ranks)\n",
                  mb(dispatch_remote), mb(dispatch_local), mb(dispatch_per_slot));
    o << b;
    std::snprintf(b, sizeof b,
                  "              combine  %.3f MB to other ranks + %.3f MB to self (a row in the "
                  "dtype or an fp32 sum per (token, rank); "
                  "per-slot: %.3f MB)\n",
                  mb(combine_remote), mb(combine_local), mb(combine_per_slot));
    o << b;
  }
  o << "  zero copy   MLP output is the combine's input, MLP grad_input the dispatch-backward's "
       "input: "
    << (zero_copy ? "yes" : "NO") << "\n";
  std::snprintf(
      b, sizeof b,
      "              saves 2 staged copies of [R, H] per step (%.3f MB each, %.3f ms each "
      "here, slowest rank)\n",
      staged_copy_bytes / 1e6, staged_copy_ms);
  o << b;
  if (checked) {
    std::snprintf(b, sizeof b,
                  "  check       vs one rank with every expert (dense): max error %.2e (%s; "
                  "tolerance %.2e)%s: %s\n",
                  max_error, worst.c_str(), tolerance,
                  bit_identical ? ", y dx dW bit-identical" : "", passed ? "PASS" : "FAIL");
    o << b;
  } else {
    o << "  check       skipped (--no-check)\n";
  }
  return o.str();
}

std::string EpStepReport::json() const {
  nlohmann::ordered_json j = {
      {"layer", "MoE"},
      {"preset", preset},
      {"engine", cfg.engine},
      {"ranks", cfg.ranks},
      {"experts", cfg.experts},
      {"topk", cfg.topk},
      {"tokens_per_rank", cfg.tokens},
      {"hidden", cfg.hidden},
      {"ffn", cfg.ffn},
      {"dtype", std::string(name(cfg.dtype))},
      {"recipe", std::string(cfg.recipe.name())},
      {"step_ms", step_ms},
      {"forward_ms",
       {{"router", fwd_router},
        {"dispatch", fwd_dispatch},
        {"mlp", fwd_mlp},
        {"combine", fwd_combine}}},
      {"backward_ms",
       {{"combine", bwd_combine},
        {"mlp", bwd_mlp},
        {"dispatch", bwd_dispatch},
        {"router", bwd_router}}},
      {"bytes_per_rank",
       {{"dispatch_remote", dispatch_remote},
        {"dispatch_local", dispatch_local},
        {"dispatch_per_slot", dispatch_per_slot},
        {"combine_remote", combine_remote},
        {"combine_local", combine_local},
        {"combine_per_slot", combine_per_slot}}},
      {"zero_copy", zero_copy},
      {"staged_copy", {{"bytes", staged_copy_bytes}, {"ms", staged_copy_ms}, {"per_step", 2}}},
  };
  if (checked) {
    j["check"] = {{"passed", passed},
                  {"max_error", max_error},
                  {"worst", worst},
                  {"tolerance", tolerance},
                  {"bit_identical", bit_identical}};
  }
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace moekit::tools
