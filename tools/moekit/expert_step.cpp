// `moekit run`'s workload: the grouped MLP of a rank's experts, as a Sequential
// fc1 [H → 2F] → ScaledSwiGLU → fc2 [F → H] (fused into GroupedMLP unless --no-fuse).
#include "expert_step.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

namespace moekit::tools {
namespace {

constexpr double kSentinel = 7.0;

// Host tensor of random normal values in `dtype`, plus its exact fp64 values.
struct HostData {
  Tensor t;
  std::vector<char> bytes;
  std::vector<double> f64;
};

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// fn(i) for i in [0, n) on all host threads (each i once, in no particular order).
template <class Fn>
void parallel_for(size_t n, const Fn& fn) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < n; i = next++) fn(i);
  };
  const size_t threads = std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), n);
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
}

// Random normal values in chunks of 2^20, each chunk from its own generator seeded from (one draw
// of `rng`, chunk index), on all host threads: the values depend on the seed only, never on the
// number of threads, and the dsv3 preset's ~800 M values take seconds instead of most of a
// minute on one thread (the GPU is idle meanwhile).
HostData random_host(const Shape& shape, DType dtype, double stddev, std::mt19937_64& rng) {
  HostData h;
  const size_t n = static_cast<size_t>(numel(shape)), elem = size_of(dtype);
  h.bytes.resize(n * elem);
  h.f64.resize(n);
  const uint64_t base = rng();
  constexpr size_t kChunk = size_t{1} << 20;
  parallel_for((n + kChunk - 1) / kChunk, [&](size_t c) {
    std::mt19937_64 chunk_rng(splitmix64(base + c));
    std::normal_distribution<double> dist(0.0, stddev);
    const size_t begin = c * kChunk, count = std::min(n, begin + kChunk) - begin;
    double* v = h.f64.data() + begin;
    for (size_t i = 0; i < count; ++i) v[i] = dist(chunk_rng);
    from_f64(v, h.bytes.data() + begin * elem, dtype, count);
    to_f64(h.bytes.data() + begin * elem, dtype, v, count);  // the values actually stored
  });
  h.t = Tensor::wrap(h.bytes.data(), shape, dtype, Device::cpu());
  return h;
}

std::vector<int64_t> route(int64_t tokens, int64_t experts, bool skewed, std::mt19937_64& rng) {
  std::vector<int64_t> counts(static_cast<size_t>(experts), tokens / experts);
  if (!skewed) {
    for (int64_t e = 0; e < tokens % experts; ++e) ++counts[static_cast<size_t>(e)];
    return counts;
  }
  // Dirichlet(1): normalised exponential draws; largest-remainder rounding keeps the total.
  std::exponential_distribution<double> exp1(1.0);
  std::vector<double> w(static_cast<size_t>(experts));
  double sum = 0;
  for (auto& x : w) sum += (x = exp1(rng));
  int64_t assigned = 0;
  std::vector<std::pair<double, size_t>> rem;
  for (size_t e = 0; e < w.size(); ++e) {
    const double share = w[e] / sum * static_cast<double>(tokens);
    counts[e] = static_cast<int64_t>(std::floor(share));
    assigned += counts[e];
    rem.push_back({share - std::floor(share), e});
  }
  std::sort(rem.rbegin(), rem.rend());
  for (int64_t i = 0; i < tokens - assigned; ++i) ++counts[rem[static_cast<size_t>(i)].second];
  return counts;
}

std::vector<double> download_f64(const Context& ctx, const Tensor& t) {
  std::vector<char> bytes(t.nbytes());
  copy(ctx, t, Tensor::wrap(bytes.data(), t.shape(), t.dtype(), Device::cpu()));
  std::vector<double> out(static_cast<size_t>(t.numel()));
  to_f64(bytes.data(), t.dtype(), out.data(), out.size());
  return out;
}

