# NCCL for the symmetric-memory engine (included by the top-level CMakeLists.txt when the CUDA
# backend is on and MOEKIT_WITH_NCCL is not OFF). Looked for, in order:
#   1. MOEKIT_NCCL_ROOT (cache or environment): <root>/include/nccl.h, <root>/lib/libnccl.so[.2];
#   2. the CUDA toolkit (/usr/local/cuda-13.0/include/nccl.h and lib/libnccl.so on the build
#      machine);
#   3. the pip wheel nvidia-nccl-cu13 (what torch 2.11 loads: include/ and lib/libnccl.so.2 only)
#      of this machine's python3, and of the GPU machine's interpreter (MOEKIT_NCCL_WHEEL_DIRS).
# It needs NCCL >= 2.28.3 (symmetric windows and nccl_device.h). The library links libnccl.so.2
# by its SONAME, so a process that already loaded torch's copy uses that one; the wheels' lib
# folders go into libmoekit's run path, so a build carried to the GPU machine (whose CUDA
# toolkit has no NCCL) finds the wheel there. The device code is compiled against these headers
# and NCCL's device API needs the same version at run time (< 2.31): src/backends/cuda/ep/ep_nccl.cu
# checks ncclGetVersion() when a communicator is made.
# Sets MOEKIT_HAS_NCCL, MOEKIT_NCCL_INCLUDE_DIR, MOEKIT_NCCL_LIBRARY, MOEKIT_NCCL_RUNTIME_DIRS.
set(MOEKIT_NCCL_ROOT "$ENV{MOEKIT_NCCL_ROOT}" CACHE PATH "NCCL root holding include/nccl.h and lib/libnccl.so")
set(MOEKIT_NCCL_WHEEL_DIRS
    "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/nvidia/nccl"
    CACHE STRING "nvidia-nccl wheel folders (include/, lib/) looked in after the toolkit; their lib/ joins the run path")
set(_moekit_nccl_wheels ${MOEKIT_NCCL_WHEEL_DIRS})
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
      "import importlib.util as u; s = u.find_spec('nvidia.nccl'); print(list(s.submodule_search_locations)[0])"
    OUTPUT_VARIABLE _moekit_nccl_py OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_moekit_nccl_py)
    list(PREPEND _moekit_nccl_wheels "${_moekit_nccl_py}")
  endif()
endif()
set(_moekit_nccl_hints ${MOEKIT_NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT} /usr/local/cuda ${_moekit_nccl_wheels})
find_path(MOEKIT_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS}
          PATHS ${_moekit_nccl_hints} PATH_SUFFIXES include)
find_library(MOEKIT_NCCL_LIBRARY NAMES nccl libnccl.so.2
             PATHS ${_moekit_nccl_hints} PATH_SUFFIXES lib lib64)

set(_moekit_nccl_missing "")
if(NOT MOEKIT_NCCL_INCLUDE_DIR)
  string(APPEND _moekit_nccl_missing " nccl.h")
elseif(NOT EXISTS "${MOEKIT_NCCL_INCLUDE_DIR}/nccl_device.h")
  string(APPEND _moekit_nccl_missing " nccl_device.h (NCCL >= 2.28.3, beside ${MOEKIT_NCCL_INCLUDE_DIR}/nccl.h)")
else()
  file(STRINGS "${MOEKIT_NCCL_INCLUDE_DIR}/nccl.h" _moekit_nccl_code REGEX "#define NCCL_VERSION_CODE ")
  string(REGEX REPLACE "[^0-9]" "" _moekit_nccl_code "${_moekit_nccl_code}")
  if(NOT _moekit_nccl_code OR _moekit_nccl_code LESS 22803)
    string(APPEND _moekit_nccl_missing " NCCL >= 2.28.3 (${MOEKIT_NCCL_INCLUDE_DIR}/nccl.h is ${_moekit_nccl_code})")
  endif()
endif()
if(NOT MOEKIT_NCCL_LIBRARY)
  string(APPEND _moekit_nccl_missing " libnccl (libnccl.so or libnccl.so.2)")
endif()

if(_moekit_nccl_missing STREQUAL "")
  set(MOEKIT_HAS_NCCL ON)
  set(MOEKIT_NCCL_RUNTIME_DIRS "")
  get_filename_component(_moekit_nccl_libdir "${MOEKIT_NCCL_LIBRARY}" DIRECTORY)
  list(APPEND MOEKIT_NCCL_RUNTIME_DIRS "${_moekit_nccl_libdir}")
  foreach(w IN LISTS _moekit_nccl_wheels)
    list(APPEND MOEKIT_NCCL_RUNTIME_DIRS "${w}/lib")
  endforeach()
  list(REMOVE_DUPLICATES MOEKIT_NCCL_RUNTIME_DIRS)
  message(STATUS "moekit: NCCL ${_moekit_nccl_code} from ${MOEKIT_NCCL_INCLUDE_DIR}, ${MOEKIT_NCCL_LIBRARY}")
elseif(MOEKIT_WITH_NCCL STREQUAL "ON")
  message(FATAL_ERROR
    "moekit: MOEKIT_WITH_NCCL=ON but missing:${_moekit_nccl_missing}. Install NCCL >= 2.28 "
    "(e.g. python3 -m pip install nvidia-nccl-cu13==2.28.9), pass -DMOEKIT_NCCL_ROOT=<dir with "
    "include/nccl.h and lib/libnccl.so>, or configure with -DMOEKIT_WITH_NCCL=OFF.")
else()
  message(STATUS "moekit: NCCL engine not built, missing:${_moekit_nccl_missing}")
endif()
