/* terse compressor plugin ABI, version 1.
 *
 * FROZEN once released: a change is a new `compressor_v2.h` plus an adapter in core/plugin that lifts v1 plugins.
 * tests/abi locks every offset below with static_assert.
 *
 * A compressor plugin is a shared library that exports exactly one required symbol, a const object of type
 * terse_compressor_v1 named `terse_compressor_plugin_v1` (use TERSE_PLUGIN_V1_EXPORT, or the C++ helper
 * <terse/sdk.hpp>), and keeps everything else but the optional entry points (resolved_params_v1.h, build_info_v1.h,
 * device_verdict_v1.h, phases_v1.h) at hidden visibility. No C++ exception may cross any function below: catch
 * everything and return TERSE_ERR_INTERNAL.
 *
 * The data's way through one step (DESIGN.md section 2), for caps.num_rounds == R:
 *   for round r in 0..R-1:  payload_r = compress(g, prev = aggregate of round r-1 or NULL)
 *                           aggregate_r = SUM / ALLGATHER / CUSTOM-reduce of every rank's payload_r
 *   out = decompress(aggregate_{R-1})       (SUM, CUSTOM: once; ALLGATHER: once per rank with accumulate = 1)
 * The core divides the decompressed aggregate by world_size. With SUM and ALLGATHER that aggregate is the sum of the
 * ranks' contributions; with CUSTOM it is what the plugin's reduction defines, scaled the same way (e.g. signSGD's
 * majority vote decodes to world_size * sign(votes)).
 *
 * Decompressing one rank's payload (source_rank >= 0) yields that rank's own contribution; with SUM and ALLGATHER
 * the sum over ranks of these equals the decompressed aggregate (CUSTOM reductions need not be sums). Error feedback
 * relies on the first part: it decompresses the local payload of the last round to learn what this rank sent.
 *
 * Threading: per-tensor memory (workspace and state) is owned and allocated by the core from the sizes the plugin
 * reports, so the hot path allocates nothing, and one ctx may serve several tensors and several in-process ranks
 * (each with its own workspace and state). Calls may therefore run concurrently on different threads with the same
 * ctx, which is read-only after init; calls that share one workspace/state are serialized by the core. */
#ifndef TERSE_COMPRESSOR_V1_H_
#define TERSE_COMPRESSOR_V1_H_

#include "terse/types_v1.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TERSE_COMPRESSOR_ABI_V1 1u
#define TERSE_COMPRESSOR_PLUGIN_V1_SYMBOL "terse_compressor_plugin_v1"

/* ---- What one call is about. Passed to every per-tensor call; valid for the duration of the call only. */
typedef struct terse_tensor_info_v1 {
  uint32_t struct_size;   /* sizeof(terse_tensor_info_v1) as the core was built */
  terse_dtype_v1 dtype;   /* element type of the gradient (input of compress, output of decompress) */
  uint64_t numel;         /* number of elements; 0 is valid and must work (an empty tensor) */
  int32_t ndim;           /* 0..4; 0 means a flat vector of numel elements */
  terse_device_v1 device; /* where every buffer of this call lives: TERSE_DEVICE_HOST or TERSE_DEVICE_CUDA */
  int64_t shape[4];       /* shape[0..ndim-1], row-major, product == numel; a matrix is rows = shape[0],
                             cols = numel / shape[0]. Unused entries are 0. */
  uint64_t tensor_id;     /* stable per tensor (or chunk) for the whole run, identical on every rank */
  uint64_t step;          /* training step, from 0 */
  uint64_t seed;          /* key for counter-based RNG. Identical on every rank when caps has
                             TERSE_CAP_SHARED_SEED, distinct per rank otherwise. Already mixed with nothing: combine it
                             with (step, tensor_id, element index) yourself. */
  int32_t rank;           /* this process's rank, 0 <= rank < world_size */
  int32_t world_size;     /* >= 1 */
  int32_t round;          /* 0 <= round < caps.num_rounds */
  int32_t source_rank;    /* compress: == rank. decompress and reduce: the rank whose payload this is, or -1 for an
                             aggregate (SUM result or CUSTOM reduction) of several ranks */
  int32_t device_index;   /* CUDA device ordinal when device == TERSE_DEVICE_CUDA, else -1 */
  uint32_t reserved0;     /* call flags, TERSE_CALL_* below (named as first released, when it was always 0) */
} terse_tensor_info_v1;

/* ---- Call flags, in terse_tensor_info_v1.reserved0. Added to v1 later: a core older than a flag never sets it and a
 * plugin older than it ignores it, so each is a hint that a plugin may ignore, and a plugin must ignore bits it does
 * not know. */
