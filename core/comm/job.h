// Joining a multi-process job: who am I (rank, world size, local rank), where is the rendezvous store, and the job's
// token -- read from the environment a launcher set up -- then the store connection every rank uses to find the
// others (DESIGN.md section 6).
//
// Sources, first match wins:
//   explicit  TERSE_RANK, TERSE_WORLD_SIZE (both or neither), TERSE_LOCAL_RANK, TERSE_LOCAL_WORLD_SIZE,
//             TERSE_MASTER_ADDR, TERSE_MASTER_PORT       -- `terse launch`, scripts/netns-cluster, any custom launcher
//   OpenMPI   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE
//             (master from TERSE_MASTER_ADDR / TERSE_MASTER_PORT; mpirun does not say which host rank 0 is on)
//   SLURM     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE / SLURM_TASKS_PER_NODE, and the first
//             host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST / SLURM_NODELIST (block distribution puts rank 0
//             there); the port from TERSE_MASTER_PORT, else derived from SLURM_JOB_ID so concurrent jobs on shared
//             nodes do not collide
// TERSE_MASTER_ADDR / TERSE_MASTER_PORT override what a scheduler's variables imply. Every value is validated: a bad
// one is InvalidArgument naming the variable and the value.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/comm/auth.h"
#include "core/comm/store.h"
#include "core/comm/tcp_store.h"

namespace terse::comm {

struct JobEnv {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 0;
  std::string source;  // "terse", "openmpi" or "slurm": where the values came from (for messages and provenance)
  std::string host;    // this host's name (gethostname), for messages naming a rank's host
};

// Where a job's size came from, for a message that gives it: "TERSE_WORLD_SIZE, which terse launch sets",
// "OMPI_COMM_WORLD_SIZE (Open MPI's mpirun)", "SLURM_NTASKS (srun)", "no launcher: a single process".
std::string describeJobSource(const JobEnv& env);

// The base of the port derived from SLURM_JOB_ID (kSlurmPortBase + job id % kSlurmPortSpan): above the registered
// services most clusters run, below Linux's default ephemeral range (32768+), so it rarely collides with either.
inline constexpr uint16_t kSlurmPortBase = 20000;
inline constexpr uint16_t kSlurmPortSpan = 10000;

// The environment as a lookup function, so tests run every source without touching the process's environment.
using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;
EnvLookup processEnv();

// nullopt when no source's variables are set (a plain single-process run). Throws InvalidArgument naming the variable
// and value for a malformed or inconsistent value (rank outside [0, world size), a port outside 1..65535, half of a
// required pair set, an unparsable hostlist).
std::optional<JobEnv> detectJobEnv();
std::optional<JobEnv> detectJobEnv(const EnvLookup& env);

// SLURM's compressed hostlist ("node[01-04,07],gpu3", "a-[1-2]b,c") expanded in order. Zero padding in a range is
// kept ("[08-10]" -> 08, 09, 10). Throws InvalidArgument naming `variable` and the text when it does not parse.
std::vector<std::string> expandSlurmHostlist(std::string_view text, std::string_view variable = "SLURM_NODELIST");
// The first host only (what a rendezvous needs), without expanding every range.
std::string firstSlurmHost(std::string_view text, std::string_view variable = "SLURM_NODELIST");

struct Job {
  JobEnv env;
  JobToken token;
  std::unique_ptr<TcpStoreServer> server;  // rank 0's, unless the store is external
  std::unique_ptr<Store> store;            // this rank's client
};

// Detects the environment (a single-rank job when none is set), takes the token from JobToken::fromEnvironment() --
// required when world_size > 1; a generated one for a single rank -- and connects to the store: rank 0 hosts it at
// master_addr:master_port (binding loopback when master_addr is a loopback address, else master_addr itself;
// TERSE_STORE_BIND overrides the bind address) unless TERSE_STORE_EXTERNAL=1 says a standalone `terse store` runs
// it. Every rank, rank 0 included, then connects a TcpStore, retrying until `timeout` (rank 0 may start late).
// A rank 0 whose master_port is 0 lets the OS pick a port (only useful when world_size is 1).
Job joinJob(std::chrono::milliseconds timeout);
Job joinJob(std::chrono::milliseconds timeout, const EnvLookup& env);

// Whether `address` names this host's loopback ("localhost", 127.0.0.0/8, ::1).
bool isLoopbackAddress(std::string_view address);

}  // namespace terse::comm
