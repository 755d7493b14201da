// One parameter-server shard (param_server_shard.h): validates each worker's requests, holds them while SSP says so,
// applies pushes as SGD steps with their staleness, serves pulls, keeps the workers' clocks and liveness, and takes
// the snapshots evaluation reads.
#include "core/train/param_server_shard.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/common/error.h"
#include "core/common/log.h"
#include "core/common/runtime.h"
#include "core/compress/plugin_codec.h"
#include "core/train/param_server_detail.h"
#include "core/train/sgd_math.h"

namespace terse::train {

// The runtime's clock: simulated time in a simulation (core/common/runtime.h).
using Clock = rt::Clock;

namespace {
// mine > slowest + s, saturating: a huge bound must not wrap around into a tiny one.
bool aheadOf(uint64_t s, uint64_t mine, uint64_t slowest) {
  return s != kNoStalenessBound && mine > slowest && mine - slowest > s;
}
}  // namespace

// One worker's receive slot: the posted receive, or the request held by SSP, and the worker's clocks.
struct ParamServerShard::Slot {
  std::vector<std::byte> buffer;
  comm::Request recv;
  bool posted = false;
  bool held = false;  // buffer holds a request SSP delays; the worker's next frames wait in the transport
  uint64_t held_bytes = 0;
  bool gone = false;  // bye or dead
  bool dead = false;
  bool lost = false;    // its connection failed (an expendable peer, core/comm/tcp/transport.h): nothing more to read
  uint64_t pulled = 0;  // 1 + the step of the last pull (0: none yet)
  uint64_t completed = 0;  // steps completed (kClock)
  Clock::time_point last_active = rt::now();
};

ParamServerShard::ParamServerShard(comm::Transport& transport, PsPlan plan, int shard, int num_workers,
                                   std::vector<float> initial, ServerOptions options)
    : transport_(transport), plan_(std::move(plan)), shard_(shard), num_workers_(num_workers), options_(options) {
  TERSE_CHECK(shard >= 0 && shard < plan_.num_shards, InvalidArgument,
              "parameter server: shard " << shard << " outside 0.." << plan_.num_shards - 1);
  TERSE_CHECK(num_workers >= 1, InvalidArgument, "parameter server: num_workers must be >= 1, got " << num_workers);
  TERSE_CHECK(transport.size() == plan_.num_shards + num_workers, InvalidArgument,
              "parameter server: transport has " << transport.size() << " ranks, the job needs " << plan_.num_shards
                                                 << " shards + " << num_workers << " workers");
  TERSE_CHECK(
      transport.rank() == serverRank(shard), InvalidArgument,
      "parameter server: shard " << shard << " must run on rank " << serverRank(shard) << ", not " << transport.rank());
  TERSE_CHECK(options_.lr > 0 && std::isfinite(options_.lr), InvalidArgument,
              "parameter server: lr must be positive, got " << options_.lr);
  ps_detail::checkCompressor(options_.compressor);
  const auto [b, e] = plan_.ranges[static_cast<std::size_t>(shard)];
  begin_ = b;
  TERSE_CHECK(initial.size() == e - b, InvalidArgument,
              "parameter server: shard " << shard << " owns " << e - b << " elements, got " << initial.size());
  TERSE_CHECK(options_.sgd.momentum >= 0 && options_.sgd.momentum < 1 && options_.sgd.weight_decay >= 0 &&
                  (!options_.sgd.nesterov || options_.sgd.momentum > 0),
              InvalidArgument,
              "parameter server: momentum must be in [0, 1) (Nesterov needs > 0) and weight decay >= 0, got momentum "
                  << options_.sgd.momentum << ", weight decay " << options_.sgd.weight_decay);
  params_ = std::move(initial);
  if (options_.sgd.momentum > 0) momentum_.assign(params_.size(), 0.0f);
  if (options_.sgd.adagrad) sum_sq_.assign(params_.size(), 0.0f);
  const auto& ids = plan_.shard_pieces[static_cast<std::size_t>(shard)];
  piece_versions_.assign(ids.size(), 0);
  uint64_t max_payload = 0, max_numel = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    local_[ids[i]] = i;
    max_numel = std::max(max_numel, plan_.pieces[ids[i]].numel);
  }
  // One decoder per (worker, piece): a stateful decoder's state follows one encoder's stream (as each rank's
  // decompress state does in the allgather path), so sharing one across workers would mix their histories. Costs
  // W x the compressor's state; stateless plugins keep none. Their workspaces are one: this thread calls every codec
  // of the shard, push decoders and pull codecs alike, one at a time (a top-k's is 131 KB or more a codec, which at
  // 64 workers was hundreds of MB of scratch). A workspace is undefined when a step starts, and no codec here both
  // encodes and decodes, so none needs what its own earlier call of a step left there.
  const auto workspace = std::make_shared<SharedWorkspace>();
  if (options_.compressor) {
    for (int w = 0; w < num_workers; ++w)
      for (uint64_t id : ids) {
        codecs_.push_back(makePluginCodec(options_.compressor, ps_detail::pieceInfo(plan_.pieces[id], w, num_workers),
                                          options_.run_seed, workspace));
        max_payload = std::max(max_payload, codecs_.back()->sizes(0).max_output_bytes);
      }
  } else {
    max_payload = max_numel * sizeof(float);
  }
  // Row-sparse pieces: a push of every row the piece overlaps, and one pull request naming all of them.
  uint64_t row_pull = 0;
  for (uint64_t id : ids) {
    const PsPiece& p = plan_.pieces[id];
    if (!isRowSparse(plan_, p)) continue;
    const auto [first, last] = pieceRows(plan_, p);
    max_payload = std::max(max_payload, kPsRowPushHeaderBytes + 4 * (last - first) + 4 * p.numel);
    row_pull += 4 + 4 * (last - first);
  }
  max_payload = std::max(max_payload, row_pull);
  grad_.resize(static_cast<std::size_t>(max_numel));
  if (options_.pull_compressor) {
    ps_detail::checkCompressor(options_.pull_compressor, "pull compressor");
    for (uint64_t id : ids)
      TERSE_CHECK(!isRowSparse(plan_, plan_.pieces[id]), InvalidArgument,
                  "parameter server: a pull compressor serves dense tensors only; tensor "
                      << plan_.pieces[id].tensor << " is row-sparse (its rows travel as they are)");
    pull_max_payloads_.assign(ids.size(), 0);
    const bool stateful = options_.pull_compressor->caps(DType::kF32).stateful;
    const uint64_t seed = ps_detail::pullCodecSeed(options_.run_seed);
    for (int w = 0; w < num_workers; ++w)
      for (std::size_t i = 0; i < ids.size(); ++i) {
        const TensorInfo info = ps_detail::pieceInfo(plan_.pieces[ids[i]], w, num_workers);
        pull_encoders_.push_back(makePluginCodec(options_.pull_compressor, info, seed, workspace));
        if (stateful || w == 0)
          pull_mirrors_.push_back(makePluginCodec(options_.pull_compressor, info, seed, workspace));
        pull_max_payloads_[i] = std::max(pull_max_payloads_[i], pull_encoders_.back()->sizes(0).max_output_bytes);
      }
    delta_frame_bytes_ = kPsReplyHeaderBytes + psDeltaPullMaxBodyBytes(pull_max_payloads_);
    replicas_.resize(static_cast<std::size_t>(num_workers));
    has_replica_.assign(static_cast<std::size_t>(num_workers), false);
  }
  // A little slack so a slightly-too-long push still arrives whole and is refused with the precise reason; a longer
  // one fails the receive itself (also refused, with the transport's message).
  max_request_bytes_ = kPsRequestHeaderBytes + max_payload + 64;
  pull_frame_bytes_ = psMaxReplyBytes(plan_, shard);
  for (int w = 0; w < num_workers; ++w) {
    slots_.push_back(std::make_unique<Slot>());
    slots_.back()->buffer.resize(static_cast<std::size_t>(max_request_bytes_));
  }
  stats_.bytes_in.assign(static_cast<std::size_t>(num_workers), 0);
  stats_.bytes_out.assign(static_cast<std::size_t>(num_workers), 0);
  stats_.dead.assign(static_cast<std::size_t>(num_workers), false);
  stats_.dead_at.assign(static_cast<std::size_t>(num_workers), {});
}

