#include "core/train/param_server.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <thread>

#include "core/common/error.h"
#include "core/common/log.h"
#include "terse/sdk/half.hpp"

namespace terse::train {
namespace {

using Clock = std::chrono::steady_clock;

void put16(std::byte* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void put32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void put64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
uint16_t get16(const std::byte* p) {
  return static_cast<uint16_t>(static_cast<uint16_t>(p[0]) | (static_cast<uint16_t>(p[1]) << 8));
}
uint32_t get32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t get64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

bool pullDtypeOk(DType d) {
  return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16;
}

void checkCompressor(const std::shared_ptr<const Compressor>& c) {
  if (!c) return;
  const CompressorCaps caps = c->caps(DType::kF32);
  TERSE_CHECK(caps.aggregation != Aggregation::kCustom, InvalidArgument,
              "parameter server: compressor '" << c->plugin().name
                                               << "' has CUSTOM aggregation; a push must be decodable on its own");
  TERSE_CHECK(caps.num_rounds == 1, InvalidArgument,
              "parameter server: compressor '" << c->plugin().name << "' has " << caps.num_rounds
                                               << " rounds; only single-round compressors can push");
  TERSE_CHECK((caps.devices & TERSE_DEVICE_HOST) != 0, InvalidArgument,
              "parameter server: compressor '" << c->plugin().name << "' has no host implementation");
}

TensorInfo pieceInfo(const PsPiece& p, int worker, int num_workers) {
  TensorInfo t;
  t.dtype = DType::kF32;
  t.numel = p.numel;
  t.ndim = 1;
  t.shape = {static_cast<int64_t>(p.numel), 0, 0, 0};
  t.tensor_id = p.id;
  t.rank = worker;
  t.world_size = num_workers;
  t.source_rank = worker;
  return t;
}

uint64_t pullBodyBytes(const PsPlan& plan, int shard, DType dtype) {
  const auto [b, e] = plan.ranges[static_cast<std::size_t>(shard)];
  return plan.shard_pieces[static_cast<std::size_t>(shard)].size() * 8 + (e - b) * dtypeSize(dtype);
}

constexpr std::size_t kMaxErrorText = 1024;

}  // namespace

// ---- sharding ----

PsPlan planShards(std::span<const uint64_t> tensor_numel, int num_shards) {
  TERSE_CHECK(num_shards >= 1, InvalidArgument, "parameter server: num_shards must be >= 1, got " << num_shards);
  PsPlan plan;
  plan.tensor_numel.assign(tensor_numel.begin(), tensor_numel.end());
  plan.num_shards = num_shards;
  std::vector<uint64_t> starts;  // flat start of every tensor, plus the end
  for (uint64_t n : tensor_numel) {
    starts.push_back(plan.total_numel);
    plan.total_numel += n;
  }
  starts.push_back(plan.total_numel);
  const uint64_t total = plan.total_numel;
  const uint64_t S = static_cast<uint64_t>(num_shards);
  const uint64_t tolerance = total / (4 * S);
  std::vector<uint64_t> cuts{0};
  for (uint64_t k = 1; k < S; ++k) {
    // round(k * total / S) without overflow for any realistic total.
    uint64_t ideal = static_cast<uint64_t>((static_cast<long double>(total) * k) / S + 0.5L);
    // The nearest tensor boundary; take it when close enough (keeps a tensor on one shard).
    auto it = std::lower_bound(starts.begin(), starts.end(), ideal);
    uint64_t best = ideal, dist = std::numeric_limits<uint64_t>::max();
    for (auto c : {it, it == starts.begin() ? it : it - 1}) {
      if (c == starts.end()) continue;
      const uint64_t d = *c > ideal ? *c - ideal : ideal - *c;
      if (d < dist) dist = d, best = *c;
    }
    uint64_t cut = dist <= tolerance ? best : ideal;
    cut = std::max(cut, cuts.back());  // monotone: a shard may be empty, never negative
    cuts.push_back(cut);
  }
  cuts.push_back(total);
  plan.shard_pieces.resize(S);
  for (uint64_t k = 0; k < S; ++k) plan.ranges.emplace_back(cuts[k], cuts[k + 1]);
  for (uint32_t t = 0; t < tensor_numel.size(); ++t) {
    const uint64_t tb = starts[t], te = starts[t + 1];
    for (uint64_t k = 0; k < S; ++k) {
      const uint64_t b = std::max(tb, cuts[k]), e = std::min(te, cuts[k + 1]);
      if (b >= e) continue;
      PsPiece p;
      p.id = plan.pieces.size();
      p.tensor = t;
      p.offset = b - tb;
      p.numel = e - b;
      p.flat_begin = b;
      p.shard = static_cast<int>(k);
      plan.shard_pieces[k].push_back(p.id);
      plan.pieces.push_back(p);
    }
  }
  return plan;
}

// ---- wire format ----

void encodePsRequest(const PsRequestHeader& h, std::span<std::byte, kPsRequestHeaderBytes> out) noexcept {
  std::byte* p = out.data();
  put32(p, kPsRequestMagic);
  put16(p + 4, kPsWireVersion);
  p[6] = static_cast<std::byte>(h.op);
  p[7] = static_cast<std::byte>(h.dtype);
  put64(p + 8, h.step);
  put64(p + 16, h.piece);
  put64(p + 24, h.offset);
  put64(p + 32, h.numel);
  put64(p + 40, h.worker_version);
  put64(p + 48, h.payload_bytes);
}

PsRequestHeader decodePsRequest(std::span<const std::byte> frame) {
  TERSE_CHECK(
      frame.size() >= kPsRequestHeaderBytes, InvalidPayload,
      "ps request: frame of " << frame.size() << " B is shorter than the " << kPsRequestHeaderBytes << "-byte header");
  const std::byte* p = frame.data();
  TERSE_CHECK(get32(p) == kPsRequestMagic, InvalidPayload, "ps request: bad magic 0x" << std::hex << get32(p));
  TERSE_CHECK(get16(p + 4) == kPsWireVersion, InvalidPayload, "ps request: unknown version " << get16(p + 4));
  const auto op = static_cast<uint8_t>(p[6]);
  TERSE_CHECK(op >= 1 && op <= 5, InvalidPayload, "ps request: unknown op " << int{op});
  PsRequestHeader h;
  h.op = static_cast<PsOp>(op);
  const auto dt = static_cast<uint8_t>(p[7]);
  h.dtype = static_cast<DType>(dt);
  if (h.op == PsOp::kPull)
    TERSE_CHECK(pullDtypeOk(h.dtype), InvalidPayload, "ps request: pull dtype " << int{dt} << " is not f32/f16/bf16");
  else
    TERSE_CHECK(dt == 0, InvalidPayload, "ps request: dtype field " << int{dt} << " must be 0 outside a pull");
  h.step = get64(p + 8);
  h.piece = get64(p + 16);
  h.offset = get64(p + 24);
  h.numel = get64(p + 32);
  h.worker_version = get64(p + 40);
  h.payload_bytes = get64(p + 48);
  TERSE_CHECK(h.payload_bytes == frame.size() - kPsRequestHeaderBytes, InvalidPayload,
              "ps request: header says " << h.payload_bytes << " payload bytes, the frame carries "
                                         << frame.size() - kPsRequestHeaderBytes);
  return h;
}

void encodePsReply(const PsReplyHeader& h, std::span<std::byte, kPsReplyHeaderBytes> out) noexcept {
  std::byte* p = out.data();
  put32(p, kPsReplyMagic);
  put16(p + 4, kPsWireVersion);
  p[6] = static_cast<std::byte>(h.status);
  p[7] = static_cast<std::byte>(h.dtype);
  put64(p + 8, h.step);
  put64(p + 16, h.piece);
  put64(p + 24, h.payload_bytes);
}

PsReplyHeader decodePsReply(std::span<const std::byte> frame) {
  TERSE_CHECK(frame.size() >= kPsReplyHeaderBytes, InvalidPayload,
              "ps reply: frame of " << frame.size() << " B is shorter than its header");
  const std::byte* p = frame.data();
  TERSE_CHECK(get32(p) == kPsReplyMagic, InvalidPayload, "ps reply: bad magic 0x" << std::hex << get32(p));
  TERSE_CHECK(get16(p + 4) == kPsWireVersion, InvalidPayload, "ps reply: unknown version " << get16(p + 4));
  PsReplyHeader h;
  const auto st = static_cast<uint8_t>(p[6]);
  TERSE_CHECK(st <= 1, InvalidPayload, "ps reply: unknown status " << int{st});
  h.status = static_cast<PsStatus>(st);
  h.dtype = static_cast<DType>(static_cast<uint8_t>(p[7]));
  TERSE_CHECK(pullDtypeOk(h.dtype), InvalidPayload, "ps reply: dtype " << int(static_cast<uint8_t>(p[7])));
  h.step = get64(p + 8);
  h.piece = get64(p + 16);
  h.payload_bytes = get64(p + 24);
  TERSE_CHECK(h.payload_bytes == frame.size() - kPsReplyHeaderBytes, InvalidPayload,
              "ps reply: header says " << h.payload_bytes << " payload bytes, the frame carries "
                                       << frame.size() - kPsReplyHeaderBytes);
  return h;
}

// ---- server ----

// One worker's receive slot: the posted receive, or the request held by SSP, and the worker's clocks.
struct ParamServerShard::Slot {
  std::vector<std::byte> buffer;
  comm::Request recv;
  bool posted = false;
  bool held = false;  // buffer holds a request SSP delays; the worker's next frames wait in the transport
  uint64_t held_bytes = 0;
  bool gone = false;  // bye or dead
  bool dead = false;
  bool lost = false;       // its connection failed (an expendable peer, tcp_transport.h): nothing more to read
  uint64_t pulled = 0;     // 1 + the step of the last pull (0: none yet)
  uint64_t completed = 0;  // steps completed (kClock)
  Clock::time_point last_active = Clock::now();
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
  checkCompressor(options_.compressor);
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
  const auto& ids = plan_.shard_pieces[static_cast<std::size_t>(shard)];
  piece_versions_.assign(ids.size(), 0);
  uint64_t max_payload = 0, max_numel = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    local_[ids[i]] = i;
    max_numel = std::max(max_numel, plan_.pieces[ids[i]].numel);
  }
  // One decoder per (worker, piece): a stateful decoder's state follows one encoder's stream (as each rank's
  // decompress state does in the allgather path), so sharing one across workers would mix their histories. Costs
  // W x the compressor's state; stateless plugins keep none.
  if (options_.compressor) {
    for (int w = 0; w < num_workers; ++w)
      for (uint64_t id : ids) {
        codecs_.push_back(
            makePluginCodec(options_.compressor, pieceInfo(plan_.pieces[id], w, num_workers), options_.run_seed));
        max_payload = std::max(max_payload, codecs_.back()->sizes(0).max_output_bytes);
      }
  } else {
    max_payload = max_numel * sizeof(float);
  }
  grad_.resize(static_cast<std::size_t>(max_numel));
  // A little slack so a slightly-too-long push still arrives whole and is refused with the precise reason; a longer
  // one fails the receive itself (also refused, with the transport's message).
  max_request_bytes_ = kPsRequestHeaderBytes + max_payload + 64;
  reply_buf_.resize(kPsReplyHeaderBytes + std::max<uint64_t>(pullBodyBytes(plan_, shard, DType::kF32), kMaxErrorText));
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
  bool taken = false;
  {
    std::lock_guard lock(mutex_);
    // One copy serves every point it passed at once (async workers may cross several between two clocks).
    while (next_snapshot_ < points.size() && global >= points[next_snapshot_]) {
      snapshots_[points[next_snapshot_]] = ShardSnapshot{points[next_snapshot_], params_, Clock::now()};
      ++next_snapshot_;
      taken = true;
    }
  }
  if (taken) snapshot_cv_.notify_all();
}

std::optional<ShardSnapshot> ParamServerShard::takeSnapshot(uint64_t step, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!snapshot_cv_.wait_for(lock, timeout, [&] { return snapshots_.count(step) > 0; })) return std::nullopt;
  auto node = snapshots_.extract(step);
  return std::move(node.mapped());
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
  std::byte* p = reply_buf_.data();
  PsReplyHeader hh = h;
  hh.payload_bytes = body.size();
  encodePsReply(hh, std::span<std::byte, kPsReplyHeaderBytes>(p, kPsReplyHeaderBytes));
  if (!body.empty() && body.data() != p + kPsReplyHeaderBytes)
    std::memcpy(p + kPsReplyHeaderBytes, body.data(), body.size());
  const uint64_t n = kPsReplyHeaderBytes + body.size();
  comm::FrameMeta meta{comm::OpKind::kP2P, kPsReplyTag, h.piece};
  // Blocking: the reply buffer is reused for the next reply. Replies are small or go to a worker that waits on them.
  try {
    transport_.send(workerRank(plan_.num_shards, worker), meta, std::span<const std::byte>(p, n));
  } catch (const comm::CommError& e) {
    if (transport_.aborted()) throw;
    lose(worker, e.what());  // the worker's connection alone failed: it is dropped, the others go on
    return;
  }
  std::lock_guard lock(mutex_);
  stats_.bytes_out[static_cast<std::size_t>(worker)] += comm::frameWireBytes(n);
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
    stats_.dead_at[static_cast<std::size_t>(worker)] = Clock::now();
  }
}

