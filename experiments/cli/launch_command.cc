// `terse launch -n N [--master-port P] [--timeout S] [--no-prefix] -- COMMAND ARGS...`: a one-host job launcher (like
// torchrun --standalone). It generates the job's token (auth.h) and starts N copies of COMMAND, rank r with
//   TERSE_RANK=r TERSE_WORLD_SIZE=N TERSE_LOCAL_RANK=r TERSE_LOCAL_WORLD_SIZE=N
//   TERSE_MASTER_ADDR=127.0.0.1 TERSE_MASTER_PORT=P TERSE_JOB_TOKEN=<a fresh terse-v1- token>
//   TERSE_LAUNCH_NOTIFY_FD=<fd>
// so that joinJob (core/comm/job.h) in each child finds the others through rank 0's store. The token travels in the
// environment, which only this user (and root) can read in /proc, never on a command line. The launcher does not read
// the study: every rank loads the file itself, from the same ARGS, so `terse run`'s --set overrides go after -- and
// reach every rank alike; --set before -- is refused with that advice.
//
// With TERSE_STORE_EXTERNAL=1 in its environment the launcher does not generate a token: the ranks get the external
// store's (from TERSE_JOB_TOKEN or TERSE_JOB_TOKEN_FILE), and --master-port must name that store's port.
//
// Control channel (core/common/launch_notify.h): each rank gets its own Unix socket to the launcher, named by
// TERSE_LAUNCH_NOTIFY_FD, on which it says `study-done` (the rank writing the results, once the study completed),
// `failed <reason>` (before it exits non-zero) or `crashed <SIGNAME> [plugin=<name> path=<path>]` (from a fatal-signal
// handler). Without it the launcher could only wait for exits, and a rank that never exits -- a SIGSTOPped
// parameter-server worker the shards dropped long ago -- kept it waiting forever.
//
// Supervision: each child runs in its own process group (so a rank that is a shell script is killed with its
// children); SIGINT/SIGTERM/SIGHUP to the launcher are forwarded to every rank. The clock starts when the study is
// done (`study-done`) or when a rank fails (a `failed` or `crashed` message, a non-zero exit or a signal; the launcher
// says which rank and how); a rank exiting 0 starts nothing, since an asynchronous worker may finish long before the
// rest. The other ranks then get --timeout seconds to end on their own -- after a failure they should, naming the dead
// rank, through the transport's fault detection -- and each one still running is named and terminated: SIGTERM and
// SIGCONT (a stopped process acts on nothing else), SIGKILL after a grace period. Exit status: 0 when every rank exited
// 0 and none reported a failure; else 1, also when the study completed but a rank had to be terminated after it (the
// summary then says that the study completed and names the rank); 128+signal when the launcher itself was
// interrupted.
//
// `terse store [--bind ADDR] [--port P] [--token-file F]`: a standalone rendezvous store for jobs whose ranks set
// TERSE_STORE_EXTERNAL=1 (e.g. when no rank should own it, or across srun steps). The token comes from --token-file,
// TERSE_JOB_TOKEN or TERSE_JOB_TOKEN_FILE. It prints "serving on ADDR:PORT" once listening and serves until SIGINT or
// SIGTERM.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <algorithm>
#include <atomic>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/comm/auth.h"
#include "core/comm/job.h"
#include "core/comm/tcp_store.h"
#include "core/common/launch_notify.h"
#include "experiments/cli/cli_util.h"
#include "experiments/cli/commands.h"

extern char** environ;

