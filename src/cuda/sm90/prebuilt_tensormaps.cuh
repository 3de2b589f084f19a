// Internal: every group's TMA descriptors built once per call by the setup kernel, instead of by
// each CTA whenever its next tile is in another group.
//
// CUTLASS 4.2's ptr-array grouped kernels keep one copy of the A, B, C and D descriptors per SM in
// global memory and rewrite it on every group change: the producer warp (and warp 0 of each
// consumer warpgroup for D, the epilogue load warp for C) copies the template to shared memory,
// replaces the address, dims and strides there, copies it out with a GPU-scope release
// (`tensormap.cp_fenceproxy … release.gpu`; the epilogue also drains its TMA stores first), and
// acquires it before the next tile's first TMA. On small groups every tile a CTA takes starts a
// new group, and ncu puts 10.6% of small_E64 fprop's stall samples on each tile's first k-block
// (bench/results/2026-11-30-nvidia-h200-43c1e0e-mlp.md). Here the setup kernel writes group g's
// descriptors to slots [g·kGroupTensormaps + {A, B, C, D}] of the call's workspace, with the same
// replacements CUTLASS makes (encode_group_tensormap), and the collectives below only point the
// kernel's descriptor pointers at them: no copy, no release; the acquire before first use stays
// (the tensormap proxy is not acquired at kernel start: PTX ISA, memory consistency model).
//
// How it plugs in (CUTLASS 4.2, gemm/kernel/sm90_gemm_array_tma_warpspecialized_{pingpong,
// cooperative}.hpp): the kernels hold the descriptor pointers in non-const locals and pass them to
// the collective's tensormaps_perform_update; the overloads here take them by reference and
// assign them. They hide the base overloads, so a CUTLASS that passes them otherwise fails to
// compile rather than falling back. The slots reach the collectives' Params through the problem
// shape (BlockedGroupProblemShape::tensormaps), which to_underlying_arguments receives. Without
// them (null: env MOEKIT_SM90_PREBUILT_TENSORMAPS=0, for A/B runs) the collectives take CUTLASS's
// own path; each collective object remembers which from its *_init call (it is a per-thread local
// of the kernel, and the release calls do not get the Params).
#pragma once

#include <type_traits>

#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/tensor.hpp>

namespace moekit::cuda::sm90 {

// Descriptor slots per group, in this order.
inline constexpr int kGroupTensormaps = 4;
enum TensormapSlot : int { kSlotA = 0, kSlotB = 1, kSlotC = 2, kSlotD = 3 };

CUTLASS_DEVICE cute::TmaDescriptor* group_tensormap(const cute::TmaDescriptor* slots, int32_t group,
                                                    int slot) {
  return const_cast<cute::TmaDescriptor*>(slots) + int64_t{group} * kGroupTensormaps + slot;
}

// The mainloop collective `Base` (CUTLASS's MainloopSm90ArrayTmaGmmaWarpSpecialized) on the
// prebuilt A and B descriptors.
template <class Base>
struct PrebuiltMainloop : Base {
  using typename Base::TensorMapStorage;
  struct Params : Base::Params {
    const cute::TmaDescriptor* group_tensormaps = nullptr;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape problem_shapes, typename Base::Arguments const& args,
                                        void* workspace) {
    Params p;
    static_cast<typename Base::Params&>(p) = Base::to_underlying_arguments(problem_shapes, args, workspace);
    p.group_tensormaps = problem_shapes.tensormaps;
    return p;
  }

  // No per-SM copy: the pointers are set on each group change (below).
  CUTLASS_DEVICE auto tensormaps_init(Params const& params, TensorMapStorage& smem, int32_t sm_count,
                                      int32_t sm_idx) {
    prebuilt_ = params.group_tensormaps != nullptr;
    if (!prebuilt_) return Base::tensormaps_init(params, smem, sm_count, sm_idx);
    return cute::make_tuple(static_cast<cute::TmaDescriptor*>(nullptr),
                            static_cast<cute::TmaDescriptor*>(nullptr));
  }
  template <class TensorMapA, class TensorMapB, class ProblemShape_MNKL>
  CUTLASS_DEVICE void tensormaps_perform_update(TensorMapStorage& smem, Params const& params,
                                                cute::tuple<TensorMapA, TensorMapB>& tensormaps,
                                                ProblemShape_MNKL shape, int32_t next_batch) {
    if (!prebuilt_) return Base::tensormaps_perform_update(smem, params, tensormaps, shape, next_batch);
    cute::get<0>(tensormaps) = group_tensormap(params.group_tensormaps, next_batch, kSlotA);
    cute::get<1>(tensormaps) = group_tensormap(params.group_tensormaps, next_batch, kSlotB);
  }
  template <class TensorMapA, class TensorMapB>
  CUTLASS_DEVICE void tensormaps_cp_fence_release(TensorMapStorage& smem,
                                                  cute::tuple<TensorMapA, TensorMapB>& tensormaps) {
    if (!prebuilt_) Base::tensormaps_cp_fence_release(smem, tensormaps);
  }