void ParamServerShard::refuse(int worker, const PsRequestHeader* h, const std::string& why) {
  std::string msg = "parameter server shard " + std::to_string(shard_) + " refused a request from worker " +
                    std::to_string(worker) + ": " + why;
  if (msg.size() > kMaxErrorText) msg.resize(kMaxErrorText);
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
  const uint64_t s = options_.staleness_bound;
  // mine > slowest + s, saturating: a huge bound must not wrap around into a tiny one.
  auto ahead = [&](uint64_t mine, uint64_t slowest) {
    return s != kNoStalenessBound && mine > slowest && mine - slowest > s;
  };
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
    case PsOp::kPull: {
      if (h.payload_bytes != 0) {
        refuse(worker, &h, "pull carries " + std::to_string(h.payload_bytes) + " payload bytes, expected 0");
        return true;
      }
      // SSP read condition (Ho et al. 2013): a worker at clock t reads only once every live worker completed t - s.
      if (ahead(h.step, minCompleted())) return false;
      const auto& ids = plan_.shard_pieces[static_cast<std::size_t>(shard_)];
      std::byte* body = reply_buf_.data() + kPsReplyHeaderBytes;
      for (std::size_t i = 0; i < ids.size(); ++i) put64(body + 8 * i, piece_versions_[i]);
      std::byte* v = body + 8 * ids.size();
      {
        std::lock_guard lock(mutex_);
        if (h.dtype == DType::kF32) {
          if (!params_.empty()) std::memcpy(v, params_.data(), params_.size() * sizeof(float));
        } else {
          for (std::size_t i = 0; i < params_.size(); ++i) {
            const uint16_t x = h.dtype == DType::kF16 ? sdk::floatToHalf(params_[i]) : sdk::floatToBf16(params_[i]);
            std::memcpy(v + 2 * i, &x, 2);  // the host is little-endian (as frame.h's inproc path assumes)
          }
        }
        ++stats_.pulls_served;
      }
      slot.pulled = std::max(slot.pulled, h.step + 1);
      reply(worker, PsReplyHeader{PsStatus::kOk, h.dtype, h.step, ids.size(), 0},
            std::span<const std::byte>(body, static_cast<std::size_t>(pullBodyBytes(plan_, shard_, h.dtype))));
      return true;
    }
    case PsOp::kPush: {
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
      if (ahead(h.step + 1, minPulled())) return false;
      const std::span<const std::byte> payload = frame.subspan(kPsRequestHeaderBytes);
      float* g = grad_.data();
      try {
        if (options_.compressor) {
          TensorCodec& c = *codecs_[static_cast<std::size_t>(worker) * piece_versions_.size() + li];
          if (payload.size() > c.sizes(0).max_output_bytes)
            TERSE_THROW(InvalidPayload, "payload of " << payload.size() << " B above the compressor's maximum "
                                                      << c.sizes(0).max_output_bytes);
          c.decode(h.step, payload, worker, g, false);
        } else {
          if (payload.size() != p.numel * sizeof(float))
            TERSE_THROW(InvalidPayload, "raw f32 payload of " << payload.size() << " B for " << p.numel << " elements");
          std::memcpy(g, payload.data(), payload.size());
        }
      } catch (const Error& e) {
        refuse(worker, &h, std::string("push for piece ") + std::to_string(h.piece) + " failed to decode: " + e.what());
        return true;
      }
      for (uint64_t i = 0; i < p.numel; ++i)
        if (!std::isfinite(g[i])) {
          refuse(
              worker, &h,
              "push for piece " + std::to_string(h.piece) + " decodes to a non-finite value at " + std::to_string(i));
          return true;
        }
      const uint64_t tau = piece_versions_[li] - h.worker_version;
      double lr = options_.lr_schedule ? options_.lr_schedule(h.step) : options_.lr;
      const double scale = options_.average_over_workers ? 1.0 / num_workers_ : 1.0;
      // Zhang et al. 2016: divide by the staleness; tau = 0 (no update since the read) is clamped to 1.
      if (options_.staleness_aware_lr) lr /= static_cast<double>(std::max<uint64_t>(tau, 1));
      {
        std::lock_guard lock(mutex_);
        float* w = params_.data() + (p.flat_begin - begin_);
        const SgdOptions& sgd = options_.sgd;
        if (sgd.momentum == 0 && sgd.weight_decay == 0) {
          // Plain SGD keeps one multiply per element: w -= (lr / W) g, what s = 0 compares with sync's mean.
          const float lrf = static_cast<float>(lr * scale);
          for (uint64_t i = 0; i < p.numel; ++i) w[i] -= lrf * g[i];
        } else {
          const auto sc = static_cast<float>(scale), wd = static_cast<float>(sgd.weight_decay);
          const auto m = static_cast<float>(sgd.momentum), lrf = static_cast<float>(lr);
          float* b = momentum_.empty() ? nullptr : momentum_.data() + (p.flat_begin - begin_);
          for (uint64_t i = 0; i < p.numel; ++i) {
            float d = sc * (g[i] + wd * w[i]);
            if (b) {
              b[i] = m * b[i] + d;
              d = sgd.nesterov ? d + m * b[i] : b[i];
            }
            w[i] -= lrf * d;
          }
        }
        ++piece_versions_[li];
        ++stats_.pushes_applied;
        ++stats_.staleness[tau];
      }
      reply(worker, PsReplyHeader{PsStatus::kOk, DType::kF32, h.step, h.piece, 0}, {});
      return true;
    }
  }
  return true;
}

