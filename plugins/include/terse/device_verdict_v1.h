/* terse optional compressor entry points, version 1: a decompress (and a multi-round compress) that leaves its payload
 * check's verdict on the device.
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
 * the word (null in an ordinary decompress), and the kit's device::checkedDecompress uses it.
 *
 * A second optional entry point, terse_compressor_compress_deferred_v1 (terse_compress_deferred_fn_v1), does the same
 * for a multi-round compressor's check of `prev`, the aggregate of the round before (PowerSGD's summed P, which round 1
 * validates before it orthogonalizes it). Without it a CUDA plugin synchronizes once a tensor in that round too.
 * Its contract: compress's (compressor_v1.h), on the same arguments, except for a fault of `prev` that the plugin finds
 * only by reading device memory:
 *   - `verdict` is a word as above (zeroed by the core, in the call's memory, read once `stream` has run the call).
 *   - For such a fault the plugin's kernels store a nonzero value into *verdict, and the call returns TERSE_OK without
 *     waiting, with *output_bytes what a valid prev gives (a fixed-size compressor's size).
 *   - When the word is raised, the output's bytes and the workspace are undefined (the core may still send the payload:
 *     every rank holds the same summed prev, so a fault of prev itself is raised on every rank alike, while a fault of
 *     a rank's own state that the check finds too fails that rank only, after the round's collective), this call
 *     writes no state (what the step's earlier rounds wrote stays), and this step's
 *     decompress of this tensor -- of the aggregate and of this rank's own payload -- must refuse, raising its own word
 *     or returning an error status, as the workspace lacks what this call would have left there (PowerSGD: round 1
 *     writes its workspace tag and its payload's header only for a valid prev, and decompress checks both).
 *   - A valid prev gives exactly compress's bytes and workspace.
 * The core passes a word only in the last round of a SUM plugin of several rounds (whose prev stays in place until the
 * step's decodes are done), only on a device, and only where the plugin defers its decompress's checks too. For a
 * raised word it calls compress on the same prev, with an input of zeros and an output of scratch memory (the
 * tensor's own workspace and state), for the refusal's message: compress must refuse that prev too, and if it accepts
 * it the core reports the plugin as broken. Ignoring `verdict` and returning compress's status is always correct.
 * sdk::CompressArgs:: deferredVerdict() is the word in a plugin built with <terse/sdk.hpp>, which exports this symbol
 * too. */
#ifndef TERSE_DEVICE_VERDICT_V1_H_
#define TERSE_DEVICE_VERDICT_V1_H_

#include "terse/compressor_v1.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TERSE_COMPRESSOR_DECOMPRESS_DEFERRED_V1_SYMBOL "terse_compressor_decompress_deferred_v1"
#define TERSE_COMPRESSOR_COMPRESS_DEFERRED_V1_SYMBOL "terse_compressor_compress_deferred_v1"

typedef terse_status_v1 (*terse_decompress_deferred_fn_v1)(void* ctx, const terse_tensor_info_v1* info,
                                                           const void* payload, uint64_t payload_bytes,
                                                           const terse_scratch_v1* scratch, void* output,
                                                           int32_t accumulate, uint32_t* verdict, void* stream);

typedef terse_status_v1 (*terse_compress_deferred_fn_v1)(void* ctx, const terse_tensor_info_v1* info, const void* input,
                                                         const void* prev, uint64_t prev_bytes,
                                                         const terse_scratch_v1* scratch, void* output,
                                                         uint64_t output_capacity, uint64_t* output_bytes,
                                                         uint32_t* verdict, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* TERSE_DEVICE_VERDICT_V1_H_ */
