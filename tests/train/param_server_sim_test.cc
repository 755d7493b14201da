// The parameter server in simulated time (core/sim): a shard's replies to many workers overlap on its NIC as the link
// model says, rather than going out one after another. Simulated time is deterministic, so the times below are the
// model's, not the host's.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/comm/inproc_transport.h"
#include "core/common/runtime.h"
#include "core/sim/simulation.h"
#include "core/train/param_server_client.h"
#include "core/train/param_server_plan.h"
#include "core/train/param_server_shard.h"
#include "core/train/param_server_wire.h"

namespace terse::train {
namespace {

constexpr int kWorkers = 16;
constexpr uint64_t kNumel = 25000;  // 100 kB of f32 per pull reply: 0.8 ms at 1 Gbps, 16 latencies of 50 us

struct Timing {
  double last_pull = 0;  // simulated seconds until every worker held its step-0 parameters
  double step = 0;       // ... until every worker completed step 0 (pull, push, clock)
  uint64_t bytes_out = 0;
};

// One shard, kWorkers workers, each pulling step 0, pushing and completing it at the same simulated instant.
Timing pullOnce(const std::string& links) {
  sim::SimulationOptions o;
  o.platform.ranks = 1 + kWorkers;
  o.platform.links = comm::parseEmulation(links);
  o.compute.compute_scale = 0;  // the network's time alone
  const std::string r = sim::runSimulation(o, [&](const sim::SimulationContext& ctx) {
    comm::InprocOptions io;
    io.network = ctx.network;
    auto fabric = comm::InprocFabric::create(1 + kWorkers, io);
    std::vector<std::unique_ptr<comm::Transport>> t;
    for (int rank = 0; rank <= kWorkers; ++rank) t.push_back(fabric->endpoint(rank));
    const PsPlan plan = planShards(std::vector<uint64_t>{kNumel}, 1);
    ServerOptions so;
    so.staleness_bound = 0;
    ParamServerShard shard(*t[0], plan, 0, kWorkers, std::vector<float>(kNumel, 1.0f), so);
    std::vector<double> pulled(kWorkers), stepped(kWorkers);
    const rt::Clock::time_point t0 = rt::now();
    std::vector<rt::Thread> workers;
    for (int w = 0; w < kWorkers; ++w)
      workers.emplace_back(
          "worker" + std::to_string(w),
          [&, w] {
            ParamServerClient client(*t[static_cast<std::size_t>(1 + w)], plan, w, kWorkers, {});
            std::vector<float> x(kNumel), g(kNumel, 0.5f);
            client.pull(0, x);
            pulled[static_cast<std::size_t>(w)] = rt::seconds(t0, rt::now());
            if (x != std::vector<float>(kNumel, 1.0f)) throw std::runtime_error("pulled the wrong parameters");
            client.push(0, g);
            stepped[static_cast<std::size_t>(w)] = rt::seconds(t0, rt::now());
            client.bye();
          },
          1 + w);
    shard.run();
    for (auto& w : workers) w.join();
    uint64_t out = 0;
    for (uint64_t b : shard.stats().bytes_out) out += b;
    std::ostringstream s;
    s.precision(17);
    s << *std::max_element(pulled.begin(), pulled.end()) << ' ' << *std::max_element(stepped.begin(), stepped.end())
      << ' ' << out;
    return s.str();
  });
  std::istringstream in(r);
  Timing timing;
  in >> timing.last_pull >> timing.step >> timing.bytes_out;
  return timing;
}

// One pull reply's transfer at 1 Gbps.
double oneReply() {
  const PsPlan plan = planShards(std::vector<uint64_t>{kNumel}, 1);
  return static_cast<double>(comm::frameWireBytes(kPsReplyHeaderBytes + psPullBodyBytes(plan, 0, DType::kF32))) * 8 /
         1e9;
}

TEST(PsSimulated, PullRepliesToManyWorkersOverlapWithAnUnlimitedNic) {
  // Every worker has its own 1 Gbps wire to the shard and the shard's NIC is not a limit, so the 16 replies travel at
  // once: a step's pulls take about one reply's transfer plus a few latencies. Replies sent one at a time took 16
  // transfers and their latencies (13 ms here, against 1 ms).
  const Timing t = pullOnce("bandwidth=1Gbps,latency=50us,nic=unlimited");
  const double one = oneReply();
  EXPECT_GT(t.last_pull, one);
  EXPECT_LT(t.last_pull, kWorkers / 2.0 * one) << "one reply takes " << one << " s";
  EXPECT_LT(t.last_pull, one + 10 * 50e-6) << "one reply takes " << one << " s";
  EXPECT_GT(t.step, t.last_pull);
}

TEST(PsSimulated, PullRepliesShareACappedNic) {
  // A 1 Gbps NIC in front of 1 Gbps wires: the 16 replies share it, so the last lands after 16 replies' bytes -- the
  // classic parameter-server bottleneck, no worse (16 transfers plus a few latencies, not 16 latencies on top).
  const Timing capped = pullOnce("bandwidth=1Gbps,latency=50us,nic=1Gbps");
  const double one = oneReply();
  EXPECT_GT(capped.last_pull, 0.99 * kWorkers * one);
  EXPECT_LT(capped.last_pull, kWorkers * one + 10 * 50e-6) << "one reply takes " << one << " s";
  const Timing unlimited = pullOnce("bandwidth=1Gbps,latency=50us,nic=unlimited");
  EXPECT_LT(unlimited.step, capped.step / 4);
  // The same frames either way: the shard's count of what it sent does not depend on the timing.
  EXPECT_EQ(capped.bytes_out, unlimited.bytes_out);
}

}  // namespace
}  // namespace terse::train
