#include "core/train/step_books.h"

#include <algorithm>

namespace terse::train {

StepBooks::StepBooks(std::size_t tensors) : chunks_left_(tensors, 0), started_(tensors, false) {
  issue_order_.reserve(tensors);
}

bool StepBooks::begin(int64_t step, double lr) {
  if (step == step_) return false;
  step_ = step;
  lr_ = lr;
  admitted_ = 0;
  std::fill(started_.begin(), started_.end(), false);
  issue_order_.clear();
  groups_.clear();
  return true;
}

bool StepBooks::admitted() {
  return ++admitted_ == started_.size();
}

bool StepBooks::start(std::size_t tensor) {
  if (started_[tensor]) return false;
  started_[tensor] = true;
  issue_order_.push_back(tensor);
  return true;
}

std::vector<std::size_t> StepBooks::finish(std::span<const Chunk> chunks) {
  std::vector<std::size_t> done;
  for (const Chunk& c : chunks) {
    const auto t = static_cast<std::size_t>(c.tensor_id);
    if (--chunks_left_[t] == 0) done.push_back(t);
  }
  return done;
}

}  // namespace terse::train