 private:
  bool prebuilt_ = true;
};

// The epilogue collective `Base` (CUTLASS's CollectiveEpilogue<Sm90PtrArrayTmaWarpSpecialized…>)
// on the prebuilt C and D descriptors.
template <class Base>
struct PrebuiltEpilogue : Base {
  using Base::Base;
  using typename Base::TensorMapStorage;
  struct Params : Base::Params {
    const cute::TmaDescriptor* group_tensormaps = nullptr;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shapes, typename Base::Arguments const& args,
                                        void* workspace) {
    Params p;
    static_cast<typename Base::Params&>(p) = Base::to_underlying_arguments(problem_shapes, args, workspace);
    p.group_tensormaps = problem_shapes.tensormaps;
    return p;
  }

  CUTLASS_DEVICE auto load_init(Params const& params, TensorMapStorage& smem, int32_t sm_count, int32_t sm_idx) {
    prebuilt_ = params.group_tensormaps != nullptr;
    if (!prebuilt_) return Base::load_init(params, smem, sm_count, sm_idx);
    return cute::make_tuple(static_cast<cute::TmaDescriptor*>(nullptr));
  }
  CUTLASS_DEVICE auto store_init(Params const& params, TensorMapStorage& smem, int32_t sm_count, int32_t sm_idx,
                                 int32_t warp_group) {
    prebuilt_ = params.group_tensormaps != nullptr;
    if (!prebuilt_) return Base::store_init(params, smem, sm_count, sm_idx, warp_group);
    return cute::make_tuple(static_cast<cute::TmaDescriptor*>(nullptr));
  }
  template <bool IsLoad, class ProblemShape_MNKL>
  CUTLASS_DEVICE void tensormaps_perform_update(TensorMapStorage& smem, Params const& params,
                                                cute::TmaDescriptor*& tensormap, ProblemShape_MNKL shape,
                                                int32_t next_batch, int32_t warp_group) {
    if (!prebuilt_) {
      return Base::template tensormaps_perform_update<IsLoad>(smem, params, tensormap, shape, next_batch,
                                                              warp_group);
    }
    tensormap = group_tensormap(params.group_tensormaps, next_batch, IsLoad ? kSlotC : kSlotD);
  }
  template <bool IsLoad>
  CUTLASS_DEVICE void tensormaps_cp_fence_release(TensorMapStorage& smem, cute::TmaDescriptor* tensormap,
                                                  int32_t warp_group = 0) {
    if (!prebuilt_) Base::template tensormaps_cp_fence_release<IsLoad>(smem, tensormap, warp_group);
  }

