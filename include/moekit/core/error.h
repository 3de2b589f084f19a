// moekit/core/error.h — the one exception type of the library.
//
// Every argument error names the argument, the expected value and the value seen, e.g.
//   moekit: invalid argument 'output': expected shape [96, 64], got [95, 64]
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace moekit {

enum class ErrorKind {
  InvalidArgument,  // the caller passed something the contract refuses
  Unsupported,      // valid, but no backend implements it (message lists each backend's reason)
  Runtime,          // a device / library call failed (message names the call and its status)
  Communication,    // expert-parallel transport failure
};

std::string_view name(ErrorKind k);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message);
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

/// Throws InvalidArgument: "invalid argument '<argument>': expected <expected>, got <seen>".
[[noreturn]] void throw_invalid(std::string_view argument, std::string_view expected,
                                std::string_view seen);
/// Throws an error of `kind` with a free-form message.
[[noreturn]] void throw_error(ErrorKind kind, const std::string& message);

/// Formats anything streamable; used to build expected/seen strings.
template <class... Ts>
std::string str(const Ts&... xs) {
  std::ostringstream os;
  (os << ... << xs);
  return os.str();
}

}  // namespace moekit
