// Internal: every group's TMA descriptors built once per call by the setup kernel, instead of by
// each CTA whenever its next tile is in another group.
//
// CUTLASS 4.2's ptr-array grouped kernels keep one copy of the A, B, C and D descriptors per SM in
// global memory and rewrite it on every group change: the producer warp (and warp 0 of each
// consumer warpgroup for D, the epilogue load warp for C) copies the template to shared memory,
// replaces the address, dims and strides there, copies it out with a GPU-scope release
// (`tensormap.cp_fenceproxy … release.gpu`; the epilogue also drains its TMA stores first), and
// acquires it before the next tile's first TMA. On small groups every tile a CTA takes starts a
// new group, and those rewrites stalled each tile's first k-block (design/PERFORMANCE.md, "What
// holds each target": small_E64). Here the setup kernel writes group g's
// descriptors to slots [g·kGroupTensormaps + {A, B, C, D}] of the call's workspace, with the same
// replacements CUTLASS makes (tensormap_fields), and the collectives below only point the
// kernel's descriptor pointers at them: no copy, no release; the acquire before first use stays
// (the tensormap proxy is not acquired at kernel start: PTX ISA, memory consistency model).
//
// How it plugs in (CUTLASS 4.2, gemm/kernel/sm90_gemm_array_tma_warpspecialized_{pingpong,
// cooperative}.hpp): the kernels hold the descriptor pointers in non-const locals and pass them to
// the collective's tensormaps_perform_update; the overloads here take them by reference and
// assign them. They hide the base overloads, so a CUTLASS that passes them otherwise fails to
// compile rather than falling back. The slots reach the collectives' Params through the problem
// shape (BlockedGroupProblemShape::tensormaps), which to_underlying_arguments receives. Without
// them (null: the study override's prebuilt_tensormaps=0, for A/B runs) the collectives take CUTLASS's
// own path; each collective object remembers which from its *_init call (it is a per-thread local
// of the kernel, and the release calls do not get the Params). That path is compiled into study
// builds only (MOEKIT_SM90_STUDY_OVERRIDE): the product's kernels hold no second descriptor path
// (it cost registers: two block-scaled wgrad instances spilled in it, 2026-12-06).
#pragma once

#include <type_traits>

#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/tensor.hpp>

