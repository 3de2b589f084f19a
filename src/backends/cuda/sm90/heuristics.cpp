// The rules of heuristics.h applied: each answer mapped onto a compiled instance (instances/), the
// study override (bench/studies/sm90_study_settings.h; its parser bench/studies/sm90_study_override.h, compiled only
// into a study build) read here and nowhere else.
#include "backends/cuda/sm90/heuristics.h"

#include <unistd.h>  // environ

#include <cstdlib>
#include <string_view>
#include <string>
#include <vector>

#include "backends/cuda/sm90/device/grouped_gemm_sm90.h"
#include "backends/cuda/sm90/instances/group_k_instances.h"
#include "backends/cuda/sm90/instances/group_m_instances.h"
#include "moekit/core/error.h"
#include "../../../../bench/studies/sm90_study_settings.h"  // the study knobs (all -1 in the product)
#if MOEKIT_SM90_STUDY_OVERRIDE
#include "../../../../bench/studies/sm90_study_override.h"  // a study build's parser
#endif

namespace moekit::cuda::sm90 {

namespace {
// The study override is read only by a study build (-DMOEKIT_SM90_STUDY_OVERRIDE=ON): the product
// reads no study setting. Either way a MOEKIT_SM90_* variable this build does not read (a typo,
// one of the variables the study override replaced, or the override in a product build) is an
// error, not silently ignored.
StudySettings read_study_settings() {
  constexpr std::string_view kPrefix = "MOEKIT_SM90_", kStudy = "MOEKIT_SM90_STUDY";
#if MOEKIT_SM90_STUDY_OVERRIDE
  constexpr bool kStudyBuild = true;
#else
  constexpr bool kStudyBuild = false;
#endif
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::string_view name = entry.substr(0, entry.find('='));
    if (name.substr(0, kPrefix.size()) == kPrefix && (name != kStudy || !kStudyBuild)) {
      throw_invalid(name,
                    kStudyBuild ? "unset (the sm90 kernels read MOEKIT_SM90_STUDY=key=value,... only: "
                                  "design/ARCHITECTURE.md, \"Environment variables\")"
                                : "unset (this build reads no sm90 study setting: a study build is "
                                  "configured with -DMOEKIT_SM90_STUDY_OVERRIDE=ON)",
                    str("'", entry.substr(name.size() + (name.size() < entry.size() ? 1 : 0)), "'"));
    }
  }
#if MOEKIT_SM90_STUDY_OVERRIDE
  return parse_study_settings(std::getenv(kStudy.data()));
#else
  return {};
#endif
}
}  // namespace

const StudySettings& study_settings() {
  static const StudySettings settings = read_study_settings();
  return settings;
}

bool prebuilt_tensormaps_setting() {
  const int study = study_settings().prebuilt_tensormaps;
  return study < 0 ? kPrebuiltTensormaps : study == 1;
}

