#include "core/plugin/scheduler.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/common/error.h"
#include "core/common/log.h"
#include "core/common/watchdog.h"
#include "core/plugin/plugin_support.h"
#include "terse/scheduler_v1.h"

namespace terse {
namespace {

// The struct the instance drives: the newest scheduler ABI this build knows (see compressor_plugin.cc).
using SchedulerApi = terse_scheduler_v1;
using AdaptFn = SchedulerApi (*)(const void* symbol, const std::string& prefix);

struct AbiRow {
  uint32_t version;
  const char* symbol;
  AdaptFn adapt;
};

SchedulerApi adaptV1(const void* symbol, const std::string& prefix) {
  using A = SchedulerApi;
  return detail::readPluginStruct<A>(symbol, TERSE_SCHEDULER_ABI_V1, TERSE_SCHEDULER_PLUGIN_V1_SYMBOL, prefix,
                                     {{"init", [](const A& a) { return a.init != nullptr; }},
                                      {"finalize", [](const A& a) { return a.finalize != nullptr; }},
                                      {"get_caps", [](const A& a) { return a.get_caps != nullptr; }},
                                      {"partition", [](const A& a) { return a.partition != nullptr; }},
                                      {"enqueue", [](const A& a) { return a.enqueue != nullptr; }},
                                      {"next", [](const A& a) { return a.next != nullptr; }},
                                      {"on_complete", [](const A& a) { return a.on_complete != nullptr; }}});
}

// Newest first.
constexpr AbiRow kAbis[] = {
    {TERSE_SCHEDULER_ABI_V1, TERSE_SCHEDULER_PLUGIN_V1_SYMBOL, &adaptV1},
};

// A partition answer that would cut one tensor into more chunks than this is treated as a broken plugin: it would
// only cost memory and per-collective latency, and a chunk_numel of 1 on a large layer is almost surely a bug.
constexpr uint64_t kMaxChunksPerTensor = uint64_t{1} << 20;

enum class ChunkState { kPartitioned, kPending, kInFlight, kDone };

std::string_view stateName(ChunkState s) {
  switch (s) {
    case ChunkState::kPartitioned:
      return "partitioned but not enqueued";
    case ChunkState::kPending:
      return "pending";
    case ChunkState::kInFlight:
      return "already in flight";
    case ChunkState::kDone:
      return "already completed";
  }
  return "?";
}

uint64_t saturatingAdd(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max() : a + b;
}

terse_chunk_v1 toAbi(const Chunk& c) {
  terse_chunk_v1 v{};
  v.chunk_id = c.chunk_id;
  v.tensor_id = c.tensor_id;
  v.step = c.step;
  v.offset = c.offset;
  v.numel = c.numel;
  v.bytes = c.bytes;
  v.wire_bytes = c.wire_bytes;
  v.layer_index = c.layer_index;
  v.chunk_index = c.chunk_index;
  return v;
}

}  // namespace

struct SchedulerPlugin::Impl {
  std::shared_ptr<detail::SharedLibrary> lib;
  SchedulerApi api{};
  terse_resolved_params_fn_v1 resolved_params = nullptr;  // optional (terse/resolved_params_v1.h)
  PluginInfo info;
  std::string label;
};

struct Scheduler::Impl {
  Impl(std::shared_ptr<const SchedulerPlugin> p, const SchedulerPlugin::Impl& pi)
      : plugin(std::move(p)),
        api(pi.api),
        resolved_params(pi.resolved_params),
        info(pi.info),
        label(pi.label),
        host(pi.label),
        watch_label(watchdog::intern(pi.label)) {}

  struct Entry {
    Chunk chunk;
    ChunkState state = ChunkState::kPartitioned;
    uint64_t group = 0;  // valid while in flight
  };
  struct TensorChunks {
    uint64_t first_id = 0;
    uint64_t count = 0;
  };
  struct Group {
    uint64_t count = 0;
    uint64_t wire_bytes = 0;  // reserved credit
  };

  std::shared_ptr<const SchedulerPlugin> plugin;  // keeps the file mapped; api, info, label point into it
  const SchedulerApi& api;
  terse_resolved_params_fn_v1 resolved_params;
  const PluginInfo& info;
  const std::string& label;
  detail::HostBinding host;
  const char* watch_label;  // label as the watchdog and the crash handler name it (watchdog::intern)
  void* ctx = nullptr;
  SchedulerCaps caps;