 private:
  bool prebuilt_ = true;
};

// One descriptor as CUTLASS's tensormaps_replace_global_address and
// tensormaps_replace_global_tensor_properties make it: the template `tma` (encoded on the host
// by to_underlying_arguments) with the address `ptr` and a (rows, cols, 1) tensor of `stride`, in
// shared memory `desc` (one thread).
template <class Element, class Tma, class Shape, class Stride>
CUTLASS_DEVICE void encode_group_tensormap(Tma const& tma, Element const* ptr, Shape shape, Stride stride,
                                           cute::TmaDescriptor& desc) {
  desc = *tma.get_tma_descriptor();
  cute::tma_descriptor_replace_addr_in_shared_mem(desc, ptr);
  cute::array<uint32_t, 5> dims = {1, 1, 1, 1, 1};
  cute::array<uint64_t, 5> strides = {0, 0, 0, 0, 0};
  auto tensor = cute::make_tensor(static_cast<Element const*>(nullptr), cute::make_layout(shape, stride));
  cute::detail::fill_tma_gmem_shape_stride(tma, tensor, dims, strides);
  for (uint64_t& s : strides) s = s * cute::sizeof_bits_v<Element> / 8;
  cute::tma_descriptor_replace_dims_strides_in_shared_mem(desc, dims, strides);
}

// Setup kernels (after the per-group arrays are written and visible to the block): the
// descriptors of every group with tiles, in rounds of one per thread. Item i is slot
// (i / 32) % kGroupTensormaps (warp-uniform, so the branch is) of group (i / 128)·32 + i % 32: the
// thread encodes it in its own `staging[threadIdx.x]` (128-byte aligned shared memory) and notes
// its destination in `target[threadIdx.x]` (-1: nothing); then warp 0 alone copies the round out,
// eight lanes per descriptor (coalesced 16-byte stores), and after the last round releases them
// all to the tensormap proxy with one fence per lane — 32 fencing threads whatever the group count.
// (History, small_E64's 256 groups: CUTLASS's warp-collective copy-and-release per descriptor,
// one warp per group, cost its fprop and dgrad 10-12% of the call at cda6ba7; each thread storing
// and fencing its own descriptors (6453b23) still took the setup kernel ~10 µs against ~5 without
// descriptors: ncu, bench/results/2026-11-30-nvidia-h200-6453b23-prebuilt-tensormaps.md.)
// `shape(g)` is group g's (M, N, K); M == 0: no tiles, nothing built. Every thread of the block
// calls it (it synchronises the block).
template <class Kernel, class ShapeOf>
CUTLASS_DEVICE void build_group_tensormaps(typename Kernel::CollectiveMainloop::Params const& mainloop,
                                           typename Kernel::CollectiveEpilogue::Params const& epilogue,
                                           int64_t groups, ShapeOf shape_of, cute::TmaDescriptor* staging,
                                           int64_t* target, int study = 0) {
  using Epilogue = typename Kernel::CollectiveEpilogue;
  if (mainloop.group_tensormaps == nullptr) return;  // CUTLASS's path (MOEKIT_SM90_PREBUILT_TENSORMAPS=0)
  constexpr int kWords = sizeof(cute::TmaDescriptor) / sizeof(uint4);  // 8 lanes per descriptor
  static_assert(kWords == 8);
  const int lane = static_cast<int>(threadIdx.x % 32), threads = static_cast<int>(blockDim.x);
  cute::TmaDescriptor& mine = staging[threadIdx.x];
  constexpr bool kSource = !std::is_void_v<typename Epilogue::ElementC>;
  constexpr bool kDestination = !std::is_void_v<typename Epilogue::ElementD>;
  bool source = false;
  if constexpr (kSource) source = epilogue.ptr_C != nullptr;
  bool built = false;
  const int64_t items = (groups + 31) / 32 * 32 * kGroupTensormaps;
  for (int64_t round = 0; round < items; round += threads) {
    const int64_t i = round + threadIdx.x;
    const int slot = static_cast<int>(i / 32 % kGroupTensormaps);
    const int64_t g = i / (32 * kGroupTensormaps) * 32 + lane;
    int64_t to = -1;
    int m = 0, n = 0, k = 0;
    if (g < groups) {
      const auto shape = shape_of(g);
      m = cute::get<0>(shape), n = cute::get<1>(shape), k = cute::get<2>(shape);
    }
    if (m > 0) {
      const auto mk = cute::make_shape(m, k, cute::Int<1>{}), nk = cute::make_shape(n, k, cute::Int<1>{});
      const auto mn = cute::make_shape(m, n, cute::Int<1>{});
      to = g * kGroupTensormaps + slot;
      if (study == 1) {  // STUDY (temporary): the loads only
        const void* p = slot == kSlotA ? static_cast<const void*>(mainloop.ptr_A[g])
                                       : static_cast<const void*>(mainloop.ptr_B[g]);
        to = p == nullptr ? -2 : -1;
      } else if (slot == kSlotA) {
        encode_group_tensormap(mainloop.tma_load_a, mainloop.ptr_A[g], mk, mainloop.dA[g], mine);
      } else if (slot == kSlotB) {
        encode_group_tensormap(mainloop.tma_load_b, mainloop.ptr_B[g], nk, mainloop.dB[g], mine);
      } else if (slot == kSlotC) {
        if constexpr (kSource) {
          if (source) encode_group_tensormap(epilogue.tma_load_c, epilogue.ptr_C[g], mn, epilogue.dC[g], mine);
          else to = -1;
        } else {
          to = -1;
        }
      } else {
        if constexpr (kDestination) encode_group_tensormap(epilogue.tma_store_d, epilogue.ptr_D[g], mn, epilogue.dD[g], mine);
        else to = -1;
      }
    }
    target[threadIdx.x] = to;
    __syncthreads();
    if (threadIdx.x < 32 && study != 1 && study != 2) {
      const int word = lane % kWords;
      auto* out = reinterpret_cast<uint4*>(const_cast<cute::TmaDescriptor*>(mainloop.group_tensormaps));
      for (int d = lane / kWords; d < threads; d += 32 / kWords) {
        if (target[d] < 0) continue;
        out[target[d] * kWords + word] = reinterpret_cast<const uint4*>(&staging[d])[word];
        built = true;
      }
    }
    __syncthreads();  // staging and target are rewritten by the next round
  }
  if (built && study != 3) cute::tma_descriptor_fence_release();
}

}  // namespace moekit::cuda::sm90
