# The Hopper (sm_90a) grouped GEMM kernels (CUTLASS 3.x / CuTe), included by src/backends/cuda/sources.cmake
# when MOEKIT_WITH_SM90_KERNELS is ON. Headers only from CUTLASS, never vendored: found through
#   1. -DMOEKIT_CUTLASS_DIR=<dir> (or the environment variable of that name): <dir>/include/cutlass
#      and <dir>/tools/util/include,
#   2. the PyPI package nvidia-cutlass (python3 -c 'import cutlass_library'; tools/bootstrap
#      installs it: pip install --no-deps nvidia-cutlass==4.2.0.0),
#   3. <repo>/.cutlass (the same two folders, unpacked from that wheel; git-ignored), for machines
#      without a registry (the GPU machine).
# The kernels build as an object library of their own so that they are compiled for sm_90a only,
# whatever CMAKE_CUDA_ARCHITECTURES holds for the rest of the library.

set(MOEKIT_CUTLASS_DIR "$ENV{MOEKIT_CUTLASS_DIR}" CACHE PATH
    "CUTLASS root holding include/cutlass (default: the nvidia-cutlass Python package, then <repo>/.cutlass)")
set(_moekit_cutlass "${MOEKIT_CUTLASS_DIR}")
if(NOT _moekit_cutlass)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c
        "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source'))"
      OUTPUT_VARIABLE _moekit_cutlass OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  endif()
  if(NOT EXISTS "${_moekit_cutlass}/include/cutlass/cutlass.h")
    set(_moekit_cutlass "${PROJECT_SOURCE_DIR}/.cutlass")
  endif()
endif()
if(NOT EXISTS "${_moekit_cutlass}/include/cutlass/cutlass.h")
  message(FATAL_ERROR
    "moekit: CUTLASS headers not found (needed by the sm90 kernels). Install them with\n"
    "  python3 -m pip install --no-deps nvidia-cutlass==4.2.0.0\n"
    "or pass -DMOEKIT_CUTLASS_DIR=<dir with include/cutlass>, or -DMOEKIT_WITH_SM90_KERNELS=OFF.")
endif()
file(STRINGS "${_moekit_cutlass}/include/cutlass/version.h" _moekit_cutlass_v
     REGEX "#define CUTLASS_(MAJOR|MINOR|PATCH) ")
string(REGEX REPLACE "[^0-9;]" "" _moekit_cutlass_v "${_moekit_cutlass_v}")
string(REPLACE ";" "." _moekit_cutlass_v "${_moekit_cutlass_v}")
message(STATUS "moekit: sm90 kernels with CUTLASS ${_moekit_cutlass_v} from ${_moekit_cutlass}")
if(NOT _moekit_cutlass_v VERSION_EQUAL 4.2.0)
  message(WARNING "moekit: the sm90 kernels are tested with CUTLASS 4.2.0, found ${_moekit_cutlass_v}")
endif()

# Layers (design/ARCHITECTURE.md, "The CUDA backend as built"): sm90_entries (the backend table's
# entries) -> heuristics (every automatic choice) -> device/ (checks, launch) -> instances/ (the
# compiled kernels) built from kernel/ (the kernel templates), collective/ (mainloop and epilogue
# parts) and scheduler/ (the tile orders).
set(_sm90 ${CMAKE_CURRENT_LIST_DIR})
add_library(moekit_sm90 OBJECT  # one TU per dtype: 6 instances each (see kernels_bf16.cu),
  ${_sm90}/instances/kernels_bf16.cu   # and one for the 4 fused-SwiGLU instances
  ${_sm90}/instances/kernels_f16.cu
  ${_sm90}/instances/kernels_swiglu.cu
  ${_sm90}/instances/kernels_dswiglu.cu  # the 4 fused SwiGLU-backward instances
  ${_sm90}/instances/kernels_fprop_wide21.cu  # bf16 fprop of large K (2 instances)
  ${_sm90}/instances/kernels_group_k_wide21.cu  # bf16 group-K of large groups, 2x1 (2)
  ${_sm90}/instances/kernels_small_swap.cu  # bf16 fprop/dgrad of small groups, A and B swapped (2)
  ${_sm90}/instances/kernels_group_k_own.cu  # bf16 -> bf16 group-K on the own ping-pong kernel (1)
  ${_sm90}/instances/kernels_fp8_group_m.cu  # FP8 per-group scales: fprop / dgrad (3)
  ${_sm90}/instances/kernels_fp8_fast_coop256.cu  # FP8 per-group scales: fprop of large groups (2)
  ${_sm90}/instances/kernels_fp8_group_k.cu  # FP8 per-group scales: wgrad (4)
  ${_sm90}/instances/kernels_fp8_block_group_m.cu  # FP8 block scales: fprop / dgrad (3)
  ${_sm90}/instances/kernels_fp8_block_group_k.cu  # FP8 block scales: wgrad (4)
  ${_sm90}/instances/kernels_fp8_f16.cu  # FP8 per-group scales, f16 outputs: fprop / dgrad / wgrad (5)
  ${_sm90}/instances/kernels_fp8_block_f16.cu  # FP8 block scales, f16 outputs (5)
)
set_target_properties(moekit_sm90 PROPERTIES
  CUDA_ARCHITECTURES 90a-real     # sm_90a machine code only (wgmma, setmaxnreg); no PTX to JIT
  POSITION_INDEPENDENT_CODE ON    # linked into the shared libmoekit
  CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON)
target_include_directories(moekit_sm90 PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/include)
target_include_directories(moekit_sm90 SYSTEM PRIVATE
  ${_moekit_cutlass}/include ${_moekit_cutlass}/tools/util/include)
target_link_libraries(moekit_sm90 PRIVATE CUDA::cudart)
# -DNDEBUG in every configuration: with CUTLASS's asserts on, nvcc serialises the wgmma pipeline
# (warning C7510). Relaxed constexpr: CuTe calls constexpr host functions from device code.
# 2908: "implicit capture of this is deprecated" inside CUTLASS's sm100 headers (not ours).
target_compile_options(moekit_sm90 PRIVATE
  -DNDEBUG --expt-relaxed-constexpr -diag-suppress=2908)

target_sources(moekit PRIVATE
  $<TARGET_OBJECTS:moekit_sm90>
  ${_sm90}/device/grouped_gemm_sm90.cpp
  ${_sm90}/heuristics.cpp
  ${_sm90}/sm90_entries.cpp)
target_compile_definitions(moekit PRIVATE MOEKIT_HAS_SM90=1)
if(MOEKIT_SM90_STUDY_OVERRIDE)  # a study build (heuristics.cpp, bench/studies/sm90_study_settings.h)
  target_compile_definitions(moekit PRIVATE MOEKIT_SM90_STUDY_OVERRIDE=1)
  target_compile_definitions(moekit_sm90 PRIVATE MOEKIT_SM90_STUDY_OVERRIDE=1)
  # the study tiles of fp8-current's fprop (MOEKIT_SM90_STUDY=fp8_fast=...)
  target_sources(moekit_sm90 PRIVATE ${PROJECT_SOURCE_DIR}/bench/studies/sm90_fp8_fast_study.cu)
  target_include_directories(moekit_sm90 PRIVATE ${PROJECT_SOURCE_DIR}/bench/studies)
endif()
