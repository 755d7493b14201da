#include "experiments/python/hook_trace.h"

#include "core/common/error.h"
#include "results/result_writer.h"

namespace terse::python {

using Clock = std::chrono::steady_clock;

double steadySeconds() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

Clock::time_point steadyPoint(double seconds) {
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
}

HookTrace::HookTrace(train::TraceHeader header) : recorder_(std::move(header), Clock::now()) {}

void HookTrace::describe(int rank, int world, int64_t batch_size, int layers, std::vector<train::TraceTensor> tensors) {
  TERSE_CHECK(!tensors.empty(), InvalidArgument, "terse.torch: step trace: the module has no parameters");
  TERSE_CHECK(layers >= 1, InvalidArgument, "terse.torch: step trace: " << layers << " layers");
  elements_.clear();
  total_elements_ = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    train::TraceTensor& t = tensors[i];
    t.id = i;
    TERSE_CHECK(t.layer >= 0 && t.layer < layers, InvalidArgument,
                "terse.torch: step trace: tensor " << i << " ('" << t.name << "') is in layer " << t.layer
                                                   << ", outside [0, " << layers << ")");
    elements_.push_back(t.elements);
    total_elements_ += t.elements;
  }
  recorder_.describe(rank, world, batch_size, layers, std::move(tensors));
  described_ = true;
}

void HookTrace::beginStep(int64_t step, double start) {
  recorder_.beginStep(step, steadyPoint(start));
  open_step_.store(step, std::memory_order_release);
}

void HookTrace::forward(int64_t step, int layer, double start, double end) {
  recorder_.compute(step, train::TraceCompute::Kind::kForward, layer, {steadyPoint(start), steadyPoint(end)});
}

void HookTrace::backward(int64_t step, int layer, double start, double end, std::vector<uint64_t> ready) {
  for (uint64_t id : ready)
    TERSE_CHECK(id < elements_.size(), InvalidArgument,
                "terse.torch: step trace: a bucket names tensor " << id << " of " << elements_.size());
  recorder_.compute(step, train::TraceCompute::Kind::kBackward, layer, {steadyPoint(start), steadyPoint(end)},
                    std::move(ready));
}

void HookTrace::optimizer(int64_t step, double start, double end) {
  if (total_elements_ == 0) return;
  const double whole = std::max(0.0, end - start);
  double at = start;
  for (std::size_t id = 0; id < elements_.size(); ++id) {
    const double d = whole * static_cast<double>(elements_[id]) / static_cast<double>(total_elements_);
    recorder_.update(step, id, {steadyPoint(at), steadyPoint(at + d)});
    at += d;
  }
}

void HookTrace::endStep(int64_t step, double step_s) {
  recorder_.endStep(step, step_s);
}

void HookTrace::write(const std::filesystem::path& dir) const {
  TERSE_CHECK(described_, InvalidArgument,
              "terse.torch: step trace: no step was traced (did backward run through the hook?)");
  results::writeStepTrace(dir, recorder_.snapshot());
}

}  // namespace terse::python
