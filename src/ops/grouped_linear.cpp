// GroupedLinear: validation of the op's contract (SPEC §2–§3), then primitives. No backend code.
#include "moekit/ops/grouped_linear.h"

#include <mutex>

#include "core/side_stream.h"
#include "core/checks.h"
#include "moekit/core/error.h"
#include "moekit/primitives/grouped_gemm.h"
#include "primitives/bind.h"

namespace moekit {

// The quantized weight of one weight version (recipes): made by a forward's run, reused by the
// forwards after it until the version changes.
struct GroupedLinear::WeightCache {
  std::mutex mutex;
  uint64_t version = 0;         // bumped by every change of the weight
  uint64_t cached_version = ~0ull;
  QuantizedTensor weight;       // the copies of cached_version
  const void* source = nullptr;  // the weight storage they were made from (copies of a layer
                                 // share the cache but may hold other weights)
  int64_t quantizations = 0;
};

namespace {

// The recipe's alignment rules (SPEC §6c), on host metadata, before any work.
void check_recipe_dims(const GroupedLinearConfig& c) {
  const Recipe& r = c.recipe;
  if (!r.enabled()) return;
  const int64_t d = r.dim_multiple();
  const std::string why = str("recipe ", r.name(), ": the FP8/FP4 GEMMs read 16-byte rows of the "
                              "quantized copies");
  if (c.in % d != 0) throw_invalid("in", str("in_features a multiple of ", d, " (", why, ")"), std::to_string(c.in));
  if (c.out % d != 0) throw_invalid("out", str("out_features a multiple of ", d, " (", why, ")"), std::to_string(c.out));
}

void check_recipe_shapes(const GroupedLinearConfig& c, const Context& ctx, const Splits& splits) {
  const Recipe& r = c.recipe;
  const int64_t rows = r.group_rows_multiple();
  if (!splits.on_host() && !splits.device_counts().device().is_cpu()) return;  // GPU: refused below
  const std::vector<int64_t> counts = read_counts(ctx, splits);
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] % rows != 0) {
      throw_invalid("splits",
                    str("rows per group a multiple of ", rows, " (recipe ", r.name(),
                        ": each group of the transposed copies the weight gradient reads starts "
                        "on a 16-byte boundary; pad the groups, as TE's Fp8Padding)"),
                    str(counts[g], " rows in group ", g));
    }
  }
}

}  // namespace

GroupedLinear::GroupedLinear(const GroupedLinearConfig& config, const Context& ctx)
    : config_(config), ctx_(ctx), cache_(std::make_shared<WeightCache>()) {
  config.recipe.validate();
  check_recipe_dims(config);
  if (config.groups <= 0) throw_invalid("groups", "a positive group count", std::to_string(config.groups));
  if (config.in <= 0) throw_invalid("in", "a positive in_features", std::to_string(config.in));
  if (config.out <= 0) throw_invalid("out", "a positive out_features", std::to_string(config.out));
  if (!is_compute_dtype(config.dtype)) {
    throw_invalid("dtype", "f32, f16 or bf16 (fp8 needs a quantized recipe)", name(config.dtype));
  }
  weight_ = Tensor::empty({config.groups, config.out, config.in}, config.dtype, ctx);
  if (config.bias) bias_ = Tensor::empty({config.groups, config.out}, config.dtype, ctx);
}

Tensor GroupedLinear::weight(int64_t g) const { return weight_.index(g); }

void GroupedLinear::set_weight(const Tensor& weight) {
  check_input("weight", weight, {config_.groups, config_.out, config_.in}, config_.dtype,
              ctx_.device());
  weight_ = weight;
  notify_weight_changed();
}

void GroupedLinear::notify_weight_changed() {
  std::lock_guard lock(cache_->mutex);
  ++cache_->version;
}

uint64_t GroupedLinear::weight_version() const {
  std::lock_guard lock(cache_->mutex);
  return cache_->version;
}

int64_t GroupedLinear::weight_quantizations() const {
  std::lock_guard lock(cache_->mutex);
  return cache_->quantizations;
}

void GroupedLinear::set_bias(const Tensor& bias) {
  if (!config_.bias) throw_invalid("bias", "no bias (the layer was configured with bias = false)", bias.describe());
  check_input("bias", bias, {config_.groups, config_.out}, config_.dtype, ctx_.device());
  bias_ = bias;
}

void GroupedLinear::set_main_grad(const Tensor& main_grad) {
  if (main_grad.defined()) {
    check_input("main_grad", main_grad, {config_.groups, config_.out, config_.in}, DType::F32,
                ctx_.device());
  }
  main_grad_ = main_grad;
}

void GroupedLinear::check_recipe_rows(const Splits& splits) const {
  check_recipe_shapes(config_, ctx_, splits);
}

