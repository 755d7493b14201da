// The checked scheduler instance: partitioning, the step's books (pending, in flight, credit), and one test per
// contract violation a scheduler plugin can commit. test_fifo (the SDK work's correct scheduler, in the build plugin
// directory) drives the happy paths; fake_sched (a C fixture with a `mode` per defect) the violations.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "core/common/error.h"
#include "core/plugin/loader.h"
#include "core/plugin/scheduler.h"
#include "tests/plugin/loader_test_util.h"

namespace terse {
namespace {

using test::contains;
using test::messageOf;

std::unique_ptr<Scheduler> fifo(const Params& params = {}) {
  PluginLoader loader(std::vector<std::string>{TERSE_TEST_PLUGIN_DIR});
  return loader.loadScheduler("test_fifo")->instantiate(params);
}

std::unique_ptr<Scheduler> fake(const std::string& mode, Params more = {}) {
  more.emplace_back("mode", mode);
  return SchedulerPlugin::open(test::fixtureScheduler("fake_sched"))->instantiate(more);
}

SchedTensor tensor(uint64_t id, uint64_t numel, int layer = 0, uint64_t step = 0) {
  SchedTensor t;
  t.dtype = DType::kF32;
  t.tensor_id = id;
  t.numel = numel;
  t.step = step;
  t.layer_index = layer;
  t.num_layers = 4;
  return t;
}

std::vector<uint64_t> idsOf(const std::vector<Chunk>& chunks) {
  std::vector<uint64_t> ids;
  for (const auto& c : chunks) ids.push_back(c.chunk_id);
  return ids;
}

// Enqueues every tensor, then drains the step completing each group at once; returns the ids in communication order.
std::vector<uint64_t> runStep(Scheduler& s, const std::vector<SchedTensor>& tensors) {
  for (const auto& t : tensors) s.enqueue(s.partition(t));
  s.markAllEnqueued();
  std::vector<uint64_t> order;
  while (!s.stepDone()) {
    auto group = s.next();
    EXPECT_FALSE(group.empty());
    if (group.empty()) break;
    const auto ids = idsOf(group);
    order.insert(order.end(), ids.begin(), ids.end());
    uint64_t wire = 0;
    for (const auto& c : group) wire += c.wire_bytes;
    s.onComplete(ids, wire);
  }
  return order;
}

TEST(SchedulerPartition, UniformChunksLastShorter) {
  auto s = fifo({{"chunk_numel", "4"}});
  const auto chunks = s->partition(tensor(11, 10, 2));
  ASSERT_EQ(chunks.size(), 3u);
  const uint64_t numel[] = {4, 4, 2};
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(chunks[i].chunk_id, i);
    EXPECT_EQ(chunks[i].tensor_id, 11u);
    EXPECT_EQ(chunks[i].offset, 4 * i);
    EXPECT_EQ(chunks[i].numel, numel[i]);
    EXPECT_EQ(chunks[i].bytes, 4 * numel[i]);
    EXPECT_EQ(chunks[i].wire_bytes, chunks[i].bytes);
    EXPECT_EQ(chunks[i].layer_index, 2);
    EXPECT_EQ(chunks[i].chunk_index, static_cast<int>(i));
  }
  // Ids continue across tensors of the step.
  EXPECT_EQ(s->partition(tensor(12, 3))[0].chunk_id, 3u);
}

TEST(SchedulerPartition, EmptyTensorIsOneEmptyChunkAndZeroMeansWhole) {
  auto chunked = fifo({{"chunk_numel", "4"}});
  const auto empty = chunked->partition(tensor(1, 0));
  ASSERT_EQ(empty.size(), 1u);
  EXPECT_EQ(empty[0].numel, 0u);
  EXPECT_EQ(empty[0].bytes, 0u);
  auto whole = fifo();
  const auto one = whole->partition(tensor(2, 1000));
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].numel, 1000u);
  EXPECT_EQ(one[0].bytes, 4000u);
}

TEST(SchedulerPartition, CorePreconditions) {
  auto s = fifo();
  s->partition(tensor(1, 8));
  EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { s->partition(tensor(1, 8)); }), {"partitioned twice"}));
  EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { s->partition(tensor(2, 8, 0, 5)); }),
                       {"is for step 5, the current step is 0"}));
  EXPECT_TRUE(
      contains(messageOf<InvalidArgument>([&] { s->partition(tensor(3, 8, 9)); }), {"layer_index 9 outside 0..3"}));
}

