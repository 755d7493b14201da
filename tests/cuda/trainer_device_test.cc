// The GPU training path end to end on one GPU (label cuda; skips without a device): the MLP's CUDA version, an NCCL
// communicator of world size 1, every tensor's codec on the communicator's stream with device buffers, the optimizer
// as a kernel -- against the same run on the CPU (the host MLP, the in-process transport, the host codecs).
//
// What must agree, and how closely:
//  - none (dense): the device and host trainers apply the same math, but cuBLAS sums the GEMMs in another order than
//    OpenBLAS, so parameters agree within float rounding amplified over a few steps: 1e-3 of each tensor's largest
//    value after 6 steps (the workload test pins one step's gradients at 1e-4).
//  - fp16 and onebit with error feedback: payload sizes are fixed, so the bytes produced are exactly the host's; the
//    trained parameters stay close (fp16 within the same bound as dense; onebit's signs may flip where a gradient is
//    within rounding of 0, so only its loss is compared: it must fall as the host's does).
//  - a fused group (the fusion scheduler) gives the same parameters as unfused groups, bit for bit: at world size 1
//    the allreduce of a concatenation is the concatenation of the allreduces.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/host_communicator.h"
#include "core/comm/inproc_transport.h"
#include "core/comm/nccl_communicator.h"
#include "core/comm/store.h"
#include "core/common/cuda.h"
#include "core/compress/make_codec.h"
#include "core/plugin/loader.h"
#include "core/train/sync_trainer.h"
#include "experiments/workloads/workloads.h"
#include "tests/workloads/workloads_test_util.h"

namespace terse::train {
namespace {

PluginLoader buildTreeLoader() {
  return PluginLoader::withSearchDirs({{TERSE_TEST_BUILD_PLUGIN_DIR, "build tree", true}});
}

struct RunResult {
  std::vector<std::vector<float>> values;
  std::vector<double> losses;
  uint64_t payload_bytes = 0;
};

SyncTrainerOptions options() {
  SyncTrainerOptions o;
  o.batch_size = 33;  // odd: no tile of the kernels divides it
  o.epochs = 1;
  o.seed = 5;
  o.sgd.momentum = 0.9;
  o.lr.lr = 0.05;
  return o;
}

// Six steps of the MLP {64, 32} on 200 random 8x8 images; device >= 0 runs the GPU path on that NCCL communicator.
RunResult train(comm::Communicator& comm, int device, const std::string& compressor, const CodecOptions& codec,
                const std::string& scheduler = "fifo") {
  auto loader = buildTreeLoader();
  auto plugin = loader.loadCompressor(compressor);
  auto instance = plugin->instantiate({});
  workloads::WorkloadOptions wo;
  wo.seed = 3;
  wo.hidden = {64, 32};
  wo.device = device;
  auto data = testing::randomSplit(200, 8, 8, 10, 17);
  auto model = workloads::makeWorkload("mlp", wo, data);
  // Core builds every tensor's info (param_info.h), on the workload's device when it has one.
  auto pipes = [&](const TensorInfo& info) {
    return std::make_unique<CompressionPipeline>(makeCodec(instance, info, 7, codec, comm.deviceStream()), comm);
  };
  auto sched = loader.loadScheduler(scheduler)->instantiate({});
  SyncTrainer trainer(*model, comm, pipes, options(), std::move(sched));
  RunResult r;
  for (int s = 0; s < 6; ++s) r.losses.push_back(trainer.step().loss);
  trainer.drain();
  r.payload_bytes = trainer.payloadBytes();
  trainer.checksum();  // refreshes the host mirror of a device workload
  for (const ParamTensor& p : model->params()) r.values.push_back(p.value);
  return r;
}

void expectClose(const RunResult& gpu, const RunResult& cpu, double tolerance) {
  ASSERT_EQ(gpu.values.size(), cpu.values.size());
  for (std::size_t t = 0; t < cpu.values.size(); ++t) {
    float scale = 0;
    for (float v : cpu.values[t]) scale = std::max(scale, std::abs(v));
    for (std::size_t i = 0; i < cpu.values[t].size(); ++i)
      ASSERT_NEAR(gpu.values[t][i], cpu.values[t][i], tolerance * scale) << "tensor " << t << " element " << i;
  }
}

class TrainerOnDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    const cuda::DeviceSummary summary = cuda::deviceSummary();
    if (summary.count == 0) GTEST_SKIP() << "no CUDA device: " << summary.reason;
    comm::NcclOptions o;
    o.store_prefix = "trainer/";
    nccl_ = comm::connectNcclCommunicator(o, store_);
    auto transports = comm::makeInprocTransports(1);
    host_ = std::make_unique<comm::HostCommunicator>(std::move(transports[0]));
  }
  comm::MemoryStore store_;
  std::unique_ptr<comm::NcclCommunicator> nccl_;
  std::unique_ptr<comm::HostCommunicator> host_;
};

TEST_F(TrainerOnDevice, DenseMatchesTheHostTrainer) {
  const RunResult gpu = train(*nccl_, nccl_->device(), "none", {});
  const RunResult cpu = train(*host_, -1, "none", {});
  expectClose(gpu, cpu, 1e-3);
  for (std::size_t s = 0; s < cpu.losses.size(); ++s) EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 1e-3 * cpu.losses[s]);
  EXPECT_EQ(gpu.payload_bytes, cpu.payload_bytes);
}

TEST_F(TrainerOnDevice, CompressedWithErrorFeedbackMatchesTheHost) {
  CodecOptions ef;
  ef.error_feedback = true;
  const RunResult gpu16 = train(*nccl_, nccl_->device(), "fp16", ef);
  const RunResult cpu16 = train(*host_, -1, "fp16", ef);
  expectClose(gpu16, cpu16, 1e-3);
  EXPECT_EQ(gpu16.payload_bytes, cpu16.payload_bytes);

  const RunResult gpu1 = train(*nccl_, nccl_->device(), "onebit", ef);
  const RunResult cpu1 = train(*host_, -1, "onebit", ef);
  EXPECT_EQ(gpu1.payload_bytes, cpu1.payload_bytes);
  // Six steps of onebit on random labels need not lower the loss (an H200 gave 2.385 -> 2.393, its last loss within 5%
  // of the host's); the claim is that the device follows the host's loss curve, step by step.
  ASSERT_EQ(gpu1.losses.size(), cpu1.losses.size());
  for (std::size_t s = 0; s < cpu1.losses.size(); ++s) {
    EXPECT_NEAR(gpu1.losses[s], cpu1.losses[s], 0.05 * cpu1.losses[s]) << "step " << s;
  }
}

TEST_F(TrainerOnDevice, FusedGroupsEqualUnfused) {
  const RunResult fifo = train(*nccl_, nccl_->device(), "fp16", {}, "fifo");
  const RunResult fused = train(*nccl_, nccl_->device(), "fp16", {}, "fusion");
  ASSERT_EQ(fifo.values.size(), fused.values.size());
  for (std::size_t t = 0; t < fifo.values.size(); ++t) EXPECT_EQ(fifo.values[t], fused.values[t]) << "tensor " << t;
  // Variable-size payloads through a fused gather (the size table's device round trip).
  const RunResult topk = train(*nccl_, nccl_->device(), "topk", {}, "fifo");
  const RunResult topk_fused = train(*nccl_, nccl_->device(), "topk", {}, "fusion");
  for (std::size_t t = 0; t < topk.values.size(); ++t) EXPECT_EQ(topk.values[t], topk_fused.values[t]) << t;
}

}  // namespace
}  // namespace terse::train