void ParamServerShard::run() {
  const comm::FrameMeta expect{comm::OpKind::kP2P, kPsRequestTag, comm::kNoTensor};
  int idle = 0;
  while (!stop_.load()) {
    if (transport_.aborted()) throw comm::CommError("parameter server shard " + std::to_string(shard_) + ": aborted");
    bool progress = false, anyone = false;
    const auto now = Clock::now();
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
          slot.last_active = Clock::now();
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
        slot.last_active = Clock::now();
        refuse(w, nullptr, e.what());
        progress = true;
        continue;
      }
      if (!done) continue;
      slot.posted = false;
      slot.held_bytes = slot.recv.bytes();
      slot.last_active = Clock::now();
      {
        std::lock_guard lock(mutex_);
        stats_.bytes_in[static_cast<std::size_t>(w)] += comm::frameWireBytes(slot.held_bytes);
      }
      progress = true;
      if (!process(w, slot)) slot.held = true;
    }
    if (!anyone) break;
    // No any-source receive exists on the transport, so the shard polls its workers' receives; it backs off when
    // idle so that a waiting shard does not eat a core the workers need.
    if (progress) {
      idle = 0;
    } else if (++idle > 64) {
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(50 * (idle - 64), 1000)));
    } else {
      std::this_thread::yield();
    }
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
ServerStats ParamServerShard::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

