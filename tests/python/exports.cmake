# cmake -DREADELF=<readelf> -DMODULE=<extension> -P exports.cmake
#
# The extension exports PyInit__terse and nothing else (experiments/python/extension.map). Anything more -- terse's
# own symbols, std:: template instantiations, or the C++ runtime of a toolchain that links libstdc++ statically --
# can interpose on the symbols of torch and of the system libstdc++ loaded in the same process (on the H200 image,
# `import torch; import terse.torch` crashed in std::locale until the map hid them).
cmake_minimum_required(VERSION 3.25)
execute_process(COMMAND "${READELF}" -W --dyn-syms "${MODULE}" OUTPUT_VARIABLE out ERROR_VARIABLE err
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${READELF} --dyn-syms ${MODULE} failed (${rc}): ${err}")
endif()
# Rows: Num: Value Size Type Bind Vis Ndx Name. Defined (Ndx not UND), global or weak, visible: what others bind to.
string(REPLACE "\n" ";" rows "${out}")
set(exported "")
foreach(row IN LISTS rows)
  if(row MATCHES "^ *[0-9]+: +[0-9a-f]+ +[0-9]+ +[A-Z_]+ +(GLOBAL|WEAK|UNIQUE) +(DEFAULT|PROTECTED) +([0-9]+|ABS) +([^ ]+)")
    list(APPEND exported "${CMAKE_MATCH_4}")
  endif()
endforeach()
if(NOT "PyInit__terse" IN_LIST exported)
  message(FATAL_ERROR "${MODULE} does not export PyInit__terse (or `${READELF} --dyn-syms` was not understood):\n"
                      "${out}")
endif()
list(REMOVE_ITEM exported "PyInit__terse")
list(LENGTH exported n)
if(n GREATER 0)
  list(SUBLIST exported 0 10 some)
  list(JOIN some "\n  " some_text)
  message(FATAL_ERROR "${MODULE} exports ${n} symbols besides PyInit__terse, e.g.\n  ${some_text}\n"
                      "Link it with experiments/python/extension.map.")
endif()
message(STATUS "${MODULE} exports PyInit__terse alone")