// Tracks max |out - ref| relative to max |ref| for one named quantity.
struct ErrorMeter {
  double max_abs_err = 0, max_abs_ref = 0;
  void add(double out, double ref) {
    max_abs_err = std::max(max_abs_err, std::isfinite(out) ? std::fabs(out - ref) : INFINITY);
    max_abs_ref = std::max(max_abs_ref, std::fabs(ref));
  }
  void merge(const ErrorMeter& o) {
    max_abs_err = std::max(max_abs_err, o.max_abs_err);
    max_abs_ref = std::max(max_abs_ref, o.max_abs_ref);
  }
  double relative() const { return max_abs_ref > 0 ? max_abs_err / max_abs_ref : max_abs_err; }
};

}  // namespace

struct ExpertStep::State {
  StepConfig cfg;
  Context ctx;
  std::vector<int64_t> counts, offsets;
  int64_t rows = 0;  // T + tail: rows of every activation buffer
  HostData x, w1, w2, dy;
  std::vector<float> probs;  // routing weight per row
  Tensor x_d, dy_d, probs_d, counts_d;
  Splits splits;
  std::shared_ptr<GroupedLinearOp> fc1, fc2;
  std::shared_ptr<ScaledSwiGLU> act;
  std::unique_ptr<Sequential> mlp;
  Tensor out_buf, dgrad_buf;  // caller-owned buffers [T + tail, H]
  Tensor y, dx, dprobs, dw1, dw2;  // last step's results

  State(const StepConfig& c, const Context& cx) : cfg(c), ctx(cx) {
    fc1 = std::make_shared<GroupedLinearOp>(
        GroupedLinearConfig{.groups = c.experts, .in = c.hidden, .out = 2 * c.ffn, .dtype = c.dtype,
                            .recipe = c.recipe},
        cx);
    act = std::make_shared<ScaledSwiGLU>(SwiGLUConfig{.layout = c.glu}, cx);
    fc2 = std::make_shared<GroupedLinearOp>(
        GroupedLinearConfig{.groups = c.experts, .in = c.ffn, .out = c.hidden, .dtype = c.dtype,
                            .recipe = c.recipe},
        cx);
    mlp = std::make_unique<Sequential>(std::vector<OpHandle>{fc1, act, fc2},
                                       SequentialOptions{.fuse = c.fuse});
  }
};

ExpertStep::ExpertStep(const StepConfig& cfg, const Context& ctx)
    : s_(std::make_unique<State>(cfg, ctx)) {
  State& s = *s_;
  std::mt19937_64 rng(cfg.seed);
  s.counts = route(cfg.tokens, cfg.experts, cfg.skewed, rng);
  if (cfg.recipe.enabled()) {  // pad every expert's rows to the recipe's multiple (Fp8Padding)
    const int64_t m = cfg.recipe.group_rows_multiple();
    for (int64_t& c : s.counts) c = (c + m - 1) / m * m;
    s.cfg.tokens = 0;
    for (int64_t c : s.counts) s.cfg.tokens += c;
  }
  s.offsets = offsets_of(s.counts);
  s.rows = s.cfg.tokens + cfg.tail;
  const int64_t H = cfg.hidden, F = cfg.ffn, E = cfg.experts;
  // Weights scaled like a trained layer's (std 1/sqrt(fan_in)) so activations stay O(1).
  s.x = random_host({s.rows, H}, cfg.dtype, 1.0, rng);
  s.w1 = random_host({E, 2 * F, H}, cfg.dtype, 1.0 / std::sqrt(double(H)), rng);
  s.w2 = random_host({E, H, F}, cfg.dtype, 1.0 / std::sqrt(double(F)), rng);
  s.dy = random_host({s.rows, H}, cfg.dtype, 1.0, rng);
  std::uniform_real_distribution<float> unit(0.05f, 1.0f);
  s.probs.resize(static_cast<size_t>(s.rows));
  for (auto& p : s.probs) p = unit(rng);
  copy(ctx, s.w1.t, s.fc1->linear().weight());
  copy(ctx, s.w2.t, s.fc2->linear().weight());
  s.x_d = to_device(ctx, s.x.t);
  s.dy_d = to_device(ctx, s.dy.t);
  s.probs_d = to_device(ctx, Tensor::wrap(s.probs.data(), {s.rows}, DType::F32, Device::cpu()));
  // Device counts: the form an expert-parallel dispatch produces (no host round trip needed).
  std::vector<int64_t> c64 = s.counts;
  s.counts_d = to_device(ctx, Tensor::wrap(c64.data(), {E}, DType::I64, Device::cpu()));
  s.splits = cfg.host_splits ? Splits::host(s.counts) : Splits::device(s.counts_d);
  s.out_buf = Tensor::empty({s.rows, H}, cfg.dtype, ctx);
  s.dgrad_buf = Tensor::empty({s.rows, H}, cfg.dtype, ctx);
  fill(ctx, s.out_buf, kSentinel);
  fill(ctx, s.dgrad_buf, kSentinel);
}

