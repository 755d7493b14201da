# CUDA detection: TERSE_CUDA=AUTO|ON|OFF. AUTO builds CUDA code when nvcc is found; ON requires it; OFF skips it.
# Sets TERSE_HAVE_CUDA. With CUDA on, .cu sources build for TERSE_CUDA_ARCHITECTURES (default sm_80 and sm_90).
set(TERSE_CUDA "AUTO" CACHE STRING "Build CUDA code: AUTO (when nvcc is found), ON or OFF")
set_property(CACHE TERSE_CUDA PROPERTY STRINGS AUTO ON OFF)
set(TERSE_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures for .cu sources")

string(TOUPPER "${TERSE_CUDA}" _terse_cuda_mode)
if(NOT _terse_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "TERSE_CUDA must be AUTO, ON or OFF, got '${TERSE_CUDA}'")
endif()

set(TERSE_HAVE_CUDA OFF)
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
endif()