ParamServerShard::~ParamServerShard() = default;

void ParamServerShard::maybeSnapshot() {
  const auto& points = options_.snapshot_steps;
  if (next_snapshot_ >= points.size()) return;
  uint64_t sum = 0;
  for (const auto& s : slots_) sum += s->completed;
  const uint64_t global = sum / static_cast<uint64_t>(num_workers_);
  if (global < points[next_snapshot_]) return;  // every clock comes here: no copy until a point is due
  std::vector<uint64_t> completed;
  for (const auto& s : slots_) completed.push_back(s->completed);
  bool taken = false;
  {
    std::lock_guard lock(mutex_);
    // One copy serves every point it passed at once (async workers may cross several between two clocks).
    while (next_snapshot_ < points.size() && global >= points[next_snapshot_]) {
      snapshots_[points[next_snapshot_]] = ShardSnapshot{points[next_snapshot_], params_, rt::now(), completed, stats_};
      ++next_snapshot_;
      taken = true;
    }
  }
  if (taken) snapshot_cv_.notify_all();
}

std::optional<ShardSnapshot> ParamServerShard::takeSnapshot(uint64_t step, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  const auto ready = [&] { return snapshots_.count(step) > 0 || finished_; };
  if (timeout == std::chrono::milliseconds::max()) {
    snapshot_cv_.wait(lock, ready);
  } else {
    snapshot_cv_.waitFor(lock, timeout, ready);
  }
  if (snapshots_.count(step) == 0) return std::nullopt;
  auto node = snapshots_.extract(step);
  return std::move(node.mapped());
}

