// The sync trainer's row-sparse path (SyncTrainerOptions::sparse_rows) on the glove workload over 3 in-process ranks:
// the same parameters as the dense allreduce path (up to float summation order), identical replicas, and the wire and
// payload bytes of the sparse tensors far below the dense path's. About 0.1 s.
#include <gtest/gtest.h>

#include <cmath>
#include <exception>
#include <thread>

#include "core/comm/host_communicator.h"
#include "core/comm/inproc_transport.h"
#include "core/compress/make_codec.h"
#include "core/plugin/loader.h"
#include "core/train/sync_trainer.h"
#include "experiments/workloads/glove.h"
#include "tests/train/glove_test_corpus.h"

namespace terse::train {
namespace {

struct TrainRun {
  std::vector<std::vector<float>> values;  // rank 0's
  std::vector<uint64_t> checksums;         // every rank's
  uint64_t wire_bytes = 0;                 // rank 0's, every frame
  uint64_t payload_bytes = 0;              // rank 0's
};

TrainRun train(bool sparse) {
  constexpr int kWorld = 3;
  auto loader = PluginLoader::withSearchDirs({{TERSE_TEST_BUILD_PLUGIN_DIR, "build tree", true}});
  auto plugin = loader.loadCompressor("none");
  auto data = testing::gloveTestCorpus();
  workloads::GloveOptions g;
  g.dim = 8;
  SyncTrainerOptions options;
  options.batch_size = 8;
  options.epochs = 1;
  options.sgd.adagrad = true;
  options.lr.lr = 0.05;
  options.sparse_rows = sparse;
  auto transports = comm::makeInprocTransports(kWorld);
  TrainRun run;
  run.checksums.resize(kWorld);
  std::vector<std::exception_ptr> errors(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      try {
        comm::HostCommunicator comm(std::move(transports[static_cast<std::size_t>(r)]));
        workloads::GloveWorkload w(data, g, 3);
        auto instance = plugin->instantiate({});
        PipelineFactory pipelines = [&](const TensorInfo& info) {
          return std::make_unique<CompressionPipeline>(makeCodec(instance, info, 7, {}), comm);
        };
        SyncTrainer trainer(w, comm, pipelines, options, loader.loadScheduler("fifo")->instantiate({}));
        while (!trainer.finished()) trainer.step();
        run.checksums[static_cast<std::size_t>(r)] = trainer.checksum();
        if (r == 0) {
          for (const auto& p : w.params()) run.values.push_back(p.value);
          run.payload_bytes = trainer.payloadBytes();
          run.wire_bytes = comm.traffic().sent.total().bytes - trainer.negotiation().bytes;
        }
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return run;
}

TEST(SyncTrainerSparse, MatchesTheDensePathWithFewerBytes) {
  const TrainRun dense = train(false);
  const TrainRun sparse = train(true);
  for (const TrainRun* run : {&dense, &sparse})
    for (uint64_t c : run->checksums) EXPECT_EQ(c, run->checksums[0]) << "replicas differ";
  ASSERT_EQ(dense.values.size(), sparse.values.size());
  for (std::size_t t = 0; t < dense.values.size(); ++t)
    for (std::size_t i = 0; i < dense.values[t].size(); ++i)
      ASSERT_NEAR(dense.values[t][i], sparse.values[t][i], 1e-4f) << "tensor " << t << " element " << i;
  // 8 examples per rank touch at most 8 of ~400 rows per tensor: the sparse path sends a fraction of the dense bytes.
  EXPECT_LT(3 * sparse.wire_bytes, dense.wire_bytes) << sparse.wire_bytes << " vs " << dense.wire_bytes;
  EXPECT_LT(3 * sparse.payload_bytes, dense.payload_bytes) << sparse.payload_bytes << " vs " << dense.payload_bytes;
}

}  // namespace
}  // namespace terse::train
