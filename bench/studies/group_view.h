// Internal: the packed rows of a grouped operand as ONE TMA tensor, built on the host whatever the
// device counts (design/PERFORMANCE.md, Next 1 (i): a grouped GEMM with no per-call setup kernel).
// Kept free of CUTLASS and CUDA so the CPU tests check the clipping arithmetic on fuzzed groups
// (bench/studies/group_view_test.cpp); moekit_tma_view_probe (bench/tma_view_probe.cu, ctest
// bench.tma_view) checks on an sm_90 device that TMA stores and loads behave as that arithmetic
// says (on the H200: design/PERFORMANCE.md, Next 1 (i); design/PERFORMANCE-LOG.md, 2026-12-02).
//
// rows x cols elements, row-major (x [T, K], dy [T, N], out [T, N]: rows grouped by expert), seen
// as overlapping windows of `window` rows: element (c, r, v) — column c, row r of window v — is
// row v - window + r. Dims {cols, window, rows + window}; the row stride and the window stride are
// both one row; the base lies `window` rows before the data. A box of rows [first, first + B) of a
// group ending at row `end` is taken at window `end`, row first - end + window: its rows at or
// past `end` have r >= window, outside the tensor, so TMA stores skip them and loads read zeros;
// the rows before `end` are first.. in order. With window = rows every box of every group fits
// (end - first <= rows), and a group's boxes differ from its first only by their row: one affine
// map per group, offset (rows - m_g) in rows and `end` in windows.
#pragma once

#include <cstdint>

namespace moekit::cuda::sm90 {

// What cuTensorMapEncodeTiled takes for the view (strides in bytes; the innermost is implicit).
struct GroupView {
  const void* base = nullptr;    // `window` rows before the data: never dereferenced there
  uint64_t dims[3] = {0, 0, 0};  // {cols, window, rows + window}
  uint64_t strides[2] = {0, 0};  // {row, row} bytes
};

inline GroupView group_view(const void* data, int64_t rows, int64_t cols, int64_t element_bytes,
                            int64_t window) {
  GroupView v;
  const int64_t row_bytes = cols * element_bytes;
  // (as an integer: the address lies outside the allocation, which C++ pointer arithmetic may not
  // reach)
  v.base = reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(data) -
                                         static_cast<uintptr_t>(window * row_bytes));
  v.dims[0] = static_cast<uint64_t>(cols);
  v.dims[1] = static_cast<uint64_t>(window);
  v.dims[2] = static_cast<uint64_t>(rows + window);
  v.strides[0] = v.strides[1] = static_cast<uint64_t>(row_bytes);
  return v;
}

// Where the box of rows starting at `first` of a group ending at `end` (first < end,
// end - first <= window) sits in the view: its first row within window `window_index`.
struct GroupViewCoord {
  int64_t row = 0, window_index = 0;
};
inline GroupViewCoord group_view_coord(int64_t first, int64_t end, int64_t window) {
  return {first - end + window, end};
}

}  // namespace moekit::cuda::sm90
