// Sequential: op_args routing, whole-call validation, the fuser, and the tape (SPEC §4).
#include "moekit/ops/sequential.h"

#include <array>
#include <mutex>

#include "core/checks.h"
#include "moekit/core/error.h"

namespace moekit {

struct Tape::Record {
  std::vector<OpHandle> ops;                         // the Sequential's ops (identity check)
  std::vector<Sequential::Stage> stages;             // the plan that ran
  std::vector<std::unique_ptr<OpContext>> contexts;  // one per stage
  std::vector<Tensor> grad_inputs;                   // per position: bound at forward
  std::vector<std::string> grad_input_names;         // their keys and ops, for errors
  Tensor probs;                                      // the routing probs of the call
  bool input_requires_grad = false;
  std::shared_ptr<bool> used = std::make_shared<bool>(false);  // one backward per tape
};

// ---------------------------------------------------------------- the fusion registry
namespace {
struct Registered {
  std::string name;
  FusionMatcher match;
};
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::vector<Registered>& registry() {
  static std::vector<Registered> fusions;
  return fusions;
}
}  // namespace

void register_fusion(std::string_view name, FusionMatcher match) {
  if (!match) throw_invalid("match", "a fusion matcher", "a null function");
  std::lock_guard lock(registry_mutex());
  registry().push_back({std::string(name), match});
}

std::string_view name(OpArgument argument) {
  return argument == OpArgument::Output ? "output" : "grad_input";
}

// ---------------------------------------------------------------- OpArgs
OpArguments& OpArgs::operator[](int64_t position) {
  for (Entry& e : entries_) {
    if (!e.op && e.position == position) return e.args;
  }
  entries_.push_back({nullptr, position, {}});
  return entries_.back().args;
}

OpArguments& OpArgs::by_handle(std::shared_ptr<const Op> op) {
  if (!op) throw_invalid("op_args", "an op handle or a position", "a null handle");
  for (Entry& e : entries_) {
    if (e.op == op) return e.args;
  }
  entries_.push_back({std::move(op), -1, {}});
  return entries_.back().args;
}

// ---------------------------------------------------------------- helpers
namespace {

constexpr std::array<OpArgument, 2> kArguments = {OpArgument::Output, OpArgument::GradInput};

const Tensor& argument_of(const OpArguments& a, OpArgument which) {
  return which == OpArgument::Output ? a.output : a.grad_input;
}

std::string describe_op(int64_t position, const Op& op) {
  return str("op ", position, " (", op.kind(), ")");
}

std::string describe_stage(const Sequential::Stage& st, const std::vector<OpHandle>& ops) {
  if (st.fused) return str("the fused ", st.fused->kind(), " (ops ", st.begin, "-", st.end - 1, ")");
  return describe_op(st.begin, *ops[static_cast<size_t>(st.begin)]);
}

// Re-throws an op's error with the op it came from: "moekit: in op 1 (ScaledSwiGLU): ...".
[[noreturn]] void rethrow_in(const Error& e, const std::string& where) {
  std::string message = e.what();
  constexpr std::string_view kPrefix = "moekit: ";
  if (message.rfind(kPrefix, 0) == 0) message.erase(0, kPrefix.size());
  throw Error(e.kind(), str("moekit: in ", where, ": ", message));
}

// A caller buffer routed to a position, with the name it was given under.
struct Routed {
  Tensor tensor;
  std::string name;  // the key as given, e.g. "op_args[2].output"
  std::string op;    // the op it names, e.g. "op 2 (GroupedLinear)"
};

}  // namespace

// ---------------------------------------------------------------- Sequential
Sequential::Sequential(std::vector<OpHandle> ops, const SequentialOptions& options)
    : ops_(std::move(ops)), fuse_(options.fuse) {
  if (ops_.empty()) throw_invalid("ops", "at least one op", "none");
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (!ops_[i]) throw_invalid(str("ops[", i, "]"), "an op", "a null handle");
    for (size_t j = 0; j < i; ++j) {
      if (ops_[j] == ops_[i]) {
        throw_invalid(str("ops[", i, "]"),
                      "each op object at most once (a handle names one position)",
                      str("the ", ops_[i]->kind(), " of position ", j, " again"));
      }
    }
    if (!(ops_[i]->context().device() == ops_[0]->context().device())) {
      throw_invalid(str("ops[", i, "]"), str("an op on ", ops_[0]->context().device().to_string()),
                    str(describe_op(static_cast<int64_t>(i), *ops_[i]), " on ",
                        ops_[i]->context().device().to_string()));
    }
  }
  replan();
}

