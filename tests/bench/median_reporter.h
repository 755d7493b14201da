// The console reporter both benchmark programs extend: it keeps each benchmark's last run and, when there are
// repetitions, their median, so that the summary a program prints after the console table reads the median where
// there is one and the single run otherwise.
#pragma once

#include <benchmark/benchmark.h>

#include <map>
#include <string>
#include <vector>

namespace terse::bench {

class MedianReporter : public benchmark::ConsoleReporter {
 public:
  explicit MedianReporter(OutputOptions options) : ConsoleReporter(options) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs) {
      if (r.error_occurred) continue;
      const std::string name = r.run_name.function_name;
      if (r.run_type == Run::RT_Aggregate) {
        if (r.aggregate_name == "median") medians_[name] = r;
      } else {
        last_[name] = r;
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }

 protected:
  bool haveMedians() const { return !medians_.empty(); }
  // Every benchmark's median, or every one's last run when there were no repetitions.
  const std::map<std::string, Run>& runs() const { return medians_.empty() ? last_ : medians_; }
  // The median of `name`'s repetitions, else its last run; null when it did not run (or failed).
  const Run* find(const std::string& name) const {
    if (auto it = medians_.find(name); it != medians_.end()) return &it->second;
    if (auto it = last_.find(name); it != last_.end()) return &it->second;
    return nullptr;
  }

 private:
  std::map<std::string, Run> medians_, last_;
};

}  // namespace terse::bench
