# ctest -P script: no two plugins in PLUGIN_DIR register a CUDA kernel of the same mangled name.
#
# CUDA's runtime looks kernels up by name; when two loaded plugins register one name it launches the copy registered
# first, also after that plugin was unloaded (terse/kit/device.cuh). The kit's kernels and cub's are compiled into
# every plugin that uses them, so terse_compressor_cuda_sources() gives each plugin its own namespaces for them. This
# check reads the kernels' host stubs (`__device_stub__<mangled kernel name>...`) from each plugin's symbol table, so
# it needs no GPU: it runs in every CUDA build.
#   -DPLUGIN_DIR=<dir> -DNM=<nm>
if(NOT IS_DIRECTORY "${PLUGIN_DIR}" OR NOT NM)
  message(FATAL_ERROR "kernel_names.cmake: needs -DPLUGIN_DIR=<dir> (got '${PLUGIN_DIR}') and -DNM=<nm>")
endif()
file(GLOB plugins "${PLUGIN_DIR}/terse_compressor_*.so")
set(total 0)
set(duplicates "")
foreach(plugin IN LISTS plugins)
  get_filename_component(name "${plugin}" NAME)
  execute_process(COMMAND "${NM}" --defined-only "${plugin}" OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} --defined-only ${plugin} failed (${rc})")
  endif()
  string(REGEX MATCHALL "[0-9a-f]+ [tT] [^\n]*__device_stub__[^\n]*" stubs "${symbols}")
  foreach(line IN LISTS stubs)
    string(REGEX REPLACE "^[0-9a-f]+ [tT] " "" stub "${line}")
    if(stub MATCHES "\\.cold$")
      continue()
    endif()
    math(EXPR total "${total} + 1")
    string(MD5 key "${stub}")
    if(DEFINED owner_${key})
      list(APPEND duplicates "${stub}\n    in ${owner_${key}} and ${name}")
    else()
      set(owner_${key} "${name}")
    endif()
  endforeach()
endforeach()
list(LENGTH plugins count)
if(total EQUAL 0)
  message(FATAL_ERROR "no kernel stub in the ${count} plugins of ${PLUGIN_DIR}: a CUDA build's built-ins have kernels")
endif()
if(duplicates)
  list(JOIN duplicates "\n  " text)
  message(FATAL_ERROR "kernels registered under one name by two plugins (the runtime would launch only the first):\n"
                      "  ${text}")
endif()
message(STATUS "${total} kernel stubs in ${count} plugins, every kernel name in one plugin only")
