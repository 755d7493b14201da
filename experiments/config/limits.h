// The bounds an experiment config must keep (experiment.proto lists them beside the fields, docs/running-studies.md
// "Experiment configs" in short). A config is untrusted text: without a ceiling a count becomes an allocation that
// ends in std::bad_alloc a minute later, a duration overflows the clock it is converted to, and a list makes the checks
// themselves take minutes. Each limit is far above what a study needs and is named in the message that refuses it.
// Header-only constants, so that readers of configs outside this target (results/compare) share them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace terse::experiments::limits {

// ---- The file.
// Text the loader reads at all: the largest committed study is 11 KB, a 10,000-variant sweep about 1 MB.
inline constexpr std::size_t kConfigBytes = std::size_t{64} << 20;
// Message nesting the text parser follows. A valid config nests at most 4 deep (variants { overrides { simulation {
// topology { ...); without a limit protobuf's parser recurses once per level and 5,000 levels overflow the stack.
inline constexpr int kNesting = 32;
// Any string field, plugin parameters' keys and values included: a path's length on Linux (PATH_MAX).
inline constexpr std::size_t kStringBytes = 4096;
// Each variant is the base copied and merged, so the study resolves to about variants x base bytes; this bounds that
// product (serialized bytes of the base) so that a long base times many variants cannot exhaust memory.
inline constexpr std::uint64_t kResolvedBytes = std::uint64_t{256} << 20;

// ---- Lists (repeated fields and maps), checked on the file before variants are resolved.
inline constexpr int kVariants = 10000;       // a sweep; each variant is a training run
inline constexpr int kHiddenLayers = 1024;    // workload.hidden_sizes
inline constexpr int kConvChannels = 16;      // workload.conv_channels (cnn takes exactly 2; the rest is a typo)
inline constexpr int kMilestones = 1000;      // optimizer.milestones
inline constexpr int kSeeds = 100;            // seeds: repeats per variant
inline constexpr int kLinkOverrides = 65536;  // link.overrides (a full mesh of 256 ranks)
inline constexpr int kPluginParams = 256;     // compressor.params, scheduler.params
inline constexpr int kGridAxes = 8;           // grid: axes of a study (variants x points stays within kVariants)
inline constexpr int kGridValues = 100;       // grid[].values

// ---- Counts.
// Ranks: what `terse launch -n` starts and the what-if studies simulate (experiments/configs/whatif_*: 1,024).
inline constexpr int kWorkers = 1024;
inline constexpr int kServers = 1024;  // parameter_server.servers
inline constexpr int kEpochs = 100000;
inline constexpr int kBatchSize = 65536;                        // data.batch_size, examples per worker per micro-batch
inline constexpr int kGlobalBatchSize = kBatchSize * kWorkers;  // data.global_batch_size, over all workers
inline constexpr int kGradientAccumulationSteps = 1024;
inline constexpr int kLocalSgdPeriod = 1000000;           // local_sgd.period
inline constexpr int kLocalSgdStartStep = 1000000000;     // local_sgd.start_step
inline constexpr int kCompressionStartStep = 1000000000;  // compression_start_step
inline constexpr int kStalenessBound = 1000000;           // more than any run's steps apart: ASYNC
inline constexpr int kHiddenSize = 65536;                 // each workload.hidden_sizes entry
inline constexpr int kConvChannelsEach = 1024;            // each workload.conv_channels entry
inline constexpr int kNicsPerNode = 64;                   // simulation.topology.nics_per_node
inline constexpr double kSlowdown = 1000;                 // worker_settings[].slowdown
inline constexpr double kComputeJitter = 4;               // compute_jitter: E[exp(4 |Z|)] is about 5,960
inline constexpr double kOversubscription = 1000;
inline constexpr std::int64_t kSocketBufferBytes = std::int64_t{1} << 30;  // tcp.socket_buffer_bytes
// workload.pytorch SYNTHETIC: every rank holds the whole set as f32 tensors.
inline constexpr std::int64_t kSyntheticExamples = std::int64_t{1} << 24;
inline constexpr double kSyntheticBytes = 16.0 * (1 << 30);

// ---- Durations (seconds) and rates.
inline constexpr double kLatencySeconds = 3600;   // link and topology latencies: one hour
inline constexpr double kTimeoutSeconds = 86400;  // tcp.timeout, parameter_server.worker_timeout: one day
// Link and NIC bandwidths, when not unlimited: below 1 Kbps one step's transfer takes hours, above 1 Pbps is no
// network that exists (NVLink is 2.4 Tbps), and 1/bandwidth and bytes/bandwidth stay finite.
inline constexpr double kMinBandwidthBps = 1e3;
inline constexpr double kMaxBandwidthBps = 1e15;
// simulation.flops_per_second: a microcontroller to an exaflop machine.
inline constexpr double kMinFlopsPerSecond = 1e6;
inline constexpr double kMaxFlopsPerSecond = 1e18;

}  // namespace terse::experiments::limits