namespace {

// The study override's values (sm90_study_settings.h, in each key's order) as the problems spell them.
int study_order(int v) {
  constexpr int kOrder[] = {-1, 0, 1, 2, 4, 8, kSnakeOrder};  // auto cutlass blocked chunk2/4/8 balanced
  return v < 0 ? -1 : kOrder[v];
}
int study_swizzle(int v) {
  constexpr int kM = static_cast<int>(kStripeMFirst);
  constexpr int kSwizzle[] = {1, 2, 4, 8, 16, 4 | kM, 8 | kM, 16 | kM};
  return v < 0 ? -1 : kSwizzle[v];
}

template <class Problem>
void resolve(Problem& q) {
  const StudySettings& study = study_settings();
  if (q.order < 0) q.order = study_order(study.order);  // still -1: each form's automatic order
  if (q.pdl < 0) q.pdl = study.pdl < 0 ? (kPdl ? 1 : 0) : study.pdl;
  if (q.k_order < 0) q.k_order = study.k_order < 0 ? kKOrder : study.k_order;
  if (q.raster < 0) q.raster = study.raster < 0 ? 0 : study.raster;
  if (q.swizzle < 0) q.swizzle = study_swizzle(study.swizzle);  // still -1: the kernel's estimate
}

// The group-M instances of one tile configuration, one per kind of problem.
struct GroupMSet {
  const GroupMInstance* kmajor;   // fprop (b transposed)
  const GroupMInstance* nmajor;   // dgrad
  const GroupMInstance* swiglu;   // fprop with SwiGLU in the epilogue (glu_z)
  const GroupMInstance* dswiglu;  // dgrad with the SwiGLU backward in the epilogue (dglu_dh)
  const GroupMInstance& pick(const GroupMProblem& p) const {
    if (p.glu_z) return *swiglu;
    if (p.dglu_dh) return *dswiglu;
    return p.b_transposed ? *kmajor : *nmajor;
  }
};

// [dtype: 0 bf16, 1 f16][config]. The fused instances share their plain instances' mainloop, so
// h and dz have the bits of the plain instance.
const GroupMSet kSets[2][kConfigCount] = {
    {{&group_m_bf16_kmajor_large, &group_m_bf16_nmajor_large, &group_m_bf16_swiglu_large,
      &group_m_bf16_dswiglu_large},
     {&group_m_bf16_kmajor_small, &group_m_bf16_nmajor_small, &group_m_bf16_swiglu_small,
      &group_m_bf16_dswiglu_small}},
    {{&group_m_f16_kmajor_large, &group_m_f16_nmajor_large, &group_m_f16_swiglu_large,
      &group_m_f16_dswiglu_large},
     {&group_m_f16_kmajor_small, &group_m_f16_nmajor_small, &group_m_f16_swiglu_small,
      &group_m_f16_dswiglu_small}},
};

int group_m_config(const GroupMProblem& p) {
  if (p.config >= 0 && p.config < kConfigCount) return p.config;
  const int study = study_settings().config;
  if (study >= 0) return study == 0 ? kLarge : kSmallM;
  return takes_small_m(p.counts.rows, p.counts.groups) ? kSmallM : kLarge;
}

// The group-K instances of one tile configuration and input dtype, one per dw dtype.
struct GroupKPair {
  const GroupKInstance* f32;   // dw in f32 (main_grad)
  const GroupKInstance* same;  // dw in the input dtype
  const GroupKInstance& pick(const GroupKProblem& p) const {
    return p.dw_dtype == DType::F32 ? *f32 : *same;
  }
};
const GroupKPair kGroupK[2] = {{&group_k_bf16_f32, &group_k_bf16_bf16},  // [dtype: 0 bf16, 1 f16]
                               {&group_k_f16_f32, &group_k_f16_f16}};
const GroupKPair kGroupKWide21{&group_k_bf16_f32_wide21, &group_k_bf16_bf16_wide21};

}  // namespace

void resolve_settings(GroupMProblem& p) { resolve(p); }
void resolve_settings(GroupKProblem& p) { resolve(p); }

const GroupMInstance& choose_instance(const GroupMProblem& p) {
  const StudySettings& study = study_settings();
  const int config = group_m_config(p);
  const bool bf16 = p.dtype == DType::BF16;
  const bool fprop = p.glu_z || (!p.dglu_dh && p.b_transposed);
  if (study.fprop_wide21 != 0 && config == kLarge && fprop && bf16 && takes_fprop_wide21(p.k)) {
    return p.glu_z ? group_m_bf16_swiglu_wide21 : group_m_bf16_kmajor_wide21;
  }
  if (study.small_swap != 0 && config == kSmallM && bf16 && !p.glu_z && !p.dglu_dh &&
      takes_small_swap(p.n)) {
    return p.b_transposed ? group_m_bf16_kmajor_small_swap : group_m_bf16_nmajor_small_swap;
  }
  return kSets[p.dtype == DType::F16 ? 1 : 0][config].pick(p);
}

const GroupKInstance& choose_instance(const GroupKProblem& p) {
  const StudySettings& study = study_settings();
  const bool f16 = p.dtype == DType::F16;
  const int64_t rows = p.counts.rows, groups = p.counts.groups;
  if (study.group_k_wide != 0 && !f16 && takes_group_k_wide(rows, groups)) return kGroupKWide21.pick(p);
  // The own kernel takes its D descriptors from the setup kernel: only with prebuilt descriptors.
  if (!f16 && p.dw_dtype == DType::BF16 && prebuilt_tensormaps_setting()) {
    const bool own = study.group_k_own >= 0
                         ? study.group_k_own == 1
                         : takes_group_k_own(rows, groups, [&] { return group_k_bf16_bf16_own.groups_below_grid(p); });
    if (own) return group_k_bf16_bf16_own;
  }
  return kGroupK[f16 ? 1 : 0].pick(p);
}

std::string declines_fused_forward() {
  const int study = study_settings().fused_forward;
  if (study < 0 ? !kFuseForward : study == 0) return "MOEKIT_SM90_STUDY=fused_forward=0";
  return "";
}

std::string declines_fused_backward() {
  const int study = study_settings().fused_backward;
  if (study < 0 ? !kFuseBackward : study == 0) {
    return "the plain dgrad + SwiGLU backward kernel are faster in whole MLP steps "
           "(sm90/heuristics.h); MOEKIT_SM90_STUDY=fused_backward=1 runs the fused kernel";
  }
  return "";
}

}  // namespace moekit::cuda::sm90