ExpertStep::~ExpertStep() = default;

void ExpertStep::run_once() {
  State& s = *s_;
  OpArgs args;
  if (s.cfg.caller_buffers) {
    args[s.fc2].output = s.out_buf;        // by handle: the combine's input buffer
    args[s.fc1].grad_input = s.dgrad_buf;  // the dispatch-backward's input buffer
  }
  auto [y, tape] = s.mlp->forward(s.x_d, {.splits = s.splits, .probs = s.probs_d}, args);
  SequentialGrads g = s.mlp->backward(tape, s.dy_d);
  s.y = y;
  s.dx = g.input;
  s.dprobs = g.probs;
  s.dw1 = g.params[0].weight;
  s.dw2 = g.params[2].weight;
}

CheckResult ExpertStep::check() const {
  const State& s = *s_;
  const int64_t H = s.cfg.hidden, F = s.cfg.ffn;
  const int64_t S = s.offsets.back();
  CheckResult r;
  std::mt19937_64 rng(s.cfg.seed + 1000);

  // Sampled rows: the first and last row of every non-empty expert, plus random rows.
  std::vector<int64_t> rows_to_check;
  for (size_t g = 0; g < s.counts.size(); ++g) {
    if (s.counts[g] == 0) continue;
    rows_to_check.push_back(s.offsets[g]);
    rows_to_check.push_back(s.offsets[g + 1] - 1);
  }
  for (int i = 0; i < 16 && S > 0; ++i) rows_to_check.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(S)));
  std::sort(rows_to_check.begin(), rows_to_check.end());
  rows_to_check.erase(std::unique(rows_to_check.begin(), rows_to_check.end()), rows_to_check.end());
  if (rows_to_check.size() > 64) {
    std::shuffle(rows_to_check.begin(), rows_to_check.end(), rng);
    rows_to_check.resize(64);
  }
  auto group_of = [&](int64_t row) {
    return static_cast<size_t>(std::upper_bound(s.offsets.begin(), s.offsets.end(), row) - s.offsets.begin() - 1);
  };
  auto dot = [](const double* a, const double* b, int64_t n, int64_t stride_b = 1) {
    double acc = 0;
    for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i * stride_b];
    return acc;
  };
  const double* x = s.x.f64.data();
  const double* w1 = s.w1.f64.data();
  const double* w2 = s.w2.f64.data();
  const double* dy = s.dy.f64.data();

  // fp64 reference of one row r of group g (SPEC §5; a_f, b_f at the columns of the GLU layout).
  const GluLayout glu = s.cfg.glu;
  auto gate = [&](int64_t f) { return glu_gate_column(f, F, glu); };
  auto lin = [&](int64_t f) { return glu_linear_column(f, F, glu); };
  auto silu = [](double a) { return a / (1.0 + std::exp(-a)); };
  auto dsilu = [](double a) {
    const double sg = 1.0 / (1.0 + std::exp(-a));
    return sg * (1.0 + a * (1.0 - sg));
  };
  auto h_at = [&](int64_t r, size_t g, int64_t j) {  // h[r, j] = x_r · W1_g[j]
    return dot(x + r * H, w1 + g * static_cast<size_t>(2 * F * H) + j * H, H);
  };
  auto dz_at = [&](int64_t r, size_t g, int64_t f) {  // dz[r, f] = dy_r · W2_g[:, f]
    return dot(dy + r * H, w2 + g * static_cast<size_t>(H * F) + f, H, F);
  };

  ErrorMeter y_err, dx_err, dp_err, dw1_err, dw2_err;
  const std::vector<double> y = download_f64(s.ctx, s.y);
  const std::vector<double> dx = download_f64(s.ctx, s.dx);
  const std::vector<double> dp = download_f64(s.ctx, s.dprobs);
  // Rows in parallel (each row's meters, merged after: max is order-free, so the result is too).
  struct RowMeters {
    ErrorMeter y, dx, dp;
  };
  std::vector<RowMeters> row_meters(rows_to_check.size());
  parallel_for(rows_to_check.size(), [&](size_t ri) {
    const int64_t row = rows_to_check[ri];
    RowMeters& m = row_meters[ri];
    std::vector<double> a(static_cast<size_t>(F)), b(static_cast<size_t>(F)),
        z(static_cast<size_t>(F)), dh(static_cast<size_t>(2 * F));
    const size_t g = group_of(row);
    const double p = s.probs[static_cast<size_t>(row)];
    const double* w1g = w1 + g * static_cast<size_t>(2 * F * H);
    const double* w2g = w2 + g * static_cast<size_t>(H * F);
    double dp_ref = 0;
    for (int64_t f = 0; f < F; ++f) {
      const size_t i = static_cast<size_t>(f);
      a[i] = h_at(row, g, gate(f));
      b[i] = h_at(row, g, lin(f));
      z[i] = p * silu(a[i]) * b[i];
      const double dz = dz_at(row, g, f);
      dp_ref += dz * silu(a[i]) * b[i];
      dh[static_cast<size_t>(gate(f))] = p * dz * b[i] * dsilu(a[i]);
      dh[static_cast<size_t>(lin(f))] = p * dz * silu(a[i]);
    }
    for (int64_t n = 0; n < H; ++n) m.y.add(y[static_cast<size_t>(row * H + n)], dot(z.data(), w2g + n * F, F));
    for (int64_t k = 0; k < H; ++k) m.dx.add(dx[static_cast<size_t>(row * H + k)], dot(dh.data(), w1g + k, 2 * F, H));
    m.dp.add(dp[static_cast<size_t>(row)], dp_ref);
  });
  for (const RowMeters& m : row_meters) {
    y_err.merge(m.y);
    dx_err.merge(m.dx);
    dp_err.merge(m.dp);
  }
  // Sampled weight-gradient entries: dW2_g[n, f] = Σ_r dy[r, n]·z[r, f]; dW1_g[j, k] = Σ_r dh[r, j]·x[r, k].
  // The references in parallel (a sum over the group's rows each), the device values after.
  struct Entry {
    size_t g;
    int64_t n, f, j, k;
    double ref2 = 0, ref1 = 0;
  };
  std::vector<Entry> entries;
  for (int i = 0; i < 8; ++i) {
    Entry en;
    en.g = static_cast<size_t>(rng() % s.counts.size());
    en.n = static_cast<int64_t>(rng() % static_cast<uint64_t>(H));
    en.f = static_cast<int64_t>(rng() % static_cast<uint64_t>(F));
    en.j = static_cast<int64_t>(rng() % static_cast<uint64_t>(2 * F));
    en.k = static_cast<int64_t>(rng() % static_cast<uint64_t>(H));
    entries.push_back(en);
  }
  parallel_for(entries.size(), [&](size_t ei) {
    Entry& en = entries[ei];
    const size_t g = en.g;
    const int64_t n = en.n, f = en.f, j = en.j, k = en.k;
    // The pair f that column j of h belongs to, and whether j is its gate column.
    const bool j_gate = glu == GluLayout::Halves ? j < F : j % 64 < 32;
    const int64_t jf = glu == GluLayout::Halves ? j % F : 32 * (j / 64) + j % 32;
    double ref2 = 0, ref1 = 0;
    for (int64_t r = s.offsets[g]; r < s.offsets[g + 1]; ++r) {
      const double p = s.probs[static_cast<size_t>(r)];
      ref2 += dy[r * H + n] * p * silu(h_at(r, g, gate(f))) * h_at(r, g, lin(f));
      const double av = h_at(r, g, gate(jf)), bv = h_at(r, g, lin(jf)), dz = dz_at(r, g, jf);
      const double dhj = j_gate ? p * dz * bv * dsilu(av) : p * dz * silu(av);
      ref1 += dhj * x[r * H + k];
    }
    en.ref2 = ref2;
    en.ref1 = ref1;
  });
  for (const Entry& en : entries) {
    const auto g = static_cast<int64_t>(en.g);
    dw2_err.add(download_f64(s.ctx, s.dw2.index(g).rows(en.n, en.n + 1))[static_cast<size_t>(en.f)], en.ref2);
    dw1_err.add(download_f64(s.ctx, s.dw1.index(g).rows(en.j, en.j + 1))[static_cast<size_t>(en.k)], en.ref1);
  }
  r.rows_checked = static_cast<int>(rows_to_check.size());
  r.grad_entries_checked = 16;

  // Caller buffers' capacity tails must still hold the sentinel (internally allocated outputs
  // and dprobs have unspecified tails: SPEC §3).
  r.tails_intact = true;
  for (const std::vector<double>* buf : {&y, &dx}) {
    if (!s.cfg.caller_buffers) break;
    for (size_t i = static_cast<size_t>(S * H); i < buf->size(); ++i) r.tails_intact &= (*buf)[i] == kSentinel;
  }
  // Tolerance: a few units of the storage dtype's rounding (inputs, the stored intermediate and
  // the output are each rounded once) plus fp32 accumulation over K ≤ 8192.
  r.tolerance = 4 * epsilon(s.cfg.dtype) + 2e-5;
  // A recipe is checked against the same unquantized fp64 reference, within what its formats'
  // rounding leaves after two GEMMs and the SwiGLU (max over the sampled entries relative to the
  // largest reference value; tiny preset, 256 tokens, seeds 1-5: fp8 recipes 0.08-0.17, nvfp4
  // 0.34-0.47). A smoke check (a wrong group or operand is O(1)); the exact checks of each recipe
  // are tests/test_quant_ops.cpp's.
  if (s.cfg.recipe.enabled()) r.tolerance = s.cfg.recipe.kind == RecipeKind::Nvfp4 ? 0.75 : 0.25;
  const std::pair<const char*, const ErrorMeter*> meters[] = {
      {"y", &y_err}, {"dx", &dx_err}, {"dprobs", &dp_err}, {"dW1", &dw1_err}, {"dW2", &dw2_err}};
  for (auto [name, m] : meters) {
    if (m->relative() >= r.max_error) {
      r.max_error = m->relative();
      r.worst = name;
    }
  }
  r.passed = r.max_error <= r.tolerance && r.tails_intact;
  return r;
}

