/* terse optional plugin entry point, version 1: the parameters an instance resolved, its defaults included.
 *
 * Additive to the compressor and scheduler ABIs v1, which stay as released (compressor_v1.h, scheduler_v1.h): beside
 * its one struct, a plugin library MAY export a function of type terse_resolved_params_fn_v1 named
 * terse_compressor_resolved_params_v1 (a compressor plugin) or terse_scheduler_resolved_params_v1 (a scheduler
 * plugin). The core looks it up by name when it loads the file; a plugin without it loads and runs as before, and
 * the run's provenance then says its defaults were not reported. Why a separate symbol and not a new member of the
 * v1 structs: their size and every offset are frozen (tests/abi), and old cores must keep loading new plugins.
 *
 * The C++ helper <terse/sdk.hpp> exports it for every plugin it builds, from the sdk::Params getters the plugin's
 * constructor called (each getter records the value it returned: the config's, parsed, or the default). */
#ifndef TERSE_RESOLVED_PARAMS_V1_H_
#define TERSE_RESOLVED_PARAMS_V1_H_

#include "terse/types_v1.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TERSE_COMPRESSOR_RESOLVED_PARAMS_V1_SYMBOL "terse_compressor_resolved_params_v1"
#define TERSE_SCHEDULER_RESOLVED_PARAMS_V1_SYMBOL "terse_scheduler_resolved_params_v1"

/* Stores in *params an array of *num_params key/value pairs: every parameter the instance `ctx` (made by init) read,
 * with the value it uses, as text (numbers in a form that parses back to the same value). Keys are unique, in the
 * order the instance read them. The array and its strings are owned by the instance and stay valid until finalize.
 * Pure (the same answer every time), does not block, may run on any thread. Returns TERSE_OK, or
 * TERSE_ERR_INVALID_ARGUMENT when a pointer is NULL (then writes nothing). */
typedef terse_status_v1 (*terse_resolved_params_fn_v1)(void* ctx, const terse_param_v1** params, size_t* num_params);

#ifdef __cplusplus
}
#endif

#endif /* TERSE_RESOLVED_PARAMS_V1_H_ */
