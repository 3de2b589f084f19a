// Sequential: op_args routing, whole-call validation, the fuser, and the tape (SPEC §4).
#include "moekit/ops/sequential.h"

#include <array>

#include "moekit/core/checks.h"
#include "moekit/core/error.h"
#include "moekit/ops/grouped_mlp.h"

namespace moekit {

struct Tape::Record {
  std::vector<OpHandle> ops;                         // the Sequential's ops (identity check)
  std::vector<Sequential::Stage> stages;             // the plan that ran
  std::vector<std::unique_ptr<OpContext>> contexts;  // one per stage
  std::vector<Tensor> grad_inputs;                   // per position: bound at forward
  std::vector<std::string> grad_input_names;         // their keys and ops, for errors
  bool input_requires_grad = false;
};

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
  if (st.fused) return str("the fused GroupedMLP (ops ", st.begin, "-", st.end - 1, ")");
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
  const int64_t n = size();
  for (int64_t i = 0; i < n;) {
    const auto at = [&](int64_t k) -> const OpHandle& { return ops_[static_cast<size_t>(k)]; };
    if (fuse_ && i + 2 < n && GroupedMLP::mismatch(*at(i), *at(i + 1), *at(i + 2)).empty()) {
      auto mlp =
          std::make_shared<const GroupedMLP>(std::dynamic_pointer_cast<GroupedLinearOp>(at(i)),
                                             std::dynamic_pointer_cast<ScaledSwiGLU>(at(i + 1)),
                                             std::dynamic_pointer_cast<GroupedLinearOp>(at(i + 2)));
      stages_.push_back({i, i + 3, std::move(mlp)});
      i += 3;
    } else {
      stages_.push_back({i, i + 1, nullptr});
      ++i;
    }
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
    out += st.fused ? str("GroupedMLP(", st.begin, "-", st.end - 1, ")")
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
          const bool ok = (which == OpArgument::Output && pos == st.end - 1) ||
                          (which == OpArgument::GradInput && pos == st.begin);
          if (ok) continue;
          static constexpr const char* kRole[] = {"fc1", "the activation", "fc2"};
          throw_invalid(r.name,
                        which == OpArgument::Output
                            ? "'output' only on fc2 (the last op) of a fused grouped MLP"
                            : "'grad_input' only on fc1 (the first op) of a fused grouped MLP",
                        str("'", name(which), "' on ", kRole[pos - st.begin], ", ",
                            describe_op(pos, op_at(pos)), ", of the fused GroupedMLP (ops ",
                            st.begin, "-", st.end - 1,
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
  Tensor cur = x;
  for (const Stage& st : stages_) {
    const bool input_requires_grad = st.begin == 0 ? in.input_requires_grad : true;
    std::unique_ptr<OpContext> context;
    try {
      if (st.fused) {
        const GroupedMLP::ForwardOptions options{
            .output = routed[static_cast<size_t>(st.end - 1)][0].tensor,
            .input_requires_grad = input_requires_grad,
            .probs_requires_grad = in.probs_requires_grad};
        if (record) {
          auto saved = std::make_unique<GroupedMLP::Saved>();
          cur = st.fused->forward(cur, in.probs, in.splits, options, saved.get());
          context = std::move(saved);
        } else {
          cur = st.fused->forward(cur, in.probs, in.splits, options);
        }
      } else {
        const auto& r = routed[static_cast<size_t>(st.begin)];
        const OpArguments op_args{.output = r[0].tensor, .grad_input = r[1].tensor};
        cur = op_at(st.begin).op_forward(cur, in, op_args, input_requires_grad,
                                         record ? &context : nullptr);
      }
    } catch (const Error& e) {
      rethrow_in(e, describe_stage(st, ops_));
    }
    if (record) record->contexts.push_back(std::move(context));
  }
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
  SequentialGrads out;
  out.params.resize(ops_.size());
  Tensor grad = dy;
  Tensor dprobs;  // summed over every op that takes the probs, in reverse op order
  for (size_t k = r.stages.size(); k-- > 0;) {
    const Stage& st = r.stages[k];
    const auto begin = static_cast<size_t>(st.begin);
    try {
      if (st.fused) {
        const auto& saved = static_cast<const GroupedMLP::Saved&>(*r.contexts[k]);
        GroupedMLP::Grads g =
            st.fused->backward(saved, grad,
                               {.grad_input = r.grad_inputs[begin],
                                .grad_probs = dprobs,
                                .defer_weight_grads = options.defer_weight_grads,
                                .deferred_sm_margin = options.deferred_sm_margin});
        out.weight_grads.merge(std::move(g.weight_grads));
        if (g.probs.defined()) dprobs = g.probs;
        out.params[begin] = g.fc1;
        out.params[begin + 2] = g.fc2;
        grad = g.input;
      } else {
        OpGrads g = ops_[begin]->op_backward(
            *r.contexts[k], grad, r.grad_inputs[begin], dprobs,
            {.weight_grads = options.defer_weight_grads, .sm_margin = options.deferred_sm_margin});
        out.weight_grads.merge(std::move(g.weight_grads));
        out.params[begin] = g.params;
        grad = g.input;
      }
    } catch (const Error& e) {
      rethrow_in(e, describe_stage(st, r.ops));
    }
  }
  if (r.input_requires_grad) out.input = grad;
  out.probs = dprobs;
  return out;
}

}  // namespace moekit