bool ParamServerShard::finished() const {
  std::lock_guard lock(mutex_);
  return finished_;
}

bool ParamServerShard::live(int worker, Clock::time_point now) const {
  const Slot& s = *slots_[static_cast<std::size_t>(worker)];
  if (s.gone) return false;
  return s.held || now - s.last_active <= options_.worker_timeout;
}

uint64_t ParamServerShard::minCompleted() const {
  uint64_t m = std::numeric_limits<uint64_t>::max();
  for (const auto& s : slots_)
    if (!s->gone) m = std::min(m, s->completed);
  return m;
}

uint64_t ParamServerShard::minPulled() const {
  uint64_t m = std::numeric_limits<uint64_t>::max();
  for (const auto& s : slots_)
    if (!s->gone) m = std::min(m, s->pulled);
  return m;
}

void ParamServerShard::reply(int worker, const PsReplyHeader& h, std::span<const std::byte> body) {
  auto frame = std::make_shared<std::vector<std::byte>>(kPsReplyHeaderBytes + body.size());
  PsReplyHeader hh = h;
  hh.payload_bytes = body.size();
  encodePsReply(hh, std::span<std::byte, kPsReplyHeaderBytes>(frame->data(), kPsReplyHeaderBytes));
  if (!body.empty()) std::memcpy(frame->data() + kPsReplyHeaderBytes, body.data(), body.size());
  const std::size_t n = frame->size();
  send(worker, std::move(frame), n, h.piece);
}

void ParamServerShard::send(int worker, std::shared_ptr<const std::vector<std::byte>> frame, std::size_t n,
                            uint64_t piece) {
  const comm::FrameMeta meta{comm::OpKind::kP2P, kPsReplyTag, piece};
  // Not waited on: the replies to every worker share the shard's NIC as the link model says, instead of taking turns
  // at one reply's latency and transfer each (a step of W workers took W of them). The frame lives in `sending_` until
  // the send completed (collectSends); a worker's replies still arrive in order (one tag, one link).
  comm::Request request;
  try {
    request =
        transport_.isend(workerRank(plan_.num_shards, worker), meta, std::span<const std::byte>(frame->data(), n));
  } catch (const comm::CommError& e) {
    if (transport_.aborted()) throw;
    lose(worker, e.what());  // the worker's connection alone failed: it is dropped, the others go on
    return;
  }
  {
    // Counted when sent, as the transport counts it: a send that fails later was still counted by both.
    std::lock_guard lock(mutex_);
    stats_.bytes_out[static_cast<std::size_t>(worker)] += comm::frameWireBytes(n);
  }
  sending_.push_back(Sending{worker, std::move(frame), std::move(request)});
}

void ParamServerShard::releasePull() {
  if (last_pull_.frame && last_pull_.frame.use_count() == 1) spare_.push_back(std::move(last_pull_.frame));
  last_pull_ = {};
}

void ParamServerShard::collectSends() {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < sending_.size(); ++i) {
    Sending& s = sending_[i];
    bool done = false;
    try {
      done = s.request.test();
    } catch (const comm::CommError& e) {
      if (transport_.aborted()) throw;
      lose(s.worker, e.what());
      done = true;
    }
    if (done) {
      s.request = {};
      // A pull frame nobody else holds (no other send, not the shared last pull) goes back to its pool.
      if (s.frame.use_count() == 1 && s.frame->size() == pull_frame_bytes_)
        spare_.push_back(std::const_pointer_cast<std::vector<std::byte>>(std::move(s.frame)));
      else if (s.frame.use_count() == 1 && s.frame->size() == delta_frame_bytes_)
        delta_spare_.push_back(std::const_pointer_cast<std::vector<std::byte>>(std::move(s.frame)));
      continue;
    }
    if (kept != i) sending_[kept] = std::move(s);
    ++kept;
  }
  sending_.resize(kept);
}

void ParamServerShard::lose(int worker, const std::string& why) {
  Slot& slot = *slots_[static_cast<std::size_t>(worker)];
  if (slot.lost) return;
  TERSE_LOG(LogLevel::kWarn, "parameter server shard " << shard_ << ": worker " << worker
                                                       << " lost its connection, dropped as dead: " << why);
  const bool was_dead = slot.dead;
  slot.gone = slot.dead = slot.lost = true;
  slot.posted = slot.held = false;
  std::lock_guard lock(mutex_);
  if (!was_dead) {
    stats_.dead[static_cast<std::size_t>(worker)] = true;
    stats_.dead_at[static_cast<std::size_t>(worker)] = rt::now();
  }
}