void Sequential::replan() {
  stages_.clear();
  std::vector<Registered> fusions;
  if (fuse_) {
    std::lock_guard lock(registry_mutex());
    fusions = registry();
  }
  const int64_t n = size();
  for (int64_t i = 0; i < n;) {
    std::shared_ptr<const FusedOp> fused;
    const std::span<const OpHandle> rest(ops_.data() + i, static_cast<size_t>(n - i));
    for (const Registered& f : fusions) {
      fused = f.match(rest);
      if (fused && fused->size() >= 1 && fused->size() <= n - i) break;
      fused.reset();
    }
    const int64_t len = fused ? fused->size() : 1;
    stages_.push_back({i, i + len, std::move(fused)});
    i += len;
  }
}

void Sequential::set_fusion(bool enabled) {
  fuse_ = enabled;
  replan();
}

bool Sequential::fused() const {
  for (const Stage& st : stages_) {
    if (st.fused) return true;
  }
  return false;
}

std::string Sequential::plan() const {
  std::string out;
  for (const Stage& st : stages_) {
    if (!out.empty()) out += ", ";
    out += st.fused ? str(st.fused->kind(), "(", st.begin, "-", st.end - 1, ")")
                    : str(ops_[static_cast<size_t>(st.begin)]->kind(), "(", st.begin, ")");
  }
  return out;
}

int64_t Sequential::position_of(const Op& op) const {
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (ops_[i].get() == &op) return static_cast<int64_t>(i);
  }
  return -1;
}

