// terse plugin SDK for C++: write a compressor (or scheduler) as a class and export it with one macro. Throw to fail:
// the generated C entry points turn sdk::InvalidArgument / InvalidPayload / Unsupported / DeviceError into their
// status codes, std::bad_alloc into TERSE_ERR_OUT_OF_MEMORY and anything else into TERSE_ERR_INTERNAL, after logging
// "<name>: <message>" through the core. Header-only; needs only the C ABI headers and the standard library.
//
//   #include <terse/sdk.hpp>
//   namespace sdk = terse::sdk;
//   constexpr sdk::PayloadFormat kFormat{"scaled", sdk::fourcc("SCLD"), 1};
//
//   class Scaled final : public sdk::Compressor {  // sends g * scale as f32; the core sums payloads across ranks
//    public:
//     Scaled(sdk::Params& p, sdk::Host&) : scale_(p.getDouble("scale", 1, sdk::Range::greaterThan(0))) {}
//     terse_compressor_caps_v1 caps(terse_dtype_v1 t) const override {
//       if (t != TERSE_DTYPE_F32) throw sdk::Unsupported("only f32 gradients");
//       terse_compressor_caps_v1 c{};  // struct_size is the SDK's job
//       c.devices = TERSE_DEVICE_HOST, c.aggregation = TERSE_AGG_SUM, c.wire_dtype = TERSE_DTYPE_F32;
//       c.flags = TERSE_CAP_FIXED_SIZE, c.num_rounds = 1;
//       return c;
//     }
//     terse_compressor_sizes_v1 sizes(const terse_tensor_info_v1& t) const override {
//       terse_compressor_sizes_v1 s{};  // the header is identical on every rank, so it is not summed
//       s.max_output_bytes = sdk::kPayloadHeaderBytes + 4 * t.numel, s.sum_header_bytes = sdk::kPayloadHeaderBytes;
//       return s;
//     }
//     uint64_t compress(const sdk::CompressArgs& a) const override {
//       sdk::ByteWriter w(a.output);
//       sdk::writeHeader(w, kFormat, a.info);
//       for (float x : a.input<float>()) w.put(float(x * scale_));
//       return w.offset();
//     }
//     void decompress(const sdk::DecompressArgs& a) const override {  // untrusted payload: every read is checked
//       sdk::ByteReader r(a.payload);
//       sdk::readHeader(r, kFormat, a.info);
//       auto v = r.getArray<float>(a.info.numel, "values");
//       r.expectEnd();
//       auto out = a.output<float>();
//       for (size_t i = 0; i < v.size(); ++i) out[i] = (a.accumulate ? out[i] : 0.0f) + float(v[i] / scale_);
//     }
//    private:
//     double scale_;
//   };
//   TERSE_EXPORT_COMPRESSOR(Scaled, "scaled", "g * scale as f32, summed across ranks", "1.0.0");
//
// Build it with terse_add_compressor(scaled SOURCES scaled.cc) (find_package(terse) out of tree; plugins/template is a
// project to copy). Schedulers: derive from sdk::Scheduler and use TERSE_EXPORT_SCHEDULER the same way.
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
