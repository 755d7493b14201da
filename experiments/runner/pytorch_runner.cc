// Workload pytorch (experiment.proto PyTorch): the variant is trained by the Python package's driver,
// `python3 -m terse.train` (experiments/python/terse/train.py), with DistributedDataParallel and terse's hook, and this
// process keeps what it keeps for every variant: the results folder's status, and the summary row of `terse run`.
//
// Why a child process and not the extension in this process: the model, its data and DDP are torch's, and torch is a
// Python library; the terse binary stays free of libtorch and of an embedded interpreter.
//
// The handshake is the results folder. This process creates it (status "running", config.textproto), writes the
// resolved experiment to a file the driver reads, and runs the driver with the folder's name; the driver's
// terse.torch.ResultsLogger rewrites config and provenance with what the hook knows and appends metrics.jsonl (rank 0).
// When the driver exits, the folder's status is settled here whatever the driver managed to write: completed only
// when it exited with 0 and marked the run completed, failed (with the exit status or signal) otherwise, so a killed
// or crashed driver never leaves a folder saying "running". A terse run stopped by SIGTERM, SIGHUP or SIGINT while the
// driver runs (core/common/stop_signals.h) sends the driver the signal and waits for this settling, whose error then
// starts with the stop ("terminated by SIGTERM: ...", results/result_writer.h).
//
// Which Python: TERSE_PYTHON if set, else the interpreter the package was built for (TERSE_PYTHON_EXECUTABLE, a
// compile definition), else python3 from PATH. The build tree's package goes first on PYTHONPATH when it exists; an
// installed or pip-installed package is found on the interpreter's own path.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <google/protobuf/util/message_differencer.h>

#include "core/common/error.h"
#include "core/common/json.h"
#include "core/common/stop_signals.h"
#include "core/plugin/loader.h"
#include "experiments/runner/runner.h"

namespace terse::runner {
namespace {

using experiments::Experiment;

std::string pythonExecutable() {
  if (const char* p = std::getenv("TERSE_PYTHON"); p != nullptr && *p != '\0') return p;
#if defined(TERSE_PYTHON_EXECUTABLE)
  if (::access(TERSE_PYTHON_EXECUTABLE, X_OK) == 0) return TERSE_PYTHON_EXECUTABLE;
#endif
  return "python3";
}

std::string pythonPath() {
  std::string path;
#if defined(TERSE_PYTHON_BUILD_DIR)
  if (std::filesystem::is_directory(std::filesystem::path(TERSE_PYTHON_BUILD_DIR) / "terse"))
    path = TERSE_PYTHON_BUILD_DIR;
#endif
  if (const char* old = std::getenv("PYTHONPATH"); old != nullptr && *old != '\0') {
    path += (path.empty() ? "" : ":") + std::string(old);
  }
  return path;
}

// Runs argv with PYTHONPATH set; returns waitpid's status. Standard streams are inherited: the driver's progress is
// the run's progress. `delegate` takes the child while it runs, for a stop signal to reach it (stop_signals.h).
int runChild(const std::vector<std::string>& argv, const std::string& python_path,
             std::optional<stop::Delegate>& delegate) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  // As system(3) does: while the driver runs, Ctrl-C (SIGINT to the whole foreground group) and SIGQUIT are the
  // driver's and its ranks' to handle -- they record "interrupted" and leave -- and this process settles the folder
  // after them; dying at once, it would take the driver down with it first (PR_SET_PDEATHSIG below). Where the stop
  // signals are this process's to record (stop_signals.h), SIGINT is taken by its stopping thread instead, which
  // waits for the driver in the same way; ignored, a blocked SIGINT would be lost.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  struct sigaction old_int {
  }, old_quit{};
  ::sigaction(SIGINT, nullptr, &old_int);
  if (!stop::installed()) ::sigaction(SIGINT, &ignore, nullptr);
  ::sigaction(SIGQUIT, &ignore, &old_quit);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGQUIT, &old_quit, nullptr);
  }
  TERSE_CHECK(pid >= 0, InvalidArgument, "workload pytorch: cannot start " << argv[0] << ": " << std::strerror(errno));
  if (pid == 0) {
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGQUIT, &old_quit, nullptr);
    stop::resetInChild();
    // The driver ends with this process: a `kill` of terse run must not leave it (and the ranks it starts, which do
    // the same with it: train.py) training on, to mark a run completed that its user stopped. The check after the
    // call catches a parent gone before it.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(128 + SIGTERM);
    if (!python_path.empty()) ::setenv("PYTHONPATH", python_path.c_str(), 1);
    // `python3 -m` puts the working directory first on sys.path (Python 3.11 and later leave it out with this set): a
    // user's queue.py or tokenize.py there would shadow the standard library's in the driver and its ranks.
    ::setenv("PYTHONSAFEPATH", "1", 1);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "terse run: workload pytorch: cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  delegate.emplace(pid);
  // Waited for without reaping first: until reaped, the pid is still the driver's, and the delegate may signal it.
  siginfo_t ended{};
  while (::waitid(P_PID, static_cast<id_t>(pid), &ended, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
  }
  delegate->childEnded();
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno == EINTR) continue;
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGQUIT, &old_quit, nullptr);
    TERSE_THROW(InternalError, "workload pytorch: waitpid: " << std::strerror(errno));
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGQUIT, &old_quit, nullptr);
  return status;
}

