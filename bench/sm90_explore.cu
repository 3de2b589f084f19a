// Tile configurations under study for the sm90 group-M grouped GEMM — bench only (sm90_check
// --only explore), never part of libmoekit. bf16, K-major B (fprop). Built by
// bench/sm90_check.sh build, next to the library's instances.
#include "cuda/sm90/group_m_kernel.cuh"

namespace moekit::cuda::sm90 {

struct ExploreCoop128x256C2x1 {  // B (weights) multicast to the 2 CTAs of an M pair
  using Schedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
  using Tile = cute::Shape<cute::_128, cute::_256, cute::_64>;
  using Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
};
struct ExploreCoop256x128C2x1 {
  using Schedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
  using Tile = cute::Shape<cute::_256, cute::_128, cute::_64>;
  using Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
};
struct ExplorePingpong128x128C1x2 {
  using Schedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
  using Tile = cute::Shape<cute::_128, cute::_128, cute::_64>;
  using Cluster = cute::Shape<cute::_1, cute::_2, cute::_1>;
};

extern const GroupMInstance explore_coop_128x256_c2x1, explore_coop_256x128_c2x1,
    explore_pingpong_128x128_c1x2;
MOEKIT_SM90_GROUP_M_INSTANCE(explore_coop_128x256_c2x1, DType::BF16, true, ExploreCoop128x256C2x1,
                             "bf16 b:k-major coop 128x256x64 cluster 2x1")
MOEKIT_SM90_GROUP_M_INSTANCE(explore_coop_256x128_c2x1, DType::BF16, true, ExploreCoop256x128C2x1,
                             "bf16 b:k-major coop 256x128x64 cluster 2x1")
MOEKIT_SM90_GROUP_M_INSTANCE(explore_pingpong_128x128_c1x2, DType::BF16, true,
                             ExplorePingpong128x128C1x2, "bf16 b:k-major pingpong 128x128x64 cluster 1x2")

}  // namespace moekit::cuda::sm90