  // Runs one plugin call under the watchdog (core/common/watchdog.h). A scheduler does not know its rank: the crash
  // handler falls back to the process's.
  template <class F>
  terse_status_v1 watched(const char* what, uint64_t tensor, F&& f) {
    const watchdog::WatchedCall mark(watch_label, what, tensor, -1);
    return f();
  }

  // The step's books. Chunk ids are indices into `chunks`, so ids are 0.. in partition order and lookups are O(1).
  uint64_t step = 0;
  bool fresh = true;  // no step has started yet: beginStep may pick any step
  bool all_enqueued = false;
  std::vector<Entry> chunks;
  std::unordered_map<uint64_t, TensorChunks> tensors;  // partitioned this step, by tensor id
  std::unordered_map<uint64_t, Group> groups;          // in flight, by group number
  uint64_t next_group = 0;
  std::size_t partitioned = 0;  // partitioned, not enqueued
  std::size_t pending = 0;
  std::size_t in_flight = 0;
  uint64_t bytes_in_flight = 0;
  std::vector<uint64_t> ids;  // next's output buffer, reused

  // Set by a failed plugin call or a contract violation; every later call throws it again.
  std::string broken;

  void checkUsable() const {
    if (!broken.empty()) {
      TERSE_THROW(PluginError, label << ": unusable after an earlier failure: " << broken);
    }
  }

  // A contract violation by the plugin: the instance's books and the plugin's no longer agree.
  [[noreturn]] void violation(const std::string& what) {
    broken = what;
    TERSE_THROW(PluginError, label << ": " << what);
  }

  void call(terse_status_v1 status, std::string_view what) {
    if (status == TERSE_OK) return;
    try {
      detail::throwPluginStatus(label, what, status);
    } catch (const Error& e) {
      broken = e.what();
      throw;
    }
  }