std::string describeExit(int status) {
  if (WIFEXITED(status)) {
    if (WEXITSTATUS(status) == 127) return "the Python driver could not be started (exit status 127)";
    return "the Python driver exited with status " + std::to_string(WEXITSTATUS(status));
  }
  if (WIFSIGNALED(status))
    return std::string("the Python driver was killed by signal ") + ::strsignal(WTERMSIG(status));
  return "the Python driver ended with wait status " + std::to_string(status);
}

struct FolderStatus {
  std::string state;  // empty when status.json cannot be read
  std::string error;
};

FolderStatus folderStatus(const std::filesystem::path& dir) {
  std::ifstream in(dir / std::string(results::kStatusFile));
  if (!in) return {};
  try {
    const Json j = Json::parse(in);
    return {j.value("state", ""), j.value("error", "")};
  } catch (const std::exception&) {
    return {};
  }
}

// The summary row from the folder's metrics.jsonl: the last record's numbers and the best accuracy.
void summarize(const std::filesystem::path& dir, RunSummary& s) {
  std::ifstream in(dir / std::string(results::kMetricsFile));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    Json r;
    try {
      r = Json::parse(line);
    } catch (const std::exception& x) {
      TERSE_THROW(InvalidArgument, (dir / std::string(results::kMetricsFile)).string()
                                       << ": record " << s.records + 1 << " is not JSON: " << x.what());
    }
    ++s.records;
    s.steps = r.value("step", int64_t{0});
    s.final_accuracy = r.value("test_accuracy", 0.0);
    s.best_accuracy = std::max(s.best_accuracy, s.final_accuracy);
    s.final_test_loss = r.value("test_loss", 0.0);
    s.wire_bytes_per_worker = r.value("wire_bytes_per_worker", uint64_t{0});
    s.payload_bytes_per_worker = r.value("payload_bytes_per_worker", uint64_t{0});
    s.wall_s = r.value("wall_s", 0.0);
  }
}

}  // namespace

