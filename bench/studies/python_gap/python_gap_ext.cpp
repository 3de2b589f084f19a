// bench/studies/python_gap/python_gap_ext.cpp — python_gap_ext.CppStep: `moekit run`'s training
// step (tools/moekit/expert_step.cpp, ExpertStep::run_once) driven from C++ inside a Python
// process, so that bench/studies/python_gap.py times it beside the same step through the bindings
// and moekit.torch on the same GPU state (issue 43: python / C++ 1.097, cause not established).
// A study (bench/studies/README.md), not part of libmoekit or of moekit._moekit; built against a
// built libmoekit by bench/studies/python_gap/CMakeLists.txt.
//
// The step: Sequential(fc1 [H -> 2F], ScaledSwiGLU(interleaved32), fc2 [F -> H]) fused into the
// grouped MLP, device split counts, y and dx into caller buffers, forward + backward with bf16
// weight gradients; the last step's results held until the next step's replace them, as
// ExpertStep holds them. Its knobs separate what the two drivers differ in:
//   stream       0: a stream of moekit's own (the CLI's Context::cuda(0)); else a cudaStream_t
//                (1: the legacy default stream, torch's default)
//   own_memory   true: every tensor copied into moekit's stream-ordered pool (the CLI's); false:
//                the caller's (torch's caching allocator) memory viewed, as the bindings do
//   hold         true: the last step's y, dx, dprobs, dW held (the CLI); false: dropped at the
//                end of the step (what the bare bindings' callers do)
// The counts' dtype (i64 in the CLI, i32 in the Python benches) is the caller's tensor's.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "moekit/moekit.h"

namespace nb = nanobind;
using namespace nb::literals;
using namespace moekit;

