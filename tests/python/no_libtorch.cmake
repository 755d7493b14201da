# cmake -DREADELF=<readelf> -DMODULE=<extension> -P no_libtorch.cmake
#
# The extension takes tensors as pointers and must not link libtorch: one module then serves every torch (Debian's
# 1.13, a CUDA 2.x wheel), which load their own libraries before importing terse. A NEEDED entry naming torch's
# libraries would tie the module to the torch it was built against, and to its ABI.
execute_process(COMMAND "${READELF}" -d "${MODULE}" OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${READELF} -d ${MODULE} failed (${rc}): ${err}")
endif()
string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*\\[[^]\n]+\\]" needed_lines "${out}")
set(needed "")
foreach(line IN LISTS needed_lines)
  string(REGEX REPLACE ".*\\[([^]]+)\\]$" "\\1" lib "${line}")
  list(APPEND needed "${lib}")
endforeach()
# No NEEDED entry at all means the output was not understood, not that the module is clean.
if(NOT needed)
  message(FATAL_ERROR "no NEEDED entries in `${READELF} -d ${MODULE}`:\n${out}")
endif()
list(JOIN needed ", " needed_text)
message(STATUS "${MODULE} needs: ${needed_text}")
foreach(lib IN LISTS needed)
  if(lib MATCHES "^lib(torch|c10|shm)[._]")  # libtorch*, libc10*, torch's libshm
    message(FATAL_ERROR "${MODULE} links ${lib}: the extension must not depend on libtorch (it takes tensors as "
                        "pointers)")
  endif()
endforeach()
