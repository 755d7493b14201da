/* terse plugin ABI, version 1: the types shared by every plugin kind.
 *
 * FROZEN. This header is part of the released v1 ABI: no field, value or layout may change. A change is a new
 * `types_v2.h` plus an adapter in core/plugin that lifts v1 plugins (see DESIGN.md section 3). The layout is locked by
 * static_assert(offsetof ...) in tests/abi.
 *
 * Plain C99, no dependencies beyond <stdint.h> and <stddef.h>, so a plugin may be written in C, C++ or anything that
 * speaks the C calling convention. Enumerations are carried in fixed-width integers (enum size is not portable). */
#ifndef TERSE_TYPES_V1_H_
#define TERSE_TYPES_V1_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Struct sizes. Every struct the core passes in or asks the plugin to fill starts with struct_size, set by the
 * core to the size it was built with, never below the v1 size. A plugin may refuse a smaller one with
 * TERSE_ERR_INVALID_ARGUMENT and must never write past struct_size. */

/* ---- Status codes: every fallible call returns one. Before returning anything but TERSE_OK a plugin should report
 * why through terse_host_v1.log at TERSE_LOG_ERROR; the core attaches the last such message to the error it raises. */
typedef int32_t terse_status_v1;
#define TERSE_OK 0
#define TERSE_ERR_INVALID_ARGUMENT 1 /* a parameter, tensor info or buffer size the plugin cannot accept */
#define TERSE_ERR_INVALID_PAYLOAD 2  /* a payload failed validation (untrusted input: never crash on it) */
#define TERSE_ERR_UNSUPPORTED 3      /* dtype, device or shape the plugin does not handle */
#define TERSE_ERR_OUT_OF_MEMORY 4
#define TERSE_ERR_DEVICE 5   /* a CUDA call failed */
#define TERSE_ERR_INTERNAL 6 /* a bug or an unexpected C++ exception inside the plugin */

/* ---- Element types. */
typedef int32_t terse_dtype_v1;
#define TERSE_DTYPE_F32 0
#define TERSE_DTYPE_F16 1  /* IEEE 754 binary16 */
#define TERSE_DTYPE_BF16 2 /* bfloat16: the upper half of a binary32 */
#define TERSE_DTYPE_F64 3
#define TERSE_DTYPE_I32 4
#define TERSE_DTYPE_I64 5
#define TERSE_DTYPE_U8 6
#define TERSE_DTYPE_I8 7
#define TERSE_DTYPE_COUNT_V1 8

/* ---- Devices, as a bitmask in capabilities and as a single value where memory lives. */
typedef uint32_t terse_device_v1;
#define TERSE_DEVICE_HOST 0x1u
#define TERSE_DEVICE_CUDA 0x2u
#define TERSE_DEVICE_ALL_V1 0x3u

/* ---- Logging, provided by the core to every plugin instance. */
typedef int32_t terse_log_level_v1;
#define TERSE_LOG_DEBUG 0
#define TERSE_LOG_INFO 1
#define TERSE_LOG_WARN 2
#define TERSE_LOG_ERROR 3

typedef struct terse_host_v1 {
  uint32_t struct_size; /* sizeof(terse_host_v1) as the core was built */
  uint32_t reserved0;
  void* user; /* opaque to the plugin; pass it back to log */
  /* Reports a message. Thread-safe, non-blocking apart from a short internal lock, callable from any thread at any
   * time between init and finalize. `message` is copied before the call returns; it need not outlive the call.
   * A message at TERSE_LOG_ERROR becomes the text of the error the core raises when the plugin's current call returns a
   * non-OK status on the same thread. Never NULL. */
  void (*log)(void* user, terse_log_level_v1 level, const char* message);
} terse_host_v1;

/* ---- Parameters: the plugin's key/value strings from the experiment config, in config order. Keys are unique.
 * Both strings are NUL-terminated and valid only during the init call: copy what you keep. */
typedef struct terse_param_v1 {
  const char* key;
  const char* value;
} terse_param_v1;

/* ---- Symbol export. A plugin's one exported object is declared with TERSE_PLUGIN_V1_EXPORT; everything else stays
 * hidden (build with -fvisibility=hidden, which terse_add_compressor() / terse_add_scheduler() set). */
#if defined(_WIN32)
#define TERSE_PLUGIN_V1_VISIBLE __declspec(dllexport)
#else
#define TERSE_PLUGIN_V1_VISIBLE __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#ifdef __cplusplus
#define TERSE_PLUGIN_V1_EXPORT extern "C" TERSE_PLUGIN_V1_VISIBLE
#else
#define TERSE_PLUGIN_V1_EXPORT TERSE_PLUGIN_V1_VISIBLE
#endif

#endif /* TERSE_TYPES_V1_H_ */