  uint64_t creditLeft() const noexcept {
    if (caps.credit_bytes == 0) return std::numeric_limits<uint64_t>::max();
    return bytes_in_flight >= caps.credit_bytes ? 0 : caps.credit_bytes - bytes_in_flight;
  }
};

Scheduler::Scheduler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Scheduler::~Scheduler() {
  detail::clearPluginError();
  const terse_status_v1 status =
      impl_->watched("finalize", watchdog::kNoTensor, [&] { return impl_->api.finalize(impl_->ctx); });
  if (status != TERSE_OK) {
    TERSE_LOG(LogLevel::kWarn, impl_->label << ": finalize failed [" << detail::statusName(status)
                                            << "]: " << detail::takePluginError());
  }
}

const PluginInfo& Scheduler::plugin() const noexcept {
  return impl_->info;
}
const SchedulerCaps& Scheduler::caps() const noexcept {
  return impl_->caps;
}
std::optional<Params> Scheduler::resolvedParams() const {
  return detail::queryResolvedParams(impl_->resolved_params, impl_->ctx, impl_->label);
}
uint64_t Scheduler::step() const noexcept {
  return impl_->step;
}
bool Scheduler::allEnqueued() const noexcept {
  return impl_->all_enqueued;
}
std::size_t Scheduler::pendingChunks() const noexcept {
  return impl_->pending;
}
std::size_t Scheduler::inFlightChunks() const noexcept {
  return impl_->in_flight;
}
uint64_t Scheduler::bytesInFlight() const noexcept {
  return impl_->bytes_in_flight;
}
uint64_t Scheduler::creditLeft() const noexcept {
  return impl_->creditLeft();
}

int Scheduler::minPendingLayer() const noexcept {
  int layer = -1;
  if (impl_->pending == 0) return layer;
  for (const auto& e : impl_->chunks)
    if (e.state == ChunkState::kPending && (layer < 0 || e.chunk.layer_index < layer)) layer = e.chunk.layer_index;
  return layer;
}

bool Scheduler::stepDone() const noexcept {
  const Impl& s = *impl_;
  return s.all_enqueued && s.partitioned == 0 && s.pending == 0 && s.in_flight == 0;
}

void Scheduler::beginStep(uint64_t step) {
  Impl& s = *impl_;
  s.checkUsable();
  TERSE_CHECK(s.partitioned == 0 && s.pending == 0 && s.in_flight == 0, InvalidArgument,
              s.label << ": beginStep(" << step << ") while step " << s.step << " still has " << s.partitioned
                      << " chunks not enqueued, " << s.pending << " pending and " << s.in_flight << " in flight");
  TERSE_CHECK(s.fresh || step > s.step, InvalidArgument,
              s.label << ": beginStep(" << step << ") does not advance past step " << s.step);
  s.step = step;
  s.fresh = false;
  s.all_enqueued = false;
  s.chunks.clear();
  s.tensors.clear();
  s.groups.clear();
  s.next_group = 0;
}

std::vector<Chunk> Scheduler::partition(const SchedTensor& tensor) {
  Impl& s = *impl_;
  s.checkUsable();
  TERSE_CHECK(!s.all_enqueued, InvalidArgument,
              s.label << ": partition of tensor " << tensor.tensor_id << " after markAllEnqueued for step " << s.step);
  TERSE_CHECK(tensor.step == s.step, InvalidArgument,
              s.label << ": tensor " << tensor.tensor_id << " is for step " << tensor.step << ", the current step is "
                      << s.step << " (call beginStep)");
  TERSE_CHECK(isValidDType(static_cast<int32_t>(tensor.dtype)), InvalidArgument,
              s.label << ": tensor " << tensor.tensor_id << " has an unknown dtype value "
                      << static_cast<int32_t>(tensor.dtype));
  TERSE_CHECK(tensor.num_layers >= 1 && tensor.layer_index >= 0 && tensor.layer_index < tensor.num_layers,
              InvalidArgument,
              s.label << ": tensor " << tensor.tensor_id << " has layer_index " << tensor.layer_index << " outside 0.."
                      << tensor.num_layers - 1);
  TERSE_CHECK(s.tensors.count(tensor.tensor_id) == 0, InvalidArgument,
              s.label << ": tensor " << tensor.tensor_id << " partitioned twice in step " << s.step);
  const uint64_t esize = dtypeSize(tensor.dtype);
  TERSE_CHECK(tensor.numel <= std::numeric_limits<uint64_t>::max() / esize, InvalidArgument,
              s.label << ": tensor " << tensor.tensor_id << " numel " << tensor.numel << " overflows its byte size");

  terse_sched_tensor_v1 abi{};
  abi.struct_size = sizeof abi;
  abi.dtype = static_cast<terse_dtype_v1>(tensor.dtype);
  abi.tensor_id = tensor.tensor_id;
  abi.numel = tensor.numel;
  abi.bytes = tensor.numel * esize;
  abi.step = tensor.step;
  abi.layer_index = tensor.layer_index;
  abi.num_layers = tensor.num_layers;
  uint64_t chunk_numel = 0;
  detail::clearPluginError();
  s.call(s.watched("partition", tensor.tensor_id, [&] { return s.api.partition(s.ctx, &abi, &chunk_numel); }),
         "partition");

  // 0 or a slice at least the tensor's size: the whole tensor; an empty tensor is still one (empty) chunk so that its
  // completion is observable like any other tensor's.
  if (chunk_numel == 0 || chunk_numel >= tensor.numel) chunk_numel = tensor.numel;
  const uint64_t asked = chunk_numel;
  // A matrix is cut at whole rows, so that each chunk is a matrix too (chunkTensorInfo): a chunk cut mid-row is a
  // vector, which PowerSGD cannot factor and sent whole (a 512 KiB chunk of a 256x784 layer as raw f32).
  // A row longer than the chunk is cut as asked: a single row is no matrix worth factoring either, and a whole row
  // would take away the preemption granularity the scheduler chose.
  if (tensor.row_numel > 1 && chunk_numel >= tensor.row_numel && chunk_numel < tensor.numel &&
      tensor.numel % tensor.row_numel == 0)
    chunk_numel = chunk_numel / tensor.row_numel * tensor.row_numel;
  const uint64_t count = tensor.numel == 0 ? 1 : (tensor.numel + chunk_numel - 1) / chunk_numel;
  if (count > kMaxChunksPerTensor) {
    std::ostringstream o;
    o << "partition answered chunk_numel " << asked << " for tensor " << tensor.tensor_id << " of numel "
      << tensor.numel;
    if (asked != chunk_numel) o << " (" << chunk_numel << " in whole rows of " << tensor.row_numel << ")";
    o << ": " << count << " chunks, above the limit of " << kMaxChunksPerTensor;
    s.violation(o.str());
  }
  std::vector<Chunk> out;
  out.reserve(count);
  const uint64_t first_id = s.chunks.size();
  for (uint64_t i = 0; i < count; ++i) {
    Chunk c;
    c.chunk_id = first_id + i;
    c.tensor_id = tensor.tensor_id;
    c.step = tensor.step;
    c.offset = i * chunk_numel;
    c.numel = tensor.numel == 0 ? 0 : std::min(chunk_numel, tensor.numel - c.offset);
    c.bytes = c.numel * esize;
    c.wire_bytes = c.bytes;
    c.layer_index = tensor.layer_index;
    c.chunk_index = static_cast<int>(i);
    out.push_back(c);
    s.chunks.push_back(Impl::Entry{c, ChunkState::kPartitioned, 0});
  }
  s.tensors.emplace(tensor.tensor_id, Impl::TensorChunks{first_id, count});
  s.partitioned += count;
  return out;
}

void Scheduler::enqueue(std::span<const Chunk> chunks) {
  Impl& s = *impl_;
  s.checkUsable();
  TERSE_CHECK(!chunks.empty(), InvalidArgument, s.label << ": enqueue of no chunks");
  auto it = s.tensors.find(chunks.front().tensor_id);
  TERSE_CHECK(it != s.tensors.end(), InvalidArgument,
              s.label << ": enqueue of tensor " << chunks.front().tensor_id << ", which was not partitioned in step "
                      << s.step);
  const Impl::TensorChunks tc = it->second;
  TERSE_CHECK(chunks.size() == tc.count, InvalidArgument,
              s.label << ": enqueue of " << chunks.size() << " chunks of tensor " << chunks.front().tensor_id
                      << ", partition made " << tc.count << " (enqueue all of a tensor's chunks at once)");
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    const uint64_t id = tc.first_id + i;
    const Chunk& made = s.chunks[id].chunk;
    const bool same = c.chunk_id == made.chunk_id && c.tensor_id == made.tensor_id && c.step == made.step &&
                      c.offset == made.offset && c.numel == made.numel && c.bytes == made.bytes &&
                      c.layer_index == made.layer_index && c.chunk_index == made.chunk_index;
    TERSE_CHECK(same, InvalidArgument,
                s.label << ": enqueue: chunk " << i << " (id " << c.chunk_id << ") is not the chunk partition made for "
                        << "tensor " << made.tensor_id << " at that position (id " << made.chunk_id << ")");
    TERSE_CHECK(s.chunks[id].state == ChunkState::kPartitioned, InvalidArgument,
                s.label << ": enqueue: chunk " << id << " of tensor " << made.tensor_id << " is "
                        << stateName(s.chunks[id].state));
  }
  std::vector<terse_chunk_v1> abi;
  abi.reserve(chunks.size());
  for (const Chunk& c : chunks) abi.push_back(toAbi(c));
  detail::clearPluginError();
  s.call(s.watched("enqueue", watchdog::kNoTensor, [&] { return s.api.enqueue(s.ctx, abi.data(), abi.size()); }),
         "enqueue");
  for (const Chunk& c : chunks) {
    auto& e = s.chunks[c.chunk_id];
    e.chunk.wire_bytes = c.wire_bytes;
    e.state = ChunkState::kPending;
  }
  s.partitioned -= chunks.size();
  s.pending += chunks.size();
}