namespace moekit::cuda::sm90 {

// Whether the kernels keep CUTLASS's own descriptor path beside the prebuilt one (see above).
#if defined(MOEKIT_SM90_STUDY_OVERRIDE)
inline constexpr bool kCutlassTensormapPath = true;
#else
inline constexpr bool kCutlassTensormapPath = false;
#endif

// Descriptor slots per group, in this order.
inline constexpr int kGroupTensormaps = 4;
enum TensormapSlot : int { kSlotA = 0, kSlotB = 1, kSlotC = 2, kSlotD = 3 };
// 16-byte words of a descriptor (a warp copies four descriptors per store instruction).
inline constexpr int kTensormapWords = sizeof(cute::TmaDescriptor) / sizeof(uint4);
static_assert(kTensormapWords == 8);

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
    prebuilt_ = !kCutlassTensormapPath || params.group_tensormaps != nullptr;
    if constexpr (kCutlassTensormapPath) {
      if (!prebuilt_) return Base::tensormaps_init(params, smem, sm_count, sm_idx);
    }
    return cute::make_tuple(static_cast<cute::TmaDescriptor*>(nullptr),
                            static_cast<cute::TmaDescriptor*>(nullptr));
  }
  template <class TensorMapA, class TensorMapB, class ProblemShape_MNKL>
  CUTLASS_DEVICE void tensormaps_perform_update(TensorMapStorage& smem, Params const& params,
                                                cute::tuple<TensorMapA, TensorMapB>& tensormaps,
                                                ProblemShape_MNKL shape, int32_t next_batch) {
    if constexpr (kCutlassTensormapPath) {
      if (!prebuilt_) return Base::tensormaps_perform_update(smem, params, tensormaps, shape, next_batch);
    }
    cute::get<0>(tensormaps) = group_tensormap(params.group_tensormaps, next_batch, kSlotA);
    cute::get<1>(tensormaps) = group_tensormap(params.group_tensormaps, next_batch, kSlotB);
  }
  template <class TensorMapA, class TensorMapB>
  CUTLASS_DEVICE void tensormaps_cp_fence_release(TensorMapStorage& smem,
                                                  cute::tuple<TensorMapA, TensorMapB>& tensormaps) {
    if constexpr (kCutlassTensormapPath) {
      if (!prebuilt_) Base::tensormaps_cp_fence_release(smem, tensormaps);
    }
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
    prebuilt_ = !kCutlassTensormapPath || params.group_tensormaps != nullptr;
    if constexpr (kCutlassTensormapPath) {
      if (!prebuilt_) return Base::load_init(params, smem, sm_count, sm_idx);
    }
    return cute::make_tuple(static_cast<cute::TmaDescriptor*>(nullptr));
  }
  CUTLASS_DEVICE auto store_init(Params const& params, TensorMapStorage& smem, int32_t sm_count, int32_t sm_idx,
                                 int32_t warp_group) {
    prebuilt_ = !kCutlassTensormapPath || params.group_tensormaps != nullptr;
    if constexpr (kCutlassTensormapPath) {
      if (!prebuilt_) return Base::store_init(params, smem, sm_count, sm_idx, warp_group);
    }
    return cute::make_tuple(static_cast<cute::TmaDescriptor*>(nullptr));
  }
  template <bool IsLoad, class ProblemShape_MNKL>
  CUTLASS_DEVICE void tensormaps_perform_update(TensorMapStorage& smem, Params const& params,
                                                cute::TmaDescriptor*& tensormap, ProblemShape_MNKL shape,
                                                int32_t next_batch, int32_t warp_group) {
    if constexpr (kCutlassTensormapPath) {
      if (!prebuilt_) {
        return Base::template tensormaps_perform_update<IsLoad>(smem, params, tensormap, shape, next_batch,
                                                                warp_group);
      }
    }
    tensormap = group_tensormap(params.group_tensormaps, next_batch, IsLoad ? kSlotC : kSlotD);
  }
  template <bool IsLoad>
  CUTLASS_DEVICE void tensormaps_cp_fence_release(TensorMapStorage& smem, cute::TmaDescriptor* tensormap,
                                                  int32_t warp_group = 0) {
    if constexpr (kCutlassTensormapPath) {
      if (!prebuilt_) Base::template tensormaps_cp_fence_release<IsLoad>(smem, tensormap, warp_group);
    }
  }
  // The kernels update the store descriptor in warp 0 of each consumer warpgroup only (the warp
  // whose elected thread issues the TMA stores) but acquire it in every thread: with CUTLASS's
  // per-SM copy all of them hold its address, here warps 1-3 still hold store_init's null, and an
  // acquire of address 0 is not one to make. They issue nothing with it: no acquire.
  template <bool IsLoad>
  CUTLASS_DEVICE void tensormaps_fence_acquire(cute::TmaDescriptor const* tensormap) {
    if (!prebuilt_ || tensormap != nullptr) Base::template tensormaps_fence_acquire<IsLoad>(tensormap);
  }

 private:
  bool prebuilt_ = true;
};

// What distinguishes one group's descriptor from the template: the address, and the (rows, cols, 1)
// tensor of `stride` as CUTLASS's tensormaps_replace_global_tensor_properties puts it (dims, and
// strides in bytes; strides[0] is implicit).
struct TensormapFields {
  uint64_t address = 0;
  cute::array<uint32_t, 5> dims = {1, 1, 1, 1, 1};
  cute::array<uint64_t, 5> strides = {0, 0, 0, 0, 0};
};
template <class Element, class Tma, class Shape, class Stride>
CUTLASS_DEVICE TensormapFields tensormap_fields(Tma const& tma, Element const* ptr, Shape shape,
                                                Stride stride) {
  TensormapFields f;
  f.address = reinterpret_cast<uint64_t>(ptr);
  auto tensor = cute::make_tensor(static_cast<Element const*>(nullptr), cute::make_layout(shape, stride));
  cute::detail::fill_tma_gmem_shape_stride(tma, tensor, f.dims, f.strides);
  for (uint64_t& s : f.strides) s = s * cute::sizeof_bits_v<Element> / 8;
  return f;
}