TEST(SchedulerStep, FifoDrainsInEnqueueOrder) {
  auto s = fifo({{"chunk_numel", "4"}});
  EXPECT_EQ(s->plugin().name, "test_fifo");
  EXPECT_EQ(s->caps().credit_bytes, 0u);
  const auto order = runStep(*s, {tensor(1, 10, 3), tensor(2, 5, 2)});
  EXPECT_EQ(order, (std::vector<uint64_t>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(s->stepDone());
  // The next step restarts ids at 0.
  s->beginStep(1);
  EXPECT_EQ(s->step(), 1u);
  EXPECT_EQ(s->partition(tensor(1, 10, 3, 1))[0].chunk_id, 0u);
}

TEST(SchedulerStep, CreditLimitsBytesInFlight) {
  // 16-byte chunks under a 40-byte credit: two fit at once, a third waits for a completion.
  auto s = fifo({{"chunk_numel", "4"}, {"credit_bytes", "40"}});
  EXPECT_EQ(s->caps().credit_bytes, 40u);
  s->enqueue(s->partition(tensor(1, 12)));
  s->markAllEnqueued();
  const auto a = s->next();
  const auto b = s->next();
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(s->bytesInFlight(), 32u);
  EXPECT_EQ(s->creditLeft(), 8u);
  EXPECT_TRUE(s->next().empty());  // 16 > 8: nothing now, and that is not a stall while chunks are in flight
  s->onComplete(idsOf(a), 16);
  EXPECT_EQ(s->creditLeft(), 24u);
  const auto c = s->next();
  ASSERT_EQ(c.size(), 1u);
  s->onComplete(idsOf(b), 10);  // actual wire bytes may be fewer than reserved
  s->onComplete(idsOf(c), 16);
  EXPECT_TRUE(s->stepDone());
  EXPECT_EQ(s->bytesInFlight(), 0u);
}

TEST(SchedulerStep, ChunkLargerThanTheCreditGoesAloneWhenNothingIsInFlight) {
  auto s = fifo({{"credit_bytes", "8"}});
  s->enqueue(s->partition(tensor(1, 100)));  // 400 bytes
  s->markAllEnqueued();
  const auto g = s->next();
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(s->creditLeft(), 0u);
  s->onComplete(idsOf(g), 400);
  EXPECT_TRUE(s->stepDone());
}

TEST(SchedulerStep, LoweredWireBytesAreWhatTheCreditCounts) {
  auto s = fifo({{"credit_bytes", "100"}});
  auto chunks = s->partition(tensor(1, 100));
  chunks[0].wire_bytes = 50;  // compressed size
  s->enqueue(chunks);
  s->markAllEnqueued();
  ASSERT_EQ(s->next().size(), 1u);
  EXPECT_EQ(s->bytesInFlight(), 50u);
}

TEST(SchedulerStep, CoreMisuseIsInvalidArgument) {
  auto s = fifo({{"chunk_numel", "4"}});
  auto chunks = s->partition(tensor(1, 10));
  auto partial = chunks;
  partial.pop_back();
  EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { s->enqueue(partial); }), {"partition made 3"}));
  auto altered = chunks;
  altered[1].offset = 5;
  EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { s->enqueue(altered); }), {"is not the chunk partition made"}));
  EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { s->markAllEnqueued(); }), {"not enqueued"}));
  s->enqueue(chunks);
  EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { s->enqueue(chunks); }), {"is pending"}));
  EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { s->beginStep(1); }), {"3 pending"}));
  const auto g = s->next();
  ASSERT_EQ(g.size(), 1u);
  const uint64_t unknown[] = {42};
  EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { s->onComplete(unknown, 0); }), {"chunk 42 is not in flight"}));
  const uint64_t pending[] = {1};
  EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { s->onComplete(pending, 0); }), {"chunk 1 is not in flight"}));
  EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { s->onComplete(idsOf(g), 17); }), {"at most 16"}));
  s->onComplete(idsOf(g), 16);
  EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { s->onComplete(idsOf(g), 16); }), {"already completed"}));
}

TEST(SchedulerStep, OnCompleteTakesExactlyOneGroup) {
  auto s = fake("fifo", {{"chunk_numel", "1"}});  // fake_sched's fifo groups everything that fits
  s->enqueue(s->partition(tensor(1, 3)));
  s->markAllEnqueued();
  const auto g = s->next();
  ASSERT_EQ(g.size(), 3u);
  const uint64_t two[] = {0, 1};
  EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { s->onComplete(two, 0); }), {"their group has 3"}));
  const uint64_t repeated[] = {0, 0, 1};
  EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { s->onComplete(repeated, 0); }), {"listed twice"}));
  s->onComplete(std::vector<uint64_t>{2, 0, 1}, 12);
  EXPECT_TRUE(s->stepDone());
}

TEST(SchedulerStep, FakeFifoGroupsWithinCredit) {
  auto s = fake("fifo", {{"chunk_numel", "1"}, {"credit_bytes", "8"}});
  const auto order = runStep(*s, {tensor(1, 5)});
  EXPECT_EQ(order, (std::vector<uint64_t>{0, 1, 2, 3, 4}));
}