void Scheduler::markAllEnqueued() {
  Impl& s = *impl_;
  s.checkUsable();
  TERSE_CHECK(
      s.partitioned == 0, InvalidArgument,
      s.label << ": markAllEnqueued with " << s.partitioned << " partitioned chunks not enqueued in step " << s.step);
  s.all_enqueued = true;
}

std::vector<Chunk> Scheduler::next() {
  Impl& s = *impl_;
  s.checkUsable();
  if (s.pending == 0) return {};
  const uint64_t credit_left = s.creditLeft();
  const bool nothing_in_flight = s.in_flight == 0;
  const uint32_t flags =
      (s.all_enqueued ? TERSE_SCHED_ALL_ENQUEUED : 0u) | (nothing_in_flight ? TERSE_SCHED_NOTHING_IN_FLIGHT : 0u);
  s.ids.assign(s.pending, 0);
  uint64_t count = 0;
  detail::clearPluginError();
  s.call(s.watched("next", watchdog::kNoTensor,
                   [&] { return s.api.next(s.ctx, credit_left, flags, s.ids.data(), s.ids.size(), &count); }),
         "next");

  std::ostringstream o;
  if (count > s.ids.size()) {
    o << "next returned count " << count << ", above the capacity " << s.ids.size() << " it was given";
    s.violation(o.str());
  }
  if (count == 0) {
    if (s.all_enqueued && nothing_in_flight) {
      o << "stall: next returned no chunks in step " << s.step << " with " << s.pending
        << " pending, every tensor enqueued and nothing in flight";
      s.violation(o.str());
    }
    return {};
  }
  std::unordered_set<uint64_t> seen;
  uint64_t group_bytes = 0;
  std::vector<Chunk> group;
  group.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t id = s.ids[i];
    if (id >= s.chunks.size()) {
      o << "next returned chunk id " << id << ", which the core never assigned in step " << s.step;
      s.violation(o.str());
    }
    if (!seen.insert(id).second) {
      o << "next returned chunk id " << id << " twice in one group";
      s.violation(o.str());
    }
    const auto& e = s.chunks[id];
    if (e.state != ChunkState::kPending) {
      o << "next returned chunk id " << id << " (tensor " << e.chunk.tensor_id << "), which is " << stateName(e.state);
      s.violation(o.str());
    }
    group_bytes = saturatingAdd(group_bytes, e.chunk.wire_bytes);
    group.push_back(e.chunk);
  }
  if (!nothing_in_flight && group_bytes > credit_left) {
    o << "next returned a group of " << count << " chunks with " << group_bytes
      << " wire bytes, above the credit left (" << credit_left << " of " << s.caps.credit_bytes << ") while "
      << s.in_flight << " chunks are in flight";
    s.violation(o.str());
  }
  const uint64_t g = s.next_group++;
  for (const Chunk& c : group) {
    auto& e = s.chunks[c.chunk_id];
    e.state = ChunkState::kInFlight;
    e.group = g;
  }
  s.groups.emplace(g, Impl::Group{count, group_bytes});
  s.pending -= count;
  s.in_flight += count;
  s.bytes_in_flight = saturatingAdd(s.bytes_in_flight, group_bytes);
  return group;
}