void ParamServerShard::refuse(int worker, const PsRequestHeader* h, const std::string& why) {
  std::string msg = "parameter server shard " + std::to_string(shard_) + " refused a request from worker " +
                    std::to_string(worker) + ": " + why;
  if (msg.size() > kPsMaxErrorText) msg.resize(kPsMaxErrorText);
  TERSE_LOG(LogLevel::kWarn, msg);
  {
    std::lock_guard lock(mutex_);
    ++stats_.refused;
    stats_.errors.push_back(msg);
  }
  // Ping and bye get no reply (the worker does not wait for one); nor does a request we could not parse when it
  // claimed to be one of those.
  if (h && (h->op == PsOp::kPing || h->op == PsOp::kBye)) return;
  PsReplyHeader r;
  r.status = PsStatus::kError;
  r.step = h ? h->step : 0;
  r.piece = h ? h->piece : 0;
  reply(worker, r, std::as_bytes(std::span<const char>(msg.data(), msg.size())));
}

// Handles the request in slot.buffer. Returns false when SSP holds it (nothing changed).
bool ParamServerShard::process(int worker, Slot& slot) {
  const std::span<const std::byte> frame(slot.buffer.data(), static_cast<std::size_t>(slot.held_bytes));
  PsRequestHeader h;
  try {
    h = decodePsRequest(frame);
  } catch (const Error& e) {
    refuse(worker, nullptr, e.what());
    return true;
  }
  auto ahead = [&](uint64_t mine, uint64_t slowest) { return aheadOf(options_.staleness_bound, mine, slowest); };
  switch (h.op) {
    case PsOp::kPing:
      return true;
    case PsOp::kBye:
      slot.gone = true;
      return true;
    case PsOp::kClock: {
      if (h.step + 1 < slot.completed) {
        refuse(worker, &h,
               "clock for step " + std::to_string(h.step) + " after step " + std::to_string(slot.completed - 1) +
                   " was completed");
        return true;
      }
      slot.completed = std::max(slot.completed, h.step + 1);
      maybeSnapshot();
      reply(worker, PsReplyHeader{PsStatus::kOk, DType::kF32, h.step, 0, 0}, {});
      return true;
    }
    case PsOp::kPull:
    case PsOp::kPullRows: {
      const bool rows = h.op == PsOp::kPullRows;
      if (!rows && h.payload_bytes != 0) {
        refuse(worker, &h, "pull carries " + std::to_string(h.payload_bytes) + " payload bytes, expected 0");
        return true;
      }
      std::vector<std::vector<uint32_t>> ids;
      if (rows) {
        try {
          ids = decodePsRowPull(plan_, shard_, frame.subspan(kPsRequestHeaderBytes));
        } catch (const Error& e) {
          refuse(worker, &h, e.what());
          return true;
        }
      }
      // SSP read condition (Ho et al. 2013): a worker at clock t reads only once every live worker completed t - s.
      if (ahead(h.step, minCompleted())) return false;
      const auto& pieces = plan_.shard_pieces[static_cast<std::size_t>(shard_)];
      const PsReplyHeader r{PsStatus::kOk, h.dtype, h.step, pieces.size(), 0};
      slot.pulled = std::max(slot.pulled, h.step + 1);
      if (options_.pull_compressor) {
        // The worker now holds the parameters as sent: its replica, the base of its next delta pull. Only an f32 pull
        // sends them exactly (a row pull is refused at construction: no row-sparse piece here).
        const auto w = static_cast<std::size_t>(worker);
        has_replica_[w] = h.dtype == DType::kF32;
        if (has_replica_[w])
          replicas_[w] = params_;
        else
          replicas_[w].clear();
      }
      // Workers that pull the same step between the same pushes get the same bytes (every pull of a step in lockstep):
      // one frame serves them all, sent from while it is in flight to each.
      if (!rows && last_pull_.frame && last_pull_.epoch == params_epoch_ && last_pull_.dtype == h.dtype &&
          last_pull_.step == h.step) {
        {
          std::lock_guard lock(mutex_);
          ++stats_.pulls_served;
        }
        send(worker, last_pull_.frame, last_pull_.bytes, r.piece);
        return true;
      }
      const uint64_t n =
          rows ? psRowPullBodyBytes(plan_, shard_, ids, h.dtype) : psPullBodyBytes(plan_, shard_, h.dtype);
      std::shared_ptr<std::vector<std::byte>> out = frameFrom(spare_, pull_frame_bytes_);
      PsReplyHeader hh = r;
      hh.payload_bytes = n;
      encodePsReply(hh, std::span<std::byte, kPsReplyHeaderBytes>(out->data(), kPsReplyHeaderBytes));
      const std::span<std::byte> body(out->data() + kPsReplyHeaderBytes, static_cast<std::size_t>(n));
      {
        std::lock_guard lock(mutex_);
        if (rows)
          encodePsRowPullBody(plan_, shard_, ids, piece_versions_, params_, h.dtype, body);
        else
          encodePsPullBody(piece_versions_, params_, h.dtype, body);
        ++stats_.pulls_served;
      }
      const std::size_t bytes = kPsReplyHeaderBytes + static_cast<std::size_t>(n);
      if (!rows) {
        releasePull();
        last_pull_ = LastPull{out, bytes, params_epoch_, h.dtype, h.step};
      }
      send(worker, std::move(out), bytes, r.piece);
      return true;
    }
    case PsOp::kPullDelta: {
      if (h.payload_bytes != 0) {
        refuse(worker, &h, "delta pull carries " + std::to_string(h.payload_bytes) + " payload bytes, expected 0");
        return true;
      }
      if (!options_.pull_compressor) {
        refuse(worker, &h, "delta pull, but this shard has no pull compressor (parameter_server.pull_compressor)");
        return true;
      }
      if (!has_replica_[static_cast<std::size_t>(worker)]) {
        refuse(worker, &h, "delta pull before a full f32 pull gave the worker the parameters to add it to");
        return true;
      }
      if (ahead(h.step, minCompleted())) return false;  // SSP's read condition, as for a full pull
      slot.pulled = std::max(slot.pulled, h.step + 1);
      processDeltaPull(worker, h);
      return true;
    }
    case PsOp::kPush:
    case PsOp::kPushRows:
      return processPush(worker, slot, h, frame.subspan(kPsRequestHeaderBytes));
  }
  return true;
}