namespace {

DType dtype_of(const nb::ndarray<>& a) {
  const nb::dlpack::dtype d = a.dtype();
  using C = nb::dlpack::dtype_code;
  const auto code = static_cast<C>(d.code);
  if (code == C::Float && d.bits == 32) return DType::F32;
  if (code == C::Bfloat && d.bits == 16) return DType::BF16;
  if (code == C::Float && d.bits == 16) return DType::F16;
  if (code == C::Int && d.bits == 32) return DType::I32;
  if (code == C::Int && d.bits == 64) return DType::I64;
  throw_invalid("tensor", "f32, bf16, f16, i32 or i64", "another dtype");
}

Tensor view(const nb::ndarray<>& a) {
  const Device device = a.device_type() == nb::device::cuda::value ? Device::cuda(a.device_id())
                                                                   : Device::cpu();
  Shape shape(a.ndim()), strides(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape[i] = static_cast<int64_t>(a.shape(i));
    strides[i] = a.stride(i);
  }
  return Tensor::wrap(a.data(), shape, strides, dtype_of(a), device);
}

double since_ms(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

class CppStep {
 public:
  CppStep(const std::string& device, uintptr_t stream, int64_t experts, int64_t hidden, int64_t ffn,
          const nb::ndarray<>& x, const nb::ndarray<>& dy, const nb::ndarray<>& probs,
          const nb::ndarray<>& counts, const nb::ndarray<>& w1, const nb::ndarray<>& w2,
          const nb::ndarray<>& out_buf, const nb::ndarray<>& dgrad_buf, bool own_memory, bool hold)
      : ctx_(device == "cpu" ? Context::cpu() : Context::cuda(0, reinterpret_cast<void*>(stream))),
        hold_(hold) {
    keep_ = {x, dy, probs, counts, w1, w2, out_buf, dgrad_buf};
    const DType dt = dtype_of(x);
    fc1_ = std::make_shared<GroupedLinearOp>(
        GroupedLinearConfig{.groups = experts, .in = hidden, .out = 2 * ffn, .dtype = dt}, ctx_);
    act_ = std::make_shared<ScaledSwiGLU>(SwiGLUConfig{.layout = GluLayout::Interleaved32}, ctx_);
    fc2_ = std::make_shared<GroupedLinearOp>(
        GroupedLinearConfig{.groups = experts, .in = ffn, .out = hidden, .dtype = dt}, ctx_);
    mlp_ = std::make_unique<Sequential>(std::vector<OpHandle>{fc1_, act_, fc2_});
    auto take = [&](const nb::ndarray<>& a) {
      const Tensor v = view(a);
      if (!own_memory) return v;
      Tensor t = Tensor::empty(v.shape(), v.dtype(), ctx_);
      copy(ctx_, v, t);
      return t;
    };
    x_ = take(x);
    dy_ = take(dy);
    probs_ = take(probs);
    counts_ = take(counts);
    out_buf_ = take(out_buf);
    dgrad_buf_ = take(dgrad_buf);
    if (own_memory) {  // the layer's own weights (allocated by the op, as the CLI's)
      copy(ctx_, view(w1), fc1_->linear().weight());
      copy(ctx_, view(w2), fc2_->linear().weight());
    } else {
      fc1_->linear().set_weight(view(w1));
      fc2_->linear().set_weight(view(w2));
    }
    splits_ = Splits::device(counts_);
    ctx_.synchronize();
  }

  // ExpertStep::run_once.
  void run_once() {
    OpArgs args;
    args[fc2_].output = out_buf_;
    args[fc1_].grad_input = dgrad_buf_;
    auto [y, tape] = mlp_->forward(x_, {.splits = splits_, .probs = probs_}, args);
    SequentialGrads g = mlp_->backward(tape, dy_);
    if (hold_) {
      y_ = y;
      dx_ = g.input;
      dprobs_ = g.probs;
      dw1_ = g.params[0].weight;
      dw2_ = g.params[2].weight;
    }
  }

  void run(int n) {
    for (int i = 0; i < n; ++i) run_once();
  }

  // `moekit run`'s timed loop (tools/moekit/main.cpp): per step the wall time to the end of the
  // device work and the host time to enqueue it; [wall..., enqueue...].
  std::vector<double> timed(int n) {
    std::vector<double> wall, enqueue;
    for (int i = 0; i < n; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      run_once();
      enqueue.push_back(since_ms(t0));
      ctx_.synchronize();
      wall.push_back(since_ms(t0));
    }
    wall.insert(wall.end(), enqueue.begin(), enqueue.end());
    return wall;
  }

  uintptr_t stream() const { return reinterpret_cast<uintptr_t>(ctx_.stream()); }
  std::string plan() const { return mlp_->plan(); }
  void synchronize() const { ctx_.synchronize(); }

 private:
  Context ctx_;
  bool hold_;
  std::vector<nb::ndarray<>> keep_;  // the caller's tensors, viewed or copied from
  std::shared_ptr<GroupedLinearOp> fc1_, fc2_;
  std::shared_ptr<ScaledSwiGLU> act_;
  std::unique_ptr<Sequential> mlp_;
  Tensor x_, dy_, probs_, counts_, out_buf_, dgrad_buf_;
  Splits splits_;
  Tensor y_, dx_, dprobs_, dw1_, dw2_;
};

}  // namespace

NB_MODULE(python_gap_ext, m) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const moekit::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
  nb::class_<CppStep>(m, "CppStep")
      .def(nb::init<const std::string&, uintptr_t, int64_t, int64_t, int64_t, const nb::ndarray<>&,
                    const nb::ndarray<>&, const nb::ndarray<>&, const nb::ndarray<>&,
                    const nb::ndarray<>&, const nb::ndarray<>&, const nb::ndarray<>&,
                    const nb::ndarray<>&, bool, bool>(),
           "device"_a, "stream"_a, "experts"_a, "hidden"_a, "ffn"_a, "x"_a, "dy"_a, "probs"_a,
           "counts"_a, "w1"_a, "w2"_a, "out_buf"_a, "dgrad_buf"_a, "own_memory"_a, "hold"_a)
      .def("run_once", &CppStep::run_once, nb::call_guard<nb::gil_scoped_release>())
      .def("run", &CppStep::run, "n"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("timed", &CppStep::timed, "n"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("synchronize", &CppStep::synchronize, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("stream", &CppStep::stream)
      .def("plan", &CppStep::plan);
}
