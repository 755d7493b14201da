// `terse bench links`: achieved bandwidth and latency of emulated inproc links against the configured ones (one-way
// time from a ping-pong, streaming bandwidth of back-to-back frames, and with more than 2 ranks a fan-out from rank 0
// that --nic caps), in nccl-tests' table style (docs/STYLE.md 10).
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/comm/inproc_transport.h"
#include "core/comm/link_emulation.h"
#include "core/common/error.h"
#include "experiments/cli/bench/bench_common.h"
#include "experiments/cli/cli_util.h"
#include "experiments/cli/commands.h"

namespace terse::cli::bench {
namespace {

using comm::InprocFabric;

constexpr std::string_view kLinksUsage =
    "usage: terse bench links [-n RANKS] [--bandwidth BW] [--latency T] [--nic BW] [-b MINBYTES] [-e MAXBYTES]\n"
    "                         [-f STEPFACTOR] [--iters N] [--json] [--check]\n"
    "\n"
    "One-way time from a ping-pong between ranks 0 and 1 (median of --iters), and streaming bandwidth of back-to-back\n"
    "frames (median of 5 runs), each against\n"
    "what the configured link predicts (frame bytes include the 32-byte header). Rows of 1 MB and more must be within\n"
    "10% (--check makes a miss the exit status). With more than 2 ranks, rank 0 also sends to all others at once\n"
    "(fan-out), which --nic caps.\n";

constexpr int kStreamRepeats = 5;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct LinkRow {
  uint64_t size = 0;
  double oneway_us = 0;
  double expect_oneway_us = 0;
  double stream_gbps = 0;
  double expect_stream_gbps = 0;
  bool checked = false;
  bool ok = true;
};

struct FanOut {
  uint64_t size = 0;  // 0: not measured (2 ranks)
  double gbps = 0;
  double expect_gbps = 0;
};

// What the configured emulation predicts for link 0 -> 1.
struct LinkModel {
  explicit LinkModel(const comm::EmulationConfig& emu) : spec(emu.linkSpec(0, 1)) {
    // The rate a frame from 0 to 1 gets: its link, capped by rank 0's egress and rank 1's ingress.
    rate = spec.bandwidth_bps;
    for (double cap : {emu.nic_egress_bps, emu.nic_ingress_bps})
      if (cap > 0 && (rate <= 0 || cap < rate)) rate = cap;
  }
  double wireSeconds(uint64_t payload) const {
    return rate > 0 ? static_cast<double>(comm::frameWireBytes(payload)) * 8 / rate : 0.0;
  }
  comm::LinkSpec spec;
  double rate = 0;
};

// Parses and validates the options; nullopt when the command is done (help printed, or a usage error reported) with
// its exit status in `exit_code`.
std::optional<CommonArgs> parseLinksOptions(const std::vector<std::string>& args, int& exit_code) {
  po::options_description options("options");
  addCommonOptions(options);
  auto vm = parse(args, options, kLinksUsage, "links", exit_code);
  if (!vm) return std::nullopt;
  CommonArgs a;
  try {
    a = commonArgs(*vm, 1024, 16ull << 20, 4, 10);
    if (a.transport != "inproc")
      throw po::error(
          "--transport: links measures the link emulation on inproc only (allreduce and allgather run on "
          "tcp)");
    if (!vm->count("bandwidth") && !vm->count("latency") && !vm->count("nic")) {
      a.inproc.emulation.link.bandwidth_bps = 10e9;
      a.inproc.emulation.link.latency_s = 50e-6;
    }
    if (a.ranks.size() != 1 || a.ranks[0] < 2) throw po::error("--ranks: links needs one world size >= 2");
    a.inproc.emulation.validate(a.ranks[0]);
  } catch (const po::error& e) {
    std::cerr << "terse bench links: " << e.what() << "\n\n" << kLinksUsage << "\n" << options;
    exit_code = kExitUsage;
    return std::nullopt;
  } catch (const Error& e) {
    std::cerr << "terse bench links: " << userMessage(e.what()) << '\n';
    exit_code = kExitUsage;
    return std::nullopt;
  }
  return a;
}

// One row: ping-pong and streaming between ranks 0 and 1 at `size`, against the model. Uses two tags from `tag`.
LinkRow measurePair(std::vector<std::unique_ptr<comm::Transport>>& ts, const CommonArgs& a, const LinkModel& m,
                    uint64_t size, comm::Tag& tag) {
  LinkRow row;
  row.size = size;
  const int stream = static_cast<int>(std::clamp<uint64_t>((8ull << 20) / size, 4, 64));
  // Medians over the iterations: one descheduled thread on a busy machine must not decide a row.
  std::vector<double> pingpong, streamed;
  const comm::Tag t_ping = tag++, t_stream = tag++;
  onRanks(2, [&](int r) {
    comm::Transport& t = *ts[static_cast<std::size_t>(r)];
    const comm::FrameMeta ping{comm::OpKind::kP2P, t_ping, comm::kNoTensor};
    const comm::FrameMeta flow{comm::OpKind::kP2P, t_stream, comm::kNoTensor};
    std::vector<std::byte> buf(size);
    const int peer = 1 - r;
    for (int i = 0; i < a.warmup + a.iters; ++i) {
      const auto start = Clock::now();
      if (r == 0) {
        t.send(peer, ping, buf);
        t.recv(peer, ping, buf);
      } else {
        t.recv(peer, ping, buf);
        t.send(peer, ping, buf);
      }
      if (r == 0 && i >= a.warmup) pingpong.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    // Streaming: `stream` frames back to back; rank 1 stamps the last arrival and answers with an empty frame.
    std::vector<std::vector<std::byte>> bufs(static_cast<std::size_t>(stream), std::vector<std::byte>(size));
    for (int rep = 0; rep < kStreamRepeats; ++rep) {
      std::vector<comm::Request> reqs;
      if (r == 0) {
        const auto start = Clock::now();
        for (auto& b : bufs) reqs.push_back(t.isend(peer, flow, b));
        for (auto& q : reqs) q.wait();
        t.recv(peer, flow, {});
        streamed.push_back(std::chrono::duration<double>(Clock::now() - start).count());
      } else {
        for (auto& b : bufs) reqs.push_back(t.irecv(peer, flow, b));
        for (auto& q : reqs) q.wait();
        t.send(peer, flow, {});
      }
    }
  });
  row.oneway_us = median(pingpong) / 2 * 1e6;
  row.expect_oneway_us = (m.wireSeconds(size) + m.spec.latency_s) * 1e6;
  // The stream's time includes the empty answer's trip back: one latency and a header.
  const double bits = static_cast<double>(stream) * static_cast<double>(comm::frameWireBytes(size)) * 8;
  const double expect_time = stream * m.wireSeconds(size) + 2 * m.spec.latency_s + m.wireSeconds(0);
  row.stream_gbps = bits / median(streamed) / 1e9;
  row.expect_stream_gbps = bits / expect_time / 1e9;
  row.checked = size >= (1u << 20) && m.rate > 0;
  if (row.checked) {
    const double r1 = row.oneway_us / row.expect_oneway_us, r2 = row.stream_gbps / row.expect_stream_gbps;
    row.ok = r1 > 0.9 && r1 < 1.1 && r2 > 0.9 && r2 < 1.1;
  }
  return row;
}

// Fan-out: rank 0 sends `size` to every other rank at once.
FanOut measureFanOut(std::vector<std::unique_ptr<comm::Transport>>& ts, int n, const comm::EmulationConfig& emu,
                     const LinkModel& m, uint64_t size, comm::Tag tag) {
  FanOut f;
  f.size = size;
  const comm::FrameMeta fan{comm::OpKind::kP2P, tag, comm::kNoTensor};
  double took = 0;
  onRanks(n, [&](int r) {
    comm::Transport& t = *ts[static_cast<std::size_t>(r)];
    std::vector<std::byte> buf(f.size);
    if (r == 0) {
      const auto start = Clock::now();
      std::vector<comm::Request> reqs;
      for (int p = 1; p < n; ++p) reqs.push_back(t.isend(p, fan, buf));
      for (auto& q : reqs) q.wait();
      took = std::chrono::duration<double>(Clock::now() - start).count();
    } else {
      t.recv(0, fan, buf);
    }
  });
  const double bits = static_cast<double>(n - 1) * static_cast<double>(comm::frameWireBytes(f.size)) * 8;
  f.gbps = bits / took / 1e9;
  double agg = m.spec.bandwidth_bps > 0 ? m.spec.bandwidth_bps * (n - 1) : 0;
  if (emu.nic_egress_bps > 0 && (agg <= 0 || emu.nic_egress_bps < agg)) agg = emu.nic_egress_bps;
  f.expect_gbps = agg / 1e9;
  return f;
}

void printJson(int n, const comm::EmulationConfig& emu, const LinkModel& m, const std::vector<LinkRow>& rows,
               const FanOut& fan, bool all_ok) {
  std::ostringstream j;
  j << "{\"benchmark\":\"links\",\"transport\":\"inproc\",\"ranks\":" << n
    << ",\"bandwidth_bps\":" << m.spec.bandwidth_bps << ",\"latency_s\":" << m.spec.latency_s
    << ",\"nic_egress_bps\":" << emu.nic_egress_bps << ",\"rows\":[";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    j << (i ? "," : "") << "{\"size\":" << r.size << ",\"oneway_us\":" << fixed(r.oneway_us, 2)
      << ",\"expected_oneway_us\":" << fixed(r.expect_oneway_us, 2) << ",\"stream_gbps\":" << fixed(r.stream_gbps, 3)
      << ",\"expected_stream_gbps\":" << fixed(r.expect_stream_gbps, 3)
      << ",\"checked\":" << (r.checked ? "true" : "false") << ",\"ok\":" << (r.ok ? "true" : "false") << "}";
  }
  j << "]";
  if (fan.size)
    j << ",\"fanout\":{\"size\":" << fan.size << ",\"gbps\":" << fixed(fan.gbps, 3)
      << ",\"expected_gbps\":" << fixed(fan.expect_gbps, 3) << "}";
  j << ",\"ok\":" << (all_ok ? "true" : "false") << "}";
  std::cout << j.str() << '\n';
}

void printTable(int n, const CommonArgs& a, const LinkModel& m, const std::vector<LinkRow>& rows, const FanOut& fan,
                bool all_ok) {
  const auto& emu = a.inproc.emulation;
  std::cout << "# terse bench links: transport inproc, ranks " << n << ", link 0 -> 1 "
            << comm::formatBandwidth(m.spec.bandwidth_bps) << " " << comm::formatDuration(m.spec.latency_s)
            << ", nic egress " << comm::formatBandwidth(emu.nic_egress_bps) << ", nic ingress "
            << comm::formatBandwidth(emu.nic_ingress_bps) << ", iters " << a.iters << "\n"
            << "# one-way: half a ping-pong; stream: back-to-back frames; expected from the configured rates with\n"
            << "# 32-byte frame headers; rows >= 1 MB must be within 10%\n";
  Table table(
      {"#       size", "oneway(us)", "expected(us)", "ratio", "stream(Gbps)", "expected(Gbps)", "ratio", "check"});
  for (const auto& r : rows) {
    std::ostringstream size;
    size << std::setw(13) << r.size;
    table.add({size.str(), fixed(r.oneway_us, 1), fixed(r.expect_oneway_us, 1),
               fixed(r.oneway_us / r.expect_oneway_us, 3), fixed(r.stream_gbps, 3), fixed(r.expect_stream_gbps, 3),
               fixed(r.stream_gbps / r.expect_stream_gbps, 3), r.checked ? (r.ok ? "ok" : "OFF") : "-"});
  }
  table.print(std::cout);
  if (fan.size) {
    std::cout << "# fan-out 0 -> all, " << fan.size << " B each: " << fixed(fan.gbps, 3) << " Gbps aggregate, expected "
              << fixed(fan.expect_gbps, 3) << " Gbps (ratio " << fixed(fan.gbps / fan.expect_gbps, 3) << ")\n";
  }
  std::cout << "# " << (all_ok ? "all checked rows within 10%" : "some rows are off by more than 10%") << "\n";
}

}  // namespace

int linksCommand(const std::vector<std::string>& args) {
  int exit_code = kExitOk;
  const std::optional<CommonArgs> parsed = parseLinksOptions(args, exit_code);
  if (!parsed) return exit_code;
  const CommonArgs& a = *parsed;
  const int n = a.ranks[0];
  const auto& emu = a.inproc.emulation;
  const LinkModel model(emu);

  std::vector<LinkRow> rows;
  FanOut fan;
  try {
    auto fabric = InprocFabric::create(n, a.inproc);
    std::vector<std::unique_ptr<comm::Transport>> ts;
    for (int r = 0; r < n; ++r) ts.push_back(fabric->endpoint(r));
    comm::Tag tag = 1;
    for (uint64_t size : sizeSweep(a, 1)) rows.push_back(measurePair(ts, a, model, size, tag));
    if (n > 2) fan = measureFanOut(ts, n, emu, model, rows.back().size, tag++);
  } catch (const std::exception& e) {
    std::cerr << "terse bench links: " << userMessage(e.what()) << '\n';
    return kExitFailure;
  }

  bool all_ok = true;
  for (const auto& r : rows) all_ok = all_ok && r.ok;
  if (a.json)
    printJson(n, emu, model, rows, fan, all_ok);
  else
    printTable(n, a, model, rows, fan, all_ok);
  return a.check && !all_ok ? kExitFailure : kExitOk;
}

}  // namespace terse::cli::bench