std::shared_ptr<std::vector<std::byte>> ParamServerShard::frameFrom(
    std::vector<std::shared_ptr<std::vector<std::byte>>>& pool, std::size_t bytes) {
  if (pool.empty()) {
    {
      std::lock_guard lock(mutex_);
      ++stats_.pull_frames_allocated;
    }
    return std::make_shared<std::vector<std::byte>>(bytes);
  }
  auto out = std::move(pool.back());
  pool.pop_back();
  return out;
}

void ParamServerShard::processDeltaPull(int worker, const PsRequestHeader& h) {
  const auto& ids = plan_.shard_pieces[static_cast<std::size_t>(shard_)];
  std::vector<float>& replica = replicas_[static_cast<std::size_t>(worker)];
  std::shared_ptr<std::vector<std::byte>> out = frameFrom(delta_spare_, delta_frame_bytes_);
  const std::span<std::byte> body(out->data() + kPsReplyHeaderBytes, out->size() - kPsReplyHeaderBytes);
  uint64_t at = 8 * ids.size();
  std::string failed;
  {
    std::lock_guard lock(mutex_);  // params_ is read here; its only writer is this thread, its readers take the lock
    encodePsPullBody(piece_versions_, {}, DType::kF32, body.first(at));
    for (std::size_t i = 0; i < ids.size() && failed.empty(); ++i) {
      const PsPiece& p = plan_.pieces[ids[i]];
      const std::size_t base = static_cast<std::size_t>(p.flat_begin - begin_);
      const std::size_t codec = static_cast<std::size_t>(worker) * ids.size() + i;
      const std::size_t mirror = pull_mirrors_.size() == pull_encoders_.size() ? codec : i;
      float* d = grad_.data();  // the push decode's scratch: this thread does one at a time
      const auto numel = static_cast<double>(p.numel);
      try {
        uint64_t n = 0;
        {
          // The change and its encode, as error feedback's residual pass is charged inside a push's encode.
          const rt::Kernel kernel({.kind = rt::CostKind::kCompress,
                                   .layer = 0,
                                   .size = numel,
                                   .flops = ps_detail::kCodecFlopsPerElement * numel,
                                   .codec = rt::kPullCodec,
                                   .phase = pull_encoders_[codec]->phaseAt(h.step)});
          for (uint64_t j = 0; j < p.numel; ++j) d[j] = params_[base + j] - replica[base + j];
          n = pull_encoders_[codec]->encode(h.step, 0, d, {}, body.subspan(at + 8, pull_max_payloads_[i]));
        }
        {
          // The worker's decode and add, mirrored (param_server_client.cc does the same two passes).
          const rt::Kernel kernel({.kind = rt::CostKind::kDecompress,
                                   .size = numel,
                                   .flops = ps_detail::kCodecFlopsPerElement * numel,
                                   .codec = rt::kPullCodec,
                                   .phase = pull_mirrors_[mirror]->phaseAt(h.step)});
          pull_mirrors_[mirror]->decode(h.step, body.subspan(at + 8, n), worker, d, false);
          for (uint64_t j = 0; j < p.numel; ++j) replica[base + j] += d[j];
        }
        at += encodePsDeltaPullEntry(body, at, n);
      } catch (const Error& e) {
        failed = "delta pull of piece " + std::to_string(ids[i]) + " failed: " + e.what();
        break;
      }
      // The shard's validation of what its plugin made, not modeled work: no region.
      for (uint64_t j = 0; j < p.numel; ++j)
        if (!std::isfinite(replica[base + j])) {
          failed = "delta pull of piece " + std::to_string(ids[i]) + " decodes to a non-finite value at " +
                   std::to_string(j) + " (pull compressor '" + options_.pull_compressor->plugin().name + "')";
          break;
        }
    }
    if (failed.empty()) {
      // What the copy still lacks, and the checksum the worker compares its copy with. Bookkeeping and validation, not
      // the modeled server's work: no region.
      double residual = 0, norm = 0;
      for (std::size_t j = 0; j < params_.size(); ++j) {
        const double p = params_[j], r = p - replica[j];
        residual += r * r;
        norm += p * p;
      }
      at = encodePsDeltaPullChecksum(body, at, psValuesChecksum(replica));
      ++stats_.pulls_served;
      ++stats_.delta_pulls;
      stats_.pull_residual_sq += residual;
      stats_.pull_params_sq += norm;
    }
  }
  if (!failed.empty()) {
    // The pieces before the failed one were added here but never reach the worker: its replica is dropped, and its
    // next pull must be a full one (the client fails on a refusal anyway).
    replica.clear();
    has_replica_[static_cast<std::size_t>(worker)] = false;
    delta_spare_.push_back(std::move(out));
    refuse(worker, &h, failed);
    return;
  }
  const PsReplyHeader r{PsStatus::kOk, DType::kF32, h.step, ids.size(), at};
  encodePsReply(r, std::span<std::byte, kPsReplyHeaderBytes>(out->data(), kPsReplyHeaderBytes));
  send(worker, std::move(out), kPsReplyHeaderBytes + static_cast<std::size_t>(at), r.piece);
}

