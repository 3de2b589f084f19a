// Internal: choosing a backend for a primitive, and the bound call (ARCHITECTURE.md "Bind once,
// run below").
//
// Each primitive has a table of {name, rejects(args) -> "" or the reason, run(args), declines,
// syncs_host} entries in preference order (CUDA: sm90 kernels, then cuBLAS; CPU: cblas). bind()
// chooses once, before any work, and returns a Plan whose run() only dispatches:
//  - the first entry that accepts is taken — unless it declines: declines(args) (optional) names
//    a measured case where a later entry is faster; the automatic choice then takes the next
//    accepting entry (and comes back to the declining one only when none accepts). rejects() is
//    what an entry cannot do, declines() what it should not do: forcing an entry ignores
//    declines().
//  - the host-sync rule (SPEC §1): an entry whose syncs_host(args) is true (the cuBLAS baseline
//    with device splits: it reads the counts on the host) is never chosen automatically: it
//    counts as rejecting, with that reason. Forced, it runs — except while the context's stream
//    captures a CUDA graph, where the sync would break the capture: an Unsupported error.
//  - Context::with_backend(name) — or, when the context forces nothing, the environment variable
//    MOEKIT_BACKEND — forces the entry of that name in every table that has one (tables without
//    it choose as usual); a forced entry that rejects the call is an error with its reason.
//    When nothing accepts, the Unsupported error lists every entry's reason. A forced name that
//    no table of this build knows (a typo, or "cublas" in a CPU-only build) is an
//    InvalidArgument error listing the known names — never silently ignored. Every table
//    registers its names with RegisterBackendNames next to its definition.
// Plan::run() records which backend ran each primitive (moekit::last_backend).
#pragma once

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/core/context.h"
#include "core/runtime.h"
#include "moekit/core/error.h"

namespace moekit::detail {

template <class Args>
struct Backend {
  std::string_view name;
  std::string (*rejects)(const Args&);  // "" when the backend accepts the call
  void (*run)(const Args&);
  std::string (*declines)(const Args&) = nullptr;  // "" (or null): no faster entry is known
  bool (*syncs_host)(const Args&) = nullptr;       // true: the call synchronises with the host
};

/// A backend entry's syncs_host: true for device splits (a backend that needs the counts on the
/// host must copy them there, which synchronises).
template <class Args>
bool reads_device_counts_on_host(const Args& args) {
  return !args.splits.on_host();
}

/// Work bound by a primitive's bind: every check done and every backend chosen; run() queues it.
/// Plans concatenate: an op binds every primitive it will call, then runs them all.
class Plan {
 public:
  void add(std::function<void()> step) { steps_.push_back(std::move(step)); }
  Plan& then(Plan&& next) {
    for (auto& s : next.steps_) steps_.push_back(std::move(s));
    next.steps_.clear();
    return *this;
  }
  void run() const {
    for (const auto& s : steps_) s();
  }
  bool empty() const { return steps_.empty(); }

 private:
  std::vector<std::function<void()>> steps_;
};

/// Records that `backend` ran `primitive` on ctx (moekit::last_backend).
inline void record_backend(const Context& ctx, std::string_view primitive, std::string_view backend) {
  auto& log = *detail::ContextAccess::impl(ctx)->log;
  std::lock_guard lock(log.mutex);
  auto it = log.last.find(primitive);
  if (it == log.last.end()) {
    log.last.emplace(std::string(primitive), std::string(backend));
  } else if (it->second != backend) {
    it->second = std::string(backend);
  }
}

inline constexpr std::string_view kHostSyncReason =
    "it reads the device split counts on the host, which synchronises: with device splits only "
    "graph-safe backends are chosen automatically (force this one with "
    "Context::with_backend or MOEKIT_BACKEND to accept the sync)";

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
  if (forced.empty() && b.syncs_host && b.syncs_host(args)) return false;
  return !forced.empty() || !b.declines || b.declines(args).empty();
}

/// The entry bind() takes for this call (throws when none may run it; see the file comment).
template <class Args>
const Backend<Args>& choose(std::string_view primitive, std::span<const Backend<Args>> table,
                            const Context& ctx, const Args& args) {
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
      if (b.syncs_host && b.syncs_host(args) && cuda_stream_capturing(ctx)) {
        throw_error(ErrorKind::Unsupported,
                    str(primitive, ": forced backend '", forced,
                        "' cannot run inside a CUDA graph capture: it reads the device split "
                        "counts on the host, and a host synchronisation would break the capture"));
      }
      return b;
    }
  }
  std::string reasons;
  const Backend<Args>* declined = nullptr;
  for (const auto& b : table) {
    std::string reason = b.rejects(args);
    if (reason.empty() && b.syncs_host && b.syncs_host(args)) reason = kHostSyncReason;
    if (!reason.empty()) {
      reasons += str("\n  ", b.name, ": ", reason);
    } else if (b.declines && !b.declines(args).empty()) {
      if (!declined) declined = &b;
    } else {
      return b;
    }
  }
  if (declined) return *declined;
  throw_error(ErrorKind::Unsupported, str(primitive, ": no backend accepts this call:", reasons));
}

/// The call of `b` on `args`, bound: run() records the backend (moekit::last_backend) and runs it.
template <class Args>
Plan bound_call(std::string_view primitive, const Backend<Args>& b, const Context& ctx, Args args) {
  Plan plan;
  plan.add([&b, primitive, ctx, args = std::move(args)] {
    record_backend(ctx, primitive, b.name);
    b.run(args);
  });
  return plan;
}

/// Chooses the backend (all checks, before any work) and returns the call bound to it.
template <class Args>
Plan bind(std::string_view primitive, std::span<const Backend<Args>> table, const Context& ctx,
          Args args) {
  const Backend<Args>& b = choose<Args>(primitive, table, ctx, args);
  return bound_call(primitive, b, ctx, std::move(args));
}

/// bind() for a primitive that tries one specialised entry (a fused kernel) before composing
/// other primitives: the entry's bound call when takes_first(), else nothing.
template <class Args>
Plan bind_first(std::string_view primitive, const Backend<Args>& b, const Context& ctx, Args args) {
  if (!takes_first(b, ctx, args)) return Plan();
  return bound_call(primitive, b, ctx, std::move(args));
}

/// bind() then run(): the primitive called on its own.
template <class Args>
void dispatch(std::string_view primitive, std::span<const Backend<Args>> table, const Context& ctx,
              Args args) {
  bind<Args>(primitive, table, ctx, std::move(args)).run();
}

}  // namespace moekit::detail