// ---- worker ----

// The requests for one shard in one exchange, and the reply buffer.
struct ParamServerClient::Outbox {
  std::vector<std::vector<std::byte>> requests;
  std::vector<comm::Request> sends;
  std::vector<std::byte> reply;
  std::vector<std::vector<std::byte>> replies;  // the bytes of each reply, in order
  comm::Request recv;
  std::size_t received = 0;
  Clock::time_point last_sent{};
};

ParamServerClient::ParamServerClient(comm::Transport& transport, PsPlan plan, int worker, int num_workers,
                                     ClientOptions options)
    : transport_(transport), plan_(std::move(plan)), worker_(worker), num_workers_(num_workers), options_(options) {
  TERSE_CHECK(worker >= 0 && worker < num_workers, InvalidArgument,
              "parameter server client: worker " << worker << " outside 0.." << num_workers - 1);
  TERSE_CHECK(
      transport.rank() == workerRank(plan_.num_shards, worker), InvalidArgument,
      "parameter server client: worker " << worker << " must run on rank " << workerRank(plan_.num_shards, worker));
  TERSE_CHECK(pullDtypeOk(options_.pull_dtype), InvalidArgument,
              "parameter server client: pull dtype " << dtypeName(options_.pull_dtype) << " is not f32/f16/bf16");
  checkCompressor(options_.compressor);
  if (options_.compressor)
    for (const PsPiece& p : plan_.pieces)
      codecs_.push_back(
          makeCodec(options_.compressor, pieceInfo(p, worker, num_workers), options_.run_seed, options_.codec));
  versions_.assign(plan_.pieces.size(), 0);
  for (int k = 0; k < plan_.num_shards; ++k) {
    out_.push_back(std::make_unique<Outbox>());
    out_.back()->reply.resize(kPsReplyHeaderBytes +
                              std::max<uint64_t>(pullBodyBytes(plan_, k, DType::kF32), kMaxErrorText));
  }
  PsRequestHeader ping;
  ping.op = PsOp::kPing;
  encodePsRequest(ping, ping_);
}

