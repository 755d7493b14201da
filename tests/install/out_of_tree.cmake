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
foreach(f include/terse/compressor_v1.h include/terse/scheduler_v1.h include/terse/sdk.hpp include/terse/kit/device.cu
          lib/cmake/terse/terseConfig.cmake lib/cmake/terse/terseHelpers.cmake lib/cmake/terse/FindRandom123.cmake
          bin/terse)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "install is missing ${f}")
  endif()
endforeach()

# A consumer project built from nothing but the installed prefix.
function(build_consumer name src_dir)
  run_step("configure ${name}" ${CMAKE_COMMAND} -S "${src_dir}" -B "${WORK_DIR}/${name}-build" -G "${GENERATOR}"
           -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix})
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

# The copy-me template, the SDK's one worked example, configured as a user would (no build type: it picks Release).
file(COPY "${TERSE_SOURCE_DIR}/plugins/template/" DESTINATION "${WORK_DIR}/template-src")
build_consumer(template "${WORK_DIR}/template-src")
file(STRINGS "${WORK_DIR}/template-build/CMakeCache.txt" build_type REGEX "^CMAKE_BUILD_TYPE:")
if(NOT build_type MATCHES "=Release$")
  message(FATAL_ERROR "the template should default to an optimised build, got '${build_type}'")
endif()
expect_loads("${WORK_DIR}/template-build/terse_compressor_my_int8.so" "my_int8")
