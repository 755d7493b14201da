// The in-process rendezvous store (core/comm/store.h): set/get/add/check semantics every Store shares, with several
// threads as ranks.
#include "core/comm/store.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "core/comm/transport.h"

namespace terse::comm {
namespace {

using namespace std::chrono_literals;

TEST(MemoryStore, GetWaitsForSetFromAnotherThread) {
  MemoryStore store;
  std::thread setter([&] {
    std::this_thread::sleep_for(20ms);
    store.set("addr/1", std::string("127.0.0.1:4242\0x", 16));
  });
  EXPECT_EQ(store.get("addr/1", 5s), std::string("127.0.0.1:4242\0x", 16));  // bytes, NUL included
  setter.join();
  EXPECT_TRUE(store.check("addr/1"));
  EXPECT_FALSE(store.check("addr/2"));
}

TEST(MemoryStore, GetTimesOutNamingTheKey) {
  MemoryStore store;
  try {
    store.get("nccl/unique_id", 30ms);
    FAIL();
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("nccl/unique_id"), std::string::npos) << e.what();
  }
}

TEST(MemoryStore, AddIsAtomicAcrossRanks) {
  MemoryStore store;
  constexpr int kRanks = 5, kAdds = 1000;
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&] {
      for (int i = 0; i < kAdds; ++i) store.add("barrier", 1);
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(store.add("barrier", 0), kRanks * kAdds);
  EXPECT_EQ(store.get("barrier", 1s), std::to_string(kRanks * kAdds));
  EXPECT_EQ(store.add("barrier", -3), kRanks * kAdds - 3);
}

TEST(MemoryStore, AddOnANonCounterIsAClearError) {
  MemoryStore store;
  store.set("addr/0", "host:1");
  try {
    store.add("addr/0", 1);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("addr/0"), std::string::npos) << e.what();
  }
  store.set("big", std::to_string(INT64_MAX));
  EXPECT_THROW(store.add("big", 1), InvalidArgument);
  EXPECT_EQ(store.get("big", 1s), std::to_string(INT64_MAX));  // unchanged by the refused add
}

}  // namespace
}  // namespace terse::comm
