// Internal to the compare library's reader: what reader.cc and config_reader.cc share. Both follow reader.h's rule
// that a problem in a folder is a warning, never an exception.
#pragma once

#include "results/compare/room.h"  // the room's guard

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "results/compare/reader.h"

namespace terse::results::detail {

// Reads a file; nullopt (and a warning) when it cannot be read. Missing files are the caller's to report, since
// whether one is expected depends on the file.
std::optional<std::string> readFile(const std::filesystem::path& path, std::vector<std::string>& warnings);

// Fills the config-derived fields of `run` (workload and data sections, compressor, error feedback, momentum
// correction, async mode, config hash) from config.textproto at `path`.
void readConfig(const std::filesystem::path& path, RunData& run, std::vector<std::string>& warnings);

}  // namespace terse::results::detail
