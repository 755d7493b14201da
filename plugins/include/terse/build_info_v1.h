/* terse optional plugin symbol, version 1: how the plugin library was compiled.
 *
 * Additive to the compressor and scheduler ABIs v1, which stay as released (compressor_v1.h, scheduler_v1.h): beside
 * its one struct, a plugin library MAY export a const terse_build_info_v1 named terse_compressor_build_info_v1 (a
 * compressor plugin) or terse_scheduler_build_info_v1 (a scheduler plugin). The core looks it up by name when it
 * loads the file, and `terse plugins show` and `terse plugins check` say when a plugin was built without
 * optimisation: a plugin at -O0 runs its loops several times slower (8x on a compress measured against Release), and
 * its timings say nothing about the method. A plugin without the symbol loads and runs as before, and how it was built
 * is reported as unknown. Why a separate symbol and not a new member of the v1 structs: their size and every offset
 * are frozen (tests/abi), and old cores must keep loading new plugins.
 *
 * The C++ helper <terse/sdk.hpp> exports it for every plugin it builds: TERSE_EXPORT_COMPRESSOR and
 * TERSE_EXPORT_SCHEDULER define it with TERSE_BUILD_INFO_V1_INIT, so it describes the translation unit that expands
 * the export macro. A C plugin may do the same:
 *
 *   TERSE_PLUGIN_V1_EXPORT const terse_build_info_v1 terse_compressor_build_info_v1 = TERSE_BUILD_INFO_V1_INIT;
 *
 * terse_add_compressor() and terse_add_scheduler() keep the symbol in the plugin's dynamic symbol table. */
#ifndef TERSE_BUILD_INFO_V1_H_
#define TERSE_BUILD_INFO_V1_H_

#include "terse/types_v1.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TERSE_COMPRESSOR_BUILD_INFO_V1_SYMBOL "terse_compressor_build_info_v1"
#define TERSE_SCHEDULER_BUILD_INFO_V1_SYMBOL "terse_scheduler_build_info_v1"

/* The translation unit was compiled with optimisation (the compiler defined __OPTIMIZE__: -O1 and above, -Os, -Og).
 * Clear: compiled at -O0. */
#define TERSE_BUILD_OPTIMIZED 0x1u
/* Every flag version 1 defines; the core ignores the others, so later versions may add flags. */
#define TERSE_BUILD_ALL_V1 0x1u

typedef struct terse_build_info_v1 {
  uint32_t struct_size; /* sizeof(terse_build_info_v1) as the plugin was built; the core reads what it knows */
  uint32_t flags;       /* TERSE_BUILD_* */
} terse_build_info_v1;

/* The flags of the translation unit that expands this macro. */
#if defined(__OPTIMIZE__)
#define TERSE_BUILD_INFO_V1_FLAGS TERSE_BUILD_OPTIMIZED
#else
#define TERSE_BUILD_INFO_V1_FLAGS 0u
#endif

#define TERSE_BUILD_INFO_V1_INIT \
  { sizeof(terse_build_info_v1), TERSE_BUILD_INFO_V1_FLAGS }

#ifdef __cplusplus
}
#endif

#endif /* TERSE_BUILD_INFO_V1_H_ */
