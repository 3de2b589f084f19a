// Internal: the EVT nodes that fuse the grouped MLP's activation into sm90 group-M epilogues —
// SwiGLU forward into fc1's (Sm90SwiGluZStore, below) and SwiGLU backward into fc2's dgrad
// (Sm90DSwiGluStore, further down) — and the base they share (design/FUSED_EPILOGUE.md).
// Included by group_m_kernel.cuh only.
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
// swiglu_forward_kernel (src/backends/cuda/activation.cu): a·(1/(1+e^-a)), ·b, ·p, each rounded to nearest,
// then one rounding to the element type. So z is bit-identical to the unfused path's.
// Rows past the group's m_g are never written (residue check); the tail [S, T) gets no tiles.
#pragma once

#include <cstdint>
#include <cstring>

#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"
#include "cutlass/numeric_conversion.h"

namespace moekit::cuda::sm90 {

// What an EVT node that only reads registers and writes global memory needs besides its
// callbacks (no producer loads, no C, no workspace, no shared memory). Args: its Arguments, which
// are also its Params (the group problem shapes live on the device: never read them here).
template <class Args>
struct StoreOnlyNode {
  struct SharedStorage {};
  using Arguments = Args;
  using Params = Args;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& a, void*) {
    return a;
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

  CUTLASS_HOST_DEVICE StoreOnlyNode() {}
  CUTLASS_HOST_DEVICE StoreOnlyNode(Params const& p, SharedStorage const&) : params_ptr(&p) {}
  Params const* params_ptr = nullptr;

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }
  template <class... A>
  CUTLASS_DEVICE auto get_producer_load_callbacks(
      cutlass::epilogue::fusion::ProducerLoadArgs<A...> const&) {
    return cutlass::epilogue::fusion::EmptyProducerLoadCallbacks{};
  }
};

template <class ElementZ>
struct SwiGluZArgs {
  ElementZ* const* ptr_z = nullptr;  // [groups]: z + off_g·ldz (null: pass h through only)
  int64_t ldz = 0;                   // F
};

template <class ElementZ>
struct Sm90SwiGluZStore : StoreOnlyNode<SwiGluZArgs<ElementZ>> {
  using Base = StoreOnlyNode<SwiGluZArgs<ElementZ>>;
  using Base::Base;
  using typename Base::Arguments;
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& a) {
    return a.ldz % 2 == 0;
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
    const auto& prm = *this->params_ptr;
    ElementZ* z = prm.ptr_z ? prm.ptr_z[l] : nullptr;
    const int row0 = static_cast<int>(M) - static_cast<int>(cute::get<0>(args.residue_tCcD));
    const int col0 = static_cast<int>(N) - static_cast<int>(cute::get<1>(args.residue_tCcD));
    return ConsumerStoreCallbacks<decltype(args.tCcD), decltype(args.residue_tCcD)>(
        z, prm.ldz, row0, col0, args.tCcD, args.residue_tCcD);
  }
};

// ---- SwiGLU backward ----
// The EVT node that fuses the SwiGLU backward into fc2's dgrad epilogue (design/ARCHITECTURE.md, "Fused MLP
// epilogues"). The GEMM is dz = dy · W2_g (group-M, N-major B); its accumulator tile is dz
// [rows, F]. Per element (row t, column j of dz) the node
//   - rounds dz to the element type (the value the unfused path stores and reads back); dz itself
//     is not stored (the kernel has no D: nothing reads dz after the activation's backward);
//   - loads a = h[t, gate(j)] and b = h[t, lin(j)] (Interleaved32: gate(j) = 64·⌊j/32⌋ + j%32,
//     lin(j) = gate(j) + 32) with 16-byte loads: the four lanes of a quad, which hold the same
//     rows and 2 columns of every 8-column chunk, first transpose their dz words so that each
//     lane holds whole chunks (8 columns: 16 bytes of gate, 16 of linear, contiguous in h and dh);
//     a warp's access then covers whole 32-byte sectors (with 4-byte accesses it covered halves,
//     and the epilogue cost several times more over the plain dgrad on the dsv3 step);
//   - writes dh[t, gate(j)] = p·dz·b·silu'(a) and dh[t, lin(j)] = p·dz·silu(a) with the SwiGLU
//     backward kernel's operations in its order (src/backends/cuda/activation.cu), so dh is bit-identical;
//   - sums dz·silu(a)·b over its chunks' columns per row; at the end of the tile the four threads of a
//     quad (which share rows) add their sums in a fixed order and lane 0 of the quad writes the
//     row's partial for this N tile: partial_g[row · n_tiles + n] (not for the N tile a 1x2
//     cluster pads past N, n == n_tiles: its slot is the next row's). A small kernel then adds the
//     partials of a row in n order (deterministic; differs from the unfused row sum only in the
//     order of the additions).
// Fragment layout this relies on (the forward node's, design/FUSED_EPILOGUE.md §3): element
// i = b + 2r + 4s + 8k of a visit() fragment sits at (row 8r, column b + 8s + 16k) relative to the
// thread's element 0, so elements (i, i + 1) with i even are adjacent columns of one row, and a
// thread's rows in a subtile are {0, 8}; epi_m moves them by kEpiRows, the subtile's rows: 64 for
// ping-pong; 128 for cooperative tiles, whose two warpgroups' 64-row halves sit in the threads'
// first coordinates.
template <class ElementH>
struct DSwiGluArgs {
  ElementH const* const* ptr_h = nullptr;  // [groups]: h + off_g·ldh
  ElementH* const* ptr_dh = nullptr;       // [groups]: dh + off_g·ldh
  float* const* ptr_partial = nullptr;     // [groups]: partial + off_g·n_tiles (null: no dp)
  int64_t ldh = 0;                         // 2F
  int n_tiles = 0;                         // ⌈F / tile N⌉
};

