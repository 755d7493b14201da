# Run by ctest (see CMakeLists.txt). Fails with the step and its output on any error.
cmake_minimum_required(VERSION 3.25)

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(step_output "${out}${err}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")

run_step("cmake --install" ${CMAKE_COMMAND} --install "${TERSE_BINARY_DIR}" --prefix "${prefix}")
foreach(f include/terse/compressor_v1.h include/terse/scheduler_v1.h include/terse/sdk.hpp
          lib/cmake/terse/terseConfig.cmake lib/cmake/terse/terseHelpers.cmake bin/terse)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "install is missing ${f}")
  endif()
endforeach()

# A consumer project built from nothing but the installed prefix.
function(build_consumer name src_dir)
  run_step("configure ${name}" ${CMAKE_COMMAND} -S "${src_dir}" -B "${WORK_DIR}/${name}-build" -G "${GENERATOR}"
           -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
  run_step("build ${name}" ${CMAKE_COMMAND} --build "${WORK_DIR}/${name}-build")
endfunction()

function(expect_loads plugin_file name)
  if(NOT EXISTS "${plugin_file}")
    message(FATAL_ERROR "expected plugin file ${plugin_file} was not built")
  endif()
  run_step("terse plugins show ${plugin_file}" "${prefix}/bin/terse" plugins show "${plugin_file}")
  if(NOT step_output MATCHES "${name}")
    message(FATAL_ERROR "terse plugins show did not report '${name}':\n${step_output}")
  endif()
  message(STATUS "${name} loads:\n${step_output}")
endfunction()

# 1. The copy-me template.
file(COPY "${TERSE_SOURCE_DIR}/plugins/template/" DESTINATION "${WORK_DIR}/template-src")
build_consumer(template "${WORK_DIR}/template-src")
expect_loads("${WORK_DIR}/template-build/terse_compressor_my_int8.so" "my_int8")

# 2. The README's "write your own compressor" example, exactly as the README shows it.
file(READ "${TERSE_SOURCE_DIR}/README.md" readme)
string(REGEX MATCH "<!-- example:begin -->[^`]*```cpp\n(.*)```[^`]*<!-- example:end -->" _ "${readme}")
set(example "${CMAKE_MATCH_1}")
if(example STREQUAL "")
  message(FATAL_ERROR "README.md has no ```cpp block between <!-- example:begin --> and <!-- example:end -->")
endif()
string(REGEX MATCH "TERSE_EXPORT_COMPRESSOR\\([A-Za-z0-9_]+, \"([a-z0-9_]+)\"" _ "${example}")
set(example_name "${CMAKE_MATCH_1}")
if(example_name STREQUAL "")
  message(FATAL_ERROR "the README example has no TERSE_EXPORT_COMPRESSOR(Class, \"name\", ...)")
endif()
file(WRITE "${WORK_DIR}/readme-src/example.cc" "${example}")
file(WRITE "${WORK_DIR}/readme-src/CMakeLists.txt"
  "cmake_minimum_required(VERSION 3.25)\nproject(readme_example CXX)\nfind_package(terse REQUIRED)\n"
  "terse_add_compressor(${example_name} SOURCES example.cc)\n")
build_consumer(readme "${WORK_DIR}/readme-src")
expect_loads("${WORK_DIR}/readme-build/terse_compressor_${example_name}.so" "${example_name}")
