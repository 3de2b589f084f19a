// python/src/moekit_ext.cpp — moekit._moekit: the C++ API seen from Python (nanobind, DLPack).
//
// Tensors cross as DLPack (torch, numpy, any producer): an argument is viewed in place
// (moekit::Tensor::wrap with its strides, never copied), and a tensor moekit allocated comes back
// as a DLPack-capable array that owns a handle to moekit's storage (torch.from_dlpack /
// numpy.from_dlpack view it). The module never includes torch: it works with any torch that speaks
// DLPack. A CUDA context borrows the caller's stream (Context.cuda(device, stream)); nanobind's
// DLPack import passes no stream, so moekit.torch hands over capsules made with stream=-1 and
// runs every call on the stream of the context it chose. Calls that queue work release the GIL.
// moekit::Error arrives as ValueError (InvalidArgument), NotImplementedError (Unsupported) or
// RuntimeError (Runtime, Communication), with the C++ message.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moekit/moekit.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using moekit::DType;
using moekit::Tensor;
using Array = nb::ndarray<>;
using OptArray = std::optional<Array>;

DType dtype_of(const Array& a, const char* argument) {
  const nb::dlpack::dtype d = a.dtype();
  const auto code = static_cast<nb::dlpack::dtype_code>(d.code);
  if (d.lanes == 1) {
    if (code == nb::dlpack::dtype_code::Float && d.bits == 32) return DType::F32;
    if (code == nb::dlpack::dtype_code::Float && d.bits == 16) return DType::F16;
    if (code == nb::dlpack::dtype_code::Bfloat && d.bits == 16) return DType::BF16;
    if (code == nb::dlpack::dtype_code::Int && d.bits == 32) return DType::I32;
    if (code == nb::dlpack::dtype_code::Int && d.bits == 64) return DType::I64;
    if (code == nb::dlpack::dtype_code::UInt && d.bits == 8) return DType::U8;
  }
  moekit::throw_error(moekit::ErrorKind::InvalidArgument,
                      moekit::str("invalid argument '", argument,
                                  "': expected a f32, f16, bf16, i32, i64 or u8 tensor, got DLPack "
                                  "dtype code ",
                                  int(d.code), " with ", int(d.bits), " bits"));
}

nb::dlpack::dtype dlpack_dtype(DType t) {
  using C = nb::dlpack::dtype_code;
  auto make = [](C c, int bits) {
    return nb::dlpack::dtype{static_cast<uint8_t>(c), static_cast<uint8_t>(bits), 1};
  };
  switch (t) {
    case DType::F32:
      return make(C::Float, 32);
    case DType::F16:
      return make(C::Float, 16);
    case DType::BF16:
      return make(C::Bfloat, 16);
    case DType::I32:
      return make(C::Int, 32);
    case DType::I64:
      return make(C::Int, 64);
    default:
      return make(C::UInt, 8);  // fp8 storage travels as bytes
  }
}

/// A moekit view of a DLPack tensor: same memory, shape, element strides (never a copy).
Tensor view(const Array& a, const char* argument) {
  moekit::Device device;
  if (a.device_type() == nb::device::cpu::value) {
    device = moekit::Device::cpu();
  } else if (a.device_type() == nb::device::cuda::value) {
    device = moekit::Device::cuda(a.device_id());
  } else {
    moekit::throw_invalid(argument, "a CPU or CUDA tensor",
                          moekit::str("a tensor on DLPack device type ", a.device_type()));
  }
  moekit::Shape shape(a.ndim()), strides(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape[i] = static_cast<int64_t>(a.shape(i));
    strides[i] = a.stride(i);
  }
  return Tensor::wrap(a.data(), shape, strides, dtype_of(a, argument), device);
}
Tensor view(const OptArray& a, const char* argument) {
  return a ? view(*a, argument) : Tensor();
}

