// The `terse._terse` extension module: pybind11 bindings of the hook state (ddp_aggregator.h), its results folder
// (hook_results.h) and the recipe bridge (recipe.h). terse's exceptions become Python exceptions of the same names and
// messages, subclasses of terse.Error (a RuntimeError); InvalidArgument is also a ValueError.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <tuple>

#include "core/comm/transport.h"
#include "core/common/crash.h"
#include "core/common/cuda.h"
#include "core/common/error.h"
#include "core/common/user_message.h"
#include "core/common/watchdog.h"
#include "core/train/local_sgd_schedule.h"
#include "experiments/python/ddp_aggregator.h"
#include "experiments/python/hook_results.h"
#include "experiments/python/recipe.h"
#include "experiments/runner/runner_detail.h"

namespace py = pybind11;

namespace terse::python {
namespace {

using StringPairs = std::vector<std::pair<std::string, std::string>>;

// The DType of a torch dtype's name (str(tensor.dtype)), or none for a dtype terse does not average.
std::optional<DType> torchDType(const std::string& name) {
  if (name == "torch.float32") return DType::kF32;
  if (name == "torch.float64") return DType::kF64;
  if (name == "torch.float16") return DType::kF16;
  if (name == "torch.bfloat16") return DType::kBF16;
  return std::nullopt;
}

DType dtypeFromTorch(const std::string& name) {
  const std::optional<DType> d = torchDType(name);
  TERSE_CHECK(d.has_value(), Unsupported,
              "terse.torch: gradients of " << name << " cannot be averaged (float32, float64, float16, bfloat16)");
  return *d;
}

// The native run's local SGD schedule for this recipe (SyncTrainer's: rounds from start_step at the rate of the step
// before each, terse.Recipe's learning rate being the trainer's), as the trainer holds it or as its list of ends.
std::function<double(int64_t)> recipeRate(Recipe& r, int64_t steps_per_epoch, int world) {
  return [&r, steps_per_epoch, world](int64_t step) { return r.learningRate(step, world, steps_per_epoch); };
}
train::LocalSgdSchedule localSgdSchedule(Recipe& r, int64_t steps_per_epoch, int64_t total_steps, int world) {
  const auto& l = r.experiment().local_sgd();
  if (l.period() <= 0) return {};
  return {l.period(), l.start_step(), l.qsr_alpha(), total_steps, recipeRate(r, steps_per_epoch, world)};
}
std::vector<int64_t> localSgdEnds(Recipe& r, int64_t steps_per_epoch, int64_t total_steps, int world) {
  const auto& l = r.experiment().local_sgd();
  if (l.period() <= 0) return {};
  return train::scheduledAveragings(l.period(), l.start_step(), l.qsr_alpha(), total_steps,
                                    recipeRate(r, steps_per_epoch, world));
}

py::dict bytesDict(const ByteCounts& c) {
  py::dict d;
  d["payload"] = c.payload;
  d["wire_sent"] = c.wire.sent_bytes;
  d["wire_received"] = c.wire.received_bytes;
  return d;
}

py::dict capsDict(const CompressorCaps& c) {
  py::dict d;
  d["aggregation"] = std::string(aggregationName(c.aggregation));
  d["wire_dtype"] = std::string(wireDtypeText(c));
  d["fixed_size"] = c.fixed_size;
  d["stateful"] = c.stateful;
  d["shared_seed"] = c.shared_seed;
  d["identity"] = c.identity;
  d["num_rounds"] = c.num_rounds;
  return d;
}

template <class T>
py::array_t<T> toArray(const std::vector<T>& v, std::vector<py::ssize_t> shape) {
  py::array_t<T> a(shape);
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

py::tuple datasetArrays(const workloads::Dataset& d) {
  const std::vector<py::ssize_t> image = d.rows > 0 ? std::vector<py::ssize_t>{d.num_examples, d.rows, d.cols}
                                                    : std::vector<py::ssize_t>{d.num_examples, d.dims};
  return py::make_tuple(toArray(d.features, image), toArray(d.labels, {d.num_examples}));
}

}  // namespace
}  // namespace terse::python

PYBIND11_MODULE(_terse, m) {
  using namespace terse;          // NOLINT: the bindings name every room's types
  using namespace terse::python;  // NOLINT
  m.doc() = "terse's codecs and aggregation engine for PyTorch (terse.torch wraps this module)";
  m.attr("__version__") = TERSE_VERSION;
  // Whether this build has the plugins' CUDA code and core's device buffers (terse.torch's CUDA path needs them).
  m.attr("built_with_cuda") = cuda::builtWithCuda();

  // Translators are tried last-registered first, so the base goes first.
  static py::exception<Error> error(m, "Error", PyExc_RuntimeError);
  py::object bases = py::make_tuple(error, py::handle(PyExc_ValueError));
  static py::exception<InvalidArgument> invalid(m, "InvalidArgument", bases.ptr());
  static py::exception<experiments::ConfigError> config(m, "ConfigError", invalid.ptr());
  static py::exception<InvalidPayload> payload(m, "InvalidPayload", error.ptr());
  static py::exception<Unsupported> unsupported(m, "Unsupported", error.ptr());
  static py::exception<PluginError> plugin(m, "PluginError", error.ptr());
  static py::exception<comm::CommError> comm_error(m, "CommError", error.ptr());
  static py::exception<InternalError> internal(m, "InternalError", error.ptr());
  // The messages without the C++ source locations TERSE_THROW puts in front, as the CLI prints them: a Python user
  // reads the message, not terse's sources.
  py::register_exception_translator([](std::exception_ptr p) {
    const auto text = [](const std::exception& e) { return withoutSourceLocations(e.what()); };
    try {
      if (p) std::rethrow_exception(p);
    } catch (const experiments::ConfigError& e) {
      config(text(e).c_str());
    } catch (const InvalidArgument& e) {
      invalid(text(e).c_str());
    } catch (const InvalidPayload& e) {
      payload(text(e).c_str());
    } catch (const Unsupported& e) {
      unsupported(text(e).c_str());
    } catch (const PluginError& e) {
      plugin(text(e).c_str());
    } catch (const comm::CommError& e) {
      comm_error(text(e).c_str());
    } catch (const InternalError& e) {
      internal(text(e).c_str());
    } catch (const Error& e) {
      error(text(e).c_str());
    }
  });

  // The plugin-call watchdog (core/common/watchdog.h): terse.torch sets the deadline and fails the bucket of a call
  // past it. The deadline is the process's; the handler is called on the watchdog's thread with the GIL taken.
  m.def(
      "set_plugin_timeout",
      [](double seconds) {
        TERSE_CHECK(seconds >= 0 && seconds <= 3600, InvalidArgument,
                    "plugin_timeout must be in [0, 3600] seconds (0 turns the watchdog off), got " << seconds);
        watchdog::setTimeout(
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(seconds)));
      },
      py::arg("seconds"));
  py::class_<watchdog::Registration>(m, "PluginWatch");
  // For processes terse owns (terse.train's ranks), not for a user's: the handler replaces Python's own reports of a
  // fatal signal (faulthandler) with terse's, which name the plugin call.
  m.def(
      "install_crash_handler",
      [](int rank, const std::string& error_file) {
        crash::install();
        crash::setProcessRank(rank);
        crash::setErrorFile(error_file);
      },
      py::arg("rank"), py::arg("error_file") = "");
  // A process that must end at once (terse.torch: a hung plugin call holding a thread nothing can free) leaves a true
  // status first: every registered results status failed with `message`, and the driver's error file (terse run's
  // PyTorch ranks) holding it, as the crash handler does for a signal.
  m.def(
      "fail_process",
      [](const std::string& message, const std::string& plugin_name) {
        crash::failRegistered(message, plugin_name);
        crash::writeErrorFile(message);
      },
      py::arg("message"), py::arg("plugin") = "");
  m.def(
      "on_plugin_overrun",
      [](py::function fn) {
        // Copies of the handler live on the watchdog's thread, which holds no GIL: the Python callable is released
        // with the GIL taken, whoever drops the last copy.
        std::shared_ptr<py::function> callable(new py::function(std::move(fn)), [](py::function* f) {
          py::gil_scoped_acquire gil;
          delete f;
        });
        return std::make_unique<watchdog::Registration>([callable](const watchdog::Overrun& o) {
          py::gil_scoped_acquire gil;
          try {
            (*callable)(o.message(), static_cast<long>(o.thread));
          } catch (py::error_already_set& e) {
            e.discard_as_unraisable("terse.torch's plugin watchdog handler");
          }
        });
      },
      py::arg("handler"));

