// The built-in schedulers (schedulers/fifo, fusion, priority) driven through the checked Scheduler the engine uses,
// with several groups in flight at once so the credit matters: priority never hands out a less urgent chunk while a
// more urgent one is ready, the credit is never overdrawn, fusion buckets respect their cap and flush, fifo keeps ready
// order, an empty tensor is one empty chunk, and bad parameters fail with plugin, key and value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/common/error.h"
#include "core/plugin/loader.h"
#include "core/plugin/scheduler.h"

namespace terse {
namespace {

PluginLoader loader() {
  return PluginLoader::withSearchDirs({{TERSE_TEST_BUILD_PLUGIN_DIR, "build tree", true}});
}

struct TensorSpec {
  uint64_t numel;
  int layer;
};

// Priority of a chunk as P3 defines it: layer first, then tensor, then position (the plugin's documented tie-break).
using Key = std::tuple<int, uint64_t, int>;
Key keyOf(const Chunk& c) {
  return {c.layer_index, c.tensor_id, c.chunk_index};
}

// Drives one step: tensors become ready in the given order (one at a time, as backward hands them over); between
// arrivals the driver takes up to `max_in_flight` groups before completing the oldest. `check` sees every group with
// the chunks still pending after it and the credit left before it.
struct Driver {
  Driver(Scheduler& sched, std::vector<TensorSpec> specs, std::vector<std::size_t> order)
      : s(sched), tensors(std::move(specs)), arrival(std::move(order)) {}

  Scheduler& s;
  std::vector<TensorSpec> tensors;
  std::vector<std::size_t> arrival;  // indices into tensors
  std::size_t max_in_flight = 3;
  uint64_t wire_num = 1, wire_den = 1;  // wire_bytes = bytes * num / den (a compressor's size)

  std::map<uint64_t, Chunk> pending;  // id -> chunk
  std::vector<std::vector<Chunk>> in_flight;
  std::vector<std::vector<Chunk>> groups;
  uint64_t max_bytes_in_flight = 0;