SequentialOutput Sequential::forward(const Tensor& x, const ExtraInputs& in,
                                     const OpArgs& args) const {
  const int64_t P = size();
  const Device dev = ops_[0]->context().device();
  const auto op_at = [&](int64_t i) -> const Op& { return *ops_[static_cast<size_t>(i)]; };

  // ---- 1. route op_args to positions (keys, ranges, duplicates)
  std::vector<std::array<Routed, 2>> routed(static_cast<size_t>(P));
  for (const OpArgs::Entry& e : args.entries()) {
    int64_t pos = e.position;
    std::string key;
    if (e.op) {
      pos = position_of(*e.op);
      key = str("op_args[", e.op->kind(), " handle]");
      if (pos < 0) {
        std::string list;
        for (int64_t i = 0; i < P; ++i) list += str(i ? ", " : "", i, " ", op_at(i).kind());
        throw_invalid(key, str("a handle of an op of this Sequential (", list, ")"),
                      str("a ", e.op->kind(), " that is not in this Sequential"));
      }
    } else {
      key = str("op_args[", pos, "]");
      if (pos < 0 || pos >= P) {
        throw_invalid(key, str("an op position in [0, ", P, ") of this Sequential"),
                      std::to_string(pos));
      }
    }
    for (size_t a = 0; a < kArguments.size(); ++a) {
      const Tensor& t = argument_of(e.args, kArguments[a]);
      if (!t.defined()) continue;
      Routed& slot = routed[static_cast<size_t>(pos)][a];
      const std::string full = str(key, ".", name(kArguments[a]));
      if (slot.tensor.defined()) {
        throw_invalid(full, "each argument of an op given once",
                      str("'", name(kArguments[a]), "' of ", describe_op(pos, op_at(pos)),
                          " given again (first as ", slot.name, ")"));
      }
      slot = {t, full, describe_op(pos, op_at(pos))};
    }
  }

  // ---- 2. placement: what each op (or fused op) accepts
  for (const Stage& st : stages_) {
    for (int64_t pos = st.begin; pos < st.end; ++pos) {
      for (size_t a = 0; a < kArguments.size(); ++a) {
        const Routed& r = routed[static_cast<size_t>(pos)][a];
        if (!r.tensor.defined()) continue;
        const OpArgument which = kArguments[a];
        if (st.fused) {
          const std::string expected = st.fused->accepts(which, pos - st.begin);
          if (expected.empty()) continue;
          throw_invalid(r.name, expected,
                        str("'", name(which), "' on ", st.fused->role(pos - st.begin), ", ",
                            describe_op(pos, op_at(pos)), ", of the fused ", st.fused->kind(),
                            " (ops ", st.begin, "-", st.end - 1,
                            "), whose inner tensors are not materialised (turn fusion off to "
                            "route buffers to its inner ops)"));
        }
        if (!op_at(pos).accepts(which)) {
          throw_invalid(
              r.name, str("an op that accepts '", name(which), "' (GroupedLinear)"),
              str(describe_op(pos, op_at(pos)), ", which does not accept '", name(which), "'"));
        }
      }
    }
  }

  // ---- 3. input, the chain of shapes, extra inputs
  if (!x.defined() || x.dim() != 2) throw_invalid("input", "a 2-D tensor [T, *]", x.describe());
  check_input("input", x, {x.size(0), x.size(1)}, x.dtype(), dev);
  const int64_t T = x.size(0);
  std::vector<Shape> shapes(static_cast<size_t>(P + 1));
  shapes[0] = x.shape();
  for (int64_t i = 0; i < P; ++i) {
    try {
      shapes[static_cast<size_t>(i + 1)] =
          op_at(i).output_shape(shapes[static_cast<size_t>(i)], x.dtype());
    } catch (const Error& e) {
      rethrow_in(e, describe_op(i, op_at(i)));
    }
  }
  int64_t probs_op = -1;
  for (int64_t i = 0; i < P && probs_op < 0; ++i) {
    if (op_at(i).takes_probs()) probs_op = i;
  }
  if (probs_op >= 0) {
    if (!in.probs.defined()) {
      throw_invalid("probs",
                    str("routing probs [", T, "] f32 (", describe_op(probs_op, op_at(probs_op)),
                        " takes them)"),
                    "undefined tensor");
    }
    check_input("probs", in.probs, {T}, DType::F32, dev);
  } else if (in.probs.defined()) {
    throw_invalid("probs", "no probs (no op of this Sequential takes routing probs)",
                  in.probs.describe());
  }
  for (int64_t i = 0; i < P; ++i) {
    int64_t groups = op_at(i).split_groups();
    if (groups == 0) continue;
    try {
      if (groups < 0) {
        groups = in.splits.groups();
        if (groups < 1) throw_invalid("splits", "at least one group count", "none");
      }
      validate_splits(in.splits, groups, T, dev);
    } catch (const Error& e) {
      rethrow_in(e, describe_op(i, op_at(i)));
    }
  }

  // ---- 4. caller buffers: SPEC §3 checks, no overlap with inputs, parameters or each other
  std::vector<std::pair<std::string, Tensor>> inputs = {
      {"input", x}, {"probs", in.probs}, {"splits", in.splits.device_counts()}};
  for (int64_t i = 0; i < P; ++i) {
    for (const OpTensor& t : op_at(i).tensors()) {
      inputs.emplace_back(str(describe_op(i, op_at(i)), " ", t.name), t.tensor);
    }
  }
  std::vector<const Routed*> buffers;
  for (int64_t pos = 0; pos < P; ++pos) {
    for (size_t a = 0; a < kArguments.size(); ++a) {
      const Routed& r = routed[static_cast<size_t>(pos)][a];
      if (!r.tensor.defined()) continue;
      const std::string label = str(r.name, " of ", r.op);  // the key as given and its op
      if (kArguments[a] == OpArgument::GradInput) {
        check_buffer_written(label, r.tensor, in.save_for_backward,
                             "save_for_backward is false: there is no backward");
        check_buffer_written(label, r.tensor, pos != 0 || in.input_requires_grad,
                             "the input does not require grad");
      }
      const Shape& shape =
          shapes[static_cast<size_t>(kArguments[a] == OpArgument::Output ? pos + 1 : pos)];
      check_input(label, r.tensor, shape, x.dtype(), dev);
      for (const auto& [input_name, t] : inputs) {
        if (overlaps(r.tensor, t)) {
          throw_invalid(label, "memory that overlaps no input of the call",
                        str("memory overlapping input '", input_name, "' (", t.describe(), ")"));
        }
      }
      for (const Routed* other : buffers) {
        if (overlaps(r.tensor, other->tensor)) {
          throw_invalid(label, "memory that overlaps no other caller buffer of the call",
                        str("memory overlapping '", other->name, "' of ", other->op));
        }
      }
      buffers.push_back(&r);
    }
  }

  // ---- 5. run the stages
  std::shared_ptr<Tape::Record> record;
  if (in.save_for_backward) {
    record = std::make_shared<Tape::Record>();
    record->ops = ops_;
    record->stages = stages_;
    record->grad_inputs.resize(static_cast<size_t>(P));
    record->grad_input_names.resize(static_cast<size_t>(P));
    for (int64_t pos = 0; pos < P; ++pos) {
      const Routed& r = routed[static_cast<size_t>(pos)][1];
      record->grad_inputs[static_cast<size_t>(pos)] = r.tensor;
      if (r.tensor.defined()) {
        record->grad_input_names[static_cast<size_t>(pos)] = str(r.name, " of ", r.op);
      }
    }
    record->input_requires_grad = in.input_requires_grad;
  }
  if (record) record->probs = in.probs;
  // ---- 5. bind every stage (each checks its own arguments and chooses its backends), then run.
  // The splits are resolved once for every stage (and their backward, through the tape).
  ExtraInputs resolved = in;
  resolved.splits = resolve_splits(ops_[0]->context(), in.splits);
  std::vector<BoundForward> bound;
  bound.reserve(stages_.size());
  Tensor cur = x;
  for (const Stage& st : stages_) {
    const bool input_requires_grad = st.begin == 0 ? in.input_requires_grad : true;
    std::unique_ptr<OpContext> context;
    try {
      if (st.fused) {
        std::vector<OpArguments> stage_args;
        for (int64_t pos = st.begin; pos < st.end; ++pos) {
          const auto& r = routed[static_cast<size_t>(pos)];
          stage_args.push_back({.output = r[0].tensor, .grad_input = r[1].tensor});
        }
        bound.push_back(st.fused->bind_forward(cur, resolved, stage_args, input_requires_grad,
                                               record ? &context : nullptr));
      } else {
        const auto& r = routed[static_cast<size_t>(st.begin)];
        const OpArguments op_args{.output = r[0].tensor, .grad_input = r[1].tensor};
        bound.push_back(op_at(st.begin).bind_forward(cur, resolved, op_args, input_requires_grad,
                                                     record ? &context : nullptr));
      }
    } catch (const Error& e) {
      rethrow_in(e, describe_stage(st, ops_));
    }
    cur = bound.back().output;
    if (record) record->contexts.push_back(std::move(context));
  }
  for (const BoundForward& b : bound) b.run();
  SequentialOutput out;
  out.output = cur;
  out.tape.record_ = std::move(record);
  return out;
}

