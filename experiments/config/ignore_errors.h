// An error collector for protobuf's text tokenizer and parser that swallows their reports: config.cc re-reads tokens
// whose errors the parser already reported better, and config_table.cc parses defaults whose failure bind() reports
// in the table's words. One copy for the protobuf versions whose callback names differ.
#pragma once

#include <google/protobuf/io/tokenizer.h>

#include <string>

namespace terse::experiments {

class IgnoreErrors : public google::protobuf::io::ErrorCollector {
 public:
#if GOOGLE_PROTOBUF_VERSION >= 4022000
  void RecordError(int, google::protobuf::io::ColumnNumber, absl::string_view) override {}
#else
  void AddError(int, google::protobuf::io::ColumnNumber, const std::string&) override {}
#endif
};

}  // namespace terse::experiments