namespace terse::cli {
namespace {

namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;

constexpr std::string_view kLaunchUsage =
    "usage: terse launch -n N [--master-port P] [--timeout S] [--no-prefix] -- COMMAND [ARGS...]\n"
    "\n"
    "Starts N ranks of COMMAND on this host with TERSE_RANK, TERSE_WORLD_SIZE, TERSE_LOCAL_RANK,\n"
    "TERSE_LOCAL_WORLD_SIZE, TERSE_MASTER_ADDR, TERSE_MASTER_PORT and a fresh TERSE_JOB_TOKEN set, e.g.\n"
    "  terse launch -n 3 -- terse run study.textproto\n"
    "Every rank gets the same COMMAND ARGS: a `terse run` option such as --set epochs=1 goes after --, and every\n"
    "rank applies it. Output lines are prefixed with [rank R]. Once the study is done (the rank writing its results\n"
    "says so) or a rank fails, the others get --timeout seconds to end on their own, then they are named and\n"
    "terminated. The exit status is 0 only when every rank exited 0; 1 when a rank failed or had to be terminated\n"
    "(the summary says whether the study completed).";

constexpr std::string_view kStoreUsage =
    "usage: terse store [--bind ADDR] [--port P] [--token-file FILE]\n"
    "\n"
    "Serves a rendezvous store for ranks started with TERSE_STORE_EXTERNAL=1 and TERSE_MASTER_ADDR/PORT pointing\n"
    "here. The job token comes from --token-file, TERSE_JOB_TOKEN or TERSE_JOB_TOKEN_FILE (mode 0600).";

// Signals delivered to the launcher: the handler only records them and wakes the poll loop (self-pipe), all real
// work happens in the loop.
std::atomic<int> g_signal{0};
int g_wake_fd = -1;

extern "C" void onSignal(int sig) {
  g_signal.store(sig);
  if (g_wake_fd >= 0) {
    const char c = 0;
    [[maybe_unused]] const ssize_t n = ::write(g_wake_fd, &c, 1);
  }
}

std::string signalName(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string describeStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + signalName(WTERMSIG(status)) + ")";
  return "stopped with wait status " + std::to_string(status);
}

// A port that was free a moment ago on loopback (bound, read back, released). Rank 0 binds it again right away; the
// window in which another process could take it is tiny and ends in a clear "cannot listen" error, not a hang.
uint16_t pickFreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TERSE_CHECK(fd >= 0, InvalidArgument, "launch: socket: " << std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  const int err = errno;
  ::close(fd);
  TERSE_CHECK(ok, InvalidArgument, "launch: cannot find a free port: " << std::strerror(err));
  return ntohs(a.sin_port);
}

// One rank's output stream, cut into lines that get the rank's prefix.
struct OutputPipe {
  int fd = -1;
  int rank = 0;
  bool is_stderr = false;
  std::string partial;
};

// What a rank's `crashed` message said (launch_notify.h).
struct Crash {
  std::string signal;  // "SIGSEGV"
  std::string plugin;  // empty when the crash was not inside a plugin call
  std::string path;
};

struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool running = true;
  int status = 0;
  int notify_fd = -1;                 // the launcher's end of the rank's control channel; -1 once closed
  int stopped_by = 0;                 // the signal that stopped the rank (SIGSTOP, SIGTSTP), 0 while it runs
  bool terminated = false;            // the launcher sent it SIGTERM for outliving --timeout
  std::optional<std::string> failed;  // the reason of its `failed` message
  std::optional<Crash> crash;
};

// "crashed SIGSEGV plugin=NAME path=PATH" -> {SIGSEGV, NAME, PATH}; the path is the rest of the line (it may hold
// spaces), the plugin name what comes before " path=".
Crash parseCrash(std::string_view rest) {
  Crash c;
  const std::size_t space = rest.find(' ');
  c.signal = std::string(rest.substr(0, space));
  if (space == std::string_view::npos) return c;
  std::string_view tail = rest.substr(space + 1);
  if (!tail.starts_with("plugin=")) return c;
  tail.remove_prefix(7);
  const std::size_t path = tail.find(" path=");
  c.plugin = std::string(tail.substr(0, path));
  if (path != std::string_view::npos) c.path = std::string(tail.substr(path + 6));
  return c;
}

std::string crashPlace(const Crash& c) {
  if (c.plugin.empty()) return {};
  return " in plugin '" + c.plugin + "'" + (c.path.empty() ? std::string() : " (" + c.path + ")");
}

// How a rank ended, with where it crashed when it said so: "was killed by signal 11 (SIGSEGV) in plugin 'x' (/p/x.so)".
std::string describeEnd(const Child& c) {
  std::string s = describeStatus(c.status);
  if (c.crash) {
    if (WIFSIGNALED(c.status) && signalName(WTERMSIG(c.status)) == c.crash->signal)
      s += crashPlace(*c.crash);
    else
      s += " after reporting a crash (" + c.crash->signal + crashPlace(*c.crash) + ")";
  }
  return s;
}

// The summary's line: the end, whether the launcher caused it, and the rank's own reason.
std::string describeChild(const Child& c) {
  std::string s = describeEnd(c);
  if (c.terminated) s += ", terminated by the launcher";
  if (c.failed) s += "; it reported: " + *c.failed;
  return s;
}

void writeLines(OutputPipe& p, std::string_view data, bool flush_partial) {
  p.partial.append(data);
  std::ostream& out = p.is_stderr ? std::cerr : std::cout;
  std::size_t start = 0;
  for (std::size_t nl; (nl = p.partial.find('\n', start)) != std::string::npos; start = nl + 1)
    out << "[rank " << p.rank << "] " << std::string_view(p.partial).substr(start, nl + 1 - start);
  p.partial.erase(0, start);
  if (flush_partial && !p.partial.empty()) {
    out << "[rank " << p.rank << "] " << p.partial << '\n';
    p.partial.clear();
  }
  out.flush();
}

class Launcher {
 public:
  Launcher(int n, uint16_t port, std::chrono::seconds timeout, bool prefix, std::vector<std::string> command)
      : n_(n), port_(port), timeout_(timeout), prefix_(prefix), command_(std::move(command)) {}

