#include "moekit/core/error.h"

namespace moekit {

std::string_view name(ErrorKind k) {
  switch (k) {
    case ErrorKind::InvalidArgument: return "invalid argument";
    case ErrorKind::Unsupported: return "unsupported";
    case ErrorKind::Runtime: return "runtime error";
    case ErrorKind::Communication: return "communication error";
  }
  return "error";
}

Error::Error(ErrorKind kind, const std::string& message)
    : std::runtime_error(message), kind_(kind) {}

void throw_invalid(std::string_view argument, std::string_view expected, std::string_view seen) {
  throw Error(ErrorKind::InvalidArgument, str("moekit: invalid argument '", argument,
                                              "': expected ", expected, ", got ", seen));
}

void throw_error(ErrorKind kind, const std::string& message) {
  throw Error(kind, str("moekit: ", name(kind), ": ", message));
}

}  // namespace moekit
