// The group view (bench/studies/group_view.h) on the CPU: the clipping arithmetic of one host-built
// TMA view over the packed rows, for design/PERFORMANCE.md's Next 1 (i). A study: built with
// -DMOEKIT_BUILD_STUDIES=ON (ctest study.group_view).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "group_view.h"

namespace moekit::cuda::sm90 {
namespace {

// The group view (group_view.h) under TMA's bounds rule — an element is moved only when every
// coordinate is inside its dimension — for every box of fuzzed groups: exactly the box's rows
// before its group's end are in bounds, each at its own address, in order; none at or past the end
// and none outside the data. Windows of the whole buffer (every box of a group at one offset) and
// of one box (a group's last box; its others taken as if the group ended with them). The device
// follows the same rule: moekit_tma_view_probe (ctest bench.tma_view) on the H200.
TEST(GroupView, EveryBoxClipsAtItsGroupsEnd) {
  std::mt19937 rng(11);
  constexpr int64_t kBox = 64, kCols = 24, kElement = 2, kRowBytes = kCols * kElement;
  std::vector<char> buffer(1);  // the data's address: only computed with, never dereferenced
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t groups = 1 + rng() % 40;
    std::vector<int64_t> counts(groups);
    int64_t rows = 0;
    for (auto& m : counts) rows += (m = rng() % 5 == 0 ? 0 : rng() % 300);
    if (rows == 0) continue;
    const char* data = buffer.data();
    for (const bool whole : {true, false}) {
      const int64_t window = whole ? rows : kBox;
      const GroupView view = group_view(data, rows, kCols, kElement, window);
      ASSERT_EQ(view.dims[0], uint64_t(kCols));
      ASSERT_EQ(view.dims[1], uint64_t(window));
      ASSERT_EQ(view.dims[2], uint64_t(rows + window));
      ASSERT_EQ(view.strides[0], uint64_t(kRowBytes));
      ASSERT_EQ(view.strides[1], uint64_t(kRowBytes));
      int64_t offset = 0;
      for (int64_t m : counts) {
        const int64_t end = offset + m;
        for (int64_t first = offset; first < end; first += kBox) {
          SCOPED_TRACE("rows " + std::to_string(rows) + ", group [" + std::to_string(offset) + ", " +
                       std::to_string(end) + "), box at " + std::to_string(first) + (whole ? ", whole" : ", box"));
          const bool last = first + kBox >= end;
          const GroupViewCoord at = group_view_coord(first, whole || last ? end : first + kBox, window);
          ASSERT_GE(at.window_index, 0);
          ASSERT_LT(at.window_index, int64_t(view.dims[2]));
          for (int64_t j = 0; j < kBox; ++j) {
            const int64_t r = at.row + j;
            const bool in_bounds = r >= 0 && r < int64_t(view.dims[1]);
            ASSERT_EQ(in_bounds, first + j < end) << "row " << j << " of the box";
            if (!in_bounds) continue;
            const uintptr_t address = reinterpret_cast<uintptr_t>(view.base) + uintptr_t(r) * view.strides[0] +
                                      uintptr_t(at.window_index) * view.strides[1];
            ASSERT_EQ(address, reinterpret_cast<uintptr_t>(data) + uintptr_t((first + j) * kRowBytes))
                << "row " << j << " of the box";
          }
        }
        offset = end;
      }
    }
  }
}

}  // namespace
}  // namespace moekit::cuda::sm90
