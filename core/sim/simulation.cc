// The simulation driver: a forked child per simulation, the engine, the platform, the runtime (simulation.h).
#include "core/sim/simulation.h"

#include <unistd.h>
#include <xbt/log.h>
#include <simgrid/s4u/Actor.hpp>
#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Host.hpp>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>

#include "core/common/runtime.h"
#include "core/common/subprocess.h"
#include "core/common/watchdog.h"
#include "core/sim/network.h"
#include "core/sim/runtime.h"

namespace terse::sim {
namespace sg4 = simgrid::s4u;

namespace {

// The child's answer: one byte (O: the body's result follows, E: an error message follows), then the text.
constexpr char kOk = 'O';
constexpr char kError = 'E';

// Sends the answer and ends the child at once: no destructors of the parent's objects, no atexit handlers (they belong
// to the parent), no SimGrid teardown of actors that may still be blocked.
[[noreturn]] void answer(int fd, char kind, const std::string& text) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  writeAll(fd, std::string(1, kind) + text);
  ::close(fd);
  ::_exit(kind == kOk ? 0 : 1);
}

std::string blockedActors() {
  std::ostringstream out;
  int shown = 0;
  const auto actors = sg4::Engine::get_instance()->get_all_actors();
  for (const auto& a : actors) {
    if (shown == 12) {
      out << ", ... (" << actors.size() << " in all)";
      break;
    }
    out << (shown++ == 0 ? "" : ", ") << "'" << a->get_name() << "' on " << a->get_host()->get_name();
  }
  return out.str();
}

[[noreturn]] void child(int fd, const SimulationOptions& options,
                        const std::function<std::string(const SimulationContext&)>& body) {
  try {
    // SimGrid's own log lines (configuration changes, its deadlock report) would interleave with terse's output; the
    // errors it finds reach the parent as this driver's messages instead.
    xbt_log_control_set("root.thres:critical");
    int argc = 1;
    char arg0[] = "terse";
    char* argv[] = {arg0, nullptr};
    sg4::Engine engine(&argc, argv);
    configureNetworkModel(engine);
    // Actors run terse's whole worker and communication code: give them a thread's stack (KiB).
    sg4::Engine::set_config("contexts/stack-size:16384");
    const std::vector<sg4::Host*> hosts = buildPlatform(engine, options.platform);
    SimRuntime runtime(hosts, options.compute, [fd](const std::string& m) { answer(fd, kError, m); });
    rt::installBackend(&runtime);
    auto network = std::make_shared<SimNetwork>(hosts, runtime);
    const SimulationContext ctx{options, network};
    // A plugin call past plugin_timeout (core/common/watchdog.h) holds the simulation's only running actor forever:
    // report the overrun as the simulation's error and end the child, which nothing else could.
    const watchdog::Registration overrun([fd](const watchdog::Overrun& o) { answer(fd, kError, o.message()); });

    std::optional<std::string> result;
    sg4::Engine::on_deadlock_cb([fd] {
      std::ostringstream m;
      m << "simulation deadlocked at simulated time " << sg4::Engine::get_clock()
        << " s: every thread is waiting and nothing is in flight (" << blockedActors() << ")";
      answer(fd, kError, m.str());
    });
    sg4::Actor::create("main", hosts[0], [&] {
      try {
        result = body(ctx);
      } catch (const std::exception& e) {
        answer(fd, kError, e.what());
      } catch (...) {
        answer(fd, kError, "simulation: unknown error");
      }
    });
    engine.run();
    if (!result) answer(fd, kError, "simulation ended before its main actor returned");
    answer(fd, kOk, *result);
  } catch (const std::exception& e) {
    answer(fd, kError, e.what());
  } catch (...) {
    answer(fd, kError, "simulation: unknown error");
  }
}

}  // namespace

std::string runSimulation(const SimulationOptions& options,
                          const std::function<std::string(const SimulationContext&)>& body) {
  TERSE_CHECK(options.platform.ranks >= 1, InvalidArgument,
              "simulation: ranks must be >= 1, got " << options.platform.ranks);
  options.platform.links.validate(options.platform.ranks);
  if (options.platform.topology.enabled()) {
    options.platform.topology.validate();
    TERSE_CHECK(!options.platform.links.enabled(), InvalidArgument,
                "simulation: a topology and emulated links both describe the network; use one");
  }
  options.compute.validate();
  const ForkedChild forked = forkWithPipe("simulation", [&](int write_fd) { child(write_fd, options, body); });
  const ChildExit done = awaitChild(forked);
  const std::string& reply = done.report;
  if (reply.empty()) {
    throw SimulationError("the simulation process " + exitText(done.status) + " before it could report");
  }
  if (reply[0] == kOk) return reply.substr(1);
  throw SimulationError(reply.substr(1));
}

}  // namespace terse::sim