  int run() {
    int wake[2];
    TERSE_CHECK(::pipe2(wake, O_CLOEXEC | O_NONBLOCK) == 0, InvalidArgument, "launch: pipe: " << std::strerror(errno));
    wake_read_ = wake[0];
    g_wake_fd = wake[1];
    struct sigaction sa {};
    sa.sa_handler = onSignal;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
    // A closed stdout (`terse launch ... | head`) must not kill the launcher and orphan the ranks.
    ::signal(SIGPIPE, SIG_IGN);

    // A store run elsewhere (`terse store`, TERSE_STORE_EXTERNAL=1) already has a token: the ranks must use that one.
    const char* external = std::getenv("TERSE_STORE_EXTERNAL");
    const bool use_env_token = external != nullptr && std::string_view(external) == "1";
    std::optional<comm::JobToken> env_token = use_env_token ? comm::JobToken::fromEnvironment() : std::nullopt;
    TERSE_CHECK(!use_env_token || env_token, InvalidArgument,
                "TERSE_STORE_EXTERNAL=1: set TERSE_JOB_TOKEN or TERSE_JOB_TOKEN_FILE to the external store's token");
    TERSE_CHECK(!use_env_token || port_ != 0, InvalidArgument,
                "TERSE_STORE_EXTERNAL=1: give the external store's port with --master-port");
    const comm::JobToken token = env_token ? *env_token : comm::JobToken::generate();
    if (port_ == 0) port_ = pickFreePort();
    for (int r = 0; r < n_; ++r) {
      if (g_signal.load() != 0) break;
      spawn(r, token);
    }
    return supervise();
  }

 private:
  std::vector<std::string> childEnv(int rank, const comm::JobToken& token, int notify_fd) const {
    // Ours replace any inherited TERSE_* of the same name; a token file would be ignored anyway, drop it to be clear.
    static const std::vector<std::string_view> kOwned{
        "TERSE_RANK=",        "TERSE_WORLD_SIZE=",  "TERSE_LOCAL_RANK=", "TERSE_LOCAL_WORLD_SIZE=",
        "TERSE_MASTER_ADDR=", "TERSE_MASTER_PORT=", "TERSE_JOB_TOKEN=",  "TERSE_JOB_TOKEN_FILE="};
    const std::string notify_prefix = std::string(kLaunchNotifyFdEnv) + "=";
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string_view v(*e);
      bool owned = v.starts_with(notify_prefix);
      for (auto prefix : kOwned) owned = owned || v.starts_with(prefix);
      if (!owned) env.emplace_back(v);
    }
    env.push_back("TERSE_RANK=" + std::to_string(rank));
    env.push_back("TERSE_WORLD_SIZE=" + std::to_string(n_));
    env.push_back("TERSE_LOCAL_RANK=" + std::to_string(rank));
    env.push_back("TERSE_LOCAL_WORLD_SIZE=" + std::to_string(n_));
    env.push_back("TERSE_MASTER_ADDR=127.0.0.1");
    env.push_back("TERSE_MASTER_PORT=" + std::to_string(port_));
    env.push_back(std::string(comm::kJobTokenEnv) + "=" + token.secret());
    env.push_back(std::string(kLaunchNotifyFdEnv) + "=" + std::to_string(notify_fd));
    return env;
  }

