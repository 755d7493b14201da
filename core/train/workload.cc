#include "core/train/workload.h"

#include <utility>

#include "core/common/error.h"

namespace terse::train {

std::span<const std::size_t> Workload::layerTensors(int layer) const {
  TERSE_CHECK(layer >= 0 && layer < numLayers(), InvalidArgument,
              "layer " << layer << " is outside [0, " << numLayers() << ")");
  return layer_tensors_[static_cast<std::size_t>(layer)];
}

std::size_t Workload::numParameters() const {
  std::size_t n = 0;
  for (const ParamTensor& p : params_) n += p.numel();
  return n;
}

std::size_t Workload::addParam(std::string name, std::vector<int64_t> shape, int layer) {
  TERSE_CHECK(layer == numLayers() - 1 || layer == numLayers(), InternalError,
              "parameter '" << name << "' has layer " << layer << " but the last layer so far is " << numLayers() - 1
                            << "; layers are added in order without gaps");
  for (const ParamTensor& p : params_)
    TERSE_CHECK(p.name != name, InternalError, "parameter name '" << name << "' is used twice");
  int64_t numel = 1;
  for (int64_t d : shape) {
    TERSE_CHECK(d > 0, InternalError, "parameter '" << name << "' has a non-positive dimension " << d);
    numel *= d;
  }
  if (layer == numLayers()) layer_tensors_.emplace_back();
  ParamTensor& p = params_.emplace_back();
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.layer = layer;
  p.value.assign(static_cast<std::size_t>(numel), 0.0f);
  p.grad.assign(static_cast<std::size_t>(numel), 0.0f);
  const std::size_t index = params_.size() - 1;
  layer_tensors_.back().push_back(index);
  return index;
}

void Workload::reportLayer(const LayerReadyFn& on_layer_ready, int layer) const {
  if (on_layer_ready) on_layer_ready(layer, layerTensors(layer));
}

LayerFlops Workload::layerFlops(int layer) const {
  double n = 0;
  for (std::size_t t : layerTensors(layer)) n += static_cast<double>(params_[t].numel());
  return LayerFlops{2 * n, 4 * n};
}

}  // namespace terse::train
