# CUDA detection: TERSE_CUDA=AUTO|ON|OFF. AUTO builds CUDA code when nvcc is found; ON requires it; OFF skips it.
# Sets TERSE_HAVE_CUDA, and TERSE_HAVE_NCCL (with the imported target terse_nccl) when NCCL is found too. With CUDA
# on, .cu sources build for TERSE_CUDA_ARCHITECTURES (default sm_80 and sm_90).
set(TERSE_CUDA "AUTO" CACHE STRING "Build CUDA code: AUTO (when nvcc is found), ON or OFF")
set_property(CACHE TERSE_CUDA PROPERTY STRINGS AUTO ON OFF)
set(TERSE_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures for .cu sources")

string(TOUPPER "${TERSE_CUDA}" _terse_cuda_mode)
if(NOT _terse_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "TERSE_CUDA must be AUTO, ON or OFF, got '${TERSE_CUDA}'")
endif()

set(TERSE_HAVE_CUDA OFF)
set(TERSE_HAVE_NCCL OFF)
if(NOT _terse_cuda_mode STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(TERSE_HAVE_CUDA ON)
  elseif(_terse_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "TERSE_CUDA=ON but no CUDA compiler was found: put nvcc on PATH or set CUDACXX, "
                        "or configure with -DTERSE_CUDA=AUTO|OFF")
  endif()
endif()

if(TERSE_HAVE_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "${TERSE_CUDA_ARCHITECTURES}")
  endif()
  enable_language(CUDA)
  # CMake 3.25 predates nvcc's C++20 support in its compiler tables; teach it the flag and the feature so C++20
  # targets (terse::plugin_sdk requires cxx_std_20) can hold .cu sources. Newer CMake knows this already.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    list(APPEND CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
  # One CUDA runtime per process: the core and every plugin with kernels use the shared libcudart, so streams, events
  # and memory handed across the plugin ABI belong to one runtime's state (CMake's default would also link a private
  # cudart_static into each of them).
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  set(TERSE_CUDA_ARCH_MSG ", architectures ${CMAKE_CUDA_ARCHITECTURES}")

  # NCCL (core/comm/nccl_communicator.h): the header and library, next to the toolkit or where NCCL_ROOT / NCCL_HOME
  # point (a tarball install). TERSE_CUDA=ON promises the whole GPU path, so a missing NCCL fails here rather than
  # leaving a build without the NCCL transport; AUTO builds the CUDA kernels without it and says so.
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY nccl HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${CUDAToolkit_LIBRARY_DIR}
               PATH_SUFFIXES lib lib64)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(TERSE_HAVE_NCCL ON)
    if(NOT TARGET terse_nccl)
      add_library(terse_nccl INTERFACE IMPORTED)
      target_include_directories(terse_nccl INTERFACE "${NCCL_INCLUDE_DIR}")
      target_link_libraries(terse_nccl INTERFACE "${NCCL_LIBRARY}")
    endif()
    string(APPEND TERSE_CUDA_ARCH_MSG ", NCCL ${NCCL_LIBRARY}")
  elseif(_terse_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "TERSE_CUDA=ON but NCCL was not found (nccl.h: ${NCCL_INCLUDE_DIR}, libnccl: "
                        "${NCCL_LIBRARY}): install NCCL (libnccl-dev) or set NCCL_ROOT to its prefix, "
                        "or configure with -DTERSE_CUDA=AUTO to build the CUDA kernels without the NCCL transport")
  else()
    string(APPEND TERSE_CUDA_ARCH_MSG ", no NCCL (the nccl transport is not built)")
  endif()
endif()
