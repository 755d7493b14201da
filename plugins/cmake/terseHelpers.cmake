# Helpers for plugin authors, the same in the terse tree and out of tree (installed next to terseConfig.cmake).
#
#   terse_add_compressor(<name> SOURCES a.cc [b.cu ...] [OUTPUT_DIRECTORY dir] [INSTALL_DESTINATION dir])
#   terse_add_scheduler(<name> SOURCES ... )
#
# Each makes a MODULE library target `terse_compressor_<name>` (`terse_scheduler_<name>`) whose file is
# terse_compressor_<name>.so: the name the loader looks for when a config says `compressor: "<name>"`. Symbols are
# hidden by default so the plugin exports only its versioned struct, and undefined symbols fail at link time rather
# than at load time. <name> must match the name the plugin declares; the loader checks.
include_guard(GLOBAL)

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
    # with default visibility), so a version script keeps the dynamic symbol table to the one versioned struct.
    set(map "${CMAKE_BINARY_DIR}/terse_plugin_exports.map")
    if(NOT EXISTS "${map}")
      file(WRITE "${map}" "{\n  global: terse_compressor_plugin_v*; terse_scheduler_plugin_v*;\n  local: *;\n};\n")
    endif()
    target_link_options(${target} PRIVATE "LINKER:--no-undefined" "LINKER:--exclude-libs,ALL"
                        "LINKER:--version-script=${map}")
    set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS "${map}")
  endif()
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
