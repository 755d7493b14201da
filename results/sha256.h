// SHA-256 (OpenSSL) as lowercase hex: the config hash `terse compare --provenance` prints and the plugin file hash the
// runner records in provenance.json, the digests `sha256sum` gives, so a published table can be checked against a
// results folder and a plugin file with standard tools.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace terse::results {

std::string sha256Hex(std::string_view data);
// Of the file's bytes, read in blocks. Throws InvalidArgument naming the file when it cannot be read.
std::string fileSha256Hex(const std::filesystem::path& path);

}  // namespace terse::results
