// Internal (src/core/checks.h): argument validation shared by every op (host metadata only).
//
// One place for the checks and their messages: "invalid argument 'output': expected shape
// [96, 64], got [95, 64]". Checks never touch tensor contents and never synchronise a device.
#pragma once

#include <initializer_list>
#include <string_view>

#include "moekit/core/context.h"
#include "moekit/core/tensor.h"
#include "moekit/ops/bound.h"

namespace moekit {

/// An input tensor: checks rank/shape (a -1 entry matches any size), dtype, device, contiguity.
void check_input(std::string_view argument, const Tensor& t, const Shape& shape, DType dtype,
                 Device device);

/// An input of the call that a buffer must not overlap: its name in messages and the tensor.
struct NamedTensor {
  std::string_view name;
  const Tensor& tensor;
};

/// A caller-provided output buffer (SPEC §3): defined, shape, dtype, device, contiguity, then
/// no overlap with any of `inputs` (undefined inputs are skipped), in that order.
void check_caller_buffer(std::string_view argument, const Tensor& buffer, const Shape& shape,
                         DType dtype, Device device, std::initializer_list<NamedTensor> inputs);

/// A caller buffer the call would never write (`written` false, e.g. a grad_input for an input
/// that needs no grad): InvalidArgument "expected no buffer (<why>)". Nothing when `written`.
void check_buffer_written(std::string_view argument, const Tensor& buffer, bool written,
                          std::string_view why);

/// One backward per forward (SPEC §1a): InvalidArgument naming `saved` when the context's
/// backward already ran (and was not retained).
void check_backward_once(const BackwardOnce& used);

/// An SM margin (Context::with_sm_margin; a backward's deferred_sm_margin): 0 <= sms < the SM
/// count of ctx's device; on a CPU context any sms >= 0.
void check_sm_margin(std::string_view argument, int sms, const Context& ctx);

}  // namespace moekit