StepReport ExpertStep::report(double step_ms, const std::string& preset, const std::string& routing,
                              const CheckResult& check, bool checked) const {
  const State& s = *s_;
  StepReport r;
  r.layer = str("grouped MLP fc1 -> ScaledSwiGLU -> fc2, Sequential plan ", s.mlp->plan(),
                ", GLU layout ", name(s.cfg.glu));
  r.preset = preset;
  r.routing = routing;
  r.device = s.ctx.device().to_string();
  r.dtype = std::string(name(s.cfg.dtype));
  r.recipe = std::string(s.cfg.recipe.name());
  const int64_t H = s.cfg.hidden, F = s.cfg.ffn, E = s.cfg.experts;
  r.shapes = str("x [", s.rows, ", ", H, "] -> fc1 W1 [", E, ", ", 2 * F, ", ", H,
                 "] -> SwiGLU*probs -> fc2 W2 [", E, ", ", H, ", ", F, "] -> y [", s.rows, ", ", H, "]");
  r.splits_kind = s.cfg.host_splits ? std::string("host counts (std::vector, --host-splits)")
                                     : str("device counts (i64 tensor on ", r.device, ")");
  r.host_splits = s.cfg.host_splits;
  r.caller_buffers = s.cfg.caller_buffers;
  r.experts = E;
  r.hidden = H;
  r.ffn = F;
  r.fused = s.mlp->fused();
  r.glu = std::string(name(s.cfg.glu));
  r.counts = s.counts;
  r.tokens = s.cfg.tokens;
  r.tail = s.cfg.tail;
  r.min_rows = *std::min_element(s.counts.begin(), s.counts.end());
  r.max_rows = *std::max_element(s.counts.begin(), s.counts.end());
  r.empty_experts = std::count(s.counts.begin(), s.counts.end(), 0);
  r.step_ms = step_ms;
  // Forward: fc1 2·S·H·2F + fc2 2·S·F·H = 6·S·H·F; backward: dgrad + wgrad, twice the forward.
  r.gflop = 3.0 * 6.0 * double(s.cfg.tokens) * double(H) * double(F) / 1e9;
  r.output_aliased = s.y.data() == s.out_buf.data() && s.y.shape() == s.out_buf.shape();
  r.grad_input_aliased = s.dx.data() == s.dgrad_buf.data() && s.dx.shape() == s.dgrad_buf.shape();
  r.checked = checked;
  r.check = check;
  return r;
}

