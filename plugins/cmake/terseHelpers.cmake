# Helpers for plugin authors, the same in the terse tree and out of tree (installed next to terseConfig.cmake).
#
#   terse_add_compressor(<name> SOURCES a.cc [b.cu ...] [OUTPUT_DIRECTORY dir] [INSTALL_DESTINATION dir])
#   terse_add_scheduler(<name> SOURCES ... )
#   terse_compressor_cuda_sources(<name> a.cu ...)
#
# Each makes a MODULE library target `terse_compressor_<name>` (`terse_scheduler_<name>`) whose file is
# terse_compressor_<name>.so: the name the loader looks for when a config says `compressor: "<name>"`. Symbols are
# hidden by default so the plugin exports only its versioned struct, and undefined symbols fail at link time rather
# than at load time. <name> must match the name the plugin declares; the loader checks.
include_guard(GLOBAL)

# A project that sets no build type compiles with CMake's empty configuration, which adds no optimisation flag at all:
# a plugin built so runs at -O0, and its loops run on every gradient of every step (a compressor copied out of the tree
# compressed 8x and decompressed 4.6x slower than at Release), with nothing saying so. So a plugin target gets -O2,
# the built-ins' level, when the project has neither a build type nor multiple configurations and its compile flags
# name no -O level of their own. A build type given (Debug included) or an -O in CMAKE_<LANG>_FLAGS is the user's
# choice and is left alone; target_compile_options(<target> PRIVATE -O0) after the call also wins, being later on the
# command line. The plugin records how it was built (terse/build_info_v1.h), and `terse plugins show` reports it.
function(_terse_plugin_default_optimisation target what)
  if(CMAKE_BUILD_TYPE OR CMAKE_CONFIGURATION_TYPES)
    return()
  endif()
  if(" ${CMAKE_C_FLAGS} ${CMAKE_CXX_FLAGS} ${CMAKE_CUDA_FLAGS} " MATCHES " -O")
    return()
  endif()
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:C,CXX,CUDA>:-O2>)
  message(STATUS "${what}: CMAKE_BUILD_TYPE is not set, so the plugin is built with -O2 "
                 "(-DCMAKE_BUILD_TYPE=Debug builds it at -O0)")
endfunction()

function(_terse_add_plugin kind name)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "OUTPUT_DIRECTORY;INSTALL_DESTINATION" "SOURCES")
  if(NOT name MATCHES "^[a-z0-9_]+$")
    message(FATAL_ERROR "terse_add_${kind}: plugin name must match [a-z0-9_]+, got '${name}'")
  endif()
  if(NOT arg_SOURCES)
    message(FATAL_ERROR "terse_add_${kind}(${name}): SOURCES is empty")
  endif()
  set(target "terse_${kind}_${name}")
  add_library(${target} MODULE ${arg_SOURCES})
  target_link_libraries(${target} PRIVATE terse::plugin_sdk)
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    OUTPUT_NAME "terse_${kind}_${name}"
    SUFFIX ".so"
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    CUDA_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    POSITION_INDEPENDENT_CODE ON)
  if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
    # -fvisibility=hidden cannot hide the libstdc++ template code a C++ plugin instantiates (namespace std is declared
    # with default visibility), so a version script keeps the dynamic symbol table to the versioned struct and the
    # optional symbols (terse/resolved_params_v1.h, terse/build_info_v1.h, terse/device_verdict_v1.h,
    # terse/phases_v1.h).
    # file(CONFIGURE) rewrites it only when the text changes.
    set(map "${CMAKE_BINARY_DIR}/terse_plugin_exports.map")
    file(CONFIGURE OUTPUT "${map}" CONTENT "{\n  global: terse_compressor_plugin_v*; terse_scheduler_plugin_v*;\n\
    terse_compressor_resolved_params_v*; terse_scheduler_resolved_params_v*;\n\
    terse_compressor_build_info_v*; terse_scheduler_build_info_v*;\n\
    terse_compressor_decompress_deferred_v*; terse_compressor_compress_deferred_v*;\n\
    terse_compressor_phases_v*;\n  local: *;\n};\n")
    target_link_options(${target} PRIVATE "LINKER:--no-undefined" "LINKER:--exclude-libs,ALL"
                        "LINKER:--version-script=${map}")
    set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS "${map}")
  endif()
  _terse_plugin_default_optimisation(${target} "terse_add_${kind}(${name})")
  if(arg_OUTPUT_DIRECTORY)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${arg_OUTPUT_DIRECTORY}")
  elseif(DEFINED TERSE_BUILD_PLUGIN_DIR)
    # Inside the terse tree: beside the other built-in plugins, where the loader's build-tree search finds them.
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${TERSE_BUILD_PLUGIN_DIR}")
  endif()
  if(arg_INSTALL_DESTINATION)
    install(TARGETS ${target} LIBRARY DESTINATION "${arg_INSTALL_DESTINATION}")
  endif()