  void spawn(int rank, const comm::JobToken& token) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    // Own process group: signals reach a rank's whole tree; default signal dispositions, nothing blocked.
    posix_spawnattr_setpgroup(&attr, 0);
    sigset_t none, all_default;
    sigemptyset(&none);
    sigemptyset(&all_default);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) sigaddset(&all_default, sig);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all_default);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    // Ranks run in background process groups: a terminal read would stop them, so stdin is /dev/null.
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    if (prefix_) {
      TERSE_CHECK(::pipe2(out, O_CLOEXEC) == 0 && ::pipe2(err, O_CLOEXEC) == 0, InvalidArgument,
                  "launch: pipe: " << std::strerror(errno));
      posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
      posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
    }
    // The control channel (launch_notify.h): the rank's end must survive exec (a rank that is a script passes it on),
    // the launcher's must not. This process has one thread, so the rank's end cannot leak into another rank before
    // it is closed below.
    int notify[2] = {-1, -1};
    TERSE_CHECK(
        ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, notify) == 0 && ::fcntl(notify[1], F_SETFD, 0) == 0,
        InvalidArgument, "launch: control channel socketpair: " << std::strerror(errno));
    std::vector<std::string> env = childEnv(rank, token, notify[1]);
    std::vector<char*> envp, argv;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = command_;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    const int rc = ::posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    ::close(notify[1]);
    if (prefix_) {
      ::close(out[1]);
      ::close(err[1]);
    }
    if (rc != 0) {
      ::close(notify[0]);
      if (prefix_) {
        ::close(out[0]);
        ::close(err[0]);
      }
      std::cerr << "terse launch: cannot start rank " << rank << " ('" << command_.front()
                << "'): " << std::strerror(rc) << '\n';
      spawn_failed_ = true;
      g_signal.store(SIGTERM);  // stop the ranks already started
      return;
    }
    Child& c = children_.emplace_back();
    c.rank = rank;
    c.pid = pid;
    c.notify_fd = notify[0];
    if (prefix_) {
      pipes_.push_back({out[0], rank, false, {}});
      pipes_.push_back({err[0], rank, true, {}});
    }
  }

  // The clock of --timeout: started by the study's end or the first failure, whichever came first.
  std::optional<Clock::time_point> clockStart() const {
    if (study_done_ && first_failure_) return std::min(*study_done_, *first_failure_);
    return study_done_ ? study_done_ : first_failure_;
  }

  std::string waitingNote() const {
    const auto left = timeout_ - std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - *clockStart());
    return "; waiting up to " + std::to_string(std::max<int64_t>(left.count(), 0)) + " s for the other ranks to stop";
  }

  // A rank failed (`what` says how): the first failure starts the clock, and is said with it. `only_first`: a line
  // the rank printed itself and the summary repeats, worth saying here only when it starts the clock.
  void noteFailure(const Child& c, const std::string& what, bool only_first = false) {
    const bool first = !first_failure_;
    if (first) first_failure_ = Clock::now();
    if (terminating_ || (only_first && !first)) return;  // the ranks the launcher killed are listed in the summary
    std::cerr << "terse launch: rank " << c.rank << " (pid " << c.pid << ") " << what
              << (first ? waitingNote() : std::string()) << '\n';
  }

  // One message from rank c's control channel (launch_notify.h).
  void handleMessage(Child& c, std::string_view line) {
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
    const std::size_t space = line.find(' ');
    const std::string_view kind = line.substr(0, space);
    const std::string_view rest = space == std::string_view::npos ? std::string_view() : line.substr(space + 1);
    if (kind == "study-done") {
      if (!study_done_) study_done_ = Clock::now(), done_rank_ = c.rank;
    } else if (kind == "failed") {
      if (c.failed) return;  // the first reason is the one that matters
      c.failed = rest.empty() ? std::string("(no reason given)") : std::string(rest);
      noteFailure(c, "reports its run failed: " + *c.failed, true);
    } else if (kind == "crashed") {
      if (c.crash) return;
      c.crash = parseCrash(rest);
      noteFailure(c, "reports a crash: " + c.crash->signal + crashPlace(*c.crash));
    } else {
      std::cerr << "terse launch: rank " << c.rank << " sent an unknown control message: '" << line << "'\n";
    }
  }

  // Reads every message waiting on rank c's control channel; closes it at its end (every process holding the rank's
  // end closed it) or on an error.
  void drainNotify(Child& c) {
    while (c.notify_fd >= 0) {
      char buf[kLaunchNotifyMaxBytes + 1];
      const ssize_t n = ::recv(c.notify_fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) {
        handleMessage(c, std::string_view(buf, static_cast<std::size_t>(n)));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        if (n < 0 && errno == EAGAIN) return;
        ::close(c.notify_fd);
        c.notify_fd = -1;
      }
    }
  }

  // Reaps exited children and follows stops; reports failures.
  void reap() {
    for (auto& c : children_) {
      while (c.running) {
        int status = 0;
        const pid_t r = ::waitpid(c.pid, &status, WNOHANG | WUNTRACED | WCONTINUED);
        if (r != c.pid) break;
        if (WIFSTOPPED(status)) {
          c.stopped_by = WSTOPSIG(status);
          continue;
        }
        if (WIFCONTINUED(status)) {
          c.stopped_by = 0;
          continue;
        }
        // What the rank said before it ended (a crash report comes just before its death) belongs to its account.
        drainNotify(c);
        c.running = false;
        c.status = status;
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) noteFailure(c, describeEnd(c));
      }
    }
  }

  void signalAll(int sig) {
    for (const auto& c : children_)
      if (c.running) ::kill(-c.pid, sig);  // the rank's process group
  }

  // SIGTERM, then SIGCONT: a stopped process acts on a pending SIGTERM only once it runs again.
  void terminateAll() {
    signalAll(SIGTERM);
    signalAll(SIGCONT);
  }

  int running() const {
    int n = 0;
    for (const auto& c : children_) n += c.running ? 1 : 0;
    return n;
  }

  void pumpOutput(int timeout_ms) {
    std::vector<pollfd> fds;
    fds.push_back({wake_read_, POLLIN, 0});
    for (const auto& p : pipes_) fds.push_back({p.fd, POLLIN, 0});
    std::vector<Child*> notifying;
    for (auto& c : children_)
      if (c.notify_fd >= 0) {
        fds.push_back({c.notify_fd, POLLIN, 0});
        notifying.push_back(&c);
      }
    if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return;
    if (fds[0].revents != 0) {
      char drain[64];
      while (::read(wake_read_, drain, sizeof(drain)) > 0) {
      }
    }
    const std::size_t first_notify = 1 + pipes_.size();
    for (std::size_t i = 1; i < first_notify; ++i) {
      if (fds[i].revents == 0) continue;
      OutputPipe& p = pipes_[i - 1];
      char buf[8192];
      const ssize_t n = ::read(p.fd, buf, sizeof(buf));
      if (n > 0) {
        writeLines(p, std::string_view(buf, static_cast<std::size_t>(n)), false);
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        writeLines(p, {}, true);
        ::close(p.fd);
        p.fd = -1;
      }
    }
    std::erase_if(pipes_, [](const OutputPipe& p) { return p.fd < 0; });
    for (std::size_t i = first_notify; i < fds.size(); ++i)
      if (fds[i].revents != 0) drainNotify(*notifying[i - first_notify]);
  }

  int supervise() {
    constexpr auto kKillGrace = std::chrono::seconds(3);
    std::optional<Clock::time_point> term_sent, all_exited;
    int forwarded = 0;
    while (running() > 0 || !pipes_.empty()) {
      pumpOutput(running() > 0 ? 50 : 200);
      reap();
      if (const int sig = g_signal.exchange(0); sig != 0 && running() > 0) {
        // Forward the user's signal; the ranks decide how to stop. A second one escalates to the kill path below.
        if (!spawn_failed_)
          std::cerr << "terse launch: got " << signalName(sig) << ", forwarding it to " << running() << " rank(s)\n";
        signalAll(sig);
        if (forwarded++ > 0 || spawn_failed_)
          terminating_ = true, first_failure_ = first_failure_.value_or(Clock::now());
        interrupted_ = interrupted_ ? interrupted_ : sig;
        if (!term_sent) term_sent = Clock::now();
      }
      const auto now = Clock::now();
      if (running() == 0) {
        // Drain what the ranks wrote before they exited, but a descriptor a grandchild still holds open must not keep
        // the launcher alive once every rank is gone.
        if (!all_exited) all_exited = now;
        if (pipes_.empty() || now - *all_exited >= std::chrono::seconds(1)) break;
        continue;
      }
      const auto clock = clockStart();
      if (clock && !terminating_ && now - *clock >= timeout_) {
        // Named one by one: a rank that outlives the study is a stopped or hung process someone will want to find.
        const bool after_study = study_done_ && (!first_failure_ || *study_done_ <= *first_failure_);
        for (auto& c : children_) {
          if (!c.running) continue;
          std::cerr << "terse launch: rank " << c.rank << " (pid " << c.pid << ") still running " << timeout_.count()
                    << " s after " << (after_study ? "the study completed" : "the first failure");
          if (c.stopped_by != 0) std::cerr << " (stopped by " << signalName(c.stopped_by) << ")";
          std::cerr << "; terminating it\n";
          c.terminated = true;
        }
        terminating_ = true;
        terminateAll();
        term_sent = now;
      } else if (terminating_ && term_sent && now - *term_sent >= kKillGrace) {
        signalAll(SIGKILL);
        term_sent = now + std::chrono::hours(1);  // once
      } else if (terminating_ && !term_sent) {
        terminateAll();
        term_sent = now;
      }
    }
    for (auto& p : pipes_) {
      writeLines(p, {}, true);
      ::close(p.fd);
    }
    // A grandchild may hold a rank's end of its channel open: read what is there, wait for nothing more.
    for (auto& c : children_) {
      drainNotify(c);
      if (c.notify_fd >= 0) ::close(c.notify_fd);
      c.notify_fd = -1;
    }
    if (interrupted_ != 0) return 128 + interrupted_;
    if (spawn_failed_) return kExitFailure;
    const auto bad = [](const Child& c) {
      return !(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0) || c.failed || c.crash;
    };
    const auto failed = std::count_if(children_.begin(), children_.end(), bad);
    if (failed == 0) return kExitOk;
    if (study_done_)
      std::cerr << "terse launch: the study completed (rank " << done_rank_ << " said so), but " << failed << " of "
                << n_ << " rank(s) did not end cleanly:\n";
    else
      std::cerr << "terse launch: " << failed << " of " << n_ << " rank(s) failed:\n";
    for (const auto& c : children_)
      if (bad(c)) std::cerr << "terse launch:   rank " << c.rank << " " << describeChild(c) << '\n';
    return kExitFailure;
  }

  int n_;
  uint16_t port_;
  std::chrono::seconds timeout_;
  bool prefix_;
  std::vector<std::string> command_;
  std::vector<Child> children_;
  std::vector<OutputPipe> pipes_;
  int wake_read_ = -1;
  std::optional<Clock::time_point> first_failure_;
  std::optional<Clock::time_point> study_done_;
  int done_rank_ = -1;
  bool terminating_ = false;
  bool spawn_failed_ = false;
  int interrupted_ = 0;
};

}  // namespace