std::string StepReport::table() const {
  std::ostringstream o;
  char buf[256];
  o << "moekit run: " << layer << " (preset " << preset << ", " << experts << " experts, " << dtype
    << ", " << device << ")\n";
  o << "  shapes      " << shapes << "\n";
  o << "  routing     " << routing << ": " << tokens << " rows routed (" << min_rows << " to "
    << max_rows << " per expert, " << empty_experts << " experts empty), capacity tail " << tail
    << " rows\n";
  o << "  splits      " << splits_kind << "\n";
  if (recipe != "none") {
    o << "  recipe      " << recipe << " (SPEC §6: its GEMM path per device in §6d; rows per expert padded to "
      << "its multiple)\n";
  }
  std::snprintf(buf, sizeof buf,
                "  step        %.3f ms forward + backward (median; host enqueue %.3f ms)\n",
                step_ms, enqueue_ms);
  o << buf;
  const double rate = gflop / (step_ms / 1e3);  // GFLOP/s
  std::snprintf(buf, sizeof buf, "  throughput  %.1f %s (%.2f GFLOP per step)\n",
                rate >= 1e3 ? rate / 1e3 : rate, rate >= 1e3 ? "TFLOP/s" : "GFLOP/s", gflop);
  o << buf;
  if (caller_buffers) {
    o << "  buffers     output aliased: " << (output_aliased ? "yes" : "NO")
      << ", grad_input aliased: " << (grad_input_aliased ? "yes" : "NO");
    if (checked) o << ", tails intact: " << (check.tails_intact ? "yes" : "NO");
  } else {
    o << "  buffers     y and dx allocated by the ops (--internal-buffers)";
  }
  o << "\n";
  if (checked) {
    std::snprintf(buf, sizeof buf,
                  "  check       max error %.2e (%s; tolerance %.2e) on %d rows + %d "
                  "weight-gradient entries vs fp64: %s\n",
                  check.max_error, check.worst.c_str(), check.tolerance, check.rows_checked,
                  check.grad_entries_checked, check.passed ? "PASS" : "FAIL");
    o << buf;
  } else {
    o << "  check       skipped (--no-check)\n";
  }
  return o.str();
}

