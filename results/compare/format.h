// `terse compare`'s output formats: the comparison table (compute.h) and the provenance table as markdown (for
// reading, numbers rounded), CSV (for scripts, full precision) and JSON (for tools, with the warnings embedded).
// Each format is its own file: format_markdown.cc, format_csv.cc, format_json.cc.
#pragma once

#include "results/compare/room.h"  // the room's guard

#include <string>
#include <vector>

#include "results/compare/compute.h"
#include "results/compare/reader.h"

namespace terse::results {

std::string toMarkdown(const Comparison& c);
std::string toCsv(const Comparison& c);
// `warnings` are embedded so a JSON consumer sees what was skipped.
std::string toJson(const Comparison& c, const std::vector<std::string>& warnings);

// --provenance: per run, the config hash, git commit, plugins (name, version, ABI, path, caps, params), transport,
// mode, world size, link emulation, host and start time, and a PyTorch hook's settings (the markdown puts them beside
// the transport).
std::string provenanceTableMarkdown(const std::vector<RunData>& runs);
std::string provenanceTableCsv(const std::vector<RunData>& runs);
std::string provenanceTableJson(const std::vector<RunData>& runs, const std::vector<std::string>& warnings);

}  // namespace terse::results