/// A tensor moekit made, as an object with __dlpack__ / __dlpack_device__ (nanobind's array-API
/// ndarray) owning a handle to moekit's storage: torch.from_dlpack / numpy.from_dlpack view it.
nb::object to_python(const Tensor& t) {
  if (!t.defined()) return nb::none();
  auto* keep = new Tensor(t);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  std::vector<int64_t> strides(t.strides().begin(), t.strides().end());
  const bool cuda = t.device().is_cuda();
  nb::ndarray<nb::array_api> array(
      t.data(), shape.size(), shape.data(), owner, strides.data(), dlpack_dtype(t.dtype()),
      cuda ? nb::device::cuda::value : nb::device::cpu::value, cuda ? t.device().index : 0);
  return nb::cast(array);
}

moekit::Splits splits_of(const nb::handle& h) {
  if (nb::isinstance<moekit::Splits>(h)) return nb::cast<moekit::Splits>(h);
  if (nb::isinstance<nb::list>(h) || nb::isinstance<nb::tuple>(h)) {
    return moekit::Splits::host(nb::cast<std::vector<int64_t>>(h));
  }
  return moekit::Splits::device(view(nb::cast<Array>(h), "splits"));
}

moekit::GluLayout layout_of(const std::string& s) {
  if (s == "halves") return moekit::GluLayout::Halves;
  if (s == "interleaved32") return moekit::GluLayout::Interleaved32;
  moekit::throw_invalid("layout", "'halves' or 'interleaved32'", "'" + s + "'");
}

/// A recipe from its name and TE's fields (moekit.torch.recipe builds these from TE's classes).
/// fp8_format "" keeps the recipe's default; power_2_scales None too. Validated (ValueError
/// naming the field).
moekit::Recipe recipe_of(const std::string& name, const std::string& fp8_format,
                         std::optional<bool> power_2_scales, float amax_epsilon, int margin) {
  moekit::Recipe r = moekit::Recipe::parse(name);
  if (!r.enabled()) return r;
  if (fp8_format == "e4m3") {
    r.fp8_format = moekit::Fp8Format::E4M3;
  } else if (fp8_format == "hybrid") {
    r.fp8_format = moekit::Fp8Format::Hybrid;
  } else if (!fp8_format.empty()) {
    moekit::throw_invalid("fp8_format", "'e4m3' or 'hybrid'", "'" + fp8_format + "'");
  }
  if (power_2_scales) r.power_2_scales = *power_2_scales;
  r.amax_epsilon = amax_epsilon;
  r.margin = margin;
  r.validate();
  return r;
}

moekit::QuantRole role_of(const std::string& s) {
  if (s == "input") return moekit::QuantRole::Input;
  if (s == "weight") return moekit::QuantRole::Weight;
  if (s == "grad_output") return moekit::QuantRole::GradOutput;
  moekit::throw_invalid("role", "'input', 'weight' or 'grad_output'", "'" + s + "'");
}

// fn() with the GIL released (a call that queues work, or a collective whose other ranks' Python
// threads must run); its result returned once the GIL is held again.
template <class F>
auto without_gil(F&& fn) {
  nb::gil_scoped_release release;
  return fn();
}

nb::object pending_to_python(moekit::PendingWork&& work) {
  return nb::cast(new moekit::PendingWork(std::move(work)), nb::rv_policy::take_ownership);
}

// What a forward keeps for its backward, plus the DLPack imports it views (their memory must
// outlive the views: holding the arrays holds the producer's tensors).
struct Keep {
  std::vector<Array> arrays;        // DLPack imports (each holds its producer's tensor)
  std::vector<nb::object> objects;  // Splits objects (which hold their counts' import)
  void splits(nb::handle h) {
    if (nb::isinstance<moekit::Splits>(h)) {
      objects.push_back(nb::borrow(h));
    } else if (!nb::isinstance<nb::list>(h) && !nb::isinstance<nb::tuple>(h)) {
      arrays.push_back(nb::cast<Array>(h));
    }
  }
};
struct LinearSaved {
  moekit::GroupedLinear::Saved saved;
  Keep keep;
};
struct SequentialTape {
  moekit::Tape tape;
  Keep keep;
};

}  // namespace