endfunction()

function(terse_add_compressor name)
  _terse_add_plugin(compressor ${name} ${ARGN})
endfunction()

function(terse_add_scheduler name)
  _terse_add_plugin(scheduler ${name} ${ARGN})
endfunction()

# The CUDA kernels of compressor <name>, built only when the project has enabled CUDA (project(... LANGUAGES CXX CUDA);
# terse's own build when nvcc is found). They are compiled with the compressor kit's host plumbing (terse/kit/device.cu,
# see terse/kit/device.hpp), TERSE_COMPRESSOR_CUDA=1 (so kit::device::kDevices advertises TERSE_DEVICE_CUDA) and
# --fmad=false, because kernels must give the host loops' bits and the host builds with -ffp-contract=off; the plugin
# links the shared CUDA runtime, so streams and memory handed across the ABI belong to the process's one runtime.
# Without CUDA this does nothing: the same plugin on host memory only. The target must link terse::compressor_kit.
function(terse_compressor_cuda_sources name)
  get_property(languages GLOBAL PROPERTY ENABLED_LANGUAGES)
  if(NOT "CUDA" IN_LIST languages)
    return()
  endif()
  if(NOT TARGET CUDA::cudart)
    find_package(CUDAToolkit REQUIRED)
  endif()
  if(NOT TERSE_KIT_DEVICE_SOURCE)
    message(FATAL_ERROR "terse_compressor_cuda_sources(${name}): TERSE_KIT_DEVICE_SOURCE is not set "
                        "(find_package(terse) sets it)")
  endif()
  if(NOT ARGN)
    message(FATAL_ERROR "terse_compressor_cuda_sources(${name}): no .cu files given")
  endif()
  set(target terse_compressor_${name})
  # The kit's host plumbing is compiled inside the plugin's first .cu file, through a generated file that includes
  # both: every nvcc run pays several seconds for the CUDA headers, its front end and the host compiler before the first
  # line of the file (terse/kit/device.cu alone took 7 s of the 12 built-ins' CUDA build each, on 2 cores). The two
  # share no names: the kit's live in terse::kit::device. The plugin's other .cu files, if any, build on their own.
  list(GET ARGN 0 first)
  get_filename_component(first "${first}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
  get_filename_component(first_name "${first}" NAME_WE)
  set(combined "${CMAKE_CURRENT_BINARY_DIR}/${target}_${first_name}_with_kit.cu")
  file(CONFIGURE OUTPUT "${combined}" @ONLY
       CONTENT "// Generated by terse_compressor_cuda_sources() (terseHelpers.cmake).\n#include \"${first}\"\n\
#include \"${TERSE_KIT_DEVICE_SOURCE}\"\n")
  target_sources(${target} PRIVATE "${combined}" ${ARGN})
  set_source_files_properties("${first}" PROPERTIES HEADER_FILE_ONLY ON)
  # Kernel names unique per plugin (terse/kit/device.cuh says why): the kit's, and cub's and thrust's.
  target_compile_definitions(${target} PRIVATE TERSE_COMPRESSOR_CUDA=1 TERSE_KIT_KERNEL_NS=terse_kernels_${name}
                                               THRUST_CUB_WRAPPED_NAMESPACE=terse_cub_${name})
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--fmad=false>)
  set_target_properties(${target} PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
  # The SDK headers are C++20 in .cu files too. CMake 3.25 predates nvcc's C++20 in its tables (terse's own build
  # teaches it in cmake/TerseCuda.cmake), so without that the flag is given directly.
  if(CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set_target_properties(${target} PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON)
  else()
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
  endif()
  target_link_libraries(${target} PRIVATE CUDA::cudart)
endfunction()