void Scheduler::onComplete(std::span<const uint64_t> chunk_ids, uint64_t wire_bytes) {
  Impl& s = *impl_;
  s.checkUsable();
  TERSE_CHECK(!chunk_ids.empty(), InvalidArgument, s.label << ": onComplete of no chunks");
  std::unordered_set<uint64_t> seen;
  uint64_t group = 0;
  for (std::size_t i = 0; i < chunk_ids.size(); ++i) {
    const uint64_t id = chunk_ids[i];
    TERSE_CHECK(id < s.chunks.size() && s.chunks[id].state == ChunkState::kInFlight, InvalidArgument,
                s.label << ": onComplete: chunk " << id << " is not in flight ("
                        << (id < s.chunks.size() ? stateName(s.chunks[id].state) : "unknown id") << ")");
    TERSE_CHECK(seen.insert(id).second, InvalidArgument, s.label << ": onComplete: chunk " << id << " listed twice");
    if (i == 0) group = s.chunks[id].group;
    TERSE_CHECK(
        s.chunks[id].group == group, InvalidArgument,
        s.label << ": onComplete: chunks " << chunk_ids[0] << " and " << id << " were handed out in different groups");
  }
  const Impl::Group g = s.groups.at(group);
  TERSE_CHECK(chunk_ids.size() == g.count, InvalidArgument,
              s.label << ": onComplete of " << chunk_ids.size() << " chunks, but their group has " << g.count);
  TERSE_CHECK(
      wire_bytes <= g.wire_bytes, InvalidArgument,
      s.label << ": onComplete reports " << wire_bytes << " wire bytes for a group of at most " << g.wire_bytes);
  detail::clearPluginError();
  s.call(s.watched("on_complete", watchdog::kNoTensor,
                   [&] { return s.api.on_complete(s.ctx, chunk_ids.data(), chunk_ids.size(), wire_bytes); }),
         "on_complete");
  for (uint64_t id : chunk_ids) s.chunks[id].state = ChunkState::kDone;
  s.groups.erase(group);
  s.in_flight -= chunk_ids.size();
  s.bytes_in_flight -= g.wire_bytes;
}

