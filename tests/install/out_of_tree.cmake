# Run by ctest (see CMakeLists.txt) with CASE=template, builtin, readme or python. Fails with the step and its output on any
# error.
cmake_minimum_required(VERSION 3.25)

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(step_output "${out}${err}" PARENT_SCOPE)
endfunction()

if(CASE STREQUAL "python")
  # The installed package is run from outside the build tree, so that nothing of the tree is found by accident: a
  # fresh folder under the temporary directory holds the prefix and is the working directory.
  set(tmp "/tmp")
  if(DEFINED ENV{TMPDIR} AND IS_DIRECTORY "$ENV{TMPDIR}")
    set(tmp "$ENV{TMPDIR}")
  endif()
  string(RANDOM LENGTH 10 suffix)
  set(WORK_DIR "${tmp}/terse-install-python-${suffix}")
endif()
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

# A consumer project built from nothing but the installed prefix; further arguments go to its configure step.
# configure_output: what its configure step printed.
function(build_consumer name src_dir)
  run_step("configure ${name}" ${CMAKE_COMMAND} -S "${src_dir}" -B "${WORK_DIR}/${name}-build" -G "${GENERATOR}"
           -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix} ${ARGN})
  set(configure_output "${step_output}" PARENT_SCOPE)
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
  set(step_output "${step_output}" PARENT_SCOPE)
endfunction()

if(CASE STREQUAL "template")
  # The copy-me template, the SDK's one worked example, configured as a user would (no build type: it picks Release).
  file(COPY "${TERSE_SOURCE_DIR}/plugins/template/" DESTINATION "${WORK_DIR}/template-src")
  build_consumer(template "${WORK_DIR}/template-src")
  file(STRINGS "${WORK_DIR}/template-build/CMakeCache.txt" build_type REGEX "^CMAKE_BUILD_TYPE:")
  if(NOT build_type MATCHES "=Release$")
    message(FATAL_ERROR "the template should default to an optimised build, got '${build_type}'")
  endif()
  expect_loads("${WORK_DIR}/template-build/terse_compressor_my_int8.so" "my_int8")
  if(NOT step_output MATCHES "build: +optimised")
    message(FATAL_ERROR "terse plugins show should report the Release template as optimised:\n${step_output}")
  endif()
  # A Debug build asked for stays at -O0, and terse says so.
  build_consumer(template-debug "${WORK_DIR}/template-src" -DCMAKE_BUILD_TYPE=Debug)
  expect_loads("${WORK_DIR}/template-debug-build/terse_compressor_my_int8.so" "my_int8")
  if(NOT step_output MATCHES "build: +NOT optimised: compiled at -O0")
    message(FATAL_ERROR "terse plugins show should report the Debug template as not optimised:\n${step_output}")
  endif()
  # The installed terse uses the plugins installed with it, and never searches the build tree it came from
  # (core/plugin/loader.h, belongsToBuildTree), though this prefix lies inside that tree: no "shadow" notes for the
  # built-ins both hold, and the build tree is not among the search directories.
  run_step("installed terse plugins show topk" "${prefix}/bin/terse" plugins show topk)
  if(NOT step_output MATCHES "found: +in install" OR step_output MATCHES "build tree")
    message(FATAL_ERROR "the installed terse should find topk in its installation, not the build tree:\n${step_output}")
  endif()
  run_step("installed terse plugins list" ${CMAKE_COMMAND} -E env --unset=TERSE_PLUGIN_PATH
           "${prefix}/bin/terse" plugins list)
  file(REAL_PATH "${prefix}/lib/terse/plugins" installed_plugins)
  string(FIND "${step_output}" "${installed_plugins} (install)" at_install)
  if(at_install LESS 0 OR step_output MATCHES "build tree|shadow")
    message(FATAL_ERROR "the installed terse should list its installation's plugins and not search the build tree "
                        "(${TERSE_BINARY_DIR}):\n${step_output}")
  endif()