QuantizedTensor GroupedLinear::bind_quantized_weight(detail::Plan& plan, QuantUsage usage) const {
  const QuantSpec spec = config_.recipe.spec(QuantRole::Weight);
  uint64_t version = 0;
  {
    std::lock_guard lock(cache_->mutex);
    version = cache_->version;
    const QuantizedTensor& c = cache_->weight;
    if (cache_->cached_version == version && cache_->source == weight_.data() && c.defined() &&
        (!has(usage, QuantUsage::Columnwise) || c.has_columnwise())) {
      return c;
    }
  }
  const int64_t G = config_.groups, N = config_.out, K = config_.in;
  QuantizedTensor qw = allocate_quantized(ctx_, spec, config_.dtype, G * N, K, G, usage);
  const Splits w_splits = Splits::host(std::vector<int64_t>(static_cast<size_t>(G), N));
  plan.then(detail::bind_quantize(ctx_, weight_.view({G * N, K}), w_splits, qw));
  plan.add([cache = cache_, qw, version, source = weight_.data()] {  // the copies exist now
    std::lock_guard lock(cache->mutex);
    ++cache->quantizations;
    if (cache->version == version) {
      cache->weight = qw;
      cache->cached_version = version;
      cache->source = source;
    }
  });
  return qw;
}

BoundForward GroupedLinear::bind_forward(const Tensor& x, const Splits& given_splits,
                                         const ForwardOptions& options, Saved* saved) const {
  const Device dev = ctx_.device();
  check_input("input", x, {-1, config_.in}, config_.dtype, dev);
  const int64_t T = x.size(0);
  validate_splits(given_splits, config_.groups, T, dev);
  Tensor y;
  if (options.output.defined()) {
    check_caller_buffer("output", options.output, {T, config_.out}, config_.dtype, dev,
                        {{"input", x}, {"weight", weight_}, {"bias", bias_},
                         {"splits", given_splits.device_counts()}, {"main_grad", main_grad_}});
    y = options.output;
  } else {
    y = Tensor::empty({T, config_.out}, config_.dtype, ctx_);
  }
  const Splits splits = resolve_splits(ctx_, given_splits);  // the backward reuses it (saved)
  detail::Plan plan;
  QuantizedTensor qx, qw;
  if (config_.recipe.enabled()) {
    // x rowwise for this GEMM, columnwise for the weight gradient; W rowwise here, columnwise
    // for the input gradient: only the copies a backward will read are made.
    check_recipe_rows(given_splits);
    const bool train = saved != nullptr;
    const QuantUsage x_usage = usage_for(true, train && weight_requires_grad_);
    const QuantUsage w_usage = usage_for(true, train && options.input_requires_grad);
    qx = allocate_quantized(ctx_, config_.recipe.spec(QuantRole::Input), x.dtype(), T, config_.in,
                            config_.groups, x_usage);
    plan.then(detail::bind_quantize(ctx_, x, splits, qx));
    qw = bind_quantized_weight(plan, w_usage);
    plan.then(detail::bind_group_m_quantized(ctx_, qx, qw, BOp::Transposed, splits, y, bias_));
  } else {
    plan = detail::bind_group_m(ctx_, x, weight_, BOp::Transposed, splits, y, bias_);
  }
  if (saved) {
    Saved s;
    s.input = x;
    s.splits = splits;
    s.input_requires_grad = options.input_requires_grad;
    s.valid = true;
    s.quantized_input = qx;
    s.quantized_weight = qw;
    s.used = std::make_shared<bool>(false);
    *saved = std::move(s);
  }
  return {y, [plan = std::move(plan)] { plan.run(); }};
}

Tensor GroupedLinear::forward(const Tensor& x, const Splits& splits,
                              const ForwardOptions& options, Saved* saved) const {
  Saved s;
  BoundForward bound = bind_forward(x, splits, options, saved ? &s : nullptr);
  bound.run();
  if (saved) *saved = std::move(s);
  return bound.output;
}

namespace {
// What a bound backward of GroupedLinear runs: its side stream and the calls bound on it.
struct LinearBackwardWork {
  std::unique_ptr<detail::SideStream> side;
  detail::Plan quantize, dw, dx, db;  // quantize: dy's copies (recipes), before dx and dW
  bool defer = false;
  std::vector<Tensor> held;  // what deferred side work reads and writes
  BackwardOnce used;
};
}  // namespace