  // A chained bucket's tensors to sum, in order: views of the engine's memory, which the caller holds until the
  // bucket's finish (torch_communicator.h, sumView).
  const auto sumViews = [](DdpAggregator& a, const SplitSum& split) {
    py::list sums;
    for (const SplitSum::Sum& x : split.sums)
      sums.append(a.communicator().sumView(x.data.data(), x.data.size(), x.wire));
    return sums;
  };
  // Opaque to Python: handed back to finish_chained.
  py::class_<ChainedBucket>(m, "ChainedBucket");

  py::class_<DdpAggregator>(m, "DdpAggregator")
      .def(py::init([](const std::string& compressor, const std::map<std::string, std::string>& params,
                       bool error_feedback, double momentum_correction, bool momentum_masking, bool momentum_nesterov,
                       uint64_t seed, const std::vector<std::string>& plugin_path, const std::string& granularity,
                       py::object group, const std::string& error_feedback_rule, double ef21_momentum,
                       uint64_t compression_start_step) {
             AggregatorOptions o;
             o.compressor = compressor;
             o.params.assign(params.begin(), params.end());  // std::map: sorted by key, as the runner passes them
             o.codec.error_feedback = error_feedback;
             TERSE_CHECK(
                 error_feedback_rule == "ef" || error_feedback_rule == "ef21", InvalidArgument,
                 "terse.torch: error_feedback_rule must be 'ef' or 'ef21', got '" << error_feedback_rule << "'");
             o.codec.error_feedback_rule =
                 error_feedback_rule == "ef21" ? ErrorFeedbackRule::kEf21 : ErrorFeedbackRule::kEf;
             o.codec.ef21_momentum = ef21_momentum;
             o.codec.momentum_correction = momentum_correction;
             o.codec.momentum_masking = momentum_masking;
             o.codec.momentum_nesterov = momentum_nesterov;
             o.seed = seed;
             o.plugin_path = plugin_path;
             TERSE_CHECK(granularity == "tensor" || granularity == "bucket", InvalidArgument,
                         "terse.torch: granularity must be 'tensor' or 'bucket', got '" << granularity << "'");
             o.granularity = granularity == "tensor" ? Granularity::kTensor : Granularity::kBucket;
             o.compression_start_step = compression_start_step;
             return std::make_unique<DdpAggregator>(std::move(o), std::move(group));
           }),
           py::arg("compressor"), py::arg("params"), py::arg("error_feedback"), py::arg("momentum_correction"),
           py::arg("momentum_masking"), py::arg("momentum_nesterov"), py::arg("seed"), py::arg("plugin_path"),
           py::arg("granularity"), py::arg("group"), py::arg("error_feedback_rule") = "ef",
           py::arg("ef21_momentum") = 1.0, py::arg("compression_start_step") = 0)
      .def(
          "aggregate",
          [](DdpAggregator& a, int index, uintptr_t data, uint64_t numel, const std::string& dtype,
             const std::vector<std::tuple<uint64_t, uint64_t, std::vector<int64_t>>>& members, bool is_last,
             double issued, const std::vector<std::pair<uint64_t, uint64_t>>& traced) {
            std::vector<BucketMember> layout;
            layout.reserve(members.size());
            for (const auto& [id, offset, shape] : members) layout.push_back(BucketMember{id, offset, shape});
            const DType d = dtypeFromTorch(dtype);
            // Without the GIL: the codecs and the waits overlap backward; the communicator takes it per call.
            py::gil_scoped_release released;
            a.aggregate(index, data, numel, d, layout, is_last, issued, traced);
          },
          py::arg("index"), py::arg("data_ptr"), py::arg("numel"), py::arg("dtype"), py::arg("members"),
          py::arg("is_last"), py::arg("issued") = 0.0, py::arg("traced") = std::vector<std::pair<uint64_t, uint64_t>>{})
      .def("trace_gather", &DdpAggregator::traceGather, py::arg("bytes"), py::arg("start"), py::arg("end"))
      .def(
          "average_dense",
          [](DdpAggregator& a, int index, uintptr_t data, uint64_t numel) {
            py::gil_scoped_release released;  // the communicator takes it per call
            a.averageDense(index, data, numel);
          },
          py::arg("index"), py::arg("data_ptr"), py::arg("numel"))
      .def_property_readonly("chainable", &DdpAggregator::chainable)
      .def_property_readonly("in_place", &DdpAggregator::inPlace)
      .def(
          "in_place_for",
          [](const DdpAggregator& a, const std::string& dtype) {
            const std::optional<DType> d = torchDType(dtype);
            return d.has_value() && a.inPlaceFor(*d);
          },
          py::arg("dtype"))
      .def(
          "begin_chained",
          [sumViews](DdpAggregator& a, int index, uintptr_t data, uint64_t numel, const std::string& dtype,
                     const std::vector<std::tuple<uint64_t, uint64_t, std::vector<int64_t>>>& members, bool is_last) {
            std::vector<BucketMember> layout;
            layout.reserve(members.size());
            for (const auto& [id, offset, shape] : members) layout.push_back(BucketMember{id, offset, shape});
            const DType d = dtypeFromTorch(dtype);
            std::unique_ptr<ChainedBucket> b;
            {
              // The encode without the GIL, as aggregate's (the communicator takes it to check the group).
              py::gil_scoped_release released;
              b = a.beginChained(index, data, numel, d, layout, is_last);
            }
            py::list sums = sumViews(a, *b->split);
            return py::make_tuple(std::move(b), sums);
          },
          py::arg("index"), py::arg("data_ptr"), py::arg("numel"), py::arg("dtype"), py::arg("members"),
          py::arg("is_last"))
      .def(
          "finish_chained",
          [sumViews](DdpAggregator& a, ChainedBucket& b, double comm_seconds) {
            bool more = false;
            {
              py::gil_scoped_release released;
              more = a.finishChained(b, comm_seconds);
            }
            // The next round's tensors to sum (a round may have none), or None once the bucket is decoded.
            return more ? py::object(sumViews(a, *b.split)) : py::object(py::none());
          },
          py::arg("bucket"), py::arg("comm_seconds"))
      // For tests (ddp_aggregator.h): chained host buckets read their verdicts once a step, as device ones do.
      .def_property("settle_later", nullptr, &DdpAggregator::settleLaterOnHost)
      .def_property_readonly("verdict_reads", &DdpAggregator::verdictReads)
      .def("bind_host", &DdpAggregator::bindHost)
      .def("bind_cuda", &DdpAggregator::bindCuda, py::arg("device"), py::arg("stream"))
      .def_property_readonly("bound", &DdpAggregator::bound)
      .def_property_readonly("on_device", &DdpAggregator::onDevice)
      .def_property_readonly("device", &DdpAggregator::device)
      .def(
          "trace_to", [](DdpAggregator& a, HookTrace* t) { a.traceTo(t); }, py::arg("trace").none(true),
          py::keep_alive<1, 2>())
      .def("add_exposed", &DdpAggregator::addExposed, py::arg("seconds"))
      .def_property_readonly("step", &DdpAggregator::step)
      .def_property_readonly("warming_up", &DdpAggregator::warmingUp)
      .def_property_readonly("phase_steps", &DdpAggregator::phaseSteps)
      .def_property_readonly("rank", [](DdpAggregator& a) { return a.communicator().rank(); })
      .def_property_readonly("world_size", [](DdpAggregator& a) { return a.communicator().size(); })
      .def_property_readonly(
          "granularity",
          [](const DdpAggregator& a) { return a.options().granularity == Granularity::kTensor ? "tensor" : "bucket"; })
      .def_property_readonly("caps", [](const DdpAggregator& a) { return capsDict(a.caps()); })
      .def("check_dtype", [](const DdpAggregator& a, const std::string& dtype) { a.checkDtype(dtypeFromTorch(dtype)); })
      .def_property_readonly("prev_checks_deferred", &DdpAggregator::prevChecksDeferred)
      .def_property_readonly("plugin",
                             [](const DdpAggregator& a) {
                               const PluginInfo& i = a.plugin().info();
                               py::dict d;
                               d["name"] = i.name;
                               d["version"] = i.version;
                               d["path"] = i.path.string();
                               d["origin"] = i.origin;
                               d["abi_version"] = i.abi_version;
                               return d;
                             })
      .def("buckets",
           [](const DdpAggregator& a) {
             py::dict out;
             for (const auto& [index, b] : a.buckets()) {
               py::dict d;
               d["numel"] = b.numel;
               d["tensors"] = b.tensors;
               d["steps"] = b.steps;
               d["last_step"] = bytesDict(b.last_step);
               d["total"] = bytesDict(b.total);
               out[py::int_(index)] = d;
             }
             return out;
           })
      .def("totals", [](const DdpAggregator& a) { return bytesDict(a.totals()); })
      .def("times", [](const DdpAggregator& a) {
        py::dict d;
        d["encode_s"] = a.encodeSeconds();
        d["decode_s"] = a.decodeSeconds();
        d["comm_s"] = a.commSeconds();
        d["hook_s"] = a.hookSeconds();
        d["exposed_s"] = a.exposedSeconds();
        return d;
      });

