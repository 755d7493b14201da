#include "core/comm/job.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <limits>

#include "core/common/error.h"
#include "core/common/log.h"

namespace terse::comm {
namespace {

// OpenMPI says nothing about where rank 0 runs or which port to use; torchrun's default port is as good as any.
constexpr uint16_t kDefaultMasterPort = 29500;
// A hostlist that expands past this is refused rather than allocated (no real allocation is this large).
constexpr std::size_t kMaxHostlistHosts = 1 << 20;

std::string thisHost() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

// A whole decimal integer in [lo, hi], or InvalidArgument naming the variable and its value.
int64_t parseInt(std::string_view variable, std::string_view text, int64_t lo, int64_t hi) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  TERSE_CHECK(!text.empty() && ec == std::errc() && ptr == end, InvalidArgument,
              variable << "='" << text << "' is not an integer");
  TERSE_CHECK(v >= lo && v <= hi, InvalidArgument,
              variable << "=" << v << " is out of range [" << lo << ", " << hi << "]");
  return v;
}

uint16_t parsePort(std::string_view variable, std::string_view text) {
  return static_cast<uint16_t>(parseInt(variable, text, 1, 65535));
}

void checkAddress(std::string_view variable, std::string_view text) {
  TERSE_CHECK(!text.empty(), InvalidArgument, variable << " is set but empty");
  for (char c : text) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == ':' || c == '_';
    TERSE_CHECK(ok, InvalidArgument, variable << "='" << text << "' is not a host name or address");
  }
}

// SLURM_TASKS_PER_NODE: "4(x2),3" = 4 tasks on each of 2 nodes, then 3; the entry for node `node`.
std::optional<int> tasksOnNode(std::string_view variable, std::string_view text, int node) {
  int index = 0;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::string_view item = text.substr(pos, comma - pos);
    const std::size_t paren = item.find("(x");
    const int64_t tasks = parseInt(variable, item.substr(0, paren), 1, 1 << 20);
    int64_t repeat = 1;
    if (paren != std::string_view::npos) {
      TERSE_CHECK(item.back() == ')', InvalidArgument, variable << "='" << text << "' is not a tasks-per-node list");
      repeat = parseInt(variable, item.substr(paren + 2, item.size() - paren - 3), 1, 1 << 20);
    }
    if (node < index + repeat) return static_cast<int>(tasks);
    index += static_cast<int>(repeat);
    pos = comma + 1;
  }
  return std::nullopt;
}

// One hostlist item ("rack[1-2]-n[01,03]") as literal text and bracket groups; each group a list of ranges.
struct HostRange {
  uint64_t lo = 0, hi = 0;
  std::size_t width = 0;  // zero padding, from the low bound's digits
};
struct HostSegment {
  std::string literal;
  std::vector<HostRange> ranges;  // empty: a literal segment
};

std::vector<std::vector<HostSegment>> parseHostlist(std::string_view text, std::string_view variable) {
  auto bad = [&](std::string_view why) {
    TERSE_THROW(InvalidArgument, variable << "='" << text << "' is not a SLURM hostlist: " << why);
  };
  std::vector<std::vector<HostSegment>> items(1);
  std::size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == ',') {
      if (items.back().empty()) bad("an empty host name");
      items.emplace_back();
      ++i;
    } else if (c == '[') {
      const std::size_t close = text.find(']', i);
      if (close == std::string_view::npos) bad("a '[' without ']'");
      HostSegment seg;
      std::string_view body = text.substr(i + 1, close - i - 1);
      if (body.empty()) bad("an empty []");
      std::size_t p = 0;
      while (p <= body.size()) {
        const std::size_t comma = std::min(body.find(',', p), body.size());
        const std::string_view range = body.substr(p, comma - p);
        const std::size_t dash = range.find('-');
        const std::string_view lo = range.substr(0, dash);
        const std::string_view hi = dash == std::string_view::npos ? lo : range.substr(dash + 1);
        auto num = [&](std::string_view digits) {
          uint64_t v = 0;
          const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
          if (digits.empty() || ec != std::errc() || ptr != digits.data() + digits.size())
            bad("'" + std::string(range) + "' is not a number or a range");
          return v;
        };
        HostRange r{num(lo), num(hi), lo.size()};
        if (r.lo > r.hi) bad("the range '" + std::string(range) + "' runs backwards");
        seg.ranges.push_back(r);
        p = comma + 1;
      }
      items.back().push_back(std::move(seg));
      i = close + 1;
    } else if (c == ']') {
      bad("a ']' without '['");
    } else if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_') {
      if (items.back().empty() || !items.back().back().ranges.empty()) items.back().emplace_back();
      items.back().back().literal.push_back(c);
      ++i;
    } else {
      bad(std::string("the character '") + c + "'");
    }
  }
  if (items.back().empty()) bad(text.empty() ? "it is empty" : "an empty host name");
  return items;
}