SchedulerPlugin::SchedulerPlugin(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SchedulerPlugin::~SchedulerPlugin() = default;

const PluginInfo& SchedulerPlugin::info() const noexcept {
  return impl_->info;
}

std::vector<uint32_t> SchedulerPlugin::supportedAbiVersions() {
  std::vector<uint32_t> out;
  for (const auto& row : kAbis) out.push_back(row.version);
  return out;
}

std::shared_ptr<const SchedulerPlugin> SchedulerPlugin::open(const std::filesystem::path& path, std::string origin,
                                                             std::vector<std::filesystem::path> shadowed) {
  auto lib =
      detail::SharedLibrary::open(detail::canonicalPluginPath(path, PluginKind::kScheduler), PluginKind::kScheduler);
  const std::filesystem::path file = lib->path();
  const std::string prefix = detail::loadErrorPrefix(PluginKind::kScheduler, file);
  for (const auto& row : kAbis) {
    const void* symbol = lib->symbol(row.symbol);
    if (symbol == nullptr) continue;
    auto impl = std::make_unique<Impl>();
    impl->api = row.adapt(symbol, prefix);
    impl->resolved_params = detail::resolvedParamsEntry(*lib, PluginKind::kScheduler);
    impl->info.optimized = detail::builtOptimized(*lib, PluginKind::kScheduler);
    impl->lib = std::move(lib);
    impl->info.kind = PluginKind::kScheduler;
    impl->info.name = impl->api.name;
    impl->info.description = impl->api.description;
    impl->info.version = impl->api.version;
    impl->info.abi_version = row.version;
    impl->info.path = file;
    impl->info.origin = std::move(origin);
    impl->info.shadowed = std::move(shadowed);
    impl->label = detail::pluginLabel(impl->info);
    return std::make_shared<SchedulerPlugin>(std::move(impl));
  }
  const auto versions = supportedAbiVersions();
  detail::throwNoPluginSymbol(*lib, PluginKind::kScheduler, versions);
}

std::unique_ptr<Scheduler> SchedulerPlugin::instantiate(const Params& params) const {
  auto impl = std::make_unique<Scheduler::Impl>(shared_from_this(), *impl_);
  const auto abi_params = detail::toAbiParams(params, impl->label);
  detail::clearPluginError();
  const terse_status_v1 status = impl->watched("init", watchdog::kNoTensor, [&] {
    return impl->api.init(abi_params.data(), abi_params.size(), impl->host.host(), &impl->ctx);
  });
  if (status != TERSE_OK) detail::throwPluginStatus(impl->label, "init", status);
  // From here on the instance owns ctx: the Scheduler's destructor finalizes it even if get_caps fails below.
  auto scheduler = std::make_unique<Scheduler>(std::move(impl));
  Scheduler::Impl& s = *scheduler->impl_;
  terse_scheduler_caps_v1 raw{};
  raw.struct_size = sizeof raw;
  detail::clearPluginError();
  const terse_status_v1 caps_status =
      s.watched("get_caps", watchdog::kNoTensor, [&] { return s.api.get_caps(s.ctx, &raw); });
  if (caps_status != TERSE_OK) detail::throwPluginStatus(s.label, "get_caps", caps_status);
  TERSE_CHECK(raw.flags == 0, PluginError,
              s.label << ": invalid caps: flags = " << raw.flags << ", reserved in v1 and must be 0");
  s.caps.credit_bytes = raw.credit_bytes;
  return scheduler;
}

}  // namespace terse