// One field of a descriptor in shared memory (CuTe replaces all dims and strides at once).
template <int I>
CUTLASS_DEVICE void replace_tensormap_dim(uint32_t smem_desc, uint32_t dim) {
  asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], %1, %2;"
               :: "r"(smem_desc), "n"(I), "r"(dim) : "memory");
}
template <int I>
CUTLASS_DEVICE void replace_tensormap_stride(uint32_t smem_desc, uint64_t stride) {
  asm volatile("tensormap.replace.tile.global_stride.shared::cta.b1024.b64 [%0], %1, %2;"
               :: "r"(smem_desc), "n"(I), "l"(stride) : "memory");
}

// One warp's 32 descriptors of one operand, one per lane (`valid`: the lane has one; `f` its
// fields), in the warp's `staging[0, 32)` (shared memory, 128-byte aligned). Lanes' descriptors are
// 128 bytes apart, so the same field of every lane is in the same bank: each replacement made by
// all lanes is a 32-way conflict, which is what building the descriptors cost (ten replacements
// a lane, on small_E64 about 1% of the call). So the first valid lane alone makes the
// template into its descriptor with all of them, the warp copies that one into the other 31 slots
// (eight lanes per descriptor, conflict-free), and each other lane replaces only the address and
// the dims and strides that differ from the first lane's (for group-M: the rows, if any). Returns
// with the descriptors in staging, after a __syncwarp.
CUTLASS_DEVICE void build_warp_tensormaps(cute::TmaDescriptor const* tmpl, bool valid,
                                          TensormapFields const& f, cute::TmaDescriptor* staging) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const unsigned valid_lanes = __ballot_sync(0xffffffffu, valid);
  if (valid_lanes == 0) return;
  const int first = __ffs(valid_lanes) - 1;
  if (lane == first) {
    staging[lane] = *tmpl;
    cute::tma_descriptor_replace_addr_in_shared_mem(staging[lane], reinterpret_cast<void const*>(f.address));
    cute::tma_descriptor_replace_dims_strides_in_shared_mem(staging[lane], f.dims, f.strides);
  }
  __syncwarp();
  constexpr int kWords = kTensormapWords;
  const uint4 word = reinterpret_cast<const uint4*>(&staging[first])[lane % kWords];
  for (int d = lane / kWords; d < 32; d += 32 / kWords) {
    if (d != first) reinterpret_cast<uint4*>(&staging[d])[lane % kWords] = word;
  }
  cute::array<uint32_t, 5> dims;
  cute::array<uint64_t, 5> strides;
  for (int i = 0; i < 5; ++i) dims[i] = __shfl_sync(0xffffffffu, f.dims[i], first);
  for (int i = 1; i < 5; ++i) strides[i] = __shfl_sync(0xffffffffu, f.strides[i], first);
  __syncwarp();
  if (valid && lane != first) {
    cute::TmaDescriptor& mine = staging[lane];
    cute::tma_descriptor_replace_addr_in_shared_mem(mine, reinterpret_cast<void const*>(f.address));
    const uint32_t at = cute::cast_smem_ptr_to_uint(&mine);
    if (f.dims[0] != dims[0]) replace_tensormap_dim<0>(at, f.dims[0]);
    if (f.dims[1] != dims[1]) replace_tensormap_dim<1>(at, f.dims[1]);
    if (f.dims[2] != dims[2]) replace_tensormap_dim<2>(at, f.dims[2]);
    if (f.dims[3] != dims[3]) replace_tensormap_dim<3>(at, f.dims[3]);
    if (f.dims[4] != dims[4]) replace_tensormap_dim<4>(at, f.dims[4]);
    if (f.strides[1] != strides[1]) replace_tensormap_stride<0>(at, f.strides[1]);
    if (f.strides[2] != strides[2]) replace_tensormap_stride<1>(at, f.strides[2]);
    if (f.strides[3] != strides[3]) replace_tensormap_stride<2>(at, f.strides[3]);
    if (f.strides[4] != strides[4]) replace_tensormap_stride<3>(at, f.strides[4]);
  }
  __syncwarp();
}

