# cmake -DSCRIPT=<cmake/build_commit.cmake> -DGIT=<git> -DWORK_DIR=<fresh folder> -P build_commit_test.cmake: the
# commit a build records (results/build_commit.h), on source trees made for each case: none in a folder that is no
# checkout of its own (a plain folder inside another repository, a repository without a commit, a subfolder of a
# checkout) or without git; HEAD of a clean checkout, reached directly or through a link; "-dirty" once a tracked file
# changed, not for an untracked one. And the generated file is rewritten only when its text changes, so an unchanged
# commit rebuilds nothing. Fails naming the case.
cmake_minimum_required(VERSION 3.25)

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(out "${WORK_DIR}/build_commit.cc")

# commit_of(<source> <var> [<git>]): the commit the script writes for <source>.
function(commit_of source var)
  set(git "${GIT}")
  if(ARGC GREATER 2)
    set(git "${ARGV2}")
  endif()
  execute_process(COMMAND "${CMAKE_COMMAND}" "-DSOURCE_DIR=${source}" "-DOUTPUT=${out}" "-DGIT=${git}" -P "${SCRIPT}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "build_commit.cmake failed for ${source} (${rc}):\n${stdout}${stderr}")
  endif()
  file(READ "${out}" text)
  if(NOT text MATCHES "std::string_view buildCommit\\(\\) { return \"([^\"]*)\"; }")
    message(FATAL_ERROR "${out} defines no buildCommit():\n${text}")
  endif()
  set(${var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

function(expect what got want)
  if(NOT got STREQUAL want)
    message(FATAL_ERROR "${what}: the build would record '${got}', want '${want}'")
  endif()
  message(STATUS "${what}: ${got}")
endfunction()

function(git repo)
  execute_process(COMMAND "${GIT}" -C "${repo}" -c user.name=t -c user.email=t@t -c commit.gpgsign=false ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "git ${ARGN} in ${repo} failed (${rc}):\n${stdout}${stderr}")
  endif()
  set(git_output "${stdout}" PARENT_SCOPE)
endfunction()

# Repositories above WORK_DIR (this build tree lies in the source checkout) must not answer for the cases below.
set(plain "${WORK_DIR}/plain")
file(MAKE_DIRECTORY "${plain}")
commit_of("${plain}" got)
expect("a folder that is no checkout of its own" "${got}" "unknown")

set(repo "${WORK_DIR}/repo")
file(MAKE_DIRECTORY "${repo}/sub")
git("${repo}" init -q)
commit_of("${repo}" got)
expect("a repository without a commit" "${got}" "unknown")

file(WRITE "${repo}/tracked.txt" "one\n")
file(WRITE "${repo}/sub/file.txt" "one\n")
git("${repo}" add tracked.txt sub/file.txt)
git("${repo}" commit -qm one)
git("${repo}" rev-parse HEAD)
set(head "${git_output}")
commit_of("${repo}" got)
expect("a clean checkout" "${got}" "${head}")

# Unchanged: not rewritten. The file is dated back first, so a rewrite shows in its date whatever the clock's grain.
execute_process(COMMAND touch -d "2001-01-01 00:00:00" "${out}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "touch -d failed on ${out}")
endif()
commit_of("${repo}" got)
file(TIMESTAMP "${out}" year "%Y")
if(NOT year STREQUAL "2001")
  message(FATAL_ERROR "an unchanged commit rewrote ${out} (dated ${year} now): every build would relink everything")
endif()
message(STATUS "an unchanged commit leaves the file as it was")

commit_of("${repo}/sub" got)
expect("a subfolder of a checkout (a tree unpacked inside another repository)" "${got}" "unknown")

file(CREATE_LINK "${repo}" "${WORK_DIR}/link" SYMBOLIC)
commit_of("${WORK_DIR}/link" got)
expect("a checkout reached through a link" "${got}" "${head}")

file(WRITE "${repo}/untracked.txt" "x\n")
commit_of("${repo}" got)
expect("an untracked file" "${got}" "${head}")

file(APPEND "${repo}/tracked.txt" "two\n")
commit_of("${repo}" got)
expect("a changed tracked file" "${got}" "${head}-dirty")
file(TIMESTAMP "${out}" year "%Y")
if(year STREQUAL "2001")
  message(FATAL_ERROR "a changed commit left ${out} as it was")
endif()

commit_of("${repo}" got "")
expect("no git" "${got}" "unknown")
commit_of("${repo}" got "GIT_EXECUTABLE-NOTFOUND")
expect("git not found at configure time" "${got}" "unknown")
commit_of("${repo}" got "${WORK_DIR}/no-such-git")
expect("a git that cannot run" "${got}" "unknown")

file(REMOVE_RECURSE "${WORK_DIR}")
