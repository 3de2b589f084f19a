// Internal: the EVT node that fuses fc1's activation into the sm90 group-M epilogue
// (design/FUSED_EPILOGUE.md). Included by group_m_kernel.cuh only.
//
// The tree is  SwiGluZStore( h = round(acc + bias_g),  p = probs_g[row] ):
//   - it returns h unchanged, so the collective stores h [rows, 2F] through shared memory and TMA
//     exactly as the plain group-M epilogue does (the backward pass needs h);
//   - it writes z [rows, F] = p · silu(a) · b itself, with 4-byte global stores, for the
//     GluLayout::Interleaved32 layout: gate column c of h (c % 64 < 32) pairs with linear column
//     c + 32, and z column (c / 64)·32 + c % 32.
//
// Why this works (checked on the host with CuTe for every thread, design/FUSED_EPILOGUE.md §3):
// with a 64-column epilogue tile (64x64 for ping-pong), each visit() fragment of 32 accumulator
// elements holds, for i < 16, gate column c at element i and linear column c + 32 of the same row
// at element i + 16; (i, i + 1) are adjacent columns. The subtile's first column is a multiple of
// 64, so every pair is whole. The static_asserts below guard the tile shape this relies on; the
// GPU tests (test_sm90, FusedSwiGlu*) compare z bit for bit with the unfused path.
//
// Numerics: z is computed from the bf16/f16-rounded h with the operations, order and rounding of
// swiglu_forward_kernel (src/cuda/activation.cu): a·(1/(1+e^-a)), ·b, ·p, each rounded to nearest,
// then one rounding to the element type. So z is bit-identical to the unfused path's.
// Rows past the group's m_g are never written (residue check); the tail [S, T) gets no tiles.
#pragma once

#include <cstdint>
#include <cstring>

#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"

namespace moekit::cuda::sm90 {

template <class ElementZ>
struct Sm90SwiGluZStore {
  struct SharedStorage {};
  struct Arguments {
    ElementZ* const* ptr_z = nullptr;  // [groups]: z + off_g·ldz (null: pass h through only)
    int64_t ldz = 0;                   // F
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& a, void*) {
    return a;  // the group problem shapes live on the device: never read them here
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& a) {
    return a.ldz % 2 == 0;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*,
                                              cudaStream_t, cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE Sm90SwiGluZStore() {}
  CUTLASS_HOST_DEVICE Sm90SwiGluZStore(Params const& p, SharedStorage const&) : params_ptr(&p) {}
  Params const* params_ptr = nullptr;

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }
  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(
      cutlass::epilogue::fusion::ProducerLoadArgs<Args...> const&) {
    return cutlass::epilogue::fusion::EmptyProducerLoadCallbacks{};
  }

  template <class CTensor, class Residue>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(ElementZ* z, int64_t ldz, int row0, int col0,
                                          CTensor tCcD, Residue residue)
        : z(z), ldz(ldz), row0(row0), col0(col0), tCcD(tCcD), residue(residue) {}
    ElementZ* z;       // this group's z (row 0 = the group's first row), or null
    int64_t ldz;
    int row0, col0;    // (row in group, column of h) of this thread's element 0
    CTensor tCcD;      // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) → coordinates relative to element 0
    Residue residue;   // (m_g, 2F) − (row0, col0): relative coordinates below it are in bounds

    template <class ElementAcc, class ElementH, class ElementP, int kFrag>
    CUTLASS_DEVICE cutlass::Array<ElementH, kFrag> visit(
        cutlass::Array<ElementAcc, kFrag> const&, int epi_v, int epi_m, int epi_n,
        cutlass::Array<ElementH, kFrag> const& h, cutlass::Array<ElementP, kFrag> const& p) {
      static_assert(kFrag == 32, "the SwiGLU epilogue needs a 64-column epilogue tile (64x64)");
      if (z == nullptr) return h;
      auto c = tCcD(cute::_, cute::_, cute::_, epi_m, epi_n);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kFrag / 2; i += 2) {  // (i, i + 1): two adjacent gate columns
        const auto rc = c(epi_v * kFrag + i);    // relative (row, column) of gate element i
        if (!cute::elem_less(rc, residue)) continue;  // a row past m_g: never written
        ElementZ out[2];
        CUTLASS_PRAGMA_UNROLL
        for (int e = 0; e < 2; ++e) {
          const float a = static_cast<float>(h[i + e]);              // gate, column c + e
          const float b = static_cast<float>(h[i + e + kFrag / 2]);  // linear, column c + e + 32
          const float act = __fmul_rn(__fmul_rn(a, 1.0f / (1.0f + expf(-a))), b);
          out[e] = ElementZ(__fmul_rn(static_cast<float>(p[i + e]), act));
        }
        const int64_t row = row0 + cute::get<0>(rc);
        const int col = col0 + cute::get<1>(rc);  // col % 64 < 32 and even
        uint32_t packed;
        memcpy(&packed, out, sizeof(packed));
        *reinterpret_cast<uint32_t*>(z + row * ldz + (col >> 6) * 32 + (col & 31)) = packed;
      }
      return h;
    }
  };

  template <bool kReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    auto [M, N, K, L] = args.problem_shape_mnkl;  // this group's (m_g, 2F, K, 1)
    auto [m, n, k, l] = args.tile_coord_mnkl;     // l = the group's index
    static_assert(cute::size<1>(decltype(args.epi_tile){}) == 64,
                  "gate and linear columns meet in one visit() only with 64-column subtiles");
    ElementZ* z = params_ptr->ptr_z ? params_ptr->ptr_z[l] : nullptr;
    const int row0 = static_cast<int>(M) - static_cast<int>(cute::get<0>(args.residue_tCcD));
    const int col0 = static_cast<int>(N) - static_cast<int>(cute::get<1>(args.residue_tCcD));
    return ConsumerStoreCallbacks<decltype(args.tCcD), decltype(args.residue_tCcD)>(
        z, params_ptr->ldz, row0, col0, args.tCcD, args.residue_tCcD);
  }
};

}  // namespace moekit::cuda::sm90
