// Internal: the environment switches of benchmarks and studies (MOEKIT_CUBLAS_BATCHING,
// MOEKIT_SIDE_STREAM): one value of a fixed set. (The sm90 kernels' one study override,
// MOEKIT_SM90_STUDY=key=value,..., has its own parser, in a study build only: bench/studies/sm90_study_override.h.) Callers read
// theirs once (a function-local static), so a switch holds for the whole process.
#pragma once

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <string_view>

#include "moekit/core/error.h"

namespace moekit::detail {

/// The index in `values` of environment variable `name`'s value; -1 when it is unset or empty.
/// Any other value is an InvalidArgument error naming the variable, the values allowed and the one seen.
inline int env_choice(const char* name, std::initializer_list<std::string_view> values) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  std::string allowed;
  int i = 0;
  for (std::string_view a : values) {
    if (a == v) return i;
    allowed += str(allowed.empty() ? "" : ", ", a);
    ++i;
  }
  throw_invalid(name, str(allowed, " or unset"), str("'", v, "'"));
}

}  // namespace moekit::detail