bool ParamServerShard::processPush(int worker, Slot& slot, const PsRequestHeader& h,
                                   std::span<const std::byte> payload) {
  auto it = local_.find(h.piece);
  if (it == local_.end()) {
    refuse(worker, &h,
           "push for piece " + std::to_string(h.piece) + ", which this shard does not own (unknown tensor)");
    return true;
  }
  const std::size_t li = it->second;
  const PsPiece& p = plan_.pieces[h.piece];
  if (h.offset != p.offset || h.numel != p.numel) {
    refuse(worker, &h,
           "push for piece " + std::to_string(h.piece) + " covers [" + std::to_string(h.offset) + ", +" +
               std::to_string(h.numel) + ") of tensor " + std::to_string(p.tensor) + ", the piece is [" +
               std::to_string(p.offset) + ", +" + std::to_string(p.numel) + ")");
    return true;
  }
  const bool rows = h.op == PsOp::kPushRows;
  if (rows != isRowSparse(plan_, p)) {
    refuse(worker, &h,
           "push for piece " + std::to_string(h.piece) +
               (rows ? " names rows; its tensor is dense" : " is dense; its tensor is row-sparse (push rows)"));
    return true;
  }
  if (h.worker_version > piece_versions_[li]) {
    refuse(worker, &h,
           "push for piece " + std::to_string(h.piece) + " claims version " + std::to_string(h.worker_version) +
               ", from the future (the piece is at version " + std::to_string(piece_versions_[li]) + ")");
    return true;
  }
  if (h.step + 1 < slot.pulled) {
    refuse(worker, &h,
           "push of step " + std::to_string(h.step) + " after a pull of step " + std::to_string(slot.pulled - 1));
    return true;
  }
  if (h.step >= slot.pulled) {
    refuse(worker, &h, "push of step " + std::to_string(h.step) + " before its pull");
    return true;
  }
  // SSP write condition: a push of step t waits until every live worker read step t - s, so with s = 0 no
  // worker reads a parameter that already holds part of its own step's updates.
  if (aheadOf(options_.staleness_bound, h.step + 1, minPulled())) return false;
  // The pushed values, in grad_: a dense piece's whole gradient, or a row push's segments one after another.
  const float* g = grad_.data();
  uint64_t count = p.numel;
  std::vector<uint32_t> ids;
  try {
    if (rows) {
      ids = decodePsRowPush(plan_, p, payload);
      count = psRowElements(plan_, p, ids);
      // The values follow the ids at 8 + 4 k bytes, whatever the transport buffer's alignment: copied out whole.
      std::memcpy(grad_.data(), payload.data() + kPsRowPushHeaderBytes + 4 * ids.size(), count * sizeof(float));
    } else if (options_.compressor) {
      TensorCodec& c = *codecs_[static_cast<std::size_t>(worker) * piece_versions_.size() + li];
      if (payload.size() > c.sizes(0).max_output_bytes)
        TERSE_THROW(InvalidPayload, "payload of " << payload.size() << " B above the compressor's maximum "
                                                  << c.sizes(0).max_output_bytes);
      const auto numel = static_cast<double>(p.numel);
      const rt::Kernel kernel({.kind = rt::CostKind::kDecompress,
                               .size = numel,
                               .flops = ps_detail::kCodecFlopsPerElement * numel,
                               .phase = c.phaseAt(h.step)});
      c.decode(h.step, payload, worker, grad_.data(), false);
    } else {
      if (payload.size() != p.numel * sizeof(float))
        TERSE_THROW(InvalidPayload, "raw f32 payload of " << payload.size() << " B for " << p.numel << " elements");
      std::memcpy(grad_.data(), payload.data(), payload.size());
    }
  } catch (const Error& e) {
    refuse(worker, &h, std::string("push for piece ") + std::to_string(h.piece) + " failed to decode: " + e.what());
    return true;
  }
  // A raw or row push's copy above is what the NIC's DMA would do: no region. The finiteness check below is the
  // shard's validation of untrusted input, not the modeled server's work: no region either.
  for (uint64_t i = 0; i < count; ++i)
    if (!std::isfinite(g[i])) {
      refuse(worker, &h,
             "push for piece " + std::to_string(h.piece) + " decodes to a non-finite value at " + std::to_string(i));
      return true;
    }
  const uint64_t tau = piece_versions_[li] - h.worker_version;
  double lr = options_.lr_schedule ? options_.lr_schedule(h.step) : options_.lr;
  // Zhang et al. 2016: divide by the staleness; tau = 0 (no update since the read) is clamped to 1.
  if (options_.staleness_aware_lr) lr /= static_cast<double>(std::max<uint64_t>(tau, 1));
  {
    std::lock_guard lock(mutex_);
    const uint64_t at = p.flat_begin - begin_;
    const auto n = static_cast<double>(count);
    const rt::Kernel kernel(
        {.kind = rt::CostKind::kOptimizer, .size = n, .flops = ps_detail::kUpdateFlopsPerElement * n});
    if (!rows) {
      update(at, g, p.numel, lr);
    } else {
      // Only the rows pushed change, as a sparse optimizer step does (the sync trainer's Optimizer::updateRows):
      // with momentum or weight decay the rows not pushed are left alone rather than decayed.
      for (uint32_t r : ids) {
        const RowSegment seg = rowSegment(plan_, p, r);
        update(at + seg.begin, g, seg.end - seg.begin, lr);
        g += seg.end - seg.begin;
      }
    }
    ++piece_versions_[li];
    ++params_epoch_;
    ++stats_.pushes_applied;
    ++stats_.staleness[tau];
  }
  reply(worker, PsReplyHeader{PsStatus::kOk, DType::kF32, h.step, h.piece, 0}, {});
  return true;
}

