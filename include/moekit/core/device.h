// moekit/core/device.h — where memory lives and work runs.
#pragma once

#include <string>

namespace moekit {

struct Device {
  enum class Kind { CPU, CUDA };
  Kind kind = Kind::CPU;
  int index = 0;  // CUDA ordinal; 0 for the CPU

  static Device cpu() { return {Kind::CPU, 0}; }
  static Device cuda(int index = 0) { return {Kind::CUDA, index}; }
  bool is_cpu() const { return kind == Kind::CPU; }
  bool is_cuda() const { return kind == Kind::CUDA; }
  friend bool operator==(const Device&, const Device&) = default;
  std::string to_string() const;  // "cpu" or "cuda:N"
};

}  // namespace moekit
