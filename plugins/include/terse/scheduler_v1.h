/* terse scheduler plugin ABI, version 1.
 *
 * FROZEN once released: a change is a new `scheduler_v2.h` plus an adapter in core/plugin. tests/abi locks the layout.
 *
 * A scheduler decides the order in which gradient chunks are communicated (DESIGN.md section 2). Per worker, as
 * backward makes each layer's gradient ready (reverse layer order), the core asks the scheduler how to cut the tensor
 * (`partition`), sizes every chunk after compression, and hands the chunks over (`enqueue`). The communication thread
 * then repeatedly asks `next` for one group of chunks (fused into one collective) that fits the credit left, runs it,
 * and reports it with `on_complete`.
 *
 * Every rank runs its own instance and must issue collectives in the same order, so a scheduler's decisions may
 * depend only on what was enqueued and completed, the flags and the credit, never on wall-clock time or
 * randomness without a shared seed. The core checks every answer (ids known and pending, credit respected, progress
 * made) and fails the run with the plugin's name on a violation.
 *
 * One plugin exports exactly one required symbol, a const terse_scheduler_v1 named `terse_scheduler_plugin_v1`, with
 * everything else but the optional entry point of resolved_params_v1.h hidden. No C++ exception may cross any function
 * below. All calls of one instance come from one thread at a time (the worker's communication thread); distinct
 * instances are independent. */
#ifndef TERSE_SCHEDULER_V1_H_
#define TERSE_SCHEDULER_V1_H_

#include "terse/types_v1.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TERSE_SCHEDULER_ABI_V1 1u
#define TERSE_SCHEDULER_PLUGIN_V1_SYMBOL "terse_scheduler_plugin_v1"

/* A gradient tensor that just became ready. */
typedef struct terse_sched_tensor_v1 {
  uint32_t struct_size; /* sizeof(terse_sched_tensor_v1) as the core was built */
  terse_dtype_v1 dtype;
  uint64_t tensor_id; /* stable for the run, identical on every rank */
  uint64_t numel;     /* may be 0 */
  uint64_t bytes;     /* numel * element size, before compression */
  uint64_t step;
  int32_t layer_index; /* position in the forward pass: 0 is the first layer, so lower goes first under P3 */
  int32_t num_layers;  /* layers of the model, > layer_index */
} terse_sched_tensor_v1;

/* A contiguous slice of one tensor: the unit the scheduler orders. */
typedef struct terse_chunk_v1 {
  uint64_t chunk_id; /* assigned by the core, unique within the step */
  uint64_t tensor_id;
  uint64_t step;
  uint64_t offset;     /* first element of the slice within the tensor */
  uint64_t numel;      /* elements in the slice */
  uint64_t bytes;      /* before compression */
  uint64_t wire_bytes; /* after compression: exact for fixed-size compressors, their upper bound otherwise */
  int32_t layer_index;
  int32_t chunk_index; /* 0.. within its tensor, in offset order */
} terse_chunk_v1;

typedef struct terse_scheduler_caps_v1 {
  uint32_t struct_size;  /* set by the core before the call */
  uint32_t flags;        /* reserved, 0 */
  uint64_t credit_bytes; /* most wire bytes in flight at once; 0 means unlimited */
} terse_scheduler_caps_v1;

/* Flags the core passes to `next`. */
/* Every tensor of this step has been enqueued: flush partial groups. */
#define TERSE_SCHED_ALL_ENQUEUED 0x1u
/* No group is in flight: returning nothing now, with chunks pending and TERSE_SCHED_ALL_ENQUEUED set, is a stall and
 * an error. */
#define TERSE_SCHED_NOTHING_IN_FLIGHT 0x2u

typedef struct terse_scheduler_v1 {
  uint32_t abi_version;    /* TERSE_SCHEDULER_ABI_V1 */
  uint32_t struct_size;    /* sizeof(terse_scheduler_v1) */
  const char* name;        /* [a-z0-9_]+; the file is terse_scheduler_<name>.so */
  const char* description; /* one line; may be "" but not NULL */
  const char* version;     /* the plugin's own version for provenance; may be "" but not NULL */

  /* As the compressor's init: validates the parameters (unknown keys are errors, reported through host->log),
   * stores an opaque context in *ctx. `host` stays valid until finalize returns; `params` only during this call. */
  terse_status_v1 (*init)(const terse_param_v1* params, size_t num_params, const terse_host_v1* host, void** ctx);

  /* Destroys the instance; called once, after every other call has returned. Errors are logged and ignored. */
  terse_status_v1 (*finalize)(void* ctx);

  /* Fills *caps. Pure: the same answer every time. */
  terse_status_v1 (*get_caps)(void* ctx, terse_scheduler_caps_v1* caps);

  /* Says how to cut a ready tensor: *chunk_numel elements per chunk (the last one shorter), or 0 for the whole tensor
   * as one chunk. The core cuts a matrix (a tensor of 2 or more dimensions, viewed as rows of its first dimension) at
   * whole rows where a row fits in *chunk_numel: rounded down to a multiple of the row, so that every chunk keeps the
   * matrix shape (PowerSGD factors a matrix, and sends a vector whole); a row longer than *chunk_numel is cut as
   * asked. Does not block; does not enqueue anything (the core calls enqueue with the resulting chunks). */
  terse_status_v1 (*partition)(void* ctx, const terse_sched_tensor_v1* tensor, uint64_t* chunk_numel);

  /* Takes the chunks of one ready tensor, in offset order (count >= 1). The array is valid during the call only: copy
   * what you keep. Does not block. */
  terse_status_v1 (*enqueue)(void* ctx, const terse_chunk_v1* chunks, uint64_t count);

  /* Picks the next group to communicate: writes up to `capacity` chunk ids into chunk_ids and the number into *count.
   * credit_left is caps.credit_bytes minus the wire bytes in flight, or UINT64_MAX when credit_bytes is 0 (unlimited).
   * The group is fused into one collective in the order given. Every id must be enqueued and not yet handed out.
   * The group's wire_bytes must not exceed credit_left, unless flags has TERSE_SCHED_NOTHING_IN_FLIGHT (a chunk
   * larger than the whole credit may then go alone). *count = 0 means "nothing now": the core calls again after the
   * next enqueue or completion. Does not block. */
  terse_status_v1 (*next)(void* ctx, uint64_t credit_left, uint32_t flags, uint64_t* chunk_ids, uint64_t capacity,
                          uint64_t* count);

  /* Notes that a group handed out by next has been communicated; wire_bytes is what it actually put on the wire
   * (at most the sum of its chunks' wire_bytes). The ids array is valid during the call only. Does not block. */
  terse_status_v1 (*on_complete)(void* ctx, const uint64_t* chunk_ids, uint64_t count, uint64_t wire_bytes);
} terse_scheduler_v1;

/* Marks the one exported symbol of a plugin written in C:
 *   TERSE_PLUGIN_V1_EXPORT const terse_scheduler_v1 terse_scheduler_plugin_v1 = {...}; */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERSE_SCHEDULER_V1_H_ */
