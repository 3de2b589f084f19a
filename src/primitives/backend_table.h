// Internal: choosing a backend for a primitive (ARCHITECTURE.md "backends").
//
// Each primitive has a table of {name, rejects(args) -> "" or the reason, run(args)} entries in
// preference order (CUDA: sm90 kernels, then cuBLAS; CPU: cblas). The first entry that accepts
// runs. Context::with_backend(name) — or, when the context forces nothing, the environment
// variable MOEKIT_BACKEND — forces the entry of that name in every table that has one (tables
// without it choose as usual); a forced entry that rejects the call is an error with its reason.
// When nothing accepts, the Unsupported error lists every entry's reason.
#pragma once

#include <cstdlib>
#include <span>
#include <string>
#include <string_view>

#include "moekit/core/context.h"
#include "moekit/core/error.h"

namespace moekit::detail {

template <class Args>
struct Backend {
  std::string_view name;
  std::string (*rejects)(const Args&);  // "" when the backend accepts the call
  void (*run)(const Args&);
};

inline std::string_view forced_backend_name(const Context& ctx) {
  if (!ctx.forced_backend().empty()) return ctx.forced_backend();
  const char* env = std::getenv("MOEKIT_BACKEND");
  return env ? std::string_view(env) : std::string_view();
}

template <class Args>
void dispatch(std::string_view primitive, std::span<const Backend<Args>> table, const Context& ctx,
              const Args& args) {
  const std::string_view forced = forced_backend_name(ctx);
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
  for (const auto& b : table) {
    const std::string reason = b.rejects(args);
    if (reason.empty()) return b.run(args);
    reasons += str("\n  ", b.name, ": ", reason);
  }
  throw_error(ErrorKind::Unsupported, str(primitive, ": no backend accepts this call:", reasons));
}

}  // namespace moekit::detail
