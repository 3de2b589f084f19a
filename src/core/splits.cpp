#include "moekit/core/splits.h"

#include <cstring>

#include "core/runtime.h"
#include "moekit/core/context.h"
#include "moekit/core/error.h"

namespace moekit {

Splits Splits::host(std::vector<int64_t> counts) {
  Splits s;
  s.counts_ = std::move(counts);
  return s;
}

Splits Splits::device(Tensor counts) {
  if (!counts.defined()) throw_invalid("splits", "a defined counts tensor", "undefined tensor");
  Splits s;
  s.counts_tensor_ = std::move(counts);
  return s;
}

Splits resolve_splits(const Context& ctx, const Splits& splits) {
  if (!splits.on_host() || !ctx.device().is_cuda() || splits.device_copy_.defined()) return splits;
  Splits out = splits;
  out.device_copy_ = detail::cuda_counts_to_device(ctx, splits.counts_);
  return out;
}

int64_t Splits::groups() const {
  if (on_host()) return static_cast<int64_t>(counts_.size());
  return counts_tensor_.dim() == 1 ? counts_tensor_.size(0) : -1;
}

const std::vector<int64_t>& Splits::host_counts() const {
  if (!on_host()) throw_invalid("splits", "host counts", "device counts (use read_counts)");
  return counts_;
}

std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts) {
  std::vector<int64_t> off(counts.size() + 1, 0);
  for (size_t g = 0; g < counts.size(); ++g) off[g + 1] = off[g] + counts[g];
  return off;
}

namespace {
std::string list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i == 16) return s + ", ... (" + std::to_string(v.size()) + " counts)]";
    s += (i ? ", " : "") + std::to_string(v[i]);
  }
  return s + "]";
}

std::vector<int64_t> read_cpu_tensor(const Tensor& t) {
  std::vector<int64_t> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = t.dtype() == DType::I32 ? t.data_as<const int32_t>()[i] : t.data_as<const int64_t>()[i];
  }
  return out;
}

}  // namespace

void check_counts(const std::vector<int64_t>& counts, int64_t rows, std::string_view argument) {
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] < 0) {
      throw_invalid(argument, "every count >= 0",
                    str("count ", counts[g], " for group ", g, " in ", list(counts)));
    }
  }
  // Summed without overflow: huge counts must not wrap to a small (or negative) S.
  int64_t total = 0;
  bool overflow = false;
  for (int64_t c : counts) overflow = overflow || __builtin_add_overflow(total, c, &total);
  if (overflow || total > rows) {
    throw_invalid(argument, str("a total row count S <= T = ", rows, " (rows presented)"),
                  str(overflow ? "S > 2^63 - 1" : str("S = ", total), " from ", list(counts)));
  }
}

void validate_splits(const Splits& splits, int64_t groups, int64_t rows, Device device,
                     std::string_view argument) {
  if (splits.on_host()) {
    if (splits.groups() != groups) {
      throw_invalid(argument, str(groups, " group counts (one per group)"),
                    str(splits.groups(), " counts"));
    }
    check_counts(splits.host_counts(), rows, argument);
    return;
  }
  const Tensor& t = splits.device_counts();
  if (t.dim() != 1 || t.size(0) != groups) {
    throw_invalid(argument, str("a counts tensor of shape [", groups, "]"), to_string(t.shape()));
  }
  if (t.dtype() != DType::I32 && t.dtype() != DType::I64) {
    throw_invalid(argument, "counts of dtype i32 or i64", name(t.dtype()));
  }
  if (!(t.device() == device)) {
    throw_invalid(argument, str("counts on ", device.to_string()), t.device().to_string());
  }
  if (!t.is_contiguous()) throw_invalid(argument, "a contiguous counts tensor", t.describe());
  // Counts that live in host memory cost nothing to check now, before any work.
  if (t.device().is_cpu()) check_counts(read_cpu_tensor(t), rows, argument);
}

void zero_tail(const Context& ctx, const Tensor& t, const Splits& splits) {
  if (!t.defined()) throw_invalid("t", "a tensor", "none");
  if (t.dim() < 1) throw_invalid("t", "a tensor of at least one dimension", t.describe());
  if (!t.is_contiguous()) throw_invalid("t", "a contiguous tensor", t.describe());
  if (!(t.device() == ctx.device())) {
    throw_invalid("t", str("a tensor on ", ctx.device().to_string(), " (the context's device)"),
                  t.describe());
  }
  const int64_t rows = t.size(0);
  validate_splits(splits, splits.groups(), rows, ctx.device());
  const size_t row_bytes = rows > 0 ? t.nbytes() / static_cast<size_t>(rows) : 0;
  if (t.device().is_cuda()) return detail::cuda_zero_tail(ctx, t.data(), row_bytes, rows, splits);
  int64_t total = 0;
  for (int64_t c : read_counts(ctx, splits)) total += c;  // checked: S <= T
  std::memset(static_cast<char*>(t.data()) + static_cast<size_t>(total) * row_bytes, 0,
              static_cast<size_t>(rows - total) * row_bytes);
}

std::vector<int64_t> read_counts(const Context& ctx, const Splits& splits) {
  if (splits.on_host()) return splits.host_counts();
  const Tensor& t = splits.device_counts();
  if (t.device().is_cpu()) return read_cpu_tensor(t);
  std::vector<int64_t> raw(static_cast<size_t>(t.numel()));
  std::vector<int32_t> raw32(raw.size());
  void* dst = t.dtype() == DType::I32 ? static_cast<void*>(raw32.data()) : raw.data();
  detail::cuda_copy(ctx, dst, Device::cpu(), t.data(), t.device(), t.nbytes());
  if (t.dtype() == DType::I32) {
    for (size_t i = 0; i < raw.size(); ++i) raw[i] = raw32[i];
  }
  return raw;
}

}  // namespace moekit