// One JSON object on one line (bench/mlp_peer.py and tools/mlp-bench read the last line of
// stdout), keys in this order.
std::string StepReport::json() const {
  nlohmann::ordered_json j = {
      {"layer", layer},
      {"preset", preset},
      {"device", device},
      {"dtype", dtype},
      {"recipe", recipe},
      {"experts", experts},
      {"tokens", tokens},
      {"tail", tail},
      {"routing", routing},
      {"min_rows", min_rows},
      {"max_rows", max_rows},
      {"empty_experts", empty_experts},
      {"step_ms", step_ms},
      {"enqueue_ms", enqueue_ms},
      {"gflop_per_step", gflop},
      {"gflops", gflop / (step_ms / 1e3)},
      {"output_aliased", output_aliased},
      {"grad_input_aliased", grad_input_aliased},
      {"hidden", hidden},
      {"ffn", ffn},
      {"fused", fused},
      {"glu", glu},
      {"host_splits", host_splits},
      {"caller_buffers", caller_buffers},
      {"counts", counts},
  };
  if (checked) {
    j["check"] = {
        {"passed", check.passed},
        {"max_error", check.max_error},
        {"worst", check.worst},
        {"tolerance", check.tolerance},
        {"rows", check.rows_checked},
        {"grad_entries", check.grad_entries_checked},
        {"tails_intact", check.tails_intact},
    };
  }
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace moekit::tools
