// A small synthetic corpus for the trainers' row-sparse tests (sync_trainer_sparse_test.cc,
// param_server_sparse_test.cc): 400 distinct words in a fixed pseudo-random order, a vocabulary large enough that a
// batch touches few rows of each embedding table.
#pragma once

#include <memory>
#include <string>

#include "experiments/workloads/glove.h"

namespace terse::train::testing {

inline std::shared_ptr<const workloads::GloveData> gloveTestCorpus() {
  std::string text;
  uint64_t x = 7;
  for (int k = 0; k < 4000; ++k) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    text += (k % 97 == 0 ? std::string("man") : "w" + std::to_string((x >> 33) % 400)) + ' ';
  }
  workloads::CooccurrenceOptions o;
  o.window = 2;
  o.min_count = 1;
  o.test_fraction = 0.1;
  return workloads::makeGloveData(workloads::countCooccurrence({text}, o));
}

}  // namespace terse::train::testing
