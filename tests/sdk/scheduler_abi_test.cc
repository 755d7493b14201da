// The C entry points TERSE_EXPORT_SCHEDULER generates, driven through test_fifo's exported struct: parameters, caps,
// partition, FIFO order under credit, the nothing-in-flight escape, and contract violations reported as errors.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "sdk_test_util.h"
#include "terse/sdk.hpp"

namespace terse::sdk {
namespace {

using testing::PluginFile;
using testing::RecordingHost;

class SdkTestFifo : public ::testing::Test {
 protected:
  void init(std::vector<std::pair<std::string, std::string>> params) {
    ASSERT_NE(api_, nullptr);
    params_ = std::move(params);
    std::vector<terse_param_v1> raw;
    for (const auto& [k, v] : params_) raw.push_back({k.c_str(), v.c_str()});
    status_ = api_->init(raw.data(), raw.size(), host_.get(), &ctx_);
  }
  void TearDown() override {
    if (ctx_ != nullptr) {
      EXPECT_EQ(api_->finalize(ctx_), TERSE_OK);
    }
  }

  terse_scheduler_caps_v1 caps() {
    terse_scheduler_caps_v1 caps{};
    caps.struct_size = sizeof caps;
    caps.flags = 0xffu;  // the SDK zeroes the reserved field
    EXPECT_EQ(api_->get_caps(ctx_, &caps), TERSE_OK) << host_.lastError();
    return caps;
  }
  uint64_t partition(uint64_t numel) {
    terse_sched_tensor_v1 t{};
    t.struct_size = sizeof t;
    t.numel = numel;
    t.bytes = 4 * numel;
    t.num_layers = 1;
    uint64_t chunk = 12345;
    EXPECT_EQ(api_->partition(ctx_, &t, &chunk), TERSE_OK) << host_.lastError();
    return chunk;
  }
  void enqueue(std::vector<std::pair<uint64_t, uint64_t>> id_and_wire_bytes) {
    std::vector<terse_chunk_v1> chunks;
    for (const auto& [id, wire] : id_and_wire_bytes) {
      terse_chunk_v1 c{};
      c.chunk_id = id;
      c.tensor_id = id / 10;
      c.wire_bytes = wire;
      c.bytes = wire;
      chunks.push_back(c);
    }
    ASSERT_EQ(api_->enqueue(ctx_, chunks.data(), chunks.size()), TERSE_OK) << host_.lastError();
  }
  // The ids of the next group.
  std::vector<uint64_t> next(uint64_t credit_left, uint32_t flags = 0, uint64_t capacity = 8) {
    std::vector<uint64_t> ids(capacity, ~0ull);
    uint64_t count = 999;
    EXPECT_EQ(api_->next(ctx_, credit_left, flags, ids.data(), capacity, &count), TERSE_OK) << host_.lastError();
    EXPECT_LE(count, capacity);
    ids.resize(count);
    return ids;
  }
  terse_status_v1 complete(std::vector<uint64_t> ids, uint64_t wire_bytes = 0) {
    return api_->on_complete(ctx_, ids.data(), ids.size(), wire_bytes);
  }