  template <class Check>
  void run(uint64_t step, Check check) {
    s.beginStep(step);
    std::size_t next_arrival = 0;
    while (true) {
      if (next_arrival < arrival.size()) {
        const std::size_t t = arrival[next_arrival++];
        SchedTensor st;
        st.tensor_id = t;
        st.numel = tensors[t].numel;
        st.step = step;
        st.layer_index = tensors[t].layer;
        st.num_layers = 8;
        auto chunks = s.partition(st);
        for (auto& c : chunks) c.wire_bytes = (c.bytes * wire_num + wire_den - 1) / wire_den + 16;
        s.enqueue(chunks);
        for (const auto& c : chunks) pending[c.chunk_id] = c;
        if (next_arrival == arrival.size()) s.markAllEnqueued();
      }
      // Take groups while the scheduler hands them out and the window has room.
      while (in_flight.size() < max_in_flight) {
        const uint64_t credit_before = s.creditLeft();
        const bool idle = in_flight.empty();
        auto g = s.next();
        if (g.empty()) break;
        for (const auto& c : g) pending.erase(c.chunk_id);
        check(g, pending, credit_before, idle);
        groups.push_back(g);
        in_flight.push_back(g);
        max_bytes_in_flight = std::max(max_bytes_in_flight, s.bytesInFlight());
      }
      if (next_arrival < arrival.size() && in_flight.size() < max_in_flight) continue;
      if (in_flight.empty()) {
        if (next_arrival >= arrival.size()) break;
        continue;
      }
      std::vector<uint64_t> ids;
      uint64_t bytes = 0;
      for (const auto& c : in_flight.front()) {
        ids.push_back(c.chunk_id);
        bytes += c.wire_bytes;
      }
      s.onComplete(ids, bytes);
      in_flight.erase(in_flight.begin());
    }
    ASSERT_TRUE(pending.empty());
    ASSERT_TRUE(s.stepDone());
  }
};

std::vector<TensorSpec> oddModel() {
  // Odd sizes, a large early layer, two tensors per layer (weight, bias) and an empty one.
  return {{100003, 0}, {257, 0}, {40961, 1}, {129, 1}, {0, 2}, {12345, 2}, {7, 3}, {65537, 3}};
}

std::vector<std::size_t> backwardOrder(const std::vector<TensorSpec>& t) {
  std::vector<std::size_t> order(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return t[a].layer > t[b].layer; });
  return order;
}

TEST(PriorityScheduler, NeverSendsALessUrgentChunkWhileAMoreUrgentOneIsReadyAndCreditNeverExceeded) {
  auto l = loader();
  auto plugin = l.loadScheduler("priority");
  for (uint64_t credit : {uint64_t{0}, uint64_t{3000}, uint64_t{9000}, uint64_t{70000}}) {
    for (uint64_t partition : {uint64_t{4096}, uint64_t{10000}, uint64_t{1} << 30}) {
      Params params{{"partition_bytes", std::to_string(partition)}, {"credit_bytes", std::to_string(credit)}};
      auto s = plugin->instantiate(params);
      Driver d{*s, oddModel(), backwardOrder(oddModel())};
      d.wire_num = 1;
      d.wire_den = 2;  // fp16-like sizes
      d.run(0, [&](const std::vector<Chunk>& g, const std::map<uint64_t, Chunk>& pending, uint64_t credit_left,
                   bool idle) {
        Key most_urgent_left{std::numeric_limits<int>::max(), 0, 0};
        for (const auto& [id, c] : pending) most_urgent_left = std::min(most_urgent_left, keyOf(c));
        uint64_t bytes = 0;
        for (std::size_t i = 0; i < g.size(); ++i) {
          bytes += g[i].wire_bytes;
          // Strict order: everything still ready is less urgent than everything handed out.
          EXPECT_LT(keyOf(g[i]), most_urgent_left) << "credit " << credit << " partition " << partition;
          if (i > 0) {
            EXPECT_LT(keyOf(g[i - 1]), keyOf(g[i])) << "a group is in priority order";
          }
        }
        // Within the credit left, except a single chunk larger than the credit going alone with nothing in flight.
        if (credit != 0 && bytes > credit_left) {
          EXPECT_TRUE(idle && g.size() == 1)
              << "credit " << credit << ": group of " << bytes << " bytes with " << credit_left << " left";
        }
      });
      if (credit != 0) {
        uint64_t largest_chunk = 0;
        for (const auto& g : d.groups)
          for (const auto& c : g) largest_chunk = std::max(largest_chunk, c.wire_bytes);
        EXPECT_LE(d.max_bytes_in_flight, std::max(credit, largest_chunk)) << "credit " << credit;
      }
      // Chunks are partition_bytes of f32 before compression (the last one of a tensor shorter).
      for (const auto& g : d.groups)
        for (const auto& c : g) EXPECT_LE(c.bytes, std::max<uint64_t>(partition / 4 * 4, 4));
    }
  }
}

TEST(PriorityScheduler, UrgentLateChunkOvertakesQueuedOnes) {
  // Layer 3 arrives first and is cut into many chunks; layer 0 arrives while most are still queued and must go next.
  auto l = loader();
  auto s = l.loadScheduler("priority")->instantiate({{"partition_bytes", "4000"}, {"credit_bytes", "4100"}});
  s->beginStep(0);
  auto enqueue = [&](uint64_t id, uint64_t numel, int layer) {
    SchedTensor t;
    t.tensor_id = id;
    t.numel = numel;
    t.layer_index = layer;
    t.num_layers = 4;
    auto chunks = s->partition(t);
    s->enqueue(chunks);
    return chunks;
  };
  auto late = enqueue(3, 10000, 3);  // 10 chunks of 1000 elements
  ASSERT_EQ(late.size(), 10u);
  auto g = s->next();
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].tensor_id, 3u);
  s->onComplete(std::vector<uint64_t>{g[0].chunk_id}, g[0].wire_bytes);
  auto early = enqueue(0, 1500, 0);
  s->markAllEnqueued();
  g = s->next();
  ASSERT_FALSE(g.empty());
  EXPECT_EQ(g[0].tensor_id, 0u) << "layer 0 preempts the queued layer-3 chunks at the chunk boundary";
  EXPECT_EQ(g[0].chunk_index, 0);
}

// A matrix is cut at whole rows (scheduler_v1.h, partition): each chunk keeps the matrix shape, which PowerSGD needs
// (a chunk cut mid-row is a vector, which it sent whole, as raw f32). 512 KiB of a 256x784 f32 layer is 167.2 rows:
// chunks of 167 rows and one of 89; a row longer than the chunk, and a vector, are cut as the plugin says.
TEST(PriorityScheduler, AMatrixIsCutAtWholeRows) {
  auto l = loader();
  auto s = l.loadScheduler("priority")->instantiate({{"partition_bytes", "524288"}});
  s->beginStep(0);
  auto cut = [&](uint64_t id, uint64_t numel, uint64_t row) {
    SchedTensor t;
    t.tensor_id = id;
    t.numel = numel;
    t.row_numel = row;
    auto chunks = s->partition(t);
    s->enqueue(chunks);
    std::vector<uint64_t> sizes;
    for (const auto& c : chunks) {
      if (row > 0 && row <= 131072) {
        EXPECT_EQ(c.offset % row, 0u) << "tensor " << id << " chunk " << c.chunk_index;
      }
      sizes.push_back(c.numel);
    }
    return sizes;
  };
  EXPECT_EQ(cut(0, 256 * 784, 784), (std::vector<uint64_t>{167 * 784, 89 * 784}));
  EXPECT_EQ(cut(1, 2 * 200000, 200000), (std::vector<uint64_t>{131072, 131072, 131072, 6784}));  // rows of 800 kB
  EXPECT_EQ(cut(2, 200000, 0), (std::vector<uint64_t>{131072, 68928}));                          // a vector
  EXPECT_EQ(cut(3, 1000 * 10, 10), (std::vector<uint64_t>{10000}));                              // fits whole
}

