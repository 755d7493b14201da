/* The current compressor ABI. Include this to build against the newest version; include compressor_v1.h to pin v1.
 * Bumping the version here is the only change a new ABI makes to this file. */
#ifndef TERSE_COMPRESSOR_H_
#define TERSE_COMPRESSOR_H_

#include "terse/compressor_v1.h"

#define TERSE_COMPRESSOR_ABI_VERSION TERSE_COMPRESSOR_ABI_V1
#define TERSE_COMPRESSOR_PLUGIN_SYMBOL TERSE_COMPRESSOR_PLUGIN_V1_SYMBOL
typedef terse_compressor_v1 terse_compressor_t;
typedef terse_tensor_info_v1 terse_tensor_info_t;
typedef terse_compressor_caps_v1 terse_compressor_caps_t;
typedef terse_compressor_sizes_v1 terse_compressor_sizes_t;
typedef terse_scratch_v1 terse_scratch_t;

#endif /* TERSE_COMPRESSOR_H_ */
