// moekit/core/splits.h — per-group row counts (SPEC §1).
//
// G counts, each >= 0 (zero-row groups are normal). Two forms:
//  - host counts: a std::vector<int64_t>, validated on the host before any work;
//  - device counts: an int32 or int64 tensor [G] on the op's device. No op synchronises with the
//    host to read them on a GPU path that claims graph safety; values are checked where they are
//    read (on the CPU device: up front, like host counts).
// Group g owns rows [off_g, off_g + m_g) with off_g = sum_{j<g} m_j; S = sum m_g <= T.
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/core/tensor.h"

namespace moekit {
class Context;
}

namespace moekit {

class Splits {
 public:
  Splits() = default;
  static Splits host(std::vector<int64_t> counts);
  static Splits device(Tensor counts);

  bool on_host() const { return !counts_tensor_.defined(); }
  int64_t groups() const;
  /// Host counts (throws InvalidArgument for device splits: read them with read_counts()).
  const std::vector<int64_t>& host_counts() const;
  /// Device counts tensor [G] (undefined for host splits).
  const Tensor& device_counts() const { return counts_tensor_; }
  /// Host splits resolved for a GPU call (resolve_splits): their counts also in device memory,
  /// written once per call and read by every kernel of it (undefined otherwise).
  const Tensor& device_copy() const { return device_copy_; }

 private:
  friend Splits resolve_splits(const Context& ctx, const Splits& splits);
  std::vector<int64_t> counts_;
  Tensor counts_tensor_;
  Tensor device_copy_;
};

/// Splits resolved once per call: host splits on a CUDA context get their counts written to the
/// device once (a kernel from its parameters: graph-capturable, no host sync), so that every
/// kernel of the call — and of its backward, through the saved context — reads that one copy
/// instead of writing its own. Anything else is returned as it is. Validate first.
Splits resolve_splits(const Context& ctx, const Splits& splits);

/// Prefix sums: offsets[g] = sum_{j<g} counts[j], offsets[G] = S.
std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts);

/// Checks the metadata of splits against an op: G == groups, device tensor dtype i32/i64, shape
/// [G], on `device`. For host counts (and device counts that live on the CPU) also the values:
/// each >= 0 and S <= rows. `argument` names the splits in messages.
void validate_splits(const Splits& splits, int64_t groups, int64_t rows, Device device,
                     std::string_view argument = "splits");

/// Checks count values: each >= 0 and S = sum <= rows (overflow-safe); the InvalidArgument error
/// names `argument`, the offending count and group, or S and T.
void check_counts(const std::vector<int64_t>& counts, int64_t rows,
                  std::string_view argument = "splits");

/// Sets rows [S, T) of t to zero — t's first dimension is T, S = Σ counts — on ctx's stream,
/// writing only those rows' bytes: the padded tail of a tensor an op allocated, which moekit's
/// ops leave unwritten (e.g. a gradient handed to a framework that reads every row). Device
/// counts on a GPU are read by the kernel (no host synchronisation, graph-capturable); invalid
/// ones write nothing and set the context's device error bits, as every kernel that reads them.
/// Checks first (InvalidArgument naming `t` or `splits`): t a contiguous tensor of at least one
/// dimension on ctx's device; the splits' metadata (validate_splits, any G) and host values.
void zero_tail(const Context& ctx, const Tensor& t, const Splits& splits);

/// The counts as host integers. Host splits: returned as is. CPU-device splits: read directly.
/// CUDA-device splits: copied to the host (synchronises ctx's stream; only for baseline paths
/// that document it).
std::vector<int64_t> read_counts(const Context& ctx, const Splits& splits);

}  // namespace moekit