void ParamServerShard::update(uint64_t at, const float* g, uint64_t n, double lr) {
  const double scale = options_.average_over_workers ? 1.0 / num_workers_ : 1.0;
  float* w = params_.data() + at;
  const SgdOptions& sgd = options_.sgd;
  if (sgd.adagrad) {
    // AdaGrad per push (sgd_math.h), on the push's share of the mean: a push arriving alone is a step of its own.
    const auto sc = static_cast<float>(scale), wd = static_cast<float>(sgd.weight_decay);
    const auto lrf = static_cast<float>(lr), eps = static_cast<float>(sgd.adagrad_eps);
    float* g2 = sum_sq_.data() + at;
    for (uint64_t i = 0; i < n; ++i) adagrad(w[i], g2[i], sc * g[i], lrf, wd, eps);
  } else if (sgd.momentum == 0 && sgd.weight_decay == 0) {
    // Plain SGD keeps one multiply per element: w -= (lr / W) g, what s = 0 compares with sync's mean.
    const float lrf = static_cast<float>(lr * scale);
    for (uint64_t i = 0; i < n; ++i) w[i] -= lrf * g[i];
  } else {
    const auto sc = static_cast<float>(scale), wd = static_cast<float>(sgd.weight_decay);
    const auto m = static_cast<float>(sgd.momentum), lrf = static_cast<float>(lr);
    float* b = momentum_.empty() ? nullptr : momentum_.data() + at;
    for (uint64_t i = 0; i < n; ++i) {
      float d = sc * (g[i] + wd * w[i]);
      if (b) {
        b[i] = m * b[i] + d;
        d = sgd.nesterov ? d + m * b[i] : b[i];
      }
      w[i] -= lrf * d;
    }
  }
}

