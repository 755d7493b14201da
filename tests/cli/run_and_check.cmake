# cmake -DTERSE=<binary> -DARGS=<a@@b@@c> -DEXPECT_RC=<n> [-DMATCH_0=<regex> ...] [-DNOMATCH_0=<regex> ...]
#   -P run_and_check.cmake
# Runs `terse` with ARGS ('@@'-separated, since ';' would be split by add_test), then checks the exit code and that
# stdout+stderr match every MATCH_<i> and no NOMATCH_<i> (i = 0..9). Prints the output on failure.
cmake_minimum_required(VERSION 3.25)
string(REPLACE "@@" ";" args "${ARGS}")
execute_process(COMMAND "${TERSE}" ${args} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
set(all "${out}${err}")
set(problems "")
if(NOT "${rc}" STREQUAL "${EXPECT_RC}")
  string(APPEND problems "\n  exit code ${rc}, expected ${EXPECT_RC}")
endif()
foreach(i RANGE 0 9)
  if(DEFINED MATCH_${i} AND NOT all MATCHES "${MATCH_${i}}")
    string(APPEND problems "\n  output does not match: ${MATCH_${i}}")
  endif()
  if(DEFINED NOMATCH_${i} AND all MATCHES "${NOMATCH_${i}}")
    string(APPEND problems "\n  output matches what it must not: ${NOMATCH_${i}}")
  endif()
endforeach()
if(problems)
  message(FATAL_ERROR "terse ${args}:${problems}\n--- stdout ---\n${out}\n--- stderr ---\n${err}")
endif()
message(STATUS "terse ${args}: exit ${rc} as expected\n${out}${err}")