  PluginFile file_{TERSE_TEST_PLUGIN_DIR "/terse_scheduler_test_fifo.so"};
  const terse_scheduler_v1* api_ = file_.symbol<terse_scheduler_v1>(TERSE_SCHEDULER_PLUGIN_V1_SYMBOL);
  RecordingHost host_;
  std::vector<std::pair<std::string, std::string>> params_;
  void* ctx_ = nullptr;
  terse_status_v1 status_ = TERSE_ERR_INTERNAL;
};

using Ids = std::vector<uint64_t>;

TEST_F(SdkTestFifo, ExportsTheSchedulerStruct) {
  ASSERT_NE(api_, nullptr);
  EXPECT_EQ(api_->abi_version, TERSE_SCHEDULER_ABI_V1);
  EXPECT_EQ(api_->struct_size, sizeof(terse_scheduler_v1));
  EXPECT_STREQ(api_->name, "test_fifo");
  EXPECT_NE(api_->description, nullptr);
  EXPECT_EQ(file_.symbol<void>(TERSE_COMPRESSOR_PLUGIN_V1_SYMBOL), nullptr);
}

TEST_F(SdkTestFifo, DefaultsAreWholeTensorsAndUnlimitedCredit) {
  init({});
  ASSERT_EQ(status_, TERSE_OK) << host_.lastError();
  const terse_scheduler_caps_v1 c = caps();
  EXPECT_EQ(c.struct_size, sizeof(terse_scheduler_caps_v1));
  EXPECT_EQ(c.credit_bytes, 0u);
  EXPECT_EQ(c.flags, 0u);
  EXPECT_EQ(partition(1000), 0u);
}

TEST_F(SdkTestFifo, Parameters) {
  init({{"chunk_numel", "10"}, {"credit_bytes", "100"}});
  ASSERT_EQ(status_, TERSE_OK) << host_.lastError();
  EXPECT_EQ(caps().credit_bytes, 100u);
  EXPECT_EQ(partition(1000), 10u);
}

TEST_F(SdkTestFifo, BadParameters) {
  init({{"chunk_numel", "-1"}});
  EXPECT_EQ(status_, TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ctx_, nullptr);
  EXPECT_EQ(host_.lastError(), "test_fifo: 'chunk_numel' must be a non-negative integer, got '-1'");
  host_.clear();
  init({{"credit", "5"}});
  EXPECT_EQ(status_, TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(host_.lastError(), "test_fifo: unknown parameter 'credit' (known: chunk_numel, credit_bytes)");
}

TEST_F(SdkTestFifo, OldestFirstWithinCredit) {
  init({{"credit_bytes", "100"}});
  ASSERT_EQ(status_, TERSE_OK);
  EXPECT_EQ(next(100), Ids{});  // nothing enqueued yet
  enqueue({{1, 60}, {2, 30}});
  enqueue({{3, 50}, {4, 200}, {5, 1}});
  EXPECT_EQ(next(100), Ids{1});
  EXPECT_EQ(next(40), Ids{2});
  EXPECT_EQ(next(10), Ids{});  // 3 needs 50 and nothing overtakes it, not even 5 which would fit
  ASSERT_EQ(complete({1}, 60), TERSE_OK);
  EXPECT_EQ(next(70), Ids{3});
  ASSERT_EQ(complete({2, 3}), TERSE_OK);
  EXPECT_EQ(next(100), Ids{});                                  // 4 is larger than the whole credit...
  EXPECT_EQ(next(100, TERSE_SCHED_NOTHING_IN_FLIGHT), Ids{4});  // ...and goes alone once nothing is in flight
  EXPECT_EQ(next(0, TERSE_SCHED_ALL_ENQUEUED), Ids{});
  EXPECT_EQ(next(1, TERSE_SCHED_ALL_ENQUEUED), Ids{5});
  EXPECT_EQ(next(100, TERSE_SCHED_NOTHING_IN_FLIGHT | TERSE_SCHED_ALL_ENQUEUED), Ids{});
  ASSERT_EQ(complete({4, 5}), TERSE_OK);
}

TEST_F(SdkTestFifo, CapacityZeroHandsOutNothing) {
  init({});
  ASSERT_EQ(status_, TERSE_OK);
  enqueue({{1, 8}});
  uint64_t count = 7;
  EXPECT_EQ(api_->next(ctx_, 100, 0, nullptr, 0, &count), TERSE_OK);
  EXPECT_EQ(count, 0u);
  EXPECT_EQ(next(100), Ids{1});
}

TEST_F(SdkTestFifo, ContractViolationsAreErrors) {
  init({});
  ASSERT_EQ(status_, TERSE_OK);
  enqueue({{1, 8}, {2, 8}});
  EXPECT_EQ(complete({1}), TERSE_ERR_INVALID_ARGUMENT);  // pending, not in flight
  EXPECT_EQ(host_.lastError(), "test_fifo: on_complete: chunk 1 is not in flight");
  const terse_chunk_v1 dup{2, 0, 0, 0, 0, 0, 8, 0, 0};
  EXPECT_EQ(api_->enqueue(ctx_, &dup, 1), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(host_.lastError(), "test_fifo: enqueue: chunk 2 is already pending or in flight");
  EXPECT_EQ(next(100), Ids{1});
  ASSERT_EQ(complete({1}), TERSE_OK);
  EXPECT_EQ(complete({1}), TERSE_ERR_INVALID_ARGUMENT);  // twice

  // Argument checks of the generated wrappers.
  EXPECT_EQ(api_->enqueue(ctx_, nullptr, 2), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(host_.lastError(), "test_fifo: enqueue: chunks is NULL");
  EXPECT_EQ(api_->next(ctx_, 100, 0, nullptr, 4, nullptr), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(host_.lastError(), "test_fifo: next: count is NULL");
  uint64_t count = 0;
  EXPECT_EQ(api_->next(ctx_, 100, 0, nullptr, 4, &count), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(host_.lastError(), "test_fifo: next: chunk_ids is NULL");
  EXPECT_EQ(api_->on_complete(ctx_, nullptr, 1, 0), TERSE_ERR_INVALID_ARGUMENT);
  terse_sched_tensor_v1 small{};
  small.struct_size = 4;
  uint64_t chunk = 0;
  EXPECT_EQ(api_->partition(ctx_, &small, &chunk), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(host_.lastError(), "test_fifo: partition: tensor: struct_size is 4, expected at least 48");
  EXPECT_EQ(api_->get_caps(nullptr, nullptr), TERSE_ERR_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace terse::sdk
