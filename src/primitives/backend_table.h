// Internal: choosing a backend for a primitive (ARCHITECTURE.md "backends").
//
// Each primitive has a table of {name, rejects(args) -> "" or the reason, run(args), declines}
// entries in preference order (CUDA: sm90 kernels, then cuBLAS; CPU: cblas). The first entry that
// accepts runs — unless it declines: declines(args) (optional) names a measured case where a later
// entry is faster; the automatic choice then takes the next accepting entry (and comes back to
// the declining one only when none accepts). rejects() is what an entry cannot do, declines() what
// it should not do: forcing an entry ignores declines(). Context::with_backend(name) — or, when the context forces nothing, the environment
// variable MOEKIT_BACKEND — forces the entry of that name in every table that has one (tables
// without it choose as usual); a forced entry that rejects the call is an error with its reason.
// When nothing accepts, the Unsupported error lists every entry's reason. A forced name that no
// table of this build knows (a typo, or "cublas" in a CPU-only build) is an InvalidArgument error
// listing the known names — never silently ignored. Every table registers its names with
// RegisterBackendNames next to its definition (a table always accepts its own names; the
// registry decides whether a name foreign to the table is some other table's or a typo).
#pragma once

#include <algorithm>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/core/context.h"
#include "moekit/core/error.h"

namespace moekit::detail {

template <class Args>
struct Backend {
  std::string_view name;
  std::string (*rejects)(const Args&);  // "" when the backend accepts the call
  void (*run)(const Args&);
  std::string (*declines)(const Args&) = nullptr;  // "" (or null): no faster entry is known
};

inline std::string_view forced_backend_name(const Context& ctx) {
  if (!ctx.forced_backend().empty()) return ctx.forced_backend();
  const char* env = std::getenv("MOEKIT_BACKEND");
  return env ? std::string_view(env) : std::string_view();
}

/// Names of every backend of every primitive table in this build (filled at load time).
inline std::vector<std::string_view>& registered_backend_names() {
  static std::vector<std::string_view> names;
  return names;
}

/// Registers the names of a table: `const RegisterBackendNames kRegisterX(kX);`.
struct RegisterBackendNames {
  template <class Args, size_t N>
  explicit RegisterBackendNames(const Backend<Args> (&table)[N]) {
    auto& names = registered_backend_names();
    for (const auto& b : table) {
      if (std::find(names.begin(), names.end(), b.name) == names.end()) names.push_back(b.name);
    }
  }
};

/// Throws InvalidArgument when `forced` is no backend of this build.
inline void check_forced_backend_is_known(const Context& ctx, std::string_view forced) {
  const auto& names = registered_backend_names();
  if (std::find(names.begin(), names.end(), forced) != names.end()) return;
  std::string known;
  for (std::string_view n : names) known += str(known.empty() ? "" : ", ", n);
  throw_invalid(ctx.forced_backend().empty() ? "MOEKIT_BACKEND" : "backend",
                str("the name of a backend of this build (", known, ")"), str("'", forced, "'"));
}

/// Whether dispatch() would take `b` if it came first in a table: forced to b's name and b accepts,
/// or nothing forced and b accepts without declining. For a primitive that tries one specialised
/// entry (a fused kernel) before composing other primitives, which then choose for themselves.
template <class Args>
bool takes_first(const Backend<Args>& b, const Context& ctx, const Args& args) {
  const std::string_view forced = forced_backend_name(ctx);
  if (!forced.empty() && forced != b.name) return false;
  if (!b.rejects(args).empty()) return false;
  return !forced.empty() || !b.declines || b.declines(args).empty();
}

template <class Args>
void dispatch(std::string_view primitive, std::span<const Backend<Args>> table, const Context& ctx,
              const Args& args) {
  const std::string_view forced = forced_backend_name(ctx);
  if (!forced.empty() && std::none_of(table.begin(), table.end(),
                                      [&](const auto& b) { return b.name == forced; })) {
    check_forced_backend_is_known(ctx, forced);  // not this table's: must be another table's
  }
  for (const auto& b : table) {
    if (!forced.empty() && b.name == forced) {
      const std::string reason = b.rejects(args);
      if (!reason.empty()) {
        throw_error(ErrorKind::Unsupported,
                    str(primitive, ": forced backend '", forced, "' cannot run this call: ", reason));
      }
      return b.run(args);
    }
  }
  std::string reasons;
  const Backend<Args>* declined = nullptr;
  for (const auto& b : table) {
    const std::string reason = b.rejects(args);
    if (!reason.empty()) {
      reasons += str("\n  ", b.name, ": ", reason);
    } else if (b.declines && !b.declines(args).empty()) {
      if (!declined) declined = &b;
    } else {
      return b.run(args);
    }
  }
  if (declined) return declined->run(args);
  throw_error(ErrorKind::Unsupported, str(primitive, ": no backend accepts this call:", reasons));
}

}  // namespace moekit::detail
