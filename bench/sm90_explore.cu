// Tile configurations under study for the sm90 group-M grouped GEMM — bench only (sm90_check
// --only explore), never part of libmoekit. bf16, both B layouts (K-major: fprop, N-major: dgrad).
// Built by bench/sm90_check.sh build, next to the library's instances.
//
// Now: the cooperative 256x128x64 tile with a 1x2 cluster — the library's kLarge up to b73d54f,
// kept here so that the new kLarge (ping-pong 128x128x64, cluster 1x2) is measured against it in
// the same process. (The first tile study's other variants — coop 128x256 c2x1, coop 256x128
// c2x1, ping-pong 128x128 c1x2 — are in git history, commit b73d54f.)
#include "cuda/sm90/group_m_kernel.cuh"

namespace moekit::cuda::sm90 {

struct ExploreCoop256x128C1x2 {
  using Schedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
  using Tile = cute::Shape<cute::_256, cute::_128, cute::_64>;
  using Cluster = cute::Shape<cute::_1, cute::_2, cute::_1>;
};

extern const GroupMInstance explore_coop_256x128_c1x2_kmajor, explore_coop_256x128_c1x2_nmajor;
MOEKIT_SM90_GROUP_M_INSTANCE(explore_coop_256x128_c1x2_kmajor, DType::BF16, true,
                             ExploreCoop256x128C1x2, "bf16 b:k-major coop 256x128x64 cluster 1x2")
MOEKIT_SM90_GROUP_M_INSTANCE(explore_coop_256x128_c1x2_nmajor, DType::BF16, false,
                             ExploreCoop256x128C1x2, "bf16 b:n-major coop 256x128x64 cluster 1x2")

}  // namespace moekit::cuda::sm90
