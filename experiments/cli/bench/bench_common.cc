// The options, size sweep and rank threads the `terse bench` benchmarks share (bench_common.h).
#include "experiments/cli/bench/bench_common.h"
#include "core/common/runtime.h"

#include <exception>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <thread>

#include "core/comm/link_emulation.h"
#include "core/common/error.h"
#include "experiments/cli/cli_util.h"
#include "experiments/cli/commands.h"

namespace terse::cli::bench {

namespace {

std::vector<int> parseRanks(const std::string& text) {
  std::vector<int> out;
  auto toInt = [&](const std::string& s) {
    std::size_t pos = 0;
    int v = 0;
    try {
      v = std::stoi(s, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    // 1024: the simulated clock's scale (a real-time run of that many threads measures this host's scheduler).
    if (pos != s.size() || v < 1 || v > 1024)
      throw po::error("--ranks: '" + text + "' is not N, A..B or A,B,... in 1..1024");
    return v;
  };
  if (const auto dots = text.find(".."); dots != std::string::npos) {
    const int a = toInt(text.substr(0, dots)), b = toInt(text.substr(dots + 2));
    if (a > b) throw po::error("--ranks: empty range '" + text + "'");
    for (int n = a; n <= b; ++n) out.push_back(n);
    return out;
  }
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(toInt(item));
  if (out.empty()) throw po::error("--ranks: empty");
  return out;
}

}  // namespace

void addCommonOptions(po::options_description& o) {
  o.add_options()("help,h", "show this help")("ranks,n", po::value<std::string>()->default_value("2"),
                                              "world sizes: N, A..B or A,B,...")(
      "minbytes,b", po::value<std::string>(), "smallest message (default 4K; links 1K)")(
      "maxbytes,e", po::value<std::string>(), "largest message (default 64M; links 16M)")(
      "stepfactor,f", po::value<double>(), "size multiplier between rows (default 2; links 4)")(
      "iters", po::value<int>(), "timed iterations per size (default 20; links 10)")(
      "warmup,w", po::value<int>()->default_value(5), "untimed iterations per size")(
      "transport", po::value<std::string>()->default_value("inproc"),
      "inproc, tcp (real sockets: one process per rank under terse launch, else -n threads over loopback) or nccl "
      "(one process per GPU, device buffers)")("bandwidth", po::value<std::string>(),
                                               "emulated bandwidth per directed link, e.g. 10Gbps")(
      "latency", po::value<std::string>(), "emulated one-way latency per link, e.g. 5us")(
      "nic", po::value<std::string>(),
      "emulated per-rank NIC egress cap shared by its links, e.g. 25Gbps; default: --bandwidth (one port per rank); "
      "none: a wire of its own per peer")("nic-ingress", po::value<std::string>(),
                                          "emulated per-rank NIC ingress cap; default: the egress cap; none: no cap")(
      "json", "print JSON instead of the table")("check", "exit with status 1 when a check fails");
}

CommonArgs commonArgs(const po::variables_map& vm, uint64_t min_default, uint64_t max_default, double step_default,
                      int iters_default) {
  CommonArgs a;
  auto wrap = [](auto&& f) {
    try {
      return f();
    } catch (const Error& e) {
      throw po::error(userMessage(e.what()));
    }
  };
  const std::string transport = vm["transport"].as<std::string>();
  if (transport != "inproc" && transport != "tcp" && transport != "nccl")
    throw po::error("--transport: unknown transport '" + transport + "' (available: inproc, tcp, nccl)");
  a.transport = transport;
  a.ranks = parseRanks(vm["ranks"].as<std::string>());
  a.min_bytes =
      vm.count("minbytes") ? wrap([&] { return comm::parseByteSize(vm["minbytes"].as<std::string>()); }) : min_default;
  a.max_bytes =
      vm.count("maxbytes") ? wrap([&] { return comm::parseByteSize(vm["maxbytes"].as<std::string>()); }) : max_default;
  a.step_factor = vm.count("stepfactor") ? vm["stepfactor"].as<double>() : step_default;
  a.iters = vm.count("iters") ? vm["iters"].as<int>() : iters_default;
  a.warmup = vm["warmup"].as<int>();
  a.json = vm.count("json") != 0;
  a.check = vm.count("check") != 0;
  if (a.min_bytes == 0 || a.min_bytes > a.max_bytes) throw po::error("need 0 < minbytes <= maxbytes");
  if (!(a.step_factor > 1)) throw po::error("--stepfactor must be > 1");
  if (a.iters < 1 || a.warmup < 0) throw po::error("--iters must be >= 1 and --warmup >= 0");
  auto& emu = a.inproc.emulation;
  if (vm.count("bandwidth"))
    emu.link.bandwidth_bps = wrap([&] { return comm::parseBandwidth(vm["bandwidth"].as<std::string>()); });
  if (vm.count("latency"))
    emu.link.latency_s = wrap([&] { return comm::parseDuration(vm["latency"].as<std::string>()); });
  // A rank has one port, as a host has one NIC, unless told otherwise: by default its NIC runs at its links' rate both
  // ways, so an algorithm that sends to or receives from several peers at once (a tree's parent, a parameter server)
  // shares it, as on a real cluster, instead of getting a dedicated wire per peer and looking as fast as the ring.
  // "none" (or 0, unlimited) gives back the wires of their own.
  auto nic = [&](const char* option) {
    const std::string v = vm[option].as<std::string>();
    return v == "none" ? 0.0 : wrap([&] { return comm::parseBandwidth(v); });
  };
  emu.nic_egress_bps = vm.count("nic") ? nic("nic") : emu.link.bandwidth_bps;
  emu.nic_ingress_bps = vm.count("nic-ingress") ? nic("nic-ingress") : emu.nic_egress_bps;
  return a;
}

std::vector<uint64_t> sizeSweep(const CommonArgs& a, uint64_t align) {
  std::vector<uint64_t> sizes;
  for (double s = static_cast<double>(a.min_bytes); s <= static_cast<double>(a.max_bytes) * 1.0000001;
       s *= a.step_factor) {
    uint64_t b = static_cast<uint64_t>(s) / align * align;
    if (b == 0) b = align;
    if (sizes.empty() || sizes.back() != b) sizes.push_back(b);
  }
  return sizes;
}

std::optional<po::variables_map> parse(const std::vector<std::string>& args, const po::options_description& options,
                                       std::string_view usage, const std::string& who, int& exit_code) {
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(options).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "terse bench " << who << ": " << e.what() << "\n\n" << usage << "\n" << options;
    exit_code = kExitUsage;
    return std::nullopt;
  }
  if (vm.count("help")) {
    std::cout << usage << "\n" << options;
    exit_code = kExitOk;
    return std::nullopt;
  }
  return vm;
}

std::string fixed(double v, int digits) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(digits) << v;
  return o.str();
}

void onRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  // The runtime's threads: under --clock simulated each rank is an actor on its own host (core/sim).
  std::vector<rt::Thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back(
        "rank " + std::to_string(r),
        [&, r] {
          try {
            fn(r);
          } catch (...) {
            errors[static_cast<std::size_t>(r)] = std::current_exception();
          }
        },
        r);
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace terse::cli::bench