template <class ElementH, int kTileRows, int kEpiRows>
struct Sm90DSwiGluStore : StoreOnlyNode<DSwiGluArgs<ElementH>> {
  using Base = StoreOnlyNode<DSwiGluArgs<ElementH>>;
  using Base::Base;
  using typename Base::Arguments;
  using typename Base::Params;
  using ElementAux = ElementH;  // lets the collective name an element type even without D
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& a) {
    return a.ldh % 64 == 0;
  }

  static_assert(kTileRows % kEpiRows == 0, "whole epilogue subtiles along M");
  static constexpr int kRowSlots = kTileRows / kEpiRows * 2;  // (epi_m, r) rows a thread touches

  template <class CTensor, class Residue>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(ElementH const* h, ElementH* dh, float* partial,
                                          int64_t ldh, int n_tiles, int n_tile, int row0,
                                          int col0, CTensor tCcD, Residue residue)
        : h(h), dh(dh), partial(partial), ldh(ldh), n_tiles(n_tiles), n_tile(n_tile),
          row0(row0), col0(col0), tCcD(tCcD), residue(residue) {
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < kRowSlots; ++s) dp[s] = 0.0f;
    }
    ElementH const* h;
    ElementH* dh;
    float* partial;
    int64_t ldh;
    int n_tiles, n_tile;
    int row0, col0;
    CTensor tCcD;
    Residue residue;
    float dp[kRowSlots];  // this thread's running Σ dz·silu(a)·b per row slot

    template <class ElementAcc, class ElementP, int kFrag>
    CUTLASS_DEVICE cutlass::Array<ElementH, kFrag> visit(
        cutlass::Array<ElementAcc, kFrag> const& acc, int epi_v, int epi_m, int epi_n,
        cutlass::Array<ElementAcc, kFrag> const&, cutlass::Array<ElementP, kFrag> const& p) {
      static_assert(kFrag == 32, "the SwiGLU backward epilogue needs a 64-column epilogue tile");
      static_assert(sizeof(ElementH) == 2, "16-bit h: a column pair is one 32-bit word");
      // dz as the plain dgrad epilogue rounds it: round_to_nearest(acc + 0), its bias being a null
      // broadcast that reads as 0 (so -0 becomes +0 there too).
      cutlass::NumericConverter<ElementH, float, cutlass::FloatRoundStyle::round_to_nearest> round;
      cutlass::Array<ElementH, kFrag> dz;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kFrag; ++i) dz[i] = round(static_cast<float>(acc[i]) + 0.0f);
      // Word w = i / 2 holds the column pair (i, i + 1): row slot r = w % 2, 8-column chunk
      // c = w / 2 (columns 8c + 2q, 8c + 2q + 1 of the subtile, q = this lane's place in its quad).
      uint32_t words[kFrag / 2];
      memcpy(words, dz.data(), sizeof(words));
      // tCcD and residue are relative to this thread's element 0 of the tile, at (row0, col0) of
      // the group (CUTLASS: make_coord_tensor of the partition's layout, no offset).
      auto c = tCcD(cute::_, cute::_, cute::_, epi_m, epi_n);
      const int col_v = col0 + static_cast<int>(cute::get<1>(c(epi_v * kFrag)));  // group column
      const int q = (col_v >> 1) & 3;  // tiles and subtiles start at multiples of 8 columns
      const int chunk0 = col_v & ~7;   // the subtile's first column in the group
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < 2; ++r) {
        const int rel_row = static_cast<int>(cute::get<0>(c(epi_v * kFrag + 2 * r)));
        const float prob = static_cast<float>(p[2 * r]);  // one probability per row
        CUTLASS_PRAGMA_UNROLL
        for (int half = 0; half < 2; ++half) {
          // A 4x4 transpose of words inside the quad: afterwards this lane holds all four pairs
          // (8 columns) of chunk 4·half + q, so its h loads and dh stores are 16 bytes, and a
          // quad's four lanes cover 64 contiguous bytes of a row. Every lane shuffles (rows past
          // m_g too): a shuffle needs the whole warp.
          uint32_t mine[4], pairs[4] = {0u, 0u, 0u, 0u};
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < 4; ++j) mine[j] = words[r + 2 * (4 * half + j)];
          CUTLASS_PRAGMA_UNROLL
          for (int t = 0; t < 4; ++t) {
            const int j = q ^ t;  // the partner's place: its pair of my chunk, my pair of its
            uint32_t send = mine[0];
            CUTLASS_PRAGMA_UNROLL
            for (int jj = 1; jj < 4; ++jj) send = j == jj ? mine[jj] : send;
            const uint32_t got = t == 0 ? send : __shfl_xor_sync(0xffffffffu, send, t);
            CUTLASS_PRAGMA_UNROLL
            for (int jj = 0; jj < 4; ++jj) pairs[jj] = j == jj ? got : pairs[jj];
          }
          const int j = chunk0 + 8 * (4 * half + q);  // the chunk's first column in the group
          // A row past m_g, or a chunk past F (F % 32 == 0: chunks lie wholly inside or outside).
          if (rel_row >= static_cast<int>(cute::get<0>(residue)) ||
              j - col0 >= static_cast<int>(cute::get<1>(residue))) {
            continue;
          }
          const int64_t row = row0 + rel_row;
          const int64_t gate = (j >> 5) * 64 + (j & 31), lin = gate + 32;
          // 16-byte accesses: h and dh are 16-byte aligned (rejects()), 2F % 64 == 0, j % 8 == 0.
          const uint4 a_bits = *reinterpret_cast<const uint4*>(h + row * ldh + gate);
          const uint4 b_bits = *reinterpret_cast<const uint4*>(h + row * ldh + lin);
          ElementH a8[8], b8[8], g8[8], da[8], db[8];
          memcpy(a8, &a_bits, sizeof(a8));
          memcpy(b8, &b_bits, sizeof(b8));
          memcpy(g8, pairs, sizeof(g8));
          float sum = 0.0f;
          CUTLASS_PRAGMA_UNROLL
          for (int e = 0; e < 8; ++e) {
            const float a = static_cast<float>(a8[e]), b = static_cast<float>(b8[e]);
            const float g = static_cast<float>(g8[e]);
            const float sig = 1.0f / (1.0f + expf(-a));
            const float silu = __fmul_rn(a, sig);
            const float dsilu = __fmul_rn(sig, __fadd_rn(1.0f, __fmul_rn(a, __fsub_rn(1.0f, sig))));
            const float pdz = __fmul_rn(prob, g);
            da[e] = ElementH(__fmul_rn(__fmul_rn(pdz, b), dsilu));
            db[e] = ElementH(__fmul_rn(pdz, silu));
            sum = __fadd_rn(sum, __fmul_rn(g, __fmul_rn(silu, b)));
          }
          uint4 da_bits, db_bits;
          memcpy(&da_bits, da, sizeof(da_bits));
          memcpy(&db_bits, db, sizeof(db_bits));
          *reinterpret_cast<uint4*>(dh + row * ldh + gate) = da_bits;
          *reinterpret_cast<uint4*>(dh + row * ldh + lin) = db_bits;
          const int slot = epi_m * 2 + r;  // row slot: rows 0 / 8 of the subtile, then epi_m
          dp[slot] = __fadd_rn(dp[slot], sum);
        }
      }
      return dz;
    }

    CUTLASS_DEVICE void end() {
      // A 1x2 cluster pads the grid with a CTA whose N tile lies wholly past N (n_tile ==
      // n_tiles): it has no columns, and its row-valid lanes must not write (its slot would be the
      // next row's first partial).
      if (partial == nullptr || n_tile >= n_tiles) return;
      // The quad's four lanes hold the same rows: fixed-order sum (xor 1, then xor 2).
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < kRowSlots; ++s) {
        dp[s] = __fadd_rn(dp[s], __shfl_xor_sync(0xffffffffu, dp[s], 1));
        dp[s] = __fadd_rn(dp[s], __shfl_xor_sync(0xffffffffu, dp[s], 2));
      }
      if (threadIdx.x % 4 != 0) return;
      auto c = tCcD(cute::_, cute::_, cute::_, 0, 0);
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < kRowSlots; ++s) {
        const int rel = static_cast<int>(cute::get<0>(c(0))) + (s >> 1) * kEpiRows + (s & 1) * 8;
        if (rel >= static_cast<int>(cute::get<0>(residue))) continue;
        partial[static_cast<int64_t>(row0 + rel) * n_tiles + n_tile] = dp[s];
      }
    }
  };

  template <bool kReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    static_assert(cute::size<0>(decltype(args.epi_tile){}) == kEpiRows,
                  "the row slots follow the epilogue subtile's rows");
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    const Params& prm = *this->params_ptr;
    const int row0 = static_cast<int>(M) - static_cast<int>(cute::get<0>(args.residue_tCcD));
    const int col0 = static_cast<int>(N) - static_cast<int>(cute::get<1>(args.residue_tCcD));
    return ConsumerStoreCallbacks<decltype(args.tCcD), decltype(args.residue_tCcD)>(
        prm.ptr_h[l], prm.ptr_dh[l], prm.ptr_partial ? prm.ptr_partial[l] : nullptr, prm.ldh,
        prm.n_tiles, static_cast<int>(n), row0, col0, args.tCcD, args.residue_tCcD);
  }
};

}  // namespace moekit::cuda::sm90
