/* The v1 ABI layout, locked. Included from a C11 and a C++ translation unit so both languages are held to the same
 * offsets. A failure here means a frozen header changed: revert it and add a _v2 header instead (DESIGN.md section 3).
 * The ABI is defined for LP64 platforms (64-bit Linux), which the first assertion states. */
#include <stddef.h>

#include "terse/build_info_v1.h"
#include "terse/compressor_v1.h"
#include "terse/device_verdict_v1.h"
#include "terse/phases_v1.h"
#include "terse/scheduler_v1.h"

#ifdef __cplusplus
#define TERSE_LOCK(cond) static_assert(cond, #cond)
#else
#define TERSE_LOCK(cond) _Static_assert(cond, #cond)
#endif
#define TERSE_AT(type, field, off) TERSE_LOCK(offsetof(type, field) == (off))

TERSE_LOCK(sizeof(void*) == 8);
TERSE_LOCK(sizeof(size_t) == 8);

/* types_v1.h */
TERSE_AT(terse_host_v1, struct_size, 0);
TERSE_AT(terse_host_v1, reserved0, 4);
TERSE_AT(terse_host_v1, user, 8);
TERSE_AT(terse_host_v1, log, 16);
TERSE_LOCK(sizeof(terse_host_v1) == 24);
TERSE_AT(terse_param_v1, key, 0);
TERSE_AT(terse_param_v1, value, 8);
TERSE_LOCK(sizeof(terse_param_v1) == 16);
TERSE_LOCK(TERSE_OK == 0 && TERSE_ERR_INVALID_ARGUMENT == 1 && TERSE_ERR_INVALID_PAYLOAD == 2);
TERSE_LOCK(TERSE_ERR_UNSUPPORTED == 3 && TERSE_ERR_OUT_OF_MEMORY == 4 && TERSE_ERR_DEVICE == 5);
TERSE_LOCK(TERSE_ERR_INTERNAL == 6);
TERSE_LOCK(TERSE_DTYPE_F32 == 0 && TERSE_DTYPE_F16 == 1 && TERSE_DTYPE_BF16 == 2 && TERSE_DTYPE_F64 == 3);
TERSE_LOCK(TERSE_DTYPE_I32 == 4 && TERSE_DTYPE_I64 == 5 && TERSE_DTYPE_U8 == 6 && TERSE_DTYPE_I8 == 7);
TERSE_LOCK(TERSE_DTYPE_COUNT_V1 == 8);
TERSE_LOCK(TERSE_DEVICE_HOST == 1 && TERSE_DEVICE_CUDA == 2);
TERSE_LOCK(TERSE_LOG_DEBUG == 0 && TERSE_LOG_INFO == 1 && TERSE_LOG_WARN == 2 && TERSE_LOG_ERROR == 3);

/* compressor_v1.h */
TERSE_AT(terse_tensor_info_v1, struct_size, 0);
TERSE_AT(terse_tensor_info_v1, dtype, 4);
TERSE_AT(terse_tensor_info_v1, numel, 8);
TERSE_AT(terse_tensor_info_v1, ndim, 16);
TERSE_AT(terse_tensor_info_v1, device, 20);
TERSE_AT(terse_tensor_info_v1, shape, 24);
TERSE_AT(terse_tensor_info_v1, tensor_id, 56);
TERSE_AT(terse_tensor_info_v1, step, 64);
TERSE_AT(terse_tensor_info_v1, seed, 72);
TERSE_AT(terse_tensor_info_v1, rank, 80);
TERSE_AT(terse_tensor_info_v1, world_size, 84);
TERSE_AT(terse_tensor_info_v1, round, 88);
TERSE_AT(terse_tensor_info_v1, source_rank, 92);
TERSE_AT(terse_tensor_info_v1, device_index, 96);
TERSE_AT(terse_tensor_info_v1, reserved0, 100);
TERSE_LOCK(sizeof(terse_tensor_info_v1) == 104);
TERSE_LOCK(TERSE_CALL_OWN_PAYLOAD == 1);

TERSE_AT(terse_compressor_caps_v1, struct_size, 0);
TERSE_AT(terse_compressor_caps_v1, devices, 4);
TERSE_AT(terse_compressor_caps_v1, aggregation, 8);
TERSE_AT(terse_compressor_caps_v1, wire_dtype, 12);
TERSE_AT(terse_compressor_caps_v1, flags, 16);
TERSE_AT(terse_compressor_caps_v1, num_rounds, 20);
TERSE_LOCK(sizeof(terse_compressor_caps_v1) == 24);
TERSE_LOCK(TERSE_AGG_ALLGATHER == 0 && TERSE_AGG_SUM == 1 && TERSE_AGG_CUSTOM == 2);
TERSE_LOCK(TERSE_CAP_FIXED_SIZE == 1 && TERSE_CAP_STATEFUL == 2 && TERSE_CAP_SHARED_SEED == 4 &&
           TERSE_CAP_IDENTITY == 8 && TERSE_CAP_ALL_V1 == 15);
TERSE_LOCK(TERSE_MAX_ROUNDS_V1 == 8);

TERSE_AT(terse_compressor_sizes_v1, struct_size, 0);
TERSE_AT(terse_compressor_sizes_v1, reserved0, 4);
TERSE_AT(terse_compressor_sizes_v1, max_output_bytes, 8);
TERSE_AT(terse_compressor_sizes_v1, workspace_bytes, 16);
TERSE_AT(terse_compressor_sizes_v1, state_bytes, 24);
TERSE_AT(terse_compressor_sizes_v1, sum_header_bytes, 32);
TERSE_AT(terse_compressor_sizes_v1, max_reduced_bytes, 40);
TERSE_LOCK(sizeof(terse_compressor_sizes_v1) == 48);