ParamServerClient::~ParamServerClient() = default;

void ParamServerClient::exchange(const std::vector<int>& shards) {
  const comm::FrameMeta expect{comm::OpKind::kP2P, kPsReplyTag, comm::kNoTensor};
  std::vector<bool> active(out_.size(), false);
  for (int k : shards) {
    Outbox& o = *out_[static_cast<std::size_t>(k)];
    active[static_cast<std::size_t>(k)] = true;
    o.sends.clear();
    o.replies.clear();
    o.received = 0;
    for (const auto& r : o.requests) {
      const uint64_t label = static_cast<PsOp>(r[6]) == PsOp::kPush ? get64(r.data() + 16) : comm::kNoTensor;
      o.sends.push_back(transport_.isend(serverRank(k), comm::FrameMeta{comm::OpKind::kP2P, kPsRequestTag, label}, r));
    }
    o.last_sent = Clock::now();
    if (!o.requests.empty()) o.recv = transport_.irecv(serverRank(k), expect, o.reply);
  }
  std::vector<comm::Request> pings;
  std::vector<std::string> errors;
  int idle = 0;
  for (;;) {
    bool pending = false, progress = false;
    for (int k : shards) {
      Outbox& o = *out_[static_cast<std::size_t>(k)];
      while (o.received < o.requests.size()) {
        if (!o.recv.test()) break;
        o.replies.emplace_back(o.reply.begin(), o.reply.begin() + static_cast<std::ptrdiff_t>(o.recv.bytes()));
        ++o.received;
        progress = true;
        if (o.received < o.requests.size()) o.recv = transport_.irecv(serverRank(k), expect, o.reply);
      }
      if (o.received < o.requests.size()) pending = true;
    }
    if (!pending) break;
    // While one shard holds us (SSP), tell the shards we are not waiting on that we are alive (elastic timeout).
    const auto now = Clock::now();
    for (int k = 0; k < plan_.num_shards; ++k) {
      Outbox& o = *out_[static_cast<std::size_t>(k)];
      const bool waiting = active[static_cast<std::size_t>(k)] && o.received < o.requests.size();
      if (!waiting && now - o.last_sent >= options_.heartbeat) {
        pings.push_back(transport_.isend(serverRank(k), comm::FrameMeta{comm::OpKind::kP2P, kPsRequestTag}, ping_));
        o.last_sent = now;
      }
    }
    if (progress) {
      idle = 0;
    } else if (++idle > 64) {
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(50 * (idle - 64), 1000)));
    } else {
      std::this_thread::yield();
    }
  }
  for (int k : shards)
    for (auto& s : out_[static_cast<std::size_t>(k)]->sends) s.wait();
  for (auto& p : pings) p.wait();
}