// Setup kernels (after the per-group arrays are written and visible to the block): the
// descriptors of every group with tiles. Work item i of a warp is one slot (i % kGroupTensormaps,
// warp-uniform) of 32 groups, one per lane: built in the warp's 32 slots of `staging` (one per
// thread of the block; build_warp_tensormaps), then copied to the groups' slots with coalesced
// 16-byte stores (eight lanes per descriptor), and after the last one released to the tensormap
// proxy with one fence per lane that stored. No block-wide synchronisation. (One warp per group
// with CUTLASS's warp-collective copy-and-release per descriptor, and one descriptor per thread
// with bank-conflicted replacements, both cost the small-group calls more: design/
// PERFORMANCE-LOG.md, the prebuilt descriptors.)
// `shape(g)` is group g's (M, N, K); M == 0: no tiles, nothing built.
template <class Kernel, class ShapeOf>
CUTLASS_DEVICE void build_group_tensormaps(typename Kernel::CollectiveMainloop::Params const& mainloop,
                                           typename Kernel::CollectiveEpilogue::Params const& epilogue,
                                           int64_t groups, ShapeOf shape_of, cute::TmaDescriptor* staging) {
  using Epilogue = typename Kernel::CollectiveEpilogue;
  if (mainloop.group_tensormaps == nullptr) return;  // CUTLASS's path (study prebuilt_tensormaps=0)
  constexpr int kWords = kTensormapWords;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int warps = static_cast<int>(blockDim.x / 32);
  cute::TmaDescriptor* warp_staging = staging + warp * 32;
  auto* out = reinterpret_cast<uint4*>(const_cast<cute::TmaDescriptor*>(mainloop.group_tensormaps));
  constexpr bool kSource = !std::is_void_v<typename Epilogue::ElementC>;
  constexpr bool kDestination = !std::is_void_v<typename Epilogue::ElementD>;
  bool source = false;
  if constexpr (kSource) source = epilogue.ptr_C != nullptr;
  bool stored = false;
  const int64_t items = (groups + 31) / 32 * kGroupTensormaps;
  for (int64_t i = warp; i < items; i += warps) {
    const int slot = static_cast<int>(i % kGroupTensormaps);
    if (slot == kSlotC && !(kSource && source)) continue;
    if (slot == kSlotD && !kDestination) continue;
    const int64_t g = i / kGroupTensormaps * 32 + lane;
    int m = 0, n = 0, k = 0;
    TensormapFields f;
    cute::TmaDescriptor const* tmpl = nullptr;
    // The slot's pointer and stride are loaded with the shape, before it is looked at: one trip to
    // L2 for the three, where loading them once the shape said the group has rows took two.
    const auto fields = [&](auto const& tma, auto const* ptrs, auto const* strides, auto extents) {
      tmpl = tma.get_tma_descriptor();
      if (g >= groups) return;
      const auto shape = shape_of(g);
      const auto ptr = ptrs[g];
      const auto stride = strides[g];
      m = cute::get<0>(shape), n = cute::get<1>(shape), k = cute::get<2>(shape);
      if (m > 0) f = tensormap_fields(tma, ptr, extents(m, n, k), stride);
    };
    const auto mk = [](int m, int, int k) { return cute::make_shape(m, k, cute::Int<1>{}); };
    const auto nk = [](int, int n, int k) { return cute::make_shape(n, k, cute::Int<1>{}); };
    const auto mn = [](int m, int n, int) { return cute::make_shape(m, n, cute::Int<1>{}); };
    if (slot == kSlotA) {
      fields(mainloop.tma_load_a, mainloop.ptr_A, mainloop.dA, mk);
    } else if (slot == kSlotB) {
      fields(mainloop.tma_load_b, mainloop.ptr_B, mainloop.dB, nk);
    } else if (slot == kSlotC) {
      if constexpr (kSource) fields(epilogue.tma_load_c, epilogue.ptr_C, epilogue.dC, mn);
    } else {
      if constexpr (kDestination) fields(epilogue.tma_store_d, epilogue.ptr_D, epilogue.dD, mn);
    }
    const bool valid = m > 0;
    build_warp_tensormaps(tmpl, valid, f, warp_staging);
    // Lane l copies word l % 8 of descriptors l / 8, l / 8 + 4, ...: each store instruction
    // writes four whole descriptors.
    const int64_t to = valid ? g * kGroupTensormaps + slot : -1;
    for (int d = 0; d < 32; d += 32 / kWords) {
      const int64_t dst = __shfl_sync(0xffffffffu, to, d + lane / kWords);
      if (dst < 0) continue;
      const auto* from = reinterpret_cast<const uint4*>(&warp_staging[d + lane / kWords]);
      out[dst * kWords + lane % kWords] = from[lane % kWords];
      stored = true;
    }
    __syncwarp();  // the warp's staging is rewritten by its next item
  }
  if (stored) cute::tma_descriptor_fence_release();
}

}  // namespace moekit::cuda::sm90
