// Internal to the compare library: one run's provenance (what ran: config hash, commit, plugins, transport, host) as
// the text cells the three formats of format.h print, so they cannot disagree on what a cell says.
#pragma once

#include "results/compare/room.h"  // the room's guard

#include <string>
#include <utility>
#include <vector>

#include "results/compare/reader.h"

namespace terse::results::detail {

struct ProvenanceRow {
  std::string study, variant, state, config_sha256, git_commit, terse_version, host, start_time, transport, mode;
  std::string world_size, link, compressor, compressor_version, compressor_abi, compressor_file, caps, params;
  // compressor_file: the plugin's file name and where the loader found it, "terse_compressor_topk.so [build tree]";
  // the run folder's provenance.json has the full path.
  std::string compressor_sha256;  // of the plugin file; empty for runs recorded before plugin hashes existed
  // Every parameter the compressor used, defaults included, as it reported them; "defaults not reported" for a
  // plugin without terse_compressor_resolved_params_v1; empty for runs recorded before the field existed.
  std::string resolved_params;
  std::string other_plugins;
  std::string clock, simulation;  // "real_time" or "simulated"; the simulated platform and compute model
  std::string cpu;                // provenance.json's "cpu"; empty for runs recorded before it existed
  std::string gemm;               // provenance.json's "gemm" (the host models' GEMM kernel); empty likewise
  // provenance.json's "hook" (a PyTorch run through terse's DDP hook: "granularity=bucket"); empty for other runs
  std::string hook;
};

// Empty cells for what the run's provenance.json does not say (a run that failed before writing it, or an older
// run without plugin hashes).
ProvenanceRow provenanceRow(const RunData& run);

// Twelve hex digits of a hash (enough to tell files or commits apart in a table); a "-dirty" suffix is kept; "-" for
// none.
std::string shortHash(const std::string& hash);

// The CSV and JSON columns, in order: name and the row's member.
std::vector<std::pair<std::string, std::string ProvenanceRow::*>> provenanceColumns();

}  // namespace terse::results::detail
