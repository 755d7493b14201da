// JSON string literals, shared by everything that writes JSON: the results folder (results/json.h) and the trace
// timelines (core/train/trace.h). Here in core/common because core cannot depend on results.
#pragma once

#include <string>
#include <string_view>

namespace terse {

// Appends `s` as a JSON string literal (quotes included): ", \ and control characters escaped, UTF-8 passed through.
void appendJsonString(std::string& out, std::string_view s);

}  // namespace terse
