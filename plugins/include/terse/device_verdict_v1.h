/* terse optional compressor entry point, version 1: a decompress that leaves its payload check's verdict on the device.
 *
 * Additive to the compressor ABI v1, which stays as released (compressor_v1.h): beside its one struct, a compressor
 * plugin library MAY export a function of type terse_decompress_deferred_fn_v1 named
 * terse_compressor_decompress_deferred_v1. The core looks it up by name when it loads the file; a plugin without it
 * loads and runs as before. Why a separate symbol and not a new member of the v1 struct: its size and every offset are
 * frozen (tests/abi), and old cores must keep loading new plugins.
 *
 * Why. decompress must return TERSE_ERR_INVALID_PAYLOAD for a malformed payload, so a CUDA plugin whose check runs in a
 * kernel synchronizes its stream once a call to read the verdict: on the DDP hook's stream, that waits for every
 * backward kernel queued before it, tensor after tensor (results/reference/gpu/README.md measured what it costs on
 * ResNet-50). This entry point lets the verdict stay on the device until the core reads the verdicts of a whole
 * collective's decodes with one synchronization.
 *
 * The contract: decompress's (compressor_v1.h), on the same arguments, except for a payload fault that the plugin finds
 * only by reading device memory:
 *   - `verdict` is a 4-byte word in the memory of the call (info->device: host memory, or device memory of
 *     info->device_index), zeroed by the core before the call and read by the core once `stream` has run the call's
 *     work. Several calls never share a word.
 *   - For such a fault the plugin's kernels store a nonzero value into *verdict (racing stores of the same value are
 *     fine), and the call returns TERSE_OK without waiting on the stream.
 *   - Every write the call queues (output, state) is skipped when the word is raised, so a refused payload leaves them
 *     as they were, as decompress does. A kernel that decodes after a separate check kernel reads the word first.
 *   - A clean payload decodes to exactly what decompress writes.
 *   - What the plugin can refuse without reading device memory (a payload of the wrong size, a bad argument) it returns
 *     as decompress does; the core treats a returned status and a raised word alike.
 * The core calls decompress (the ordinary entry point) on a payload whose word was raised, for the refusal's message:
 * decompress must refuse it too, and if it accepts it the core reports the plugin as broken. One exception: the
 * decode of a rank's own payload for error feedback (TERSE_CALL_OWN_PAYLOAD) under SUM, whose payload the collective
 * has summed over by the time the word is read; that refusal is reported without the plugin's message. Ignoring
 * `verdict` and returning decompress's status is always correct; on the host the core passes a host word, and a host
 * plugin has no reason to use it. Does not block (unless it ignores `verdict`: then it blocks as decompress does).
 *
 * The C++ helper <terse/sdk.hpp> exports it for every plugin it builds: sdk::DecompressArgs::deferredVerdict() is then
 * the word (null in an ordinary decompress), and the kit's device::checkedDecompress uses it. */
#ifndef TERSE_DEVICE_VERDICT_V1_H_
#define TERSE_DEVICE_VERDICT_V1_H_

#include "terse/compressor_v1.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TERSE_COMPRESSOR_DECOMPRESS_DEFERRED_V1_SYMBOL "terse_compressor_decompress_deferred_v1"

typedef terse_status_v1 (*terse_decompress_deferred_fn_v1)(void* ctx, const terse_tensor_info_v1* info,
                                                           const void* payload, uint64_t payload_bytes,
                                                           const terse_scratch_v1* scratch, void* output,
                                                           int32_t accumulate, uint32_t* verdict, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* TERSE_DEVICE_VERDICT_V1_H_ */