std::string formatNumber(uint64_t v, std::size_t width) {
  std::string s = std::to_string(v);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

std::optional<std::string> firstSet(const EnvLookup& env, std::initializer_list<std::string_view> names,
                                    std::string* which = nullptr) {
  for (auto name : names) {
    if (auto v = env(name); v && !v->empty()) {
      if (which) *which = name;
      return v;
    }
  }
  return std::nullopt;
}

void checkRanks(const JobEnv& j, std::string_view rank_var, std::string_view size_var, std::string_view local_var,
                std::string_view local_size_var) {
  TERSE_CHECK(j.rank < j.world_size, InvalidArgument,
              rank_var << "=" << j.rank << " is not below " << size_var << "=" << j.world_size);
  TERSE_CHECK(j.local_rank < j.local_world_size, InvalidArgument,
              local_var << "=" << j.local_rank << " is not below " << local_size_var << "=" << j.local_world_size);
  TERSE_CHECK(j.local_world_size <= j.world_size, InvalidArgument,
              local_size_var << "=" << j.local_world_size << " exceeds " << size_var << "=" << j.world_size);
}

// TERSE_MASTER_ADDR / TERSE_MASTER_PORT, applied over what a scheduler's variables gave.
void applyMasterOverrides(JobEnv& j, const EnvLookup& env) {
  if (auto addr = env("TERSE_MASTER_ADDR")) {
    checkAddress("TERSE_MASTER_ADDR", *addr);
    j.master_addr = *addr;
  }
  if (auto port = env("TERSE_MASTER_PORT")) j.master_port = parsePort("TERSE_MASTER_PORT", *port);
}

std::optional<JobToken> tokenFrom(const EnvLookup& env) {
  if (auto t = env(kJobTokenEnv); t && !t->empty()) return JobToken::fromString(*t, kJobTokenEnv);
  if (auto f = env(kJobTokenFileEnv); f && !f->empty()) return JobToken::fromFile(*f);
  return std::nullopt;
}

bool parseFlag(std::string_view variable, std::string_view text) {
  if (text == "1" || text == "true" || text == "yes" || text == "on") return true;
  if (text == "0" || text == "false" || text == "no" || text == "off" || text.empty()) return false;
  TERSE_THROW(InvalidArgument, variable << "='" << text << "' must be 1 or 0");
}

}  // namespace

EnvLookup processEnv() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

std::vector<std::string> expandSlurmHostlist(std::string_view text, std::string_view variable) {
  std::vector<std::string> out;
  for (const auto& item : parseHostlist(text, variable)) {
    std::vector<std::string> partial{""};
    for (const auto& seg : item) {
      std::vector<std::string> next;
      for (const auto& prefix : partial) {
        if (seg.ranges.empty()) {
          next.push_back(prefix + seg.literal);
          continue;
        }
        for (const auto& r : seg.ranges) {
          TERSE_CHECK(r.hi - r.lo < kMaxHostlistHosts && next.size() + (r.hi - r.lo) < kMaxHostlistHosts,
                      InvalidArgument,
                      variable << "='" << text << "' expands to more than " << kMaxHostlistHosts << " hosts");
          for (uint64_t v = r.lo; v <= r.hi; ++v) next.push_back(prefix + formatNumber(v, r.width));
        }
      }
      partial = std::move(next);
    }
    out.insert(out.end(), partial.begin(), partial.end());
    TERSE_CHECK(out.size() <= kMaxHostlistHosts, InvalidArgument,
                variable << "='" << text << "' expands to more than " << kMaxHostlistHosts << " hosts");
  }
  return out;
}

std::string firstSlurmHost(std::string_view text, std::string_view variable) {
  const auto items = parseHostlist(text, variable);  // validates the whole list
  std::string host;
  for (const auto& seg : items.front())
    host += seg.ranges.empty() ? seg.literal : formatNumber(seg.ranges.front().lo, seg.ranges.front().width);
  return host;
}

bool isLoopbackAddress(std::string_view address) {
  if (address == "localhost" || address == "::1") return true;
  in_addr a{};
  if (::inet_pton(AF_INET, std::string(address).c_str(), &a) == 1) return (ntohl(a.s_addr) >> 24) == 127;
  return false;
}

std::string describeJobSource(const JobEnv& env) {
  if (env.source == "terse") return "TERSE_WORLD_SIZE, which terse launch sets";
  if (env.source == "openmpi") return "OMPI_COMM_WORLD_SIZE (Open MPI's mpirun)";
  if (env.source == "slurm") return "SLURM_NTASKS (srun)";
  if (env.source == "single") return "no launcher: a single process";
  return env.source;
}