TEST(FusionScheduler, BucketsRespectTheCapKeepReadyOrderAndFlush) {
  auto l = loader();
  auto plugin = l.loadScheduler("fusion");
  for (uint64_t cap : {uint64_t{1000}, uint64_t{60000}, uint64_t{1} << 30}) {
    auto s = plugin->instantiate({{"bucket_bytes", std::to_string(cap)}});
    const auto model = oddModel();
    Driver d{*s, model, backwardOrder(model)};
    d.max_in_flight = 1;
    d.run(0, [&](const std::vector<Chunk>& g, const std::map<uint64_t, Chunk>&, uint64_t, bool) {
      uint64_t bytes = 0;
      for (const auto& c : g) bytes += c.wire_bytes;
      if (g.size() > 1) {
        EXPECT_LE(bytes, cap) << "a bucket of several tensors stays within the cap";
      }
      for (const auto& c : g) EXPECT_EQ(c.numel, model[c.tensor_id].numel) << "fusion keeps tensors whole";
    });
    std::vector<std::size_t> order;
    for (const auto& g : d.groups)
      for (const auto& c : g) order.push_back(c.tensor_id);
    EXPECT_EQ(order, backwardOrder(model)) << "cap " << cap;
    if (cap == (uint64_t{1} << 30)) {
      EXPECT_EQ(d.groups.size(), 1u) << "everything fits one bucket: one flush";
    }
    if (cap == 1000) {
      EXPECT_GE(d.groups.size(), 6u);
    }
  }
}

TEST(FifoScheduler, WholeTensorsOnePerGroupInReadyOrder) {
  auto l = loader();
  auto s = l.loadScheduler("fifo")->instantiate({});
  const auto model = oddModel();
  std::vector<std::size_t> arrival = {5, 1, 7, 0, 2, 4, 6, 3};
  Driver d{*s, model, arrival};
  d.run(0,
        [](const std::vector<Chunk>& g, const std::map<uint64_t, Chunk>&, uint64_t, bool) { EXPECT_EQ(g.size(), 1u); });
  std::vector<std::size_t> order;
  for (const auto& g : d.groups) order.push_back(g.at(0).tensor_id);
  EXPECT_EQ(order, arrival);
}

TEST(Schedulers, AnEmptyTensorIsOneEmptyChunkThatCompletes) {
  auto l = loader();
  for (const char* name : {"fifo", "fusion", "priority"}) {
    auto s = l.loadScheduler(name)->instantiate({});
    Driver d{*s, {{0, 0}}, {0}};
    d.run(0, [](const std::vector<Chunk>&, const std::map<uint64_t, Chunk>&, uint64_t, bool) {});
    ASSERT_EQ(d.groups.size(), 1u) << name;
    EXPECT_EQ(d.groups[0].at(0).numel, 0u) << name;
  }
}

std::string initError(const std::string& name, const Params& params) {
  auto l = loader();
  try {
    l.loadScheduler(name)->instantiate(params);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Schedulers, BadParametersNamePluginKeyAndValue) {
  EXPECT_NE(initError("priority", {{"partition_bytes", "0"}}).find("priority: 'partition_bytes' must be"),
            std::string::npos)
      << initError("priority", {{"partition_bytes", "0"}});
  EXPECT_NE(initError("priority", {{"partition_bytes", "0"}}).find("got 0"), std::string::npos);
  EXPECT_NE(initError("priority", {{"credit_bytes", "-5"}}).find("'credit_bytes'"), std::string::npos);
  EXPECT_NE(initError("priority", {{"credit_bytes", "-5"}}).find("-5"), std::string::npos);
  EXPECT_NE(initError("fusion", {{"bucket_bytes", "lots"}}).find("fusion: 'bucket_bytes'"), std::string::npos);
  EXPECT_NE(initError("fusion", {{"bucket_bytes", "lots"}}).find("lots"), std::string::npos);
  EXPECT_NE(initError("fifo", {{"partition_bytes", "4"}}).find("fifo: unknown parameter 'partition_bytes'"),
            std::string::npos);
  EXPECT_NE(initError("priority", {{"parition_bytes", "4096"}}).find("unknown parameter 'parition_bytes'"),
            std::string::npos);
  EXPECT_EQ(initError("priority", {{"partition_bytes", "4096"}, {"credit_bytes", "0"}}), "");
}

}  // namespace
}  // namespace terse
