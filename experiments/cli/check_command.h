// `terse plugins check` and the payload-size table of `terse plugins show --numel`, both built on the conformance
// suite in core/conformance/conformance.h. Dispatched from plugins_command.cc.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/conformance/conformance.h"
#include "core/plugin/compressor.h"
#include "core/plugin/compressor_plugin.h"

namespace terse::cli {

// `terse plugins check NAME|PATH ...`; args are the words after "check".
int checkCommand(const std::vector<std::string>& args);

// The tensor `--numel N` and `--shape D0xD1[x..]` describe (at most one of them may be given; neither: nullopt).
// Throws std::invalid_argument with a user-facing message for a malformed value.
std::optional<ConformanceShape> shapeFromOptions(const std::optional<uint64_t>& numel,
                                                 const std::optional<std::string>& shape);

// Prints, per round, the payload bytes for `shape`: get_sizes' bound and what compress produced for a standard-normal
// input, beside the 4 * numel bytes of the dense f32 tensor and the ratio; then the wire bytes per worker per step at
// `world` ranks under the plugin's aggregation (core/compress/wire_model.h) beside a dense f32 ring allreduce's, and
// their ratio. Returns false (after printing why) when the plugin could not be measured.
bool printPayloadSizes(std::ostream& out, const CompressorPlugin& plugin, const Params& params,
                       const ConformanceShape& shape, int world);

}  // namespace terse::cli