  m.def("description_module", &descriptionModule, py::arg("description"),
        "the workload.pytorch.module a ResultsLogger description names, as written ('' for none)");
  m.def("monotonic", &steadySeconds,
        "seconds on the clock terse stamps its phases with (steady_clock), for step-trace events from Python");
  // Local SGD's round under the quadratic synchronization rule (local_sgd_schedule.h): terse.torch.LocalSGD draws its
  // rounds with the trainer's own arithmetic.
  m.def("local_round_length", &train::localRoundLength, py::arg("period"), py::arg("qsr_alpha"), py::arg("rate"));

  py::class_<HookTrace>(m, "HookTrace")
      .def(py::init([](const std::string& workload, const std::string& compressor, const std::string& backend,
                       int64_t compression_start_step, int64_t compressor_phases_end) {
             train::TraceHeader h;
             h.mode = "sync";
             h.source = "pytorch";
             h.workload = workload;
             h.compressor = compressor;
             // DDP's order: buckets one at a time as they become ready, each a group of the trace.
             h.scheduler = "ddp";
             // torch.distributed picks its own algorithms; a replay prices the collectives as terse's `auto` at N.
             h.allreduce_algorithm = "torch:" + backend;
             h.allgather_algorithm = "torch:" + backend;
             h.clock = "real_time";
             h.compression_start_step = compression_start_step;
             h.compressor_phases_end = compressor_phases_end;
             return std::make_unique<HookTrace>(std::move(h));
           }),
           py::arg("workload"), py::arg("compressor"), py::arg("backend"), py::arg("compression_start_step") = 0,
           py::arg("compressor_phases_end") = 0)
      .def(
          "describe",
          [](HookTrace& t, int rank, int world, int64_t batch_size, int layers,
             const std::vector<std::tuple<std::string, uint64_t, int>>& tensors) {
            std::vector<train::TraceTensor> v;
            for (const auto& [name, elements, layer] : tensors)
              v.push_back(train::TraceTensor{0, name, elements, layer});
            t.describe(rank, world, batch_size, layers, std::move(v));
          },
          py::arg("rank"), py::arg("world"), py::arg("batch_size"), py::arg("layers"), py::arg("tensors"))
      .def_property_readonly("described", &HookTrace::described)
      .def("begin_step", &HookTrace::beginStep, py::arg("step"), py::arg("start"))
      .def("forward", &HookTrace::forward, py::arg("step"), py::arg("layer"), py::arg("start"), py::arg("end"))
      .def("backward", &HookTrace::backward, py::arg("step"), py::arg("layer"), py::arg("start"), py::arg("end"),
           py::arg("ready"))
      .def("optimizer", &HookTrace::optimizer, py::arg("step"), py::arg("start"), py::arg("end"))
      .def("end_step", &HookTrace::endStep, py::arg("step"), py::arg("step_s"))
      .def("write", &HookTrace::write, py::arg("dir"))
      .def("lines", [](const HookTrace& t) {
        // The trace as the file would hold it, line by line (tests).
        const train::StepTrace s = t.snapshot();
        std::vector<std::string> out{train::stepTraceHeaderLine(s.header)};
        for (const auto& step : s.steps) out.push_back(train::stepTraceStepLine(step));
        return out;
      });