std::optional<JobEnv> detectJobEnv() {
  return detectJobEnv(processEnv());
}

std::optional<JobEnv> detectJobEnv(const EnvLookup& env) {
  JobEnv j;
  j.host = thisHost();
  const auto rank = env("TERSE_RANK"), size = env("TERSE_WORLD_SIZE");
  if (rank || size) {
    TERSE_CHECK(
        rank && size, InvalidArgument,
        (rank ? "TERSE_RANK is set but TERSE_WORLD_SIZE is not" : "TERSE_WORLD_SIZE is set but TERSE_RANK is not")
            << " (set both, or neither)");
    j.source = "terse";
    j.world_size = static_cast<int>(parseInt("TERSE_WORLD_SIZE", *size, 1, 1 << 20));
    j.rank = static_cast<int>(parseInt("TERSE_RANK", *rank, 0, (1 << 20) - 1));
    // Without local variables the job is taken to be on one host (what `terse launch` starts).
    const auto lrank = env("TERSE_LOCAL_RANK"), lsize = env("TERSE_LOCAL_WORLD_SIZE");
    j.local_rank = lrank ? static_cast<int>(parseInt("TERSE_LOCAL_RANK", *lrank, 0, (1 << 20) - 1)) : j.rank;
    j.local_world_size =
        lsize ? static_cast<int>(parseInt("TERSE_LOCAL_WORLD_SIZE", *lsize, 1, 1 << 20)) : j.world_size;
    if (lrank && !lsize) j.local_world_size = std::max(j.local_rank + 1, 1);
    checkRanks(j, "TERSE_RANK", "TERSE_WORLD_SIZE", "TERSE_LOCAL_RANK", "TERSE_LOCAL_WORLD_SIZE");
    applyMasterOverrides(j, env);
    TERSE_CHECK(
        j.world_size == 1 || j.master_port != 0, InvalidArgument,
        "TERSE_WORLD_SIZE=" << j.world_size << " but TERSE_MASTER_PORT is not set: every rank needs the store's port");
    return j;
  }
  if (auto ompi_rank = env("OMPI_COMM_WORLD_RANK")) {
    const auto ompi_size = env("OMPI_COMM_WORLD_SIZE");
    TERSE_CHECK(ompi_size, InvalidArgument, "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not");
    j.source = "openmpi";
    j.world_size = static_cast<int>(parseInt("OMPI_COMM_WORLD_SIZE", *ompi_size, 1, 1 << 20));
    j.rank = static_cast<int>(parseInt("OMPI_COMM_WORLD_RANK", *ompi_rank, 0, (1 << 20) - 1));
    const auto lrank = env("OMPI_COMM_WORLD_LOCAL_RANK"), lsize = env("OMPI_COMM_WORLD_LOCAL_SIZE");
    j.local_rank = lrank ? static_cast<int>(parseInt("OMPI_COMM_WORLD_LOCAL_RANK", *lrank, 0, (1 << 20) - 1)) : 0;
    j.local_world_size = lsize ? static_cast<int>(parseInt("OMPI_COMM_WORLD_LOCAL_SIZE", *lsize, 1, 1 << 20)) : 1;
    checkRanks(j, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
               "OMPI_COMM_WORLD_LOCAL_SIZE");
    j.master_port = kDefaultMasterPort;
    applyMasterOverrides(j, env);
    // Ranks on other hosts cannot guess where rank 0 is; loopback would silently split the job.
    TERSE_CHECK(j.local_world_size == j.world_size || env("TERSE_MASTER_ADDR"), InvalidArgument,
                "OpenMPI job over several hosts (OMPI_COMM_WORLD_SIZE="
                    << j.world_size << ", OMPI_COMM_WORLD_LOCAL_SIZE=" << j.local_world_size
                    << "): set TERSE_MASTER_ADDR to rank 0's host "
                       "(mpirun -x TERSE_MASTER_ADDR=HOST)");
    return j;
  }
  if (auto procid = env("SLURM_PROCID")) {
    const auto ntasks = env("SLURM_NTASKS");
    TERSE_CHECK(ntasks, InvalidArgument, "SLURM_PROCID is set but SLURM_NTASKS is not (run under srun)");
    j.source = "slurm";
    j.world_size = static_cast<int>(parseInt("SLURM_NTASKS", *ntasks, 1, 1 << 20));
    j.rank = static_cast<int>(parseInt("SLURM_PROCID", *procid, 0, (1 << 20) - 1));
    const auto localid = env("SLURM_LOCALID");
    j.local_rank = localid ? static_cast<int>(parseInt("SLURM_LOCALID", *localid, 0, (1 << 20) - 1)) : 0;
    if (auto per_node = env("SLURM_NTASKS_PER_NODE")) {
      j.local_world_size = static_cast<int>(parseInt("SLURM_NTASKS_PER_NODE", *per_node, 1, 1 << 20));
    } else if (auto tasks = env("SLURM_TASKS_PER_NODE")) {
      const int node =
          env("SLURM_NODEID") ? static_cast<int>(parseInt("SLURM_NODEID", *env("SLURM_NODEID"), 0, (1 << 20) - 1)) : 0;
      const auto n = tasksOnNode("SLURM_TASKS_PER_NODE", *tasks, node);
      TERSE_CHECK(n, InvalidArgument, "SLURM_TASKS_PER_NODE='" << *tasks << "' has no entry for SLURM_NODEID=" << node);
      j.local_world_size = *n;
    } else {
      j.local_world_size = j.local_rank + 1;
    }
    checkRanks(j, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE");
    std::string list_var;
    if (auto list = firstSet(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}, &list_var)) {
      j.master_addr = firstSlurmHost(*list, list_var);
    } else if (j.world_size > 1 && !env("TERSE_MASTER_ADDR")) {
      TERSE_THROW(InvalidArgument, "SLURM job without SLURM_NODELIST: set TERSE_MASTER_ADDR to rank 0's host");
    }
    if (auto job_id = env("SLURM_JOB_ID")) {
      const int64_t id = parseInt("SLURM_JOB_ID", *job_id, 0, std::numeric_limits<int64_t>::max());
      j.master_port = static_cast<uint16_t>(kSlurmPortBase + id % kSlurmPortSpan);
    }
    applyMasterOverrides(j, env);
    TERSE_CHECK(j.world_size == 1 || j.master_port != 0, InvalidArgument,
                "SLURM job without SLURM_JOB_ID: set TERSE_MASTER_PORT");
    return j;
  }
  return std::nullopt;
}