RunSummary Runner::runPyTorch(const Experiment& e) {
  const std::filesystem::path root = options_.output_root.value_or(std::filesystem::path(e.output_dir()));
  const std::string folder = experiments::resultsSubfolder(e);
  const bool multi_process = e.transport() == Experiment::TCP;
  const bool rank0 =
      !multi_process || std::getenv("TERSE_RANK") == nullptr || std::string(std::getenv("TERSE_RANK")) == "0";
  primary_ = primary_ && rank0;

  // Rank 0 owns the folder (as the native multi-process runner: the other ranks write nothing).
  std::optional<results::ResultWriter> writer;
  RunSummary summary;
  summary.study = e.study();
  summary.variant = e.variant();
  if (rank0) {
    writer.emplace(root, e.study(), folder);
    writer->writeConfig(experiments::toText(e));
    summary.dir = writer->dir();
  }
  // The resolved experiment, for the driver: beside the folder on rank 0, in the temporary directory on the others.
  const std::filesystem::path spec =
      rank0 ? writer->dir() / ".pytorch-experiment.textproto"
            : std::filesystem::temp_directory_path() / ("terse-pytorch-" + std::to_string(::getpid()) + ".textproto");
  bool refused = false;  // the driver's checks refused the workload (WorkloadRefused)
  // Alive until the folder is settled (on every way out of this function), which a stop signal waits for.
  std::optional<stop::Delegate> delegate;
  try {
    {
      std::ofstream out(spec);
      out << experiments::toText(e);
      TERSE_CHECK(out.good(), InvalidArgument, "cannot write " << spec.string());
    }
    // Where the driver leaves its error's one-line summary when it fails before its logger could.
    const std::filesystem::path error_file = spec.string() + ".error";
    std::vector<std::string> argv{pythonExecutable(), "-m",       "terse.train", spec.string(),  "--out",
                                  root.string(),      "--folder", folder,        "--error-file", error_file.string()};
    // Only the folders given as --plugin-path: the driver's own loader adds TERSE_PLUGIN_PATH (inherited), the
    // installation's and the build tree's folders itself, in the same order, with their own origins. Handed over as
    // --plugin-path, every plugin found there would be recorded in provenance.json as found on --plugin-path, where a
    // native run records "build tree" or "install" for the same file.
    for (const SearchDir& d : options_.loader->searchDirs()) {
      if (d.exists && d.origin == kOriginPluginPath) argv.insert(argv.end(), {"--plugin-path", d.dir.string()});
    }
    const int status = runChild(argv, pythonPath(), delegate);
    // The summary line, then "config" when the driver's own checks refused the workload, "module" when the user's
    // module failed before training (train.py, _write_error): either fails every variant with that workload alike.
    std::string driver_error, driver_kind;
    if (std::ifstream in(error_file); in) {
      std::getline(in, driver_error);
      std::getline(in, driver_kind);
    }
    std::error_code ignored;
    std::filesystem::remove(spec, ignored);
    std::filesystem::remove(error_file, ignored);
    // Under transport TCP every rank's driver reports a failure before training with the same kind (train.py,
    // _agree_before_training), so every rank's terse run skips the same later variants.
    const bool workload_refused = (driver_kind == "config" || driver_kind == "module") && !driver_error.empty();
    if (!rank0) {
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return summary;
      std::string message = "variant '" + e.variant() + "' of study '" + e.study() +
                            "': " + (driver_error.empty() ? "" : driver_error + " (") + describeExit(status) +
                            (driver_error.empty() ? "" : ")");
      if (workload_refused) throw WorkloadRefused(std::move(message), {});
      throw RunFailed(std::move(message), {});
    }
    writer->recount();
    const FolderStatus left = folderStatus(writer->dir());
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      // The driver's own reason: its summary, else what its logger wrote into the status.
      std::string why = driver_error;
      if (why.empty() && left.state == results::kStateFailed) why = left.error;
      refused = workload_refused;
      throw std::runtime_error(why.empty() ? describeExit(status) : why + " (" + describeExit(status) + ")");
    }
    TERSE_CHECK(
        left.state == results::kStateCompleted, InvalidArgument,
        "the Python driver exited with 0 but left the run " << (left.state.empty() ? "without a status" : left.state));
    summarize(writer->dir(), summary);
    writer->markCompleted();
    return summary;
  } catch (const RunFailed&) {
    throw;
  } catch (const std::exception& x) {
    std::error_code ignored;
    std::filesystem::remove(spec, ignored);
    if (!writer) throw;
    writer->recount();
    writer->markFailed(x.what());  // prefixed with the stop when there was one (ResultWriter::markFailed)
    // "partial results" only where there are some: a run that failed before its first record left its status alone.
    std::string message = "variant '" + e.variant() + "' of study '" + e.study() + "' failed (" +
                          (writer->records() > 0 ? "partial results in " : "status in ") + writer->dir().string() +
                          "): " + x.what();
    if (refused) throw WorkloadRefused(std::move(message), writer->dir());
    throw RunFailed(std::move(message), writer->dir());
  }
}

bool sameWorkloadAsRefused(const Experiment& later, const Experiment& refused) {
  return later.workers() == refused.workers() &&
         google::protobuf::util::MessageDifferencer::Equals(later.workload(), refused.workload()) &&
         google::protobuf::util::MessageDifferencer::Equals(later.data(), refused.data());
}

}  // namespace terse::runner
