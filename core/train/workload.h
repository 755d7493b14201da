// The Workload interface: what the trainer sees of a model and its data. core knows nothing about MLPs or
// Fashion-MNIST (DESIGN.md 1): it sees named f32 parameter tensors in layer order, each with a gradient buffer of the
// same shape, and a forwardBackward that reports each layer's gradients as soon as they are final -- last layer
// first -- so the communication thread can start on layer L while backward still runs for layers L-1..0
// (DESIGN.md 2). Implementations live in experiments/workloads.
//
// Threading contract: one Workload instance per worker thread, used only from that thread. Calls never overlap:
// forwardBackward, evaluate and reads/writes of parameter values happen one at a time. evaluate may be called
// between steps; it reads the current values and leaves gradients alone. The layer-ready callback runs on the
// worker's thread inside forwardBackward. Once a layer is reported, forwardBackward neither reads nor writes that
// layer's values or grads again during the call, so the callback (or a thread it hands the layer to) may read the
// grads and update the values in place right away -- the optimizer can apply layer L while backward still runs for
// layers below it. Tensors of layers not yet reported must not be touched until they are reported or the call
// returns. Instances may share read-only data (the data set) between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace terse::train {

// One named parameter tensor: f32, contiguous, row-major in `shape`; on the host, or on a device (see device_value).
struct ParamTensor {
  std::string name;            // unique within the workload, e.g. "fc1.weight"
  std::vector<int64_t> shape;  // row-major dimensions
  int layer = 0;               // index in forward order, 0 = first layer
  std::vector<float> value;    // the optimizer updates these in place
  std::vector<float> grad;     // same size as value; overwritten by every forwardBackward
  // A device workload's tensors (Workload::device() >= 0): numel floats each in device memory the workload owns, with
  // the same addresses for its lifetime. There they are the parameters: forwardBackward writes device_grad (grad stays
  // as it is) and the trainer reads it and updates device_value in place; value is a host mirror that holds the
  // initial values and is refreshed only by Workload::copyValuesToHost(). Null on the host path.
  float* device_value = nullptr;
  float* device_grad = nullptr;
  // Row-sparse gradients (an embedding table's: a batch touches few of its rows; a row is a slice along the first
  // dimension). When the workload sets row_sparse (in its constructor; host tensors only), every forwardBackward also
  // fills grad_rows with the rows its grad may be nonzero in, sorted and without repeats; every other row of grad is
  // zero. The trainer may then send (row ids, rows) instead of the dense tensor (DESIGN.md section 2).
  bool row_sparse = false;
  std::vector<int64_t> grad_rows;

  std::size_t numel() const { return value.size(); }
  // Elements per row (the product of every dimension after the first); 1 for a vector.
  std::size_t rowLength() const { return shape.empty() ? 1 : value.size() / static_cast<std::size_t>(shape.front()); }
};

struct EvalResult {
  double loss = 0.0;         // mean loss over the evaluated examples
  double accuracy = 0.0;     // fraction correct for classifiers; workloads that are not classifiers say what it is
  int64_t num_examples = 0;  // how many held-out examples were evaluated
};

// Called once per layer, in reverse layer order (numLayers()-1 first, 0 last), when every gradient of that layer is
// final. `tensors` are indices into params() of that layer's tensors; across one forwardBackward every tensor index
// appears exactly once. The span is valid only during the call.
using LayerReadyFn = std::function<void(int layer, std::span<const std::size_t> tensors)>;

// Called on the worker's thread right before the forward pass first reads layer `layer`'s values (forwardBackward and
// evaluate alike). The trainer installs one that blocks until the previous step's update of that layer is applied, so
// the next step's forward of layer i waits only for layer i (DESIGN.md 2) while later layers are still being
// communicated. It may throw (the step then fails); the workload must not catch it.
using LayerGateFn = std::function<void(int layer)>;

// Floating-point operations of one example through one layer: the FLOP model of a simulation (DESIGN.md section 9).
struct LayerFlops {
  double forward = 0;
  double backward = 0;  // the gradients of the weights and of the layer's input
};

class Workload {
 public:
  virtual ~Workload() = default;
  Workload(const Workload&) = delete;
  Workload& operator=(const Workload&) = delete;

  // The workload's registered name ("mlp", "cnn", ...).
  virtual std::string_view name() const = 0;

  // Examples in the training set; batches passed to forwardBackward index into [0, numTrainExamples()).
  virtual int64_t numTrainExamples() const = 0;

  // A classifier's training labels, one per example in [0, numClasses()): what a non-IID partition splits by
  // (label_partition.h). Empty, and 0 classes, for a workload without classes.
  virtual std::span<const int32_t> trainLabels() const { return {}; }
  virtual int numClasses() const { return 0; }