void ParamServerShard::run() {
  // However run() ends, a reader waiting for a snapshot learns that no more will come.
  struct Finish {
    ParamServerShard& shard;
    ~Finish() {
      {
        std::lock_guard lock(shard.mutex_);
        shard.finished_ = true;
      }
      shard.snapshot_cv_.notify_all();
    }
  } finish{*this};
  // Replies still in flight when run() ends go to workers that left or died: dropped (a dropped send keeps its frame's
  // bytes for the peer, request.h), before the frames they read from.
  struct DropSends {
    std::vector<Sending>& sending;
    ~DropSends() { sending.clear(); }
  } drop_sends{sending_};
  const comm::FrameMeta expect{comm::OpKind::kP2P, kPsRequestTag, comm::kNoTensor};
  ps_detail::IdleWait idle(transport_);
  while (!stop_.load()) {
    if (transport_.aborted()) throw comm::CommError("parameter server shard " + std::to_string(shard_) + ": aborted");
    collectSends();
    bool progress = false, anyone = false;
    idle.mark();
    const auto now = rt::now();
    for (int w = 0; w < num_workers_; ++w) {
      Slot& slot = *slots_[static_cast<std::size_t>(w)];
      if (slot.lost) continue;
      if (slot.dead) {
        // A worker declared dead that speaks again is refused, never left waiting (rejoining would need a membership
        // protocol: not built).
        if (!slot.posted) {
          slot.recv = transport_.irecv(workerRank(plan_.num_shards, w), expect, slot.buffer);
          slot.posted = true;
        }
        bool done = false, failed = false;
        try {
          done = slot.recv.test();
        } catch (const comm::CommError& e) {
          if (transport_.aborted()) throw;
          lose(w, e.what());
          continue;
        } catch (const Error&) {
          done = failed = true;
        }
        if (done) {
          slot.posted = false;
          PsRequestHeader h;
          bool parsed = !failed;
          try {
            if (parsed) h = decodePsRequest(std::span<const std::byte>(slot.buffer.data(), slot.recv.bytes()));
          } catch (const Error&) {
            parsed = false;
          }
          refuse(w, parsed ? &h : nullptr,
                 "worker " + std::to_string(w) + " was declared dead after " +
                     std::to_string(options_.worker_timeout.count()) + " ms of silence");
          progress = true;
        }
        continue;
      }
      if (slot.gone) continue;
      anyone = true;
      if (!live(w, now)) {
        // Elastic: a silent worker stops counting in the SSP minimum; its receive is cancelled by dropping it.
        TERSE_LOG(LogLevel::kWarn, "parameter server shard " << shard_ << ": worker " << w << " silent for more than "
                                                             << options_.worker_timeout.count()
                                                             << " ms, dropped as dead");
        slot.gone = slot.dead = true;  // its posted receive stays: what it sends later is refused (above)
        std::lock_guard lock(mutex_);
        stats_.dead[static_cast<std::size_t>(w)] = true;
        stats_.dead_at[static_cast<std::size_t>(w)] = now;
        progress = true;
        continue;
      }
      if (slot.held) {
        if (process(w, slot)) {
          slot.held = false;
          slot.last_active = rt::now();
          progress = true;
        }
        continue;
      }
      if (!slot.posted) {
        slot.recv = transport_.irecv(workerRank(plan_.num_shards, w), expect, slot.buffer);
        slot.posted = true;
      }
      bool done = false;
      try {
        done = slot.recv.test();
      } catch (const comm::CommError& e) {
        if (transport_.aborted()) throw;
        lose(w, e.what());
        progress = true;
        continue;
      } catch (const Error& e) {
        // A frame the receive could not take (too long, wrong kind): consumed by the transport; refuse and go on.
        slot.posted = false;
        // Not added to bytes_in: a failed receive does not report the frame's length (the transport's own rank
        // totals still count it).
        slot.last_active = rt::now();
        refuse(w, nullptr, e.what());
        progress = true;
        continue;
      }
      if (!done) continue;
      slot.posted = false;
      slot.held_bytes = slot.recv.bytes();
      slot.last_active = rt::now();
      {
        std::lock_guard lock(mutex_);
        stats_.bytes_in[static_cast<std::size_t>(w)] += comm::frameWireBytes(slot.held_bytes);
      }
      progress = true;
      if (!process(w, slot)) slot.held = true;
    }
    if (!anyone) break;
    // Look again when the first live worker's silence would exceed the timeout (strictly after: at that instant it is
    // still live, and a simulated clock would not move on by itself).
    Clock::time_point deadline = Clock::time_point::max();
    for (const auto& slot : slots_)
      if (!slot->gone && !slot->held)
        deadline = std::min(deadline, slot->last_active + options_.worker_timeout + Clock::duration(1));
    idle.wait(progress, deadline);
  }
}

std::vector<float> ParamServerShard::params() const {
  std::lock_guard lock(mutex_);
  return params_;
}
std::vector<uint64_t> ParamServerShard::versions() const {
  std::lock_guard lock(mutex_);
  return piece_versions_;
}
std::vector<float> ParamServerShard::replica(int worker) const {
  TERSE_CHECK(worker >= 0 && worker < num_workers_, InvalidArgument,
              "parameter server: worker " << worker << " outside 0.." << num_workers_ - 1);
  return replicas_.empty() ? std::vector<float>{} : replicas_[static_cast<std::size_t>(worker)];
}
ServerStats ParamServerShard::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace terse::train