/* decompress only: the payload is the one this rank's own compress wrote for this tensor, step and last round,
 * untouched since (error feedback decoding what it sent: source_rank == rank, accumulate == 0). A plugin whose own
 * payloads always validate may decode it without validating it -- on a device, without the synchronization that reads
 * a validation verdict. One whose compress may write a payload its decompress refuses (a non-finite gradient let
 * through) should keep validating: the refusal fails error feedback's step before its residual changes. Never set for
 * a payload that crossed the network. */
#define TERSE_CALL_OWN_PAYLOAD 0x1u

/* ---- Capabilities: answered per gradient dtype before the run starts; the core validates them and picks the
 * aggregation path from them. They must not depend on anything but the dtype and the init parameters. */
typedef int32_t terse_aggregation_v1;
/* Payloads differ per rank and are not combinable: the core allgathers them (allgatherv) and decompresses each one
 * with accumulate = 1. Example: top-k values with their indices. */
#define TERSE_AGG_ALLGATHER 0
/* Payload bytes [sum_header_bytes, output_bytes) may be summed elementwise across ranks as wire_dtype (fp32, fp16 or
 * bf16; 16-bit sums are accumulated in fp32 per pair by the core). The first sum_header_bytes are identical on every
 * rank and are carried through unsummed. Requires TERSE_CAP_FIXED_SIZE. Examples: fp16 casting, random-k with a
 * shared seed, PowerSGD factors. */
#define TERSE_AGG_SUM 1
/* The plugin supplies `reduce`, an associative combination of two payloads (raw or already reduced). The core
 * allgathers the raw payloads and folds them in rank order on every rank, then decompresses once. Example: signSGD
 * with majority vote. */
#define TERSE_AGG_CUSTOM 2

/* output_bytes == sizes.max_output_bytes for every input: depends only on the tensor info, never on the data. */
#define TERSE_CAP_FIXED_SIZE 0x1u
/* The plugin keeps per-tensor state across steps in the core-owned state buffer. */
#define TERSE_CAP_STATEFUL 0x2u
/* info.seed must be identical on every rank (e.g. random-k picks shared indices). */
#define TERSE_CAP_SHARED_SEED 0x4u
/* The payload is the input itself: aggregation SUM, one round, not stateful, wire_dtype == the dtype asked about, and
 * for every input compress writes sum_header_bytes of header followed by the input's bytes unchanged, and decompress
 * with accumulate = 0 writes the body's bytes back unchanged. A core may then sum the gradient where it lies instead
 * of calling compress and decompress (the PyTorch hook does, as DDP's own allreduce does: no copy). The conformance
 * suite's "identity" check holds a plugin to this. Added to v1 later: a core older than the flag refuses it. */
#define TERSE_CAP_IDENTITY 0x8u
#define TERSE_CAP_ALL_V1 0xFu

#define TERSE_MAX_ROUNDS_V1 8

typedef struct terse_compressor_caps_v1 {
  uint32_t struct_size;    /* set by the core before the call */
  terse_device_v1 devices; /* bitmask of TERSE_DEVICE_*, nonzero */
  terse_aggregation_v1 aggregation;
  terse_dtype_v1 wire_dtype; /* SUM only: F32, F16 or BF16. Ignored otherwise. */
  uint32_t flags;            /* TERSE_CAP_* */
  int32_t num_rounds;        /* 1..TERSE_MAX_ROUNDS_V1 (PowerSGD: 2); more than 1 requires SUM or CUSTOM, so that
                                `prev` is one aggregated payload */
} terse_compressor_caps_v1;

/* ---- Two-phase sizing (cub style): asked once per tensor and round at setup; the core allocates then. */
typedef struct terse_compressor_sizes_v1 {
  uint32_t struct_size; /* set by the core before the call */
  uint32_t reserved0;
  uint64_t max_output_bytes;  /* upper bound of compress's output for this round (exact with TERSE_CAP_FIXED_SIZE) */
  uint64_t workspace_bytes;   /* scratch for this tensor; contents kept from round 0's compress to the last
                                 decompress of the same step, undefined when a step starts. Max over rounds is used. */
  uint64_t state_bytes;       /* persistent per-tensor state, zero-filled once by the core, kept across steps. Must be
                                 0 unless caps has TERSE_CAP_STATEFUL. Max over rounds is used. */
  uint64_t sum_header_bytes;  /* SUM only: leading bytes not summed, a multiple of the wire dtype's size */
  uint64_t max_reduced_bytes; /* CUSTOM only: upper bound of reduce's output for any number of ranks, >= max_output */
} terse_compressor_sizes_v1;

/* ---- The core-owned per-tensor memory of one call, on info.device, each aligned to at least 64 bytes. A pointer is
 * NULL exactly when its size is 0. */
typedef struct terse_scratch_v1 {
  void* workspace;
  uint64_t workspace_bytes;
  void* state;
  uint64_t state_bytes;
} terse_scratch_v1;