// ---- Contract violations: each names the scheduler and what it did, and leaves the instance unusable.

std::string violationOf(Scheduler& s) {
  const std::string m = messageOf<PluginError>([&] {
    for (int i = 0; i < 4; ++i) {
      auto g = s.next();
      if (!g.empty()) s.onComplete(idsOf(g), 0);
    }
  });
  // Afterwards every call refuses, instead of running on books that no longer match the plugin's.
  EXPECT_TRUE(contains(messageOf<PluginError>([&] { s.next(); }), {"unusable after an earlier failure"}));
  return m;
}

std::unique_ptr<Scheduler> loaded(const std::string& mode, Params more = {}) {
  auto s = fake(mode, std::move(more));
  s->enqueue(s->partition(tensor(1, 2)));
  s->enqueue(s->partition(tensor(2, 2)));
  s->markAllEnqueued();
  return s;
}

TEST(SchedulerViolations, DuplicateIdInOneGroup) {
  auto s = loaded("dup");
  EXPECT_TRUE(contains(violationOf(*s), {"scheduler 'fake_sched' (", "next returned chunk id 0 twice in one group"}));
}

TEST(SchedulerViolations, Stall) {
  auto s = loaded("stall");
  EXPECT_TRUE(contains(violationOf(*s),
                       {"scheduler 'fake_sched'", "stall: next returned no chunks", "2 pending", "nothing in flight"}));
}

TEST(SchedulerViolations, NothingBeforeAllEnqueuedIsNotAStall) {
  auto s = fake("stall");
  s->enqueue(s->partition(tensor(1, 2)));
  EXPECT_TRUE(s->next().empty());
}

TEST(SchedulerViolations, UnknownId) {
  auto s = loaded("unknown");
  EXPECT_TRUE(contains(violationOf(*s), {"next returned chunk id 999999, which the core never assigned"}));
}

TEST(SchedulerViolations, CountAboveCapacity) {
  auto s = loaded("overflow");
  EXPECT_TRUE(contains(violationOf(*s), {"next returned count 3, above the capacity 2"}));
}

TEST(SchedulerViolations, CreditOverdrawn) {
  auto s = fake("greedy", {{"credit_bytes", "8"}});
  s->enqueue(s->partition(tensor(1, 2)));
  s->enqueue(s->partition(tensor(2, 2)));
  // The first group may exceed the credit (nothing in flight); the core then holds it in flight...
  auto first = s->next();
  ASSERT_EQ(first.size(), 2u);
  // ... and a greedy second group while bytes are in flight overdraws it.
  s->enqueue(s->partition(tensor(3, 2)));
  const std::string m = messageOf<PluginError>([&] { s->next(); });
  EXPECT_TRUE(contains(
      m, {"group of 1 chunks with 8 wire bytes, above the credit left (0 of 8)", "while 2 chunks are in flight"}));
}

TEST(SchedulerViolations, IdAlreadyInFlight) {
  auto s = loaded("repeat");
  ASSERT_EQ(s->next().size(), 1u);
  const std::string m = messageOf<PluginError>([&] { s->next(); });
  EXPECT_TRUE(contains(m, {"next returned chunk id 0 (tensor 1), which is already in flight"}));
}

TEST(SchedulerViolations, FailedCallCarriesThePluginsMessage) {
  auto s = loaded("fail_next");
  try {
    s->next();
    ADD_FAILURE() << "next did not throw";
  } catch (const PluginError& e) {
    EXPECT_EQ(e.status(), TERSE_ERR_INTERNAL);
    EXPECT_TRUE(contains(e.what(), {"scheduler 'fake_sched'",
                                    "next failed [plugin error]: fake_sched: deliberate "
                                    "failure in next"}));
  }
  EXPECT_THROW(s->next(), PluginError);
}

TEST(SchedulerViolations, TooManyChunks) {
  auto s = fake("tiny");
  const std::string m = messageOf<PluginError>([&] { s->partition(tensor(1, uint64_t{1} << 21)); });
  EXPECT_TRUE(contains(m, {"partition answered chunk_numel 1", "2097152 chunks, above the limit"}));
}

TEST(SchedulerPlugin, InitFailureAndKindMismatch) {
  auto plugin = SchedulerPlugin::open(test::fixtureScheduler("fake_sched"));
  EXPECT_EQ(plugin->info().kind, PluginKind::kScheduler);
  EXPECT_EQ(plugin->info().abi_version, 1u);
  const std::string m = messageOf<InvalidArgument>([&] { plugin->instantiate({{"chunk_numel", "-3"}}); });
  EXPECT_TRUE(contains(m, {"scheduler 'fake_sched'",
                           "init failed [invalid argument]: fake_sched: invalid value '-3' "
                           "for 'chunk_numel'"}));
}

}  // namespace
}  // namespace terse