int launchCommand(const std::vector<std::string>& args) {
  // Everything after "--" is the command, untouched by option parsing.
  const auto dashdash = std::find(args.begin(), args.end(), "--");
  const std::vector<std::string> own(args.begin(), dashdash);
  std::vector<std::string> command;
  if (dashdash != args.end()) command.assign(dashdash + 1, args.end());

  po::options_description options("options");
  options.add_options()("help,h", "show this help")("nproc,n", po::value<int>(), "number of ranks (1..1024)")(
      "master-port", po::value<int>()->default_value(0), "rank 0's store port (default: a free one)")(
      "timeout", po::value<int>()->default_value(30), "seconds the other ranks get to stop after one fails")(
      "no-prefix", "pass the ranks' output through without [rank R] prefixes");
  po::variables_map vm;
  try {
    // The launcher never reads the study: each rank loads it, so an override is the ranks' own option.
    for (const auto& a : own) {
      if (a == "--set" || a.starts_with("--set="))
        throw po::error(
            "--set is an option of `terse run`: give it after --, where every rank gets it, e.g. "
            "terse launch -n 2 -- terse run CONFIG --set epochs=1");
    }
    po::store(po::command_line_parser(own).options(options).run(), vm);
    po::notify(vm);
    if (vm.count("help")) {
      std::cout << kLaunchUsage << "\n\n" << options;
      return kExitOk;
    }
    if (!vm.count("nproc")) throw po::error("-n N is required");
    const int n = vm["nproc"].as<int>();
    if (n < 1 || n > 1024) throw po::error("-n must be in 1..1024, got " + std::to_string(n));
    const int port = vm["master-port"].as<int>();
    if (port < 0 || port > 65535) throw po::error("--master-port must be in 0..65535, got " + std::to_string(port));
    const int timeout = vm["timeout"].as<int>();
    if (timeout < 0 || timeout > 86400)
      throw po::error("--timeout must be in 0..86400 s, got " + std::to_string(timeout));
    if (command.empty()) throw po::error("no command: put it after --, e.g. terse launch -n 2 -- terse run CONFIG");
    Launcher launcher(n, static_cast<uint16_t>(port), std::chrono::seconds(timeout), !vm.count("no-prefix"),
                      std::move(command));
    return launcher.run();
  } catch (const po::error& e) {
    std::cerr << "terse launch: " << e.what() << "\n\n" << kLaunchUsage << "\n\n" << options;
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "terse launch: " << userMessage(e.what()) << '\n';
    return kExitFailure;
  }
}