/* ---- The plugin. All function pointers are required unless said otherwise. "Blocking" below means the call may
 * wait on the given stream; on the host path (device == HOST, stream == NULL) every call completes its work before
 * returning. Buffers passed in are aligned to at least 16 bytes. */
typedef struct terse_compressor_v1 {
  uint32_t abi_version;    /* TERSE_COMPRESSOR_ABI_V1 */
  uint32_t struct_size;    /* sizeof(terse_compressor_v1) */
  const char* name;        /* [a-z0-9_]+, unique among loaded plugins; the file is terse_compressor_<name>.so */
  const char* description; /* one line for `terse plugins list`; may be "" but not NULL */
  const char* version;     /* the plugin's own version for provenance, e.g. "1.2.0"; may be "" but not NULL */

  /* Creates an instance from the config parameters. Validates every parameter and rejects unknown keys, reporting
   * the key and value through host->log (ERROR) and returning TERSE_ERR_INVALID_ARGUMENT. On success stores an opaque
   * context in *ctx (may be NULL if the plugin needs none). `host` stays valid until finalize returns; `params` only
   * during this call. Does not block. Several instances of one plugin may coexist. */
  terse_status_v1 (*init)(const terse_param_v1* params, size_t num_params, const terse_host_v1* host, void** ctx);

  /* Destroys an instance made by init; called exactly once per successful init, after every other call on it has
   * returned. Frees everything the instance owns. A non-OK status is logged by the core and otherwise ignored. */
  terse_status_v1 (*finalize)(void* ctx);

  /* Fills *caps for gradients of `dtype`. Returns TERSE_ERR_UNSUPPORTED for a dtype the plugin does not handle.
   * Pure: the same answer every time. Does not block. */
  terse_status_v1 (*get_caps)(void* ctx, terse_dtype_v1 dtype, terse_compressor_caps_v1* caps);

  /* Fills *sizes for the tensor and info->round (step, seed and source_rank are 0 here). Called at setup, never on the
   * hot path. Returns TERSE_ERR_UNSUPPORTED for a shape the plugin cannot handle. Does not block. */
  terse_status_v1 (*get_sizes)(void* ctx, const terse_tensor_info_v1* info, terse_compressor_sizes_v1* sizes);

  /* Writes this rank's payload for info->round into output (capacity: output_capacity >= max_output_bytes) and its
   * size into *output_bytes (host memory). `input` holds info->numel elements of info->dtype and is read-only.
   * `prev` is the aggregate of round - 1 (prev_bytes long, a SUM result or an ALLGATHER/CUSTOM result as the caps
   * say) and NULL in round 0. The payload must be self-describing so that decompress can validate it.
   * Blocking: a variable-size compressor on CUDA synchronizes `stream` to learn *output_bytes. */
  terse_status_v1 (*compress)(void* ctx, const terse_tensor_info_v1* info, const void* input, const void* prev,
                              uint64_t prev_bytes, const terse_scratch_v1* scratch, void* output,
                              uint64_t output_capacity, uint64_t* output_bytes, void* stream);

  /* output (info->numel elements of info->dtype) = decompressed payload, or output += decompressed payload when
   * accumulate != 0. The payload is untrusted (it came over the network): validate every length, count and index
   * against info and the sizes, and return TERSE_ERR_INVALID_PAYLOAD without touching memory out of bounds on any
   * malformed input. info->round is the last round; info->source_rank says whose payload it is (-1: aggregate).
   * May be called several times per step (once per rank's payload, and once more on the local payload by error
   * feedback): it never modifies the workspace, and modifies the state only for the aggregate (source_rank == -1),
   * e.g. PowerSGD's warm start keeping the aggregated factor for the next step. A CUDA plugin may also export the
   * optional deferred form (device_verdict_v1.h), which leaves a check's verdict on the device instead of waiting. */
  terse_status_v1 (*decompress)(void* ctx, const terse_tensor_info_v1* info, const void* payload,
                                uint64_t payload_bytes, const terse_scratch_v1* scratch, void* output,
                                int32_t accumulate, void* stream);

  /* CUSTOM aggregation only, NULL otherwise: output = a (+) b for an associative (+), where a and b are raw payloads or
   * outputs of earlier reduce calls (validate both, as in decompress). output_capacity >= max_reduced_bytes; the size
   * goes to *output_bytes. output never aliases a or b. */
  terse_status_v1 (*reduce)(void* ctx, const terse_tensor_info_v1* info, const void* a, uint64_t a_bytes, const void* b,
                            uint64_t b_bytes, const terse_scratch_v1* scratch, void* output, uint64_t output_capacity,
                            uint64_t* output_bytes, void* stream);
} terse_compressor_v1;

/* Marks the one exported symbol of a plugin written in C:
 *   TERSE_PLUGIN_V1_EXPORT const terse_compressor_v1 terse_compressor_plugin_v1 = {...}; */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERSE_COMPRESSOR_V1_H_ */