  py::class_<HookResults>(m, "HookResults")
      .def(
          py::init([](DdpAggregator& aggregator, const std::filesystem::path& root, const std::string& study,
                      const std::string& variant, const std::string& description, const std::string& torch_version,
                      std::optional<uint64_t> repeat_seed, const StringPairs& code_hook,
                      const StringPairs& module_files, const py::object& local_sgd, const StringPairs& data_partition) {
            // local_sgd: None, or (period, start_step, outer_lr, outer_momentum, outer_nesterov, qsr_alpha), checked
            // by terse.torch.LocalSGD.
            std::optional<experiments::LocalSgd> local;
            if (!local_sgd.is_none()) {
              const auto [period, start, lr, momentum, nesterov, qsr] =
                  local_sgd.cast<std::tuple<int64_t, int64_t, double, double, bool, double>>();
              local.emplace();
              local->set_period(period);
              local->set_start_step(start);
              local->set_outer_lr(lr);
              local->set_outer_momentum(momentum);
              local->set_outer_nesterov(nesterov);
              if (qsr > 0) local->set_qsr_alpha(qsr);
            }
            return std::make_unique<HookResults>(aggregator, root, study, variant, description, torch_version,
                                                 repeat_seed, ScriptProvenance{code_hook, module_files, data_partition},
                                                 std::move(local));
          }),
          py::arg("aggregator"), py::arg("root"), py::arg("study"), py::arg("variant"), py::arg("description"),
          py::arg("torch_version"), py::arg("repeat_seed") = py::none(), py::arg("code_hook") = StringPairs{},
          py::arg("module_files") = StringPairs{}, py::arg("local_sgd") = py::none(),
          py::arg("data_partition") = StringPairs{}, py::keep_alive<1, 2>())
      .def_static(
          "baseline",
          [](py::object group, const std::filesystem::path& root, const std::string& study, const std::string& variant,
             const std::string& compressor, uint64_t bytes_per_step, const std::string& description,
             const std::string& torch_version, std::optional<uint64_t> repeat_seed, const StringPairs& code_hook,
             const StringPairs& module_files, const StringPairs& data_partition) {
            return std::make_unique<HookResults>(std::move(group), BaselineRun{compressor, bytes_per_step}, root, study,
                                                 variant, description, torch_version, repeat_seed,
                                                 ScriptProvenance{code_hook, module_files, data_partition});
          },
          py::arg("group"), py::arg("root"), py::arg("study"), py::arg("variant"), py::arg("compressor"),
          py::arg("bytes_per_step"), py::arg("description"), py::arg("torch_version"),
          py::arg("repeat_seed") = py::none(), py::arg("code_hook") = StringPairs{},
          py::arg("module_files") = StringPairs{}, py::arg("data_partition") = StringPairs{})
      .def(
          "record",
          [](HookResults& r, double test_accuracy, double test_loss, int64_t test_examples, double train_loss,
             double epoch, double lr, int64_t step) {
            r.record(EvalNumbers{test_accuracy, test_loss, test_examples, train_loss, epoch, lr},
                     step < 0 ? std::nullopt : std::optional<int64_t>(step));
          },
          py::arg("test_accuracy"), py::arg("test_loss") = 0.0, py::arg("test_examples") = 0,
          py::arg("train_loss") = 0.0, py::arg("epoch") = 0.0, py::arg("lr") = 0.0, py::arg("step") = -1)
      .def("finish", &HookResults::finish, py::arg("error") = py::none())
      .def("check_open", &HookResults::checkOpen, py::arg("call"))
      .def_property_readonly("finished", &HookResults::finished)
      .def_property_readonly("dir", &HookResults::dir);

