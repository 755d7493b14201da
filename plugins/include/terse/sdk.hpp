// terse plugin SDK for C++: write a compressor (or scheduler) as a class and export it with one macro. Throw to fail:
// the generated C entry points turn sdk::InvalidArgument / InvalidPayload / Unsupported / DeviceError into their
// status codes, std::bad_alloc into TERSE_ERR_OUT_OF_MEMORY and anything else into TERSE_ERR_INTERNAL, after logging
// "<name>: <message>" through the core. Header-only; needs only the C ABI headers and the standard library.
//
// The worked example is plugins/template (installed nowhere: copy it from the terse source tree): my_int8.cc is a
// complete compressor (parameters, caps, sizes, a self-describing payload, a decompress that validates everything),
// and its CMakeLists.txt builds it against an installed SDK with find_package(terse) and terse_add_compressor().
// Schedulers: derive from sdk::Scheduler and use TERSE_EXPORT_SCHEDULER the same way.
//
// Besides the plugin's struct, the export macros define optional symbols that the core looks up by name and does
// without when they are missing (plugins written in C, or built before they existed): terse_<kind>_resolved_params_v1
// (terse/resolved_params_v1.h: the parameters an instance resolved, defaults included, for a run's provenance),
// terse_<kind>_build_info_v1 (terse/build_info_v1.h: whether the file that expands the macro was compiled with
// optimisation, so that `terse plugins show` and `terse plugins check` can say when a plugin was built at -O0) and,
// for a compressor, terse_compressor_decompress_deferred_v1 and terse_compressor_compress_deferred_v1
// (terse/device_verdict_v1.h: payload checks whose verdicts stay on the device) and terse_compressor_phases_v1
// (terse/phases_v1.h: the steps at which its work per call changes). They
// are symbols of their own, not new members of the v1 structs, because those structs' layout is frozen.
//
// What this header brings in (terse/sdk/):
//   compressor.hpp, scheduler.hpp  the base classes and the export macros TERSE_EXPORT_COMPRESSOR / _SCHEDULER
//   params.hpp                     typed, validated parameters: errors like `topk: 'ratio' must be in (0, 1], got 2`
//   bytes.hpp                      bounds-checked payload writing and reading, the self-describing payload header
//   caps.hpp                       capabilities with defaults: sdk::Caps::allgather(), sdk::Caps::sum(wire_dtype), ...
//   dtype.hpp, error.hpp, host.hpp, cpu.hpp   dtype names, the exceptions, logging through the core, the CPU ISA query
// Included on their own, because not every plugin needs them (and what they need):
//   terse/sdk/philox.hpp    counter-based random numbers keyed by (seed, step, tensor, element), the same on CPU and
//                           GPU (Random123, which terse::compressor_kit links)
//   terse/sdk/bitpack.hpp   codes of any width 1..32 bit-packed into 64-bit words, CPU and GPU alike
//   terse/sdk/half.hpp      fp16 / bf16 conversions with the same bits on CPU and GPU
//   terse/sdk/parallel.hpp  multi-threaded compress of one tensor in ranges that give one thread's bytes (a
//                           plugin's `threads` parameter)
//   terse/sdk/cuda.hpp, terse/sdk/cublas.hpp   TERSE_SDK_CUDA_CHECK / TERSE_SDK_CUBLAS_CHECK (CUDA translation units)
// The compressor kit, terse/kit/ (CMake target terse::compressor_kit): what the built-in compressors share, for a new
// compressor to start from: input checks (host_f32.hpp), the sparse (value, index) payload (sparse_payload.hpp) and
// exact top-k selection by magnitude (topk_math.hpp, topk_select.hpp), the 16-bit cast plugin (cast16.hpp), and the
// CUDA path's plumbing (device.hpp, device.cuh, the shared kernels *_kernels.cuh; terse_compressor_cuda_sources()
// compiles it in). Every built-in in compressors/ builds from the SDK and the kit alone, so one makes a starting point
// too: copy its folder next to the template's CMakeLists.txt.
#pragma once

#include "terse/compressor_v1.h"
#include "terse/scheduler_v1.h"
#include "terse/sdk/bytes.hpp"
#include "terse/sdk/caps.hpp"
#include "terse/sdk/compressor.hpp"
#include "terse/sdk/cpu.hpp"
#include "terse/sdk/dtype.hpp"
#include "terse/sdk/error.hpp"
#include "terse/sdk/host.hpp"
#include "terse/sdk/params.hpp"
#include "terse/sdk/scheduler.hpp"
#include "terse/types_v1.h"