Job joinJob(std::chrono::milliseconds timeout) {
  return joinJob(timeout, processEnv());
}

Job joinJob(std::chrono::milliseconds timeout, const EnvLookup& env) {
  std::optional<JobEnv> detected = detectJobEnv(env);
  JobEnv je;
  if (detected) {
    je = std::move(*detected);
  } else {
    je.source = "single";
    je.host = thisHost();
    applyMasterOverrides(je, env);  // e.g. a single rank using an external `terse store`
  }
  std::optional<JobToken> token = tokenFrom(env);
  if (!token) {
    TERSE_CHECK(
        je.world_size == 1, InvalidArgument,
        "this is rank " << je.rank << " of " << je.world_size << " (from " << je.source
                        << ") but no job token is set: run under `terse launch` (it generates one), or give "
                           "every rank the same token, made by `terse token`, in TERSE_JOB_TOKEN or in a file named by "
                           "TERSE_JOB_TOKEN_FILE (mode 0600): `"
                        << JobToken::kHowToMakeOne << "`");
    token = JobToken::generate();  // one rank: nobody else needs to know it
  }
  const bool external = env("TERSE_STORE_EXTERNAL") && parseFlag("TERSE_STORE_EXTERNAL", *env("TERSE_STORE_EXTERNAL"));
  std::unique_ptr<TcpStoreServer> server;
  uint16_t port = je.master_port;
  if (je.rank == 0 && !external) {
    TERSE_CHECK(je.world_size == 1 || je.master_port != 0, InvalidArgument,
                "a job of " << je.world_size << " ranks needs a fixed store port (TERSE_MASTER_PORT)");
    TcpStoreServerOptions options;
    if (auto bind = env("TERSE_STORE_BIND"); bind && !bind->empty()) {
      checkAddress("TERSE_STORE_BIND", *bind);
      options.bind_address = *bind;
    } else {
      options.bind_address = je.master_addr == "localhost" ? "127.0.0.1" : je.master_addr;
    }
    options.port = je.master_port;
    server = std::make_unique<TcpStoreServer>(*token, options);
    port = server->port();
    TERSE_LOG(LogLevel::kInfo,
              "job: rank 0 of " << je.world_size << " hosts the store on " << options.bind_address << ":" << port);
  }
  TERSE_CHECK(port != 0, InvalidArgument,
              "TERSE_STORE_EXTERNAL=1 but no store port: set TERSE_MASTER_PORT to the `terse store` port");
  auto store = std::make_unique<TcpStore>(je.master_addr, port, *token, timeout);
  if (je.world_size == 1) je.master_port = port;
  return Job{std::move(je), std::move(*token), std::move(server), std::move(store)};
}

}  // namespace terse::comm
