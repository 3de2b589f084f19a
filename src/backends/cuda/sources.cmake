# The CUDA backend (included by src/CMakeLists.txt when MOEKIT_HAS_CUDA): runtime hooks of core,
# the cuBLAS grouped-GEMM baseline and moekit's own kernels. Kernels are compiled ahead of time
# for CMAKE_CUDA_ARCHITECTURES (default 90a).
target_sources(moekit PRIVATE
  backends/cuda/runtime.cpp
  backends/cuda/fill.cu
  backends/cuda/bias.cu
  backends/cuda/activation.cu
  backends/cuda/quantize.cu
  backends/cuda/quantized_gemm_bf16.cu
  backends/cuda/router.cu
  backends/cuda/quantized_gemm_emulation.cu
  backends/cuda/pointer_arrays.cu
  backends/cuda/grouped_gemm_cublas.cpp
  # expert parallelism's GPU engine (src/ep/ep_device.h), one idea per file
  backends/cuda/ep/ep_runtime.cpp
  backends/cuda/ep/ep_count.cu
  backends/cuda/ep/ep_plan.cu
  backends/cuda/ep/ep_send.cu
  backends/cuda/ep/ep_expand.cu
  backends/cuda/ep/ep_reduce.cu
  backends/cuda/ep/ep_sum.cu
)
# One CUDA runtime per process, shared with the programs that link moekit (benchmarks, tests).
set_target_properties(moekit PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
target_link_libraries(moekit PRIVATE CUDA::cudart CUDA::cublas CUDA::cublasLt)
# .cu files are C++20 too (the public headers use it; CMake derives CUDA20 from cxx_std_20).
# CMake < 3.26 has no flag for it with nvcc: supply it.
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
target_compile_options(moekit PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-missing-field-initializers>
  $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<CONFIG:Release>>:-DNDEBUG>)
# The Hopper grouped GEMM kernels (CUTLASS): src/backends/cuda/sm90/.
if(MOEKIT_WITH_SM90_KERNELS)
  include(${CMAKE_CURRENT_LIST_DIR}/sm90/sources.cmake)
endif()
