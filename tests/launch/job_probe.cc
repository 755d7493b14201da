// A minimal rank for launcher tests: joins the job from its environment (core/comm/job.h), publishes its host under
// its rank in the store, waits for every other rank's, and prints what it saw -- so a test can check that `terse
// launch`, `terse store` and scripts/netns-cluster really put N processes in one job.
//   job_probe [--exit-code-at-rank R C]    (rank R exits with status C after the rendezvous)
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "core/comm/job.h"

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  try {
    terse::comm::Job job = terse::comm::joinJob(10s);
    const auto& env = job.env;
    auto& store = *job.store;
    store.set("probe/host/" + std::to_string(env.rank), env.host);
    std::string seen;
    for (int r = 0; r < env.world_size; ++r) {
      store.get("probe/host/" + std::to_string(r), 10s);
      seen += (r ? "," : "") + std::to_string(r);
    }
    // Rank 0 hosts the store: it leaves only after everyone has read what they need.
    store.add("probe/done", 1);
    if (env.rank == 0 && job.server) {
      for (auto until = std::chrono::steady_clock::now() + 10s;
           store.add("probe/done", 0) < env.world_size && std::chrono::steady_clock::now() < until;)
        std::this_thread::sleep_for(10ms);
    }
    std::cout << "probe rank " << env.rank << " of " << env.world_size << " (" << env.source << ", local "
              << env.local_rank << "/" << env.local_world_size << ", master " << env.master_addr << ":"
              << env.master_port << ") saw ranks " << seen << std::endl;
    if (argc == 4 && std::string(argv[1]) == "--exit-code-at-rank" && std::atoi(argv[2]) == env.rank)
      return std::atoi(argv[3]);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "probe: " << e.what() << std::endl;
    return 1;
  }
}