  py::class_<Recipe>(m, "Recipe")
      .def(py::init<const std::string&, const std::string&, const std::vector<std::string>&>(), py::arg("path"),
           py::arg("variant") = "", py::arg("plugin_path") = std::vector<std::string>{})
      .def_property_readonly("text", &Recipe::text)
      .def_property_readonly("experiment",
                             [](const Recipe& r) {
                               std::string json;
                               google::protobuf::util::JsonPrintOptions o;
                               o.preserve_proto_field_names = true;
                               TERSE_CHECK(google::protobuf::util::MessageToJsonString(r.experiment(), &json, o).ok(),
                                           InternalError, "cannot print the experiment as JSON");
                               return py::module_::import("json").attr("loads")(json);
                             })
      .def("data",
           [](Recipe& r) {
             const workloads::DataSplit& d = r.data();
             return py::make_tuple(datasetArrays(d.train), datasetArrays(d.test));
           })
      .def("initial_parameters",
           [](Recipe& r) {
             py::list out;
             for (const InitialParam& p : r.initialParameters()) {
               std::vector<py::ssize_t> shape(p.shape.begin(), p.shape.end());
               out.append(py::make_tuple(p.name, toArray(p.value, shape)));
             }
             return out;
           })
      .def("steps_per_epoch", &Recipe::stepsPerEpoch, py::arg("world_size"))
      .def("total_steps", &Recipe::totalSteps, py::arg("world_size"))
      .def(
          "batches",
          [](Recipe& r, int rank, int world, int64_t epoch) {
            py::list out;
            for (const auto& b : r.batches(rank, world, epoch))
              out.append(toArray(b, {static_cast<py::ssize_t>(b.size())}));
            return out;
          },
          py::arg("rank"), py::arg("world_size"), py::arg("epoch"))
      .def("learning_rate", &Recipe::learningRate, py::arg("step"), py::arg("world_size"),
           py::arg("steps_per_epoch") = 0)
      .def("data_partition", &Recipe::dataPartition, py::arg("world_size"))
      // The native runner's warning (runner_detail.h) for a run of these many steps: "" when none.
      .def(
          "local_sgd_warning",
          [](Recipe& r, int64_t steps_per_epoch, int64_t total_steps, int world) {
            return runner::detail::localSgdEvaluationWarning(r.experiment(), steps_per_epoch, total_steps,
                                                             localSgdSchedule(r, steps_per_epoch, total_steps, world));
          },
          py::arg("steps_per_epoch"), py::arg("total_steps"), py::arg("world_size"))
      .def(
          "compression_start_warning",
          [](Recipe& r, int64_t total_steps) {
            return runner::detail::compressionStartWarning(r.experiment(), total_steps);
          },
          py::arg("total_steps"))
      // The same for the compressor's phases (terse/phases_v1.h; the hook state's phase_steps): "" when none.
      .def(
          "compressor_phases_warning",
          [](Recipe& r, const std::vector<uint64_t>& phases, int64_t total_steps) {
            return runner::detail::compressorPhasesWarning(r.experiment(), phases, total_steps);
          },
          py::arg("phases"), py::arg("total_steps"))
      // The step counts after which the native run's local SGD schedule averages (local_sgd_schedule.h), the forced
      // averagings at the evaluation points and the last step aside: what terse.torch.LocalSGD must do alike.
      .def("local_sgd_schedule", &localSgdEnds, py::arg("steps_per_epoch"), py::arg("total_steps"),
           py::arg("world_size"));
}