elseif(CASE STREQUAL "builtin")
  # A built-in as a starting point: compressors/topk copied out of the tree builds from the installed SDK and kit
  # alone (its own CMakeLists.txt uses in-tree helpers, so the copy gets the few lines a researcher writes; the CUDA
  # line does nothing in this CXX-only project), and the copy passes the conformance suite. Those lines set no build
  # type, as a researcher's often do not: terse_add_compressor() then builds the plugin with -O2 and says so.
  file(COPY "${TERSE_SOURCE_DIR}/compressors/topk/" DESTINATION "${WORK_DIR}/topk-src")
  file(WRITE "${WORK_DIR}/topk-src/CMakeLists.txt"
    "cmake_minimum_required(VERSION 3.25)\nproject(topk_copy CXX)\nfind_package(terse REQUIRED)\n"
    "terse_add_compressor(topk SOURCES topk.cc)\n"
    "target_link_libraries(terse_compressor_topk PRIVATE terse::compressor_kit)\n"
    "terse_compressor_cuda_sources(topk topk.cu)\n")
  build_consumer(topk "${WORK_DIR}/topk-src" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON)
  if(NOT configure_output MATCHES "terse_add_compressor\\(topk\\): CMAKE_BUILD_TYPE is not set, so the plugin is built")
    message(FATAL_ERROR "configuring without a build type should say the plugin gets -O2:\n${configure_output}")
  endif()
  file(READ "${WORK_DIR}/topk-build/compile_commands.json" commands)
  string(REGEX MATCH "\"command\": \"[^\n]*/topk\\.cc\"" command "${commands}")
  if(NOT command MATCHES " -O2 ")
    message(FATAL_ERROR "topk.cc should compile with -O2 when no build type is set:\n${commands}")
  endif()
  set(plugin "${WORK_DIR}/topk-build/terse_compressor_topk.so")
  expect_loads("${plugin}" "topk")
  if(NOT step_output MATCHES "build: +optimised")
    message(FATAL_ERROR "terse plugins show should report the copied topk as optimised:\n${step_output}")
  endif()
  run_step("terse plugins check ${plugin}" "${prefix}/bin/terse" plugins check "${plugin}")
  if(step_output MATCHES "NOT optimised")
    message(FATAL_ERROR "terse plugins check should not call the copied topk unoptimised:\n${step_output}")
  endif()
  message(STATUS "the copied topk passes the conformance suite:\n${step_output}")
elseif(CASE STREQUAL "readme")
  # README.md's "Write your own compressor", as a reader follows it: its C++ block and its CMake block written to a
  # fresh folder, built against the installed prefix, loaded by path and by name, and passed through the conformance
  # suite. So the front door's example cannot stop compiling, loading or keeping the contract unnoticed.
  file(READ "${TERSE_SOURCE_DIR}/README.md" readme)
  function(fenced_block lang out)
    string(FIND "${readme}" "\n```${lang}\n" begin)
    if(begin LESS 0)
      message(FATAL_ERROR "README.md has no ```${lang} block: the compressor example moved or lost its code")
    endif()
    string(LENGTH "\n```${lang}\n" skip)
    math(EXPR begin "${begin} + ${skip}")
    string(SUBSTRING "${readme}" ${begin} -1 rest)
    string(FIND "${rest}" "\n```\n" end)
    if(end LESS 0)
      message(FATAL_ERROR "README.md's ```${lang} block is not closed")
    endif()
    string(SUBSTRING "${rest}" 0 ${end} block)
    set(${out} "${block}\n" PARENT_SCOPE)
  endfunction()
  fenced_block(cpp source)
  fenced_block(cmake lists)
  if(NOT lists MATCHES "terse_add_compressor\\(([A-Za-z0-9_]+) SOURCES ([A-Za-z0-9_.]+)\\)")
    message(FATAL_ERROR "README.md's CMake block has no terse_add_compressor(<name> SOURCES <file>):\n${lists}")
  endif()
  set(name "${CMAKE_MATCH_1}")
  set(src_dir "${WORK_DIR}/readme-src")
  file(WRITE "${src_dir}/CMakeLists.txt" "${lists}")
  file(WRITE "${src_dir}/${CMAKE_MATCH_2}" "${source}")
  build_consumer(readme "${src_dir}")
  set(plugin "${WORK_DIR}/readme-build/terse_compressor_${name}.so")
  expect_loads("${plugin}" "${name}")
  run_step("terse plugins show ${name} by name" "${prefix}/bin/terse" plugins show "${name}"
           --plugin-path "${WORK_DIR}/readme-build")
  if(NOT step_output MATCHES "${name}")
    message(FATAL_ERROR "terse plugins show ${name} --plugin-path should find the README's plugin:\n${step_output}")
  endif()
  run_step("terse plugins check ${plugin}" "${prefix}/bin/terse" plugins check "${plugin}")
  message(STATUS "the README's compressor passes the conformance suite:\n${step_output}")
