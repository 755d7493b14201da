// Communication schedulers as the core drives them: a loaded scheduler plugin file (SchedulerPlugin) and a checked
// instance (Scheduler) that keeps the step's books the ABI leaves to the core. The core assigns chunk ids, cuts
// tensors into chunks from the plugin's partition answer, tracks which chunks are pending and in flight and the wire
// bytes in flight against the credit, and checks every answer of the plugin: a scheduler that hands out an unknown or
// repeated id, overdraws the credit, or stalls fails the run with its name instead of hanging or corrupting the step
// (scheduler_v1.h, "The core checks every answer").
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/common/dtype.h"
#include "core/plugin/compressor.h"  // Params
#include "core/plugin/plugin_info.h"

namespace terse {

// A gradient tensor that just became ready (bytes before compression are numel * element size).
struct SchedTensor {
  DType dtype = DType::kF32;
  uint64_t tensor_id = 0;
  uint64_t numel = 0;
  uint64_t step = 0;
  int layer_index = 0;  // forward-pass position, 0 first
  int num_layers = 1;
  // Elements of one row of the tensor's matrix view (numel / first dimension) for a tensor of 2 or more dimensions;
  // 0 for a vector. partition() cuts a matrix at whole rows (scheduler_v1.h).
  uint64_t row_numel = 0;
};

// A contiguous slice of one tensor; mirrors terse_chunk_v1.
struct Chunk {
  uint64_t chunk_id = 0;  // assigned by the core, unique within the step (0, 1, 2, ... in partition order)
  uint64_t tensor_id = 0;
  uint64_t step = 0;
  uint64_t offset = 0;  // first element within the tensor
  uint64_t numel = 0;
  uint64_t bytes = 0;       // before compression
  uint64_t wire_bytes = 0;  // after compression (exact or an upper bound); partition() sets it to `bytes`
  int layer_index = 0;
  int chunk_index = 0;  // 0.. within its tensor, in offset order
};

struct SchedulerCaps {
  uint64_t credit_bytes = 0;  // most wire bytes in flight at once; 0 = unlimited
};

class SchedulerPlugin;

// One initialized scheduler instance. Not thread-safe: the ABI has one thread (the worker's communication thread)
// drive an instance. A step goes: beginStep -> (partition -> enqueue)* -> markAllEnqueued, interleaved with
// next -> onComplete until stepDone(). After a contract violation or a failed plugin call the instance is unusable
// (the plugin's own books no longer match the core's) and every further call throws.
class Scheduler {
 public:
  ~Scheduler();  // finalize; a failure is logged
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  const PluginInfo& plugin() const noexcept;
  const SchedulerCaps& caps() const noexcept;
  // Every parameter the instance uses, defaults included; nullopt when the plugin does not report them
  // (terse/resolved_params_v1.h is optional).
  std::optional<Params> resolvedParams() const;

  // Starts step `step`: chunk ids restart at 0. The previous step must be finished (nothing partitioned but not
  // enqueued, pending or in flight); the first step may start without it (an instance starts at step 0).
  void beginStep(uint64_t step);
  uint64_t step() const noexcept;

  // Asks the plugin how to cut `tensor` and returns the chunks with ids assigned and wire_bytes = bytes: uniform
  // chunk_numel elements, the last one shorter; chunk_numel 0 (or >= numel) is the whole tensor as one chunk; an empty
  // tensor is one empty chunk. The caller may lower wire_bytes (the compressed size) before enqueue. A tensor is
  // partitioned once per step.
  std::vector<Chunk> partition(const SchedTensor& tensor);
  // Hands the chunks of one tensor to the plugin, exactly as partition returned them (wire_bytes may differ).
  void enqueue(std::span<const Chunk> chunks);
  // Every tensor of the step has been enqueued: the plugin is told to flush partial groups, and from now on returning
  // nothing while chunks are pending and nothing is in flight is a stall.
  void markAllEnqueued();

  // The next group to communicate, fused in the order given; empty means "nothing now" (call again after the next
  // enqueue or completion). Checks: ids enqueued and not yet handed out, no repeats, at most the pending count, the
  // group's wire_bytes within the credit left unless nothing is in flight, and no stall.
  std::vector<Chunk> next();
  // Reports a group returned by next as communicated; `wire_bytes` is what it actually sent (at most the group's
  // wire_bytes). The ids must be exactly that group's (any order). Its credit is released.
  void onComplete(std::span<const uint64_t> chunk_ids, uint64_t wire_bytes);

  bool allEnqueued() const noexcept;
  std::size_t pendingChunks() const noexcept;   // enqueued, not handed out
  std::size_t inFlightChunks() const noexcept;  // handed out, not completed
  uint64_t bytesInFlight() const noexcept;      // sum of wire_bytes of in-flight chunks
  uint64_t creditLeft() const noexcept;         // UINT64_MAX when the credit is unlimited
  // The smallest layer_index among pending chunks, -1 when none: what a group just handed out left behind, for checks
  // of a priority order (sync_trainer.h's IssuedGroup). A scan of the step's chunks.
  int minPendingLayer() const noexcept;
  // All enqueued, nothing partitioned but not enqueued, pending or in flight.
  bool stepDone() const noexcept;

  struct Impl;
  explicit Scheduler(std::unique_ptr<Impl> impl);

 private:
  friend class SchedulerPlugin;
  std::unique_ptr<Impl> impl_;
};

// A loaded scheduler plugin file; the counterpart of CompressorPlugin (same ABI-table structure, same errors).
class SchedulerPlugin : public std::enable_shared_from_this<SchedulerPlugin> {
 public:
  // dlopens `path` and validates what it exports; throws PluginError naming the file and the reason.
  static std::shared_ptr<const SchedulerPlugin> open(const std::filesystem::path& path, std::string origin = "path",
                                                     std::vector<std::filesystem::path> shadowed = {});
  // The scheduler ABI versions this build loads, newest first.
  static std::vector<uint32_t> supportedAbiVersions();

  const PluginInfo& info() const noexcept;

  // Calls init with `params` and get_caps; throws the terse::Error matching a failed status with the plugin's message.
  std::unique_ptr<Scheduler> instantiate(const Params& params = {}) const;

  struct Impl;
  explicit SchedulerPlugin(std::unique_ptr<Impl> impl);
  ~SchedulerPlugin();

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace terse
