// Fuzz target: the experiment config's loader (experiments/config/config.h) on arbitrary text -- protobuf's text
// parser, then terse's own: variants merged over the base, defaults, and every semantic check (link strings, ranks,
// modes), without loading plugins. Anything wrong is a ConfigError; a study it accepts writes out (toText) as text
// that parses back to an equal message, as the results folder relies on.
#include <google/protobuf/util/message_differencer.h>

#include <string>
#include <string_view>

#include "experiments/config/config.h"
#include "tests/fuzz/fuzz_util.h"

using namespace terse;
using namespace terse::experiments;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ConfigOptions options;  // no loader: plugin names are only checked to be non-empty
  options.modes = {Experiment::SYNC, Experiment::ASYNC, Experiment::SSP, Experiment::HOGWILD};
  options.transports = {Experiment::INPROC, Experiment::TCP, Experiment::NCCL};
  try {
    const Study study = loadStudyText(text, "fuzz.textproto", options);
    for (const Experiment& e : study.experiments) {
      const Experiment back = parseConfigText(toText(e), "written");
      TERSE_FUZZ_CHECK(google::protobuf::util::MessageDifferencer::Equals(e, back),
                       "a resolved config does not read back as written");
    }
  } catch (const InvalidArgument&) {  // ConfigError is one
  }
  return 0;
}