void ParamServerClient::pull(uint64_t step, std::span<float> params) {
  TERSE_CHECK(
      params.size() == plan_.total_numel, InvalidArgument,
      "parameter server client: pull into " << params.size() << " elements, the model has " << plan_.total_numel);
  std::vector<int> shards;
  for (int k = 0; k < plan_.num_shards; ++k) {
    Outbox& o = *out_[static_cast<std::size_t>(k)];
    o.requests.clear();
    if (plan_.shard_pieces[static_cast<std::size_t>(k)].empty()) continue;  // an empty shard serves nothing
    PsRequestHeader h;
    h.op = PsOp::kPull;
    h.dtype = options_.pull_dtype;
    h.step = step;
    o.requests.emplace_back(kPsRequestHeaderBytes);
    encodePsRequest(h, std::span<std::byte, kPsRequestHeaderBytes>(o.requests.back().data(), kPsRequestHeaderBytes));
    shards.push_back(k);
  }
  exchange(shards);
  for (int k : shards) {
    const auto& r = out_[static_cast<std::size_t>(k)]->replies.at(0);
    const PsReplyHeader h = decodePsReply(r);
    const std::byte* body = r.data() + kPsReplyHeaderBytes;
    if (h.status != PsStatus::kOk) throw PsRefused(std::string(reinterpret_cast<const char*>(body), h.payload_bytes));
    const auto& ids = plan_.shard_pieces[static_cast<std::size_t>(k)];
    TERSE_CHECK(h.dtype == options_.pull_dtype && h.piece == ids.size() &&
                    h.payload_bytes == pullBodyBytes(plan_, k, options_.pull_dtype),
                InvalidPayload, "parameter server client: malformed pull reply from shard " << k);
    for (std::size_t i = 0; i < ids.size(); ++i) versions_[ids[i]] = get64(body + 8 * i);
    const std::byte* v = body + 8 * ids.size();
    const auto [b, e] = plan_.ranges[static_cast<std::size_t>(k)];
    if (h.dtype == DType::kF32) {
      std::memcpy(params.data() + b, v, (e - b) * sizeof(float));
    } else {
      for (uint64_t i = 0; i < e - b; ++i) {
        uint16_t x;
        std::memcpy(&x, v + 2 * i, 2);
        params[b + i] = h.dtype == DType::kF16 ? sdk::halfToFloat(x) : sdk::bf16ToFloat(x);
      }
    }
  }
}

