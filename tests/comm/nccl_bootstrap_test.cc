// The store side of the NCCL communicator's bootstrap (core/comm/nccl_bootstrap.h), which every build compiles: the
// unique id's key, its exact bytes through a memory store and a real TCP store (an id is binary: zeros and 0xff
// included), the clear error when rank 0 never publishes, a foreign value under the key, and the device choice per
// local rank.
#include "core/comm/nccl_bootstrap.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "core/comm/auth.h"
#include "core/comm/tcp_store.h"
#include "core/comm/transport.h"
#include "core/common/error.h"

namespace terse::comm {
namespace {

using namespace std::chrono_literals;

NcclUniqueIdBytes testId() {
  NcclUniqueIdBytes id;
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<std::byte>((i * 37 + 11) % 256);
  id[0] = std::byte{0};  // an NCCL id starts with zero bytes often enough that a C-string store would truncate it
  id[1] = std::byte{0xff};
  return id;
}

TEST(NcclBootstrap, KeyLivesUnderTheJobPrefix) {
  EXPECT_EQ(ncclUniqueIdKey(""), "nccl/unique_id");
  EXPECT_EQ(ncclUniqueIdKey("bench/nccl/4/"), "bench/nccl/4/nccl/unique_id");
}

TEST(NcclBootstrap, RankZeroPublishesAndOthersWaitForIt) {
  MemoryStore store;
  const NcclUniqueIdBytes id = testId();
  std::thread rank0([&] {
    std::this_thread::sleep_for(20ms);  // the others are already waiting
    publishNcclUniqueId(store, "job/", id);
  });
  const NcclUniqueIdBytes got = fetchNcclUniqueId(store, "job/", 1, 5s);
  rank0.join();
  EXPECT_EQ(got, id);
  EXPECT_EQ(store.get("job/nccl/unique_id", 1s).size(), kNcclUniqueIdBytes);
  // Another prefix is another job: nothing there.
  EXPECT_FALSE(store.check("other/nccl/unique_id"));
}

TEST(NcclBootstrap, IdSurvivesATcpStoreByteForByte) {
  const JobToken token = JobToken::generate();
  TcpStoreServer server(token, TcpStoreServerOptions{});
  TcpStore rank0("127.0.0.1", server.port(), token, 5s);
  TcpStore rank1("127.0.0.1", server.port(), token, 5s);
  const NcclUniqueIdBytes id = testId();
  publishNcclUniqueId(rank0, "p/", id);
  EXPECT_EQ(fetchNcclUniqueId(rank1, "p/", 1, 5s), id);
}

TEST(NcclBootstrap, MissingRankZeroIsAClearTimeout) {
  MemoryStore store;
  try {
    fetchNcclUniqueId(store, "job7/", 3, 40ms);
    FAIL() << "no id was published";
  } catch (const CommError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 3"), std::string::npos) << m;
    EXPECT_NE(m.find("'job7/nccl/unique_id'"), std::string::npos) << m;
    EXPECT_NE(m.find("40 ms"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 0 publishes it"), std::string::npos) << m;
  }
}

TEST(NcclBootstrap, AForeignValueUnderTheKeyIsRefused) {
  MemoryStore store;
  store.set("job/nccl/unique_id", "127.0.0.1:4242");
  try {
    fetchNcclUniqueId(store, "job/", 1, 1s);
    FAIL() << "a 14-byte value is not an NCCL unique id";
  } catch (const InvalidPayload& e) {
    EXPECT_NE(std::string(e.what()).find("has 14 bytes"), std::string::npos) << e.what();
  }
}

TEST(NcclBootstrap, DeviceFollowsTheLocalRank) {
  EXPECT_EQ(selectCudaDevice(0, 1, 1), 0);
  EXPECT_EQ(selectCudaDevice(3, 4, 8), 3);  // one process per GPU, more GPUs than processes
  EXPECT_EQ(selectCudaDevice(2, 4, 4), 2);
  // One visible device per process: the launcher set CUDA_VISIBLE_DEVICES per task.
  EXPECT_EQ(selectCudaDevice(5, 8, 1), 0);
  EXPECT_THROW(selectCudaDevice(0, 1, 0), InvalidArgument);  // no device at all
  EXPECT_THROW(selectCudaDevice(4, 4, 4), InvalidArgument);  // local rank outside the local world
  EXPECT_THROW(selectCudaDevice(-1, 4, 4), InvalidArgument);
  try {
    selectCudaDevice(2, 4, 2);  // four processes, two GPUs
    FAIL();
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("4 processes"), std::string::npos) << m;
    EXPECT_NE(m.find("2 visible CUDA devices"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace terse::comm