SequentialGrads Sequential::backward(const Tape& tape, const Tensor& dy,
                                     const SequentialBackwardOptions& options) const {
  if (tape.empty()) {
    throw_invalid("tape", "a tape recorded by forward (save_for_backward = true)", "an empty tape");
  }
  const Tape::Record& r = *tape.record_;
  if (r.ops != ops_) {
    throw_invalid("tape", "a tape recorded by this Sequential's forward", "a tape of other ops");
  }
  for (const OpHandle& op : ops_)
    check_sm_margin("deferred_sm_margin", options.deferred_sm_margin, op->context());
  // The grad_input buffers bound at forward are written during this call: none may overlap its
  // input dy (each op checks them against its own grad_output only, which is dy for the last).
  for (size_t pos = 0; pos < r.grad_inputs.size(); ++pos) {
    if (overlaps(r.grad_inputs[pos], dy)) {
      throw_invalid(r.grad_input_names[pos], "memory that overlaps no input of the call",
                    str("memory overlapping input 'grad_output' (", dy.describe(), ")"));
    }
  }
  if (*r.used) {
    throw_invalid("tape", "a tape whose backward has not run yet (one backward per forward; "
                  "SequentialBackwardOptions::retain_tape keeps it)",
                  "a tape already used by a backward");
  }
  // What the backward writes besides its outputs (each op's main_grad) may not overlap what it
  // reads: dy and the routing probs (an op checks its own grad_output only, dy for the last op).
  for (size_t pos = 0; pos < ops_.size(); ++pos) {
    for (const OpTensor& t : ops_[pos]->tensors()) {
      if (!t.written_by_backward || !t.tensor.defined()) continue;
      for (const NamedTensor& in : {NamedTensor{"grad_output", dy}, NamedTensor{"probs", r.probs}}) {
        if (overlaps(t.tensor, in.tensor)) {
          throw_invalid(str(describe_op(static_cast<int64_t>(pos), *ops_[pos]), " ", t.name),
                        "memory that overlaps no input of the backward",
                        str("memory overlapping input '", in.name, "' (", in.tensor.describe(), ")"));
        }
      }
    }
  }
  // ---- bind every stage, last first (each stage's dy is the dx its successor binds), then run
  const Deferral defer{.weight_grads = options.defer_weight_grads,
                       .sm_margin = options.deferred_sm_margin,
                       .retain_saved = options.retain_tape};
  std::vector<BoundBackward> bound(r.stages.size());
  Tensor grad = dy;
  Tensor dprobs;  // summed over every op that takes the probs, in reverse op order
  for (size_t k = r.stages.size(); k-- > 0;) {
    const Stage& st = r.stages[k];
    const auto begin = static_cast<size_t>(st.begin);
    try {
      if (st.fused) {
        const std::span<const Tensor> grad_inputs(r.grad_inputs.data() + begin,
                                                  static_cast<size_t>(st.end - st.begin));
        bound[k] = st.fused->bind_backward(*r.contexts[k], grad, grad_inputs, dprobs, defer);
      } else {
        bound[k] = ops_[begin]->bind_backward(*r.contexts[k], grad, r.grad_inputs[begin], dprobs,
                                              defer);
      }
    } catch (const Error& e) {
      rethrow_in(e, describe_stage(st, r.ops));
    }
    grad = bound[k].input;
  }
  SequentialGrads out;
  out.params.resize(ops_.size());
  if (!options.retain_tape) *r.used = true;
  for (size_t k = r.stages.size(); k-- > 0;) {
    bound[k].run(out.weight_grads);
    const Stage& st = r.stages[k];
    for (int64_t pos = st.begin; pos < st.end; ++pos) {
      const auto i = static_cast<size_t>(pos - st.begin);
      if (i < bound[k].params.size()) out.params[static_cast<size_t>(pos)] = bound[k].params[i];
    }
  }
  if (r.input_requires_grad) out.input = grad;
  out.probs = dprobs;
  return out;
}

}  // namespace moekit
