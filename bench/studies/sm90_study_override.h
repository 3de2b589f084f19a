// bench/studies/sm90_study_override.h — the sm90 study override's parser: the environment
// variable MOEKIT_SM90_STUDY=key=value[,key=value...] of a study build (-DMOEKIT_SM90_STUDY_OVERRIDE=ON,
// read by src/backends/cuda/sm90/heuristics.cpp only in that build) turned into the knobs of
// sm90_study_settings.h (beside this file). Each key fixes one automatic choice of heuristics.h,
// for A/B runs and ctest's study variant; unset or empty: every choice automatic. An unknown key,
// a value outside its set, a key given twice or an entry without '=' is an InvalidArgument error
// naming the key — never silently ignored. CUTLASS- and CUDA-free so the CPU tests check it
// (tests/test_tile_units.cpp). Not part of the product.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include "sm90_study_settings.h"
#include "moekit/core/error.h"

namespace moekit::cuda::sm90 {

namespace study_detail {
struct Key {
  std::string_view name;
  int StudySettings::*field;
  std::array<std::string_view, 8> values;  // the first `count` are the key's values
  int count;
};
inline const std::array<Key, 14>& keys() {
  static const std::array<Key, 14> k{{
      {"config", &StudySettings::config, {"large", "small"}, 2},
      {"order", &StudySettings::order, {"auto", "cutlass", "blocked", "chunk2", "chunk4", "chunk8", "balanced"}, 7},
      {"raster", &StudySettings::raster, {"m", "n"}, 2},
      {"swizzle", &StudySettings::swizzle, {"1", "2", "4", "8", "16", "m4", "m8", "m16"}, 8},
      {"k_order", &StudySettings::k_order, {"forward", "alternate"}, 2},
      {"pdl", &StudySettings::pdl, {"0", "1"}, 2},
      {"prebuilt_tensormaps", &StudySettings::prebuilt_tensormaps, {"0", "1"}, 2},
      {"fprop_wide21", &StudySettings::fprop_wide21, {"0", "1"}, 2},
      {"small_swap", &StudySettings::small_swap, {"0", "1"}, 2},
      {"group_k_wide", &StudySettings::group_k_wide, {"0", "1"}, 2},
      {"group_k_own", &StudySettings::group_k_own, {"0", "1"}, 2},
      {"fused_forward", &StudySettings::fused_forward, {"0", "1"}, 2},
      {"fused_backward", &StudySettings::fused_backward, {"0", "1"}, 2},
      {"fp8_fast", &StudySettings::fp8_fast, {"pingpong12", "pingpong21", "coop256"}, 3},
  }};
  return k;
}
inline std::string join(const Key& k) {
  std::string s;
  for (int i = 0; i < k.count; ++i) s += str(s.empty() ? "" : "|", k.values[i]);
  return s;
}
inline std::string names() {
  std::string s;
  for (const Key& k : keys()) s += str(s.empty() ? "" : ", ", k.name);
  return s;
}
}  // namespace study_detail

/// The settings `spec` names (the variable's value; "" or null: none). Throws InvalidArgument
/// naming MOEKIT_SM90_STUDY's key on any entry it cannot take.
inline StudySettings parse_study_settings(const char* spec) {
  constexpr std::string_view kVar = "MOEKIT_SM90_STUDY";
  StudySettings s;
  if (spec == nullptr) return s;
  std::string_view rest(spec);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view entry = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t eq = entry.find('=');
    if (entry.empty() || eq == std::string_view::npos || eq == 0) {
      throw_invalid(kVar, str("key=value entries separated by ',' (keys: ", study_detail::names(), ")"),
                    str("'", entry, "'"));
    }
    const std::string_view name = entry.substr(0, eq), value = entry.substr(eq + 1);
    const study_detail::Key* key = nullptr;
    for (const auto& k : study_detail::keys()) {
      if (k.name == name) key = &k;
    }
    if (key == nullptr) {
      throw_invalid(kVar, str("a key of ", study_detail::names()), str("key '", name, "'"));
    }
    if (s.*key->field != -1) {
      throw_invalid(str(kVar, " key ", name), "at most once", str("'", name, "' given twice"));
    }
    int index = 0;
    while (index < key->count && key->values[index] != value) ++index;
    if (index == key->count) {
      throw_invalid(str(kVar, " key ", name), study_detail::join(*key), str("'", value, "'"));
    }
    s.*key->field = index;
  }
  return s;
}

}  // namespace moekit::cuda::sm90