void ParamServerClient::push(uint64_t step, std::span<const float> grad) {
  TERSE_CHECK(grad.size() == plan_.total_numel, InvalidArgument,
              "parameter server client: push of " << grad.size() << " elements, the model has " << plan_.total_numel);
  std::vector<int> shards;
  for (int k = 0; k < plan_.num_shards; ++k) {
    Outbox& o = *out_[static_cast<std::size_t>(k)];
    o.requests.clear();
    const auto& ids = plan_.shard_pieces[static_cast<std::size_t>(k)];
    if (ids.empty()) continue;
    for (uint64_t id : ids) {
      const PsPiece& p = plan_.pieces[id];
      const float* g = grad.data() + p.flat_begin;
      uint64_t max_payload = options_.compressor ? codecs_[id]->sizes(0).max_output_bytes : p.numel * sizeof(float);
      std::vector<std::byte> req(kPsRequestHeaderBytes + max_payload);
      uint64_t n;
      if (options_.compressor) {
        // Error feedback (if configured) adds this worker's residual inside encode and keeps the new one here.
        const auto t0 = Clock::now();
        n = codecs_[id]->encode(step, 0, g, {}, std::span<std::byte>(req).subspan(kPsRequestHeaderBytes));
        encode_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
      } else {
        n = p.numel * sizeof(float);
        std::memcpy(req.data() + kPsRequestHeaderBytes, g, n);
      }
      req.resize(kPsRequestHeaderBytes + n);
      payload_bytes_ += n;
      PsRequestHeader h;
      h.op = PsOp::kPush;
      h.step = step;
      h.piece = id;
      h.offset = p.offset;
      h.numel = p.numel;
      h.worker_version = versions_[id];
      h.payload_bytes = n;
      encodePsRequest(h, std::span<std::byte, kPsRequestHeaderBytes>(req.data(), kPsRequestHeaderBytes));
      o.requests.push_back(std::move(req));
    }
    // Ho et al.'s clock(): this worker finished step `step` on this shard.
    PsRequestHeader c;
    c.op = PsOp::kClock;
    c.step = step;
    o.requests.emplace_back(kPsRequestHeaderBytes);
    encodePsRequest(c, std::span<std::byte, kPsRequestHeaderBytes>(o.requests.back().data(), kPsRequestHeaderBytes));
    shards.push_back(k);
  }
  exchange(shards);
  std::string refused;
  for (int k : shards)
    for (const auto& r : out_[static_cast<std::size_t>(k)]->replies) {
      const PsReplyHeader h = decodePsReply(r);
      if (h.status != PsStatus::kOk) {
        if (!refused.empty()) refused += "; ";
        refused.append(reinterpret_cast<const char*>(r.data() + kPsReplyHeaderBytes), h.payload_bytes);
      }
    }
  if (!refused.empty()) throw PsRefused(refused);
}

void ParamServerClient::bye() {
  std::array<std::byte, kPsRequestHeaderBytes> b{};
  PsRequestHeader h;
  h.op = PsOp::kBye;
  encodePsRequest(h, b);
  for (int k = 0; k < plan_.num_shards; ++k)
    transport_.send(serverRank(k), comm::FrameMeta{comm::OpKind::kP2P, kPsRequestTag}, b);
}

}  // namespace terse::train