TERSE_AT(terse_scratch_v1, workspace, 0);
TERSE_AT(terse_scratch_v1, workspace_bytes, 8);
TERSE_AT(terse_scratch_v1, state, 16);
TERSE_AT(terse_scratch_v1, state_bytes, 24);
TERSE_LOCK(sizeof(terse_scratch_v1) == 32);

TERSE_LOCK(TERSE_COMPRESSOR_ABI_V1 == 1);
TERSE_AT(terse_compressor_v1, abi_version, 0);
TERSE_AT(terse_compressor_v1, struct_size, 4);
TERSE_AT(terse_compressor_v1, name, 8);
TERSE_AT(terse_compressor_v1, description, 16);
TERSE_AT(terse_compressor_v1, version, 24);
TERSE_AT(terse_compressor_v1, init, 32);
TERSE_AT(terse_compressor_v1, finalize, 40);
TERSE_AT(terse_compressor_v1, get_caps, 48);
TERSE_AT(terse_compressor_v1, get_sizes, 56);
TERSE_AT(terse_compressor_v1, compress, 64);
TERSE_AT(terse_compressor_v1, decompress, 72);
TERSE_AT(terse_compressor_v1, reduce, 80);
TERSE_LOCK(sizeof(terse_compressor_v1) == 88);

/* scheduler_v1.h */
TERSE_AT(terse_sched_tensor_v1, struct_size, 0);
TERSE_AT(terse_sched_tensor_v1, dtype, 4);
TERSE_AT(terse_sched_tensor_v1, tensor_id, 8);
TERSE_AT(terse_sched_tensor_v1, numel, 16);
TERSE_AT(terse_sched_tensor_v1, bytes, 24);
TERSE_AT(terse_sched_tensor_v1, step, 32);
TERSE_AT(terse_sched_tensor_v1, layer_index, 40);
TERSE_AT(terse_sched_tensor_v1, num_layers, 44);
TERSE_LOCK(sizeof(terse_sched_tensor_v1) == 48);

TERSE_AT(terse_chunk_v1, chunk_id, 0);
TERSE_AT(terse_chunk_v1, tensor_id, 8);
TERSE_AT(terse_chunk_v1, step, 16);
TERSE_AT(terse_chunk_v1, offset, 24);
TERSE_AT(terse_chunk_v1, numel, 32);
TERSE_AT(terse_chunk_v1, bytes, 40);
TERSE_AT(terse_chunk_v1, wire_bytes, 48);
TERSE_AT(terse_chunk_v1, layer_index, 56);
TERSE_AT(terse_chunk_v1, chunk_index, 60);
TERSE_LOCK(sizeof(terse_chunk_v1) == 64);

TERSE_AT(terse_scheduler_caps_v1, struct_size, 0);
TERSE_AT(terse_scheduler_caps_v1, flags, 4);
TERSE_AT(terse_scheduler_caps_v1, credit_bytes, 8);
TERSE_LOCK(sizeof(terse_scheduler_caps_v1) == 16);
TERSE_LOCK(TERSE_SCHED_ALL_ENQUEUED == 1 && TERSE_SCHED_NOTHING_IN_FLIGHT == 2);

TERSE_LOCK(TERSE_SCHEDULER_ABI_V1 == 1);
TERSE_AT(terse_scheduler_v1, abi_version, 0);
TERSE_AT(terse_scheduler_v1, struct_size, 4);
TERSE_AT(terse_scheduler_v1, name, 8);
TERSE_AT(terse_scheduler_v1, description, 16);
TERSE_AT(terse_scheduler_v1, version, 24);
TERSE_AT(terse_scheduler_v1, init, 32);
TERSE_AT(terse_scheduler_v1, finalize, 40);
TERSE_AT(terse_scheduler_v1, get_caps, 48);
TERSE_AT(terse_scheduler_v1, partition, 56);
TERSE_AT(terse_scheduler_v1, enqueue, 64);
TERSE_AT(terse_scheduler_v1, next, 72);
TERSE_AT(terse_scheduler_v1, on_complete, 80);
TERSE_LOCK(sizeof(terse_scheduler_v1) == 88);

/* build_info_v1.h (optional symbol) */
TERSE_AT(terse_build_info_v1, struct_size, 0);
TERSE_AT(terse_build_info_v1, flags, 4);
TERSE_LOCK(sizeof(terse_build_info_v1) == 8);
TERSE_LOCK(TERSE_BUILD_OPTIMIZED == 1 && TERSE_BUILD_ALL_V1 == 1);

/* device_verdict_v1.h (optional symbols): their names; their signatures are locked in abi_layout_test.cc. */
TERSE_LOCK(sizeof(TERSE_COMPRESSOR_DECOMPRESS_DEFERRED_V1_SYMBOL) == sizeof("terse_compressor_decompress_deferred_v1"));
TERSE_LOCK(sizeof(TERSE_COMPRESSOR_COMPRESS_DEFERRED_V1_SYMBOL) == sizeof("terse_compressor_compress_deferred_v1"));

/* phases_v1.h (optional symbol): its name and bound; its signature is locked in abi_layout_test.cc. */
TERSE_LOCK(sizeof(TERSE_COMPRESSOR_PHASES_V1_SYMBOL) == sizeof("terse_compressor_phases_v1"));
TERSE_LOCK(TERSE_MAX_PHASES_V1 == 64);