int storeCommand(const std::vector<std::string>& args) {
  po::options_description options("options");
  options.add_options()("help,h", "show this help")(
      "bind", po::value<std::string>()->default_value("127.0.0.1"),
      "address to listen on (0.0.0.0 for every interface; loopback by default)")(
      "port", po::value<int>()->default_value(0), "port (default: a free one, printed)")(
      "token-file", po::value<std::string>(), "the job token file (mode 0600); else TERSE_JOB_TOKEN[_FILE]");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(options).run(), vm);
    po::notify(vm);
    if (vm.count("help")) {
      std::cout << kStoreUsage << "\n\n" << options;
      return kExitOk;
    }
    const int port = vm["port"].as<int>();
    if (port < 0 || port > 65535) throw po::error("--port must be in 0..65535, got " + std::to_string(port));
    std::optional<comm::JobToken> token =
        vm.count("token-file") ? std::optional(comm::JobToken::fromFile(vm["token-file"].as<std::string>()))
                               : comm::JobToken::fromEnvironment();
    if (!token) {
      std::cerr << "terse store: no job token: give --token-file FILE, or set TERSE_JOB_TOKEN or TERSE_JOB_TOKEN_FILE "
                   "(the same token every rank has, made by `"
                << comm::JobToken::kHowToMakeOne << "`)\n";
      return kExitUsage;
    }
    // Block the stop signals before the server thread exists, so only sigwait below sees them.
    sigset_t stop;
    sigemptyset(&stop);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stop, sig);
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    comm::TcpStoreServerOptions so;
    so.bind_address = vm["bind"].as<std::string>();
    so.port = static_cast<uint16_t>(port);
    comm::TcpStoreServer server(*token, so);
    std::cout << "terse store: serving on " << so.bind_address << ":" << server.port() << std::endl;
    int sig = 0;
    sigwait(&stop, &sig);
    std::cerr << "terse store: got " << signalName(sig) << ", stopping\n";
    server.stop();
    return kExitOk;
  } catch (const po::error& e) {
    std::cerr << "terse store: " << e.what() << "\n\n" << kStoreUsage << "\n\n" << options;
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "terse store: " << userMessage(e.what()) << '\n';
    return kExitFailure;
  }
}

}  // namespace terse::cli
