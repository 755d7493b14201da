# Finds Random123 (header-only counter-based RNGs; terse/sdk/philox.hpp uses its Philox4x32-10) and defines the
# imported target Random123::Random123. Installed with the terse package, whose compressor kit links it.
find_path(Random123_INCLUDE_DIR Random123/philox.h)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Random123 REQUIRED_VARS Random123_INCLUDE_DIR)
if(Random123_FOUND AND NOT TARGET Random123::Random123)
  add_library(Random123::Random123 INTERFACE IMPORTED)
  set_target_properties(Random123::Random123 PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${Random123_INCLUDE_DIR}")
endif()
mark_as_advanced(Random123_INCLUDE_DIR)