BoundBackward GroupedLinear::bind_backward(const Saved& saved, const Tensor& dy,
                                           const BackwardOptions& options) const {
  if (!saved.valid) throw_invalid("saved", "the context filled by forward(..., &saved)", "an empty context");
  check_backward_once(saved.used);
  const Device dev = ctx_.device();
  const int64_t T = saved.input.size(0);
  check_input("grad_output", dy, {T, config_.out}, config_.dtype, dev);
  check_sm_margin("deferred_sm_margin", options.deferred_sm_margin, ctx_);
  const bool need_dx = saved.input_requires_grad;
  const bool need_dw = weight_requires_grad_;
  if (options.grad_input.defined()) {
    check_buffer_written("grad_input", options.grad_input, need_dx, "the input does not require grad");
    check_caller_buffer("grad_input", options.grad_input, {T, config_.in}, config_.dtype, dev,
                        {{"grad_output", dy}, {"weight", weight_}, {"input", saved.input},
                         {"splits", saved.splits.device_counts()}, {"main_grad", main_grad_}});
  }
  if (main_grad_.defined() && need_dw) {
    // main_grad is written too: it may not alias what the call reads.
    check_caller_buffer("main_grad", main_grad_, {config_.groups, config_.out, config_.in},
                        DType::F32, dev,
                        {{"grad_output", dy}, {"weight", weight_}, {"input", saved.input},
                         {"splits", saved.splits.device_counts()}});
  }

  // Every output on this context's stream first; the weight gradient is bound on the side
  // stream's context (core/side_stream.h), beside the input gradient when there is one.
  BoundBackward bound;
  ParamGrads params;
  if (need_dx) {
    bound.input = options.grad_input.defined() ? options.grad_input
                                               : Tensor::empty({T, config_.in}, config_.dtype, ctx_);
  }
  if (need_dw) {
    params.weight = main_grad_.defined() ? main_grad_ : Tensor::empty(weight_.shape(), config_.dtype, ctx_);
    if (bias_.defined()) params.bias = Tensor::empty(bias_.shape(), config_.dtype, ctx_);
  }
  const Splits splits = resolve_splits(ctx_, saved.splits);  // one copy for dx, dW and db
  auto work = std::make_shared<LinearBackwardWork>();
  work->side = std::make_unique<detail::SideStream>(ctx_, need_dx && need_dw);
  work->defer = options.defer_weight_grads;
  const bool quantized = config_.recipe.enabled();
  QuantizedTensor qdy;
  if (quantized) {
    // dy rowwise for dx, columnwise for dW, quantized before either GEMM runs.
    const QuantUsage usage = usage_for(need_dx, need_dw);
    if (need_dx || need_dw) {
      qdy = allocate_quantized(ctx_, config_.recipe.spec(QuantRole::GradOutput), dy.dtype(), T,
                               config_.out, config_.groups, usage);
      // The bias gradient from the quantize's read of dy (bind_quantize's db).
      work->quantize = detail::bind_quantize(ctx_, dy, splits, qdy, params.bias);
    }
  }
  if (need_dw) {
    const Context& side = work->side->context();
    const Context& dw_ctx = work->defer ? detail::deferred_context(side, options.deferred_sm_margin) : side;
    work->dw = quantized ? detail::bind_group_k_quantized(dw_ctx, qdy, saved.quantized_input, splits,
                                                          params.weight, main_grad_.defined())
                         : detail::bind_group_k(dw_ctx, dy, saved.input, splits, params.weight,
                                                /*accumulate=*/main_grad_.defined());
  }
  if (need_dx) {
    work->dx = quantized ? detail::bind_group_m_quantized(ctx_, qdy, saved.quantized_weight,
                                                          BOp::Plain, splits, bound.input)
                         : detail::bind_group_m(ctx_, dy, weight_, BOp::Plain, splits, bound.input);
  }
  if (params.bias.defined() && !quantized) {  // quantized: dy's quantize computes it (above)
    work->db = detail::bind_bias_grad(ctx_, dy, splits, params.bias, false);
  }
  work->held = {dy, saved.input, splits.device_counts(), splits.device_copy(), params.weight};
  for (const QuantizedTensor* q : {static_cast<const QuantizedTensor*>(&qdy), &saved.quantized_input}) {  // what a quantized dW reads
    if (q->has_columnwise()) work->held.insert(work->held.end(), {q->columnwise, q->columnwise_scale_inv, q->group_scale_inv});
  }
  if (!options.retain_saved) work->used = saved.used;
  bound.params = {params};
  // Joined (default): dW forked first, so its CTAs start with dx's and fill the SMs dx's last
  // wave leaves. Deferred: dx (and db) first at full width, dW after it, joined by the caller.
  bound.run = [work](PendingWork& pending) {
    if (work->used) *work->used = true;
    work->quantize.run();
    auto weight_grad = [&] {
      if (work->dw.empty()) return;
      work->side->fork();
      work->dw.run();
    };
    if (!work->defer) weight_grad();
    work->dx.run();
    work->db.run();
    if (work->defer) {
      weight_grad();
      detail::defer(pending, std::move(work->side), std::move(work->held));
    } else {
      work->side->join();
    }
  };
  return bound;
}

GroupedLinear::Grads GroupedLinear::backward(const Saved& saved, const Tensor& dy,
                                             const BackwardOptions& options) const {
  BoundBackward bound = bind_backward(saved, dy, options);
  Grads grads{bound.input, bound.params[0].weight, bound.params[0].bias, {}};
  bound.run(grads.weight_grads);
  return grads;
}

}  // namespace moekit