  // Runs forward and backward over the given training examples, overwrites every grad buffer with the gradient of
  // the mean loss over the batch, calls on_layer_ready (may be empty) per layer as described above, and returns the
  // mean loss. Throws InvalidArgument for an empty batch or an index out of range. Buffers grow to the largest
  // batch seen and are reused afterwards, so steady-state steps do not allocate.
  virtual double forwardBackward(std::span<const int64_t> batch, const LayerReadyFn& on_layer_ready) = 0;

  // Loss and accuracy on the held-out set with the current values; max_examples > 0 evaluates only the first
  // max_examples of it (cheap progress points), 0 evaluates all of it.
  virtual EvalResult evaluate(int64_t max_examples = 0) = 0;

  // Parameter tensors in layer order (layer indices non-decreasing). The vector and each tensor's buffers keep
  // their addresses for the lifetime of the workload.
  std::span<ParamTensor> params() { return params_; }
  std::span<const ParamTensor> params() const { return params_; }
  int numLayers() const { return static_cast<int>(layer_tensors_.size()); }
  // Indices into params() of one layer's tensors.
  std::span<const std::size_t> layerTensors(int layer) const;
  // Sum of numel over all tensors.
  std::size_t numParameters() const;
  // Row-sparse workloads: fills rows[t], for every row-sparse tensor t, with the rows forwardBackward(batch) reads of
  // it (any order, repeats allowed; rows has params().size() entries, the others are left alone) and returns true; a
  // workload that cannot say returns false (the default). A parameter-server worker then pulls only those rows
  // (core/train/param_server_client.h), as parameter servers do for embedding tables (Li et al., OSDI 2014).
  virtual bool forwardRows(std::span<const int64_t> batch, std::span<std::vector<int64_t>> rows) {
    (void)batch;
    (void)rows;
    return false;
  }
  // FLOPs of one example through layer `layer`. The default is a dense layer's: every parameter is used once per
  // example, a multiply-add (2 flops) forward and two backward (weight and input gradients): 2 and 4 flops per
  // parameter. A layer that reuses its weights (a convolution: once per output position) overrides it.
  virtual LayerFlops layerFlops(int layer) const;

  // Per-layer forward gating. A workload that calls awaitLayer(l) before every read of layer l's values in its forward
  // pass (and touches layer l's grads only after that) returns true from gatesLayers(); the trainer then overlaps the
  // next step's forward with the communication of layers not needed yet. A workload that returns false gets every
  // update applied before forwardBackward starts (correct, no cross-step overlap).
  virtual bool gatesLayers() const { return false; }
  // Installs (or, with an empty function, removes) the gate. Call only between forwardBackward/evaluate calls.
  void setLayerGate(LayerGateFn gate) { gate_ = std::move(gate); }

  // ---- Device workloads (DESIGN.md section 5): the model computes on a CUDA device and keeps its data set,
  // activations and ParamTensor::device_value / device_grad there.
  //
  // Ordering contract with the trainer, which works on its own streams: when on_layer_ready runs for layer L, the
  // layer's device_grad is complete ON THE DEVICE (the workload synchronized its stream, or an equivalent, first), so
  // the callee may read it from any stream; before the forward reads device_value of layer L it calls awaitLayer(L),
  // and the trainer's gate returns only once the update of that layer is complete on the device. evaluate() likewise
  // reads device_value only after the trainer drained (its updates are complete on the device).

  // The CUDA device ordinal the workload computes on, or -1 for a host workload (the default).
  virtual int device() const { return -1; }
  // Device workloads: copies every tensor's device_value into value (checksums, parameter snapshots). No-op on the
  // host. Call only between forwardBackward/evaluate calls.
  virtual void copyValuesToHost() {}
  // Device workloads: copies every tensor's value into device_value (after the caller changed the host values, e.g.
  // to load parameters). No-op on the host. Call only between forwardBackward/evaluate calls.
  virtual void copyValuesToDevice() {}

 protected:
  Workload() = default;

  // Registers a zero-filled tensor; layers must be added in non-decreasing order starting at 0 without gaps.
  // Returns its index in params(). Call only from the constructor: later calls would move the tensors.
  std::size_t addParam(std::string name, std::vector<int64_t> shape, int layer);
  // Calls on_layer_ready for one layer (no-op for an empty callback).
  void reportLayer(const LayerReadyFn& on_layer_ready, int layer) const;
  // Calls the installed gate for one layer (no-op without one); see gatesLayers().
  void awaitLayer(int layer) const {
    if (gate_) gate_(layer);
  }

 private:
  std::vector<ParamTensor> params_;
  std::vector<std::vector<std::size_t>> layer_tensors_;
  LayerGateFn gate_;
};

}  // namespace terse::train