NB_MODULE(_moekit, m) {
  m.doc() = "moekit's C++ API (grouped linear, grouped MLP, Sequential) over DLPack tensors";
  // Modules and autograd graphs that live until exit hold moekit objects; that is no leak.
  nb::set_leak_warnings(false);

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const moekit::Error& e) {
      PyObject* type = PyExc_RuntimeError;
      if (e.kind() == moekit::ErrorKind::InvalidArgument) type = PyExc_ValueError;
      if (e.kind() == moekit::ErrorKind::Unsupported) type = PyExc_NotImplementedError;
      PyErr_SetString(type, e.what());
    }
  });

  m.def("built_with_cuda", &moekit::Context::built_with_cuda);
  m.def("cuda_device_count", &moekit::Context::cuda_device_count);

  nb::class_<moekit::Context>(m, "Context")
      .def_static("cpu", &moekit::Context::cpu, "threads"_a = 0)
      .def_static(
          "cuda",
          [](int device, uintptr_t stream) {
            return moekit::Context::cuda(device, reinterpret_cast<void*>(stream));
          },
          "device"_a = 0, "stream"_a = 0,
          "A CUDA context on `stream` (a cudaStream_t as an int, e.g. "
          "torch.cuda.current_stream().cuda_stream; 0: moekit creates one)")
      .def_prop_ro("device", [](const moekit::Context& c) { return c.device().to_string(); })
      .def_prop_ro("stream",
                   [](const moekit::Context& c) { return reinterpret_cast<uintptr_t>(c.stream()); })
      .def("with_backend", &moekit::Context::with_backend, "name"_a)
      .def("synchronize", &moekit::Context::synchronize, nb::call_guard<nb::gil_scoped_release>())
      .def("release_cached_memory", &moekit::Context::release_cached_memory,
           nb::call_guard<nb::gil_scoped_release>(),
           "Gives back the memory moekit keeps for reuse on this context's device (a host sync)")
      .def_prop_ro("memory_reserved", &moekit::Context::memory_reserved,
                   "Bytes moekit's pool for this context's device holds from the driver (0: CPU)")
      .def("device_error_bits", &moekit::Context::device_error_bits,
           nb::call_guard<nb::gil_scoped_release>())
      .def("check_device_errors", &moekit::Context::check_device_errors,
           nb::call_guard<nb::gil_scoped_release>());
  m.def("last_backend", [](const moekit::Context& c, const std::string& primitive) {
    return moekit::last_backend(c, primitive);
  });

  // Deferred weight gradients (SPEC §1b): wait() makes the op's stream wait for them (the host
  // never blocks); dropping the handle waits too. A CPU context defers nothing (already done).
  nb::class_<moekit::PendingWork>(m, "PendingWork")
      .def_prop_ro("pending", &moekit::PendingWork::pending)
      .def("wait", &moekit::PendingWork::wait, nb::call_guard<nb::gil_scoped_release>());

  nb::class_<moekit::Splits>(m, "Splits")
      .def_static("host", &moekit::Splits::host, "counts"_a)
      .def_static(
          "device",
          [](const Array& counts) { return moekit::Splits::device(view(counts, "splits")); },
          "counts"_a, nb::keep_alive<0, 1>(),
          "An int32/int64 tensor [G] on the op's device (viewed, not copied; kept alive)")
      .def_prop_ro("groups", &moekit::Splits::groups)
      .def_prop_ro("on_host", &moekit::Splits::on_host)
      .def_prop_ro(
          "counts",
          [](const moekit::Splits& s) {
            return s.on_host() ? nb::none() : to_python(s.device_counts());
          },
          "The device counts tensor [G] (None for host counts)");

  // Rows [S, T) of t set to zero (moekit::zero_tail: only the tail's bytes; device counts read on
  // the device, no host sync). moekit.torch zeroes the tails of the gradients moekit allocated.
  m.def(
      "zero_tail",
      [](const moekit::Context& ctx, const Array& t, nb::handle splits) {
        const Tensor tt = view(t, "t");
        const moekit::Splits s = splits_of(splits);
        nb::gil_scoped_release release;
        moekit::zero_tail(ctx, tt, s);
      },
      "ctx"_a, "t"_a, "splits"_a);

  // ---- quantized recipes (SPEC §6): per layer, given to the GroupedLinear / GroupedLinearOp
  nb::class_<moekit::Recipe>(m, "Recipe")
      .def_static("make", &recipe_of, "name"_a, "fp8_format"_a = "",
                  "power_2_scales"_a = nb::none(), "amax_epsilon"_a = 0.0f, "margin"_a = 0,
                  "A recipe by name (none, fp8-current, fp8-block, mxfp8, nvfp4) with TE's fields; "
                  "fp8_format 'e4m3' / 'hybrid' ('' keeps the default)")
      .def_prop_ro("name", [](const moekit::Recipe& r) { return std::string(r.name()); })
      .def_prop_ro("enabled", &moekit::Recipe::enabled)
      .def_prop_ro("fp8_format",
                   [](const moekit::Recipe& r) {
                     return std::string(r.fp8_format == moekit::Fp8Format::E4M3 ? "e4m3"
                                                                                : "hybrid");
                   })
      .def_ro("power_2_scales", &moekit::Recipe::power_2_scales)
      .def_ro("amax_epsilon", &moekit::Recipe::amax_epsilon)
      .def_ro("margin", &moekit::Recipe::margin)
      .def_prop_ro("dim_multiple", &moekit::Recipe::dim_multiple)
      .def_prop_ro("group_rows_multiple", &moekit::Recipe::group_rows_multiple);
  // The CPU reference quantize then dequantize of one operand (tests: what the layer's GEMMs
  // see). out: f32, [T, C] for rowwise, [C, T] for columnwise (the copy as stored); only valid
  // rows (columns) are written.
  m.def(
      "quantize_dequantize",
      [](const moekit::Context& ctx, const Array& x, nb::handle splits,
         const moekit::Recipe& recipe, const std::string& role, bool columnwise,
         const Array& out) {
        const Tensor xt = view(x, "x");
        const Tensor ot = view(out, "out");
        const moekit::Splits s = splits_of(splits);
        const moekit::QuantSpec spec = recipe.spec(role_of(role));
        const moekit::QuantUsage usage =
            columnwise ? moekit::QuantUsage::Columnwise : moekit::QuantUsage::Rowwise;
        nb::gil_scoped_release release;
        const moekit::QuantizedTensor q = moekit::quantize(ctx, xt, s, spec, usage);
        moekit::dequantize(ctx, q, s, usage, ot);
        ctx.synchronize();
      },
      "ctx"_a, "x"_a, "splits"_a, "recipe"_a, "role"_a, "columnwise"_a, "out"_a);

  // ---- GroupedLinear, driven directly (moekit.torch.GroupedLinear)
  nb::class_<LinearSaved>(m, "GroupedLinearSaved");
  nb::class_<moekit::GroupedLinear>(m, "GroupedLinear")
      .def(
          "__init__",
          [](moekit::GroupedLinear* self, const moekit::Context& ctx, int64_t groups, int64_t in,
             int64_t out, const std::string& dtype, bool bias,
             const std::optional<moekit::Recipe>& recipe) {
            new (self) moekit::GroupedLinear({.groups = groups,
                                              .in = in,
                                              .out = out,
                                              .dtype = moekit::parse_dtype(dtype),
                                              .bias = bias,
                                              .recipe = recipe.value_or(moekit::Recipe::none())},
                                             ctx);
          },
          "ctx"_a, "groups"_a, "in_features"_a, "out_features"_a, "dtype"_a, "bias"_a = false,
          "recipe"_a = nb::none())
      .def_prop_ro("recipe", [](const moekit::GroupedLinear& l) { return l.config().recipe; })
      .def("notify_weight_changed", &moekit::GroupedLinear::notify_weight_changed)
      .def_prop_ro("weight_version", &moekit::GroupedLinear::weight_version)
      .def_prop_ro("weight_quantizations", &moekit::GroupedLinear::weight_quantizations)
      .def("set_weight",
           [](moekit::GroupedLinear& l, const Array& w) { l.set_weight(view(w, "weight")); })
      .def("set_bias",
           [](moekit::GroupedLinear& l, const Array& b) { l.set_bias(view(b, "bias")); })
      .def("set_main_grad", [](moekit::GroupedLinear& l,
                               const OptArray& g) { l.set_main_grad(view(g, "main_grad")); })
      .def_prop_rw("weight_requires_grad", &moekit::GroupedLinear::weight_requires_grad,
                   &moekit::GroupedLinear::set_weight_requires_grad)
      .def(
          "forward",
          [](const moekit::GroupedLinear& l, const Array& x, nb::handle splits,
             const OptArray& output, bool input_requires_grad, bool save) {
            moekit::GroupedLinear::ForwardOptions options{
                .output = view(output, "output"), .input_requires_grad = input_requires_grad};
            const Tensor xt = view(x, "input");
            const moekit::Splits s = splits_of(splits);
            auto saved = std::make_unique<LinearSaved>();
            Tensor y;
            {
              nb::gil_scoped_release release;
              y = l.forward(xt, s, options, save ? &saved->saved : nullptr);
            }
            nb::object saved_py = nb::none();
            if (save) {
              saved->keep.arrays.push_back(x);
              saved->keep.splits(splits);
              saved_py = nb::cast(saved.release(), nb::rv_policy::take_ownership);
            }
            return nb::make_tuple(to_python(y), saved_py);
          },
          "x"_a, "splits"_a, "output"_a = nb::none(), "input_requires_grad"_a = true,
          "save"_a = true,
          "y [T, N] (the output buffer when given) and what backward needs (None unless save)")
      .def(
          "backward",
          [](const moekit::GroupedLinear& l, const LinearSaved& saved, const Array& dy,
             const OptArray& grad_input, bool retain_saved, bool defer_weight_grads,
             int deferred_sm_margin) {
            moekit::GroupedLinear::BackwardOptions options{
                .grad_input = view(grad_input, "grad_input"),
                .defer_weight_grads = defer_weight_grads,
                .deferred_sm_margin = deferred_sm_margin,
                .retain_saved = retain_saved};
            const Tensor dyt = view(dy, "grad_output");
            moekit::GroupedLinear::Grads g;
            {
              nb::gil_scoped_release release;
              g = l.backward(saved.saved, dyt, options);
            }
            return nb::make_tuple(to_python(g.input), to_python(g.weight), to_python(g.bias),
                                  pending_to_python(std::move(g.weight_grads)));
          },
          "saved"_a, "dy"_a, "grad_input"_a = nb::none(), "retain_saved"_a = false,
          "defer_weight_grads"_a = false, "deferred_sm_margin"_a = 0,
          "(dx, dW or main_grad, db, PendingWork), each tensor None when not computed; with "
          "defer_weight_grads, dW (and main_grad) may be read only after the PendingWork's wait()");

  // ---- basic ops and Sequential (moekit.torch.ops)
  nb::class_<moekit::Op>(m, "Op").def_prop_ro(
      "kind", [](const moekit::Op& op) { return std::string(op.kind()); });
  nb::class_<moekit::GroupedLinearOp, moekit::Op>(m, "GroupedLinearOp")
      .def(
          "__init__",
          [](moekit::GroupedLinearOp* self, const moekit::Context& ctx, int64_t groups, int64_t in,
             int64_t out, const std::string& dtype, bool bias, bool scale_bias,
             const std::optional<moekit::Recipe>& recipe) {
            new (self) moekit::GroupedLinearOp(
                {.groups = groups,
                 .in = in,
                 .out = out,
                 .dtype = moekit::parse_dtype(dtype),
                 .bias = bias,
                 .recipe = recipe.value_or(moekit::Recipe::none())},
                ctx, {.scale_bias = scale_bias});
          },
          "ctx"_a, "groups"_a, "in_features"_a, "out_features"_a, "dtype"_a, "bias"_a = false,
          "scale_bias"_a = false, "recipe"_a = nb::none())
      .def("notify_weight_changed",
           [](moekit::GroupedLinearOp& op) { op.linear().notify_weight_changed(); })
      .def_prop_ro("weight_version",
                   [](const moekit::GroupedLinearOp& op) { return op.linear().weight_version(); })
      .def_prop_ro("weight_quantizations", [](const moekit::GroupedLinearOp& op) {
        return op.linear().weight_quantizations();
      })
      .def("set_weight", [](moekit::GroupedLinearOp& op,
                            const Array& w) { op.linear().set_weight(view(w, "weight")); })
      .def("set_bias",
           [](moekit::GroupedLinearOp& op, const Array& b) { op.set_bias(view(b, "bias")); })
      .def("set_main_grad",
           [](moekit::GroupedLinearOp& op, const OptArray& g) {
             op.linear().set_main_grad(view(g, "main_grad"));
           })
      .def_prop_rw(
          "weight_requires_grad",
          [](const moekit::GroupedLinearOp& op) { return op.linear().weight_requires_grad(); },
          [](moekit::GroupedLinearOp& op, bool r) { op.linear().set_weight_requires_grad(r); });
  nb::class_<moekit::ScaledSwiGLU, moekit::Op>(m, "ScaledSwiGLU")
      .def(
          "__init__",
          [](moekit::ScaledSwiGLU* self, const moekit::Context& ctx, const std::string& layout) {
            new (self) moekit::ScaledSwiGLU({.layout = layout_of(layout)}, ctx);
          },
          "ctx"_a, "layout"_a = "halves");
  nb::class_<moekit::SwiGLU, moekit::Op>(m, "SwiGLU")
      .def(
          "__init__",
          [](moekit::SwiGLU* self, const moekit::Context& ctx, const std::string& layout) {
            new (self) moekit::SwiGLU({.layout = layout_of(layout)}, ctx);
          },
          "ctx"_a, "layout"_a = "halves");

  nb::class_<SequentialTape>(m, "Tape");
  nb::class_<moekit::Sequential>(m, "Sequential")
      .def(
          "__init__",
          [](moekit::Sequential* self, std::vector<std::shared_ptr<moekit::Op>> ops, bool fuse) {
            new (self) moekit::Sequential(std::move(ops), {.fuse = fuse});
          },
          "ops"_a, "fuse"_a = true)
      .def("plan", &moekit::Sequential::plan)
      .def("fused", &moekit::Sequential::fused)
      .def("set_fusion", &moekit::Sequential::set_fusion)
      .def(
          "forward",
          [](const moekit::Sequential& seq, const Array& x, nb::handle splits,
             const OptArray& probs,
             const std::vector<std::tuple<nb::object, OptArray, OptArray>>& op_args,
             bool input_requires_grad, bool probs_requires_grad, bool save) {
            auto tape = std::make_unique<SequentialTape>();
            moekit::ExtraInputs in{.splits = splits_of(splits),
                                   .probs = view(probs, "probs"),
                                   .input_requires_grad = input_requires_grad,
                                   .probs_requires_grad = probs_requires_grad,
                                   .save_for_backward = save};
            moekit::OpArgs args;
            for (const auto& [key, output, grad_input] : op_args) {
              moekit::OpArguments* a = nullptr;
              if (nb::isinstance<nb::int_>(key)) {
                a = &args[nb::cast<int64_t>(key)];
              } else {
                a = &args[nb::cast<std::shared_ptr<moekit::Op>>(key)];
              }
              if (output) {
                a->output = view(*output, "output");
                tape->keep.arrays.push_back(*output);
              }
              if (grad_input) {
                a->grad_input = view(*grad_input, "grad_input");
                tape->keep.arrays.push_back(*grad_input);
              }
            }
            const Tensor xt = view(x, "input");
            moekit::SequentialOutput out;
            {
              nb::gil_scoped_release release;
              out = seq.forward(xt, in, args);
            }
            nb::object tape_py = nb::none();
            if (!out.tape.empty()) {
              tape->tape = out.tape;
              tape->keep.arrays.push_back(x);
              if (probs) tape->keep.arrays.push_back(*probs);
              tape->keep.splits(splits);
              tape_py = nb::cast(tape.release(), nb::rv_policy::take_ownership);
            }
            return nb::make_tuple(to_python(out.output), tape_py);
          },
          "x"_a, "splits"_a, "probs"_a = nb::none(),
          "op_args"_a = std::vector<std::tuple<nb::object, OptArray, OptArray>>{},
          "input_requires_grad"_a = true, "probs_requires_grad"_a = true, "save"_a = true,
          "y and the tape (None in inference). op_args: [(position or op, output, grad_input)]")
      .def(
          "backward",
          [](const moekit::Sequential& seq, const SequentialTape& tape, const Array& dy,
             bool retain_tape, bool defer_weight_grads, int deferred_sm_margin) {
            const Tensor dyt = view(dy, "dy");
            moekit::SequentialGrads g;
            {
              nb::gil_scoped_release release;
              g = seq.backward(tape.tape, dyt,
                               {.defer_weight_grads = defer_weight_grads,
                                .deferred_sm_margin = deferred_sm_margin,
                                .retain_tape = retain_tape});
            }
            nb::list params;
            for (const moekit::ParamGrads& p : g.params) {
              params.append(nb::make_tuple(to_python(p.weight), to_python(p.bias)));
            }
            return nb::make_tuple(to_python(g.input), to_python(g.probs), params,
                                  pending_to_python(std::move(g.weight_grads)));
          },
          "tape"_a, "dy"_a, "retain_tape"_a = false, "defer_weight_grads"_a = false,
          "deferred_sm_margin"_a = 0,
          "(dx, dprobs, [(dW or main_grad, db) per op], PendingWork), None where not computed");

  // ---- expert parallelism over a caller's group (SPEC §7): one rank per Python thread or process,
  // the caller's symmetric region (e.g. torch symmetric memory's buffer) and collectives. The
  // collectives are Python callables, called with the GIL taken back (every EP call releases it).
  nb::class_<moekit::Communicator>(m, "Communicator")
      .def_prop_ro("rank", &moekit::Communicator::rank)
      .def_prop_ro("world_size", &moekit::Communicator::world_size)
      .def_prop_ro("engine", &moekit::Communicator::engine);
  m.def(
      "caller_communicator",
      [](int rank, int world_size, const moekit::Context& ctx, const Array& region,
         const std::vector<uintptr_t>& peer_bases, nb::callable barrier, nb::callable all_gather) {
        std::vector<void*> bases;
        for (uintptr_t b : peer_bases) bases.push_back(reinterpret_cast<void*>(b));
        auto keep_b = std::make_shared<nb::callable>(std::move(barrier));
        auto keep_g = std::make_shared<nb::callable>(std::move(all_gather));
        moekit::CallerGroup g{
            .rank = rank,
            .world_size = world_size,
            .context = ctx,
            .region = view(region, "region"),
            .peer_bases = std::move(bases),
            .barrier =
                [keep_b] {
                  nb::gil_scoped_acquire gil;
                  (*keep_b)();
                },
            .all_gather =
                [keep_g](std::string_view bytes) {
                  nb::gil_scoped_acquire gil;
                  const nb::object r = (*keep_g)(nb::bytes(bytes.data(), bytes.size()));
                  std::vector<std::string> out;
                  for (nb::handle h : r) {
                    const nb::bytes b = nb::cast<nb::bytes>(h);
                    out.emplace_back(b.c_str(), b.size());
                  }
                  return out;
                }};
        return std::shared_ptr<moekit::Communicator>(moekit::caller_communicator(std::move(g)));
      },
      "rank"_a, "world_size"_a, "ctx"_a, "region"_a, "peer_bases"_a, "barrier"_a, "all_gather"_a,
      nb::keep_alive<0, 4>(),
      "A rank over the caller's symmetric region (u8 [bytes], kept alive) and every rank's base "
      "address of it; barrier() and all_gather(bytes) -> [bytes per rank] are the caller's");
  auto ep_config = [](int64_t experts_per_rank, int64_t hidden, const std::string& dtype,
                      int64_t topk, int64_t max_tokens, int64_t receive_capacity,
                      int64_t alignment, const std::string& overflow) {
    if (overflow != "error" && overflow != "drop") {
      moekit::throw_invalid("overflow", "'error' or 'drop'", "'" + overflow + "'");
    }
    return moekit::ExpertParallelConfig{
        .experts_per_rank = experts_per_rank,
        .hidden = hidden,
        .dtype = moekit::parse_dtype(dtype),
        .topk = topk,
        .max_tokens = max_tokens,
        .receive_capacity = receive_capacity,
        .alignment = alignment,
        .overflow = overflow == "drop" ? moekit::OverflowPolicy::Drop : moekit::OverflowPolicy::Error};
  };
  nb::class_<moekit::ExpertParallel::Handle>(m, "EpHandle");
  nb::class_<moekit::ExpertParallel>(m, "ExpertParallel")
      .def(
          "__init__",
          [ep_config](moekit::ExpertParallel* self, moekit::Communicator& comm,
                      int64_t experts_per_rank, int64_t hidden, const std::string& dtype,
                      int64_t topk, int64_t max_tokens, int64_t receive_capacity,
                      int64_t alignment, const std::string& overflow) {
            const moekit::ExpertParallelConfig c = ep_config(
                experts_per_rank, hidden, dtype, topk, max_tokens, receive_capacity, alignment,
                overflow);
            nb::gil_scoped_release release;  // collective: the other ranks' threads must run
            new (self) moekit::ExpertParallel(comm, c);
          },
          "comm"_a, "experts_per_rank"_a, "hidden"_a, "dtype"_a, "topk"_a, "max_tokens"_a,
          "receive_capacity"_a, "alignment"_a = 1, "overflow"_a = "error", nb::keep_alive<1, 2>())
      .def_static(
          "symmetric_bytes",
          [ep_config](int64_t experts_per_rank, int64_t hidden, const std::string& dtype,
                      int64_t topk, int64_t max_tokens, int64_t receive_capacity, int world_size,
                      const std::string& device, int64_t alignment) {
            return moekit::ExpertParallel::symmetric_bytes(
                ep_config(experts_per_rank, hidden, dtype, topk, max_tokens, receive_capacity,
                          alignment, "error"),
                world_size, device == "cpu" ? moekit::Device::cpu() : moekit::Device::cuda(0));
          },
          "experts_per_rank"_a, "hidden"_a, "dtype"_a, "topk"_a, "max_tokens"_a,
          "receive_capacity"_a, "world_size"_a, "device"_a = "cpu", "alignment"_a = 1)
      .def_prop_ro("combine_input",
                   [](const moekit::ExpertParallel& ep) { return to_python(ep.combine_input()); })
      .def_prop_ro("dispatch_backward_input", [](const moekit::ExpertParallel& ep) {
        return to_python(ep.dispatch_backward_input());
      })
      .def(
          "dispatch",
          [](moekit::ExpertParallel& ep, const Array& tokens, const Array& topk_idx,
             const Array& topk_weights) {
            const Tensor t = view(tokens, "tokens"), i = view(topk_idx, "topk_idx"),
                         w = view(topk_weights, "topk_weights");
            const auto d = without_gil([&] { return ep.dispatch(t, i, w); });
            return nb::make_tuple(to_python(d.recv), nb::cast(d.splits), to_python(d.tokens_per_expert),
                                  to_python(d.weights), d.rows, nb::cast(d.handle));
          },
          "tokens"_a, "topk_idx"_a, "topk_weights"_a,
          "(recv [R, H], splits (device counts: the MLP's), tokens_per_expert [L], weights [R], "
          "rows S (CPU ranks), handle)")
      .def(
          "combine",
          [](moekit::ExpertParallel& ep, const moekit::ExpertParallel::Handle& h,
             const Array& expert_out) {
            const Tensor e = view(expert_out, "expert_out");
            return to_python(without_gil([&] { return ep.combine(h, e); }));
          },
          "handle"_a, "expert_out"_a)
      .def(
          "combine_backward",
          [](moekit::ExpertParallel& ep, const moekit::ExpertParallel::Handle& h,
             const Array& grad_output) {
            const Tensor g = view(grad_output, "grad_output");
            return to_python(without_gil([&] { return ep.combine_backward(h, g); }));
          },
          "handle"_a, "grad_output"_a)
      .def(
          "dispatch_backward",
          [](moekit::ExpertParallel& ep, const moekit::ExpertParallel::Handle& h,
             const Array& grad_recv, const OptArray& grad_weights) {
            const Tensor g = view(grad_recv, "grad_recv"), gw = view(grad_weights, "grad_weights");
            const auto d = without_gil([&] { return ep.dispatch_backward(h, g, gw); });
            return nb::make_tuple(to_python(d.tokens), to_python(d.topk_weights));
          },
          "handle"_a, "grad_recv"_a, "grad_weights"_a = nb::none());
}
