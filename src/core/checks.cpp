#include "core/checks.h"

#include "core/runtime.h"
#include "moekit/core/error.h"

namespace moekit {
namespace {
bool shape_matches(const Shape& seen, const Shape& expected) {
  if (seen.size() != expected.size()) return false;
  for (size_t i = 0; i < seen.size(); ++i) {
    if (expected[i] >= 0 && seen[i] != expected[i]) return false;
  }
  return true;
}
std::string pattern(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    out += (i ? ", " : "") + (s[i] < 0 ? std::string("*") : std::to_string(s[i]));
  }
  return out + "]";
}
}  // namespace

void check_input(std::string_view argument, const Tensor& t, const Shape& shape, DType dtype,
                 Device device) {
  if (!t.defined()) throw_invalid(argument, str("a tensor of shape ", pattern(shape)), "undefined tensor");
  if (!shape_matches(t.shape(), shape)) {
    throw_invalid(argument, str("shape ", pattern(shape)), to_string(t.shape()));
  }
  if (t.dtype() != dtype) throw_invalid(argument, str("dtype ", name(dtype)), name(t.dtype()));
  if (!(t.device() == device)) {
    throw_invalid(argument, str("device ", device.to_string()), t.device().to_string());
  }
  if (!t.is_contiguous()) {
    throw_invalid(argument, "a contiguous (row-major, dense) tensor",
                  str("strides ", to_string(t.strides()), " for shape ", to_string(t.shape())));
  }
}

void check_buffer_written(std::string_view argument, const Tensor& buffer, bool written,
                          std::string_view why) {
  if (!written) throw_invalid(argument, str("no buffer (", why, ")"), buffer.describe());
}

void check_caller_buffer(std::string_view argument, const Tensor& buffer, const Shape& shape,
                         DType dtype, Device device,
                         std::initializer_list<NamedTensor> inputs) {
  check_input(argument, buffer, shape, dtype, device);
  for (const NamedTensor& in : inputs) {
    if (overlaps(buffer, in.tensor)) {
      throw_invalid(argument, "memory that overlaps no input of the call",
                    str("memory overlapping input '", in.name, "' (", in.tensor.describe(), ")"));
    }
  }
}

void check_backward_once(const BackwardOnce& used) {
  if (used && *used) {
    throw_invalid("saved", "a context whose backward has not run yet (one backward per forward)",
                  "a context already used by a backward");
  }
}

void check_sm_margin(std::string_view argument, int sms, const Context& ctx) {
  if (sms < 0) throw_invalid(argument, "an SM margin >= 0", std::to_string(sms));
  if (!ctx.device().is_cuda()) return;
  const int count = detail::cuda_sm_count(ctx);
  if (sms >= count) {
    throw_invalid(argument,
                  str("an SM margin below ", ctx.device().to_string(), "'s ", count, " SMs"),
                  std::to_string(sms));
  }
}

}  // namespace moekit