elseif(CASE STREQUAL "python")
  # The installed Python package finds the plugins of its own prefix, with the build tree still in place, and does not
  # search the build tree: the extension terse._terse runs inside python3, whose executable says nothing of where
  # terse is installed. A test plugin copied into the prefix's plugin folder, and only there, tells that folder from
  # the build tree's.
  set(plugin_dir "${prefix}/${PLUGIN_SUBDIR}")
  file(COPY "${EXTRA_PLUGIN}" DESTINATION "${plugin_dir}")
  get_filename_component(extra_file "${EXTRA_PLUGIN}" NAME)
  string(REGEX REPLACE "^terse_compressor_(.*)\\.so$" "\\1" extra_name "${extra_file}")
  # A config is validated whole, every compressor it names loaded: one config per compressor.
  foreach(pair "extra;${extra_name}" "builtin;topk" "missing;no_such_plugin")
    list(GET pair 0 what)
    list(GET pair 1 compressor)
    file(WRITE "${WORK_DIR}/${what}.textproto"
         "study: \"installed\"\nworkload { name: \"mlp\" hidden_sizes: [8] }\n"
         "data { dataset_dir: \"/nonexistent\" batch_size: 8 }\noptimizer { lr: 0.1 }\n"
         "workers: 2\nmode: SYNC\ntransport: INPROC\nepochs: 1\nseed: 1\ncompressor { name: \"${compressor}\" }\n")
  endforeach()
  # WORK_DIR, which holds the prefix and is the working directory, is made a git repository of its own, as a user's
  # project would be: the results the package writes must still name the commit terse was built from
  # (results/build_commit.h), where git at run time found this repository's HEAD.
  set(expected_commit "unknown")
  if(GIT)
    set(git_user -c user.name=t -c user.email=t@t -c commit.gpgsign=false)
    file(WRITE "${WORK_DIR}/README" "a user's project\n")
    run_step("git init ${WORK_DIR}" "${GIT}" -C "${WORK_DIR}" init -q)
    run_step("git commit in ${WORK_DIR}" "${GIT}" -C "${WORK_DIR}" ${git_user} add README)
    run_step("git commit in ${WORK_DIR}" "${GIT}" -C "${WORK_DIR}" ${git_user} commit -qm "a user's commit")
    # What the build recorded, asked of the source tree now (the test runs after the build): its HEAD, "-dirty" with
    # changes to tracked files, "unknown" when it is not the top of a checkout of its own.
    execute_process(COMMAND "${GIT}" -C "${TERSE_SOURCE_DIR}" rev-parse --show-toplevel HEAD RESULT_VARIABLE rc
                    OUTPUT_VARIABLE out ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
    string(REPLACE "\n" ";" out "${out}")
    list(LENGTH out lines)
    if(rc EQUAL 0 AND lines EQUAL 2)
      list(GET out 0 top)
      file(REAL_PATH "${top}" top)
      file(REAL_PATH "${TERSE_SOURCE_DIR}" source)
      if(top STREQUAL source)
        list(GET out 1 expected_commit)
        run_step("git status of ${TERSE_SOURCE_DIR}" "${GIT}" -C "${TERSE_SOURCE_DIR}" status --porcelain
                 --untracked-files=no)
        if(NOT step_output STREQUAL "")
          string(APPEND expected_commit "-dirty")
        endif()
      endif()
    endif()
  endif()
  run_step("the installed package, from ${WORK_DIR}"
           ${CMAKE_COMMAND} -E chdir "${WORK_DIR}"
           ${CMAKE_COMMAND} -E env --unset=PYTHONHOME "PYTHONPATH=${prefix}/${PYTHON_PACKAGE_DIR}" TERSE_PLUGIN_PATH=
           "${PYTHON}" -s "${TERSE_SOURCE_DIR}/tests/install/installed_package.py" "${prefix}" "${WORK_DIR}")
  message(STATUS "${step_output}")
  file(REAL_PATH "${plugin_dir}" plugin_dir)  # as the loader names it, links resolved
  string(FIND "${step_output}" "${plugin_dir} (install)" at_install)
  string(FIND "${step_output}" "(build tree)" at_build_tree)
  if(at_install LESS 0 OR NOT at_build_tree LESS 0)
    message(FATAL_ERROR "the installed package should search ${plugin_dir} (install) and not the build tree it was "
                        "built in (core/plugin/loader.h, belongsToBuildTree):\n${step_output}")
  endif()
  # Its own installation's folder and no other: not one beside python3's executable (/usr/bin/../lib/terse/plugins,
  # some other terse's or none), which says nothing of where the package is installed.
  string(REGEX MATCHALL "\\(install" installs "${step_output}")
  list(LENGTH installs n_installs)
  if(NOT n_installs EQUAL 1)
    message(FATAL_ERROR "the installed package should search one installation's folder, its own (${plugin_dir}), not "
                        "one found from python3's executable (core/plugin/loader.h):\n${step_output}")
  endif()
  string(FIND "${step_output}" "git_commit: ${expected_commit}\n" at_commit)
  if(at_commit LESS 0)
    message(FATAL_ERROR "the installed package's results should name the commit terse was built from, "
                        "${expected_commit}, not the HEAD of the repository it runs in (rebuild first if the source "
                        "moved since the build):\n${step_output}")
  endif()
  file(REMOVE_RECURSE "${WORK_DIR}")
else()
  message(FATAL_ERROR "CASE must be template, builtin, readme or python, got '${CASE}'")
endif()
