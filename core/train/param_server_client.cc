// A worker's parameter-server client (param_server_client.h): builds the requests of a pull or a push, exchanges them
// with the shards, and reads the replies.
#include "core/train/param_server_client.h"

#include <algorithm>
#include <cstring>

#include "core/common/runtime.h"
#include "core/train/param_server_detail.h"

namespace terse::train {

// The runtime's clock: simulated time in a simulation (core/common/runtime.h).
using Clock = rt::Clock;

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
  TERSE_CHECK(isPsPullDtype(options_.pull_dtype), InvalidArgument,
              "parameter server client: pull dtype " << dtypeName(options_.pull_dtype) << " is not f32/f16/bf16");
  ps_detail::checkCompressor(options_.compressor);
  // EF21's sum of the estimates is updated from an aggregate every rank decodes (ef21.h); a worker here decodes none.
  TERSE_CHECK(!(options_.codec.error_feedback && options_.codec.error_feedback_rule == ErrorFeedbackRule::kEf21),
              Unsupported,
              "parameter server client: EF21 needs the step's aggregate on every worker, which a parameter server "
              "keeps to itself; use error feedback's residual (rule EF)");
  if (options_.compressor)
    for (const PsPiece& p : plan_.pieces)
      codecs_.push_back(makeCodec(options_.compressor, ps_detail::pieceInfo(p, worker, num_workers), options_.run_seed,
                                  options_.codec));
  if (options_.pull_compressor) {
    ps_detail::checkCompressor(options_.pull_compressor, "pull compressor");
    TERSE_CHECK(options_.pull_dtype == DType::kF32, InvalidArgument,
                "parameter server client: a pull compressor needs pull dtype f32, got "
                    << dtypeName(options_.pull_dtype) << " (the compressor decides what travels down)");
    uint64_t largest = 0;
    for (const PsPiece& p : plan_.pieces) {
      TERSE_CHECK(!isRowSparse(plan_, p), InvalidArgument,
                  "parameter server client: a pull compressor serves dense tensors only; tensor "
                      << p.tensor << " is row-sparse (its rows travel as they are)");
      pull_codecs_.push_back(makePluginCodec(options_.pull_compressor, ps_detail::pieceInfo(p, worker, num_workers),
                                             ps_detail::pullCodecSeed(options_.run_seed)));
      pull_max_payloads_.push_back(pull_codecs_.back()->sizes(0).max_output_bytes);
      largest = std::max(largest, p.numel);
    }
    replica_.resize(static_cast<std::size_t>(plan_.total_numel));
    decoded_.resize(static_cast<std::size_t>(largest));
  }
  versions_.assign(plan_.pieces.size(), 0);
  for (int k = 0; k < plan_.num_shards; ++k) {
    out_.push_back(std::make_unique<Outbox>());
    std::vector<uint64_t> delta_max;
    if (options_.pull_compressor)
      for (uint64_t id : plan_.shard_pieces[static_cast<std::size_t>(k)]) delta_max.push_back(pull_max_payloads_[id]);
    out_.back()->reply.resize(psMaxReplyBytes(plan_, k, delta_max));
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
      o.sends.push_back(
          transport_.isend(serverRank(k), comm::FrameMeta{comm::OpKind::kP2P, kPsRequestTag, psRequestLabel(r)}, r));
    }
    o.last_sent = rt::now();
    if (!o.requests.empty()) o.recv = transport_.irecv(serverRank(k), expect, o.reply);
  }
  std::vector<comm::Request> pings;
  std::vector<std::string> errors;
  ps_detail::IdleWait idle(transport_);
  for (;;) {
    bool pending = false, progress = false;
    idle.mark();
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
    const auto now = rt::now();
    Clock::time_point next_ping = Clock::time_point::max();
    for (int k = 0; k < plan_.num_shards; ++k) {
      Outbox& o = *out_[static_cast<std::size_t>(k)];
      const bool waiting = active[static_cast<std::size_t>(k)] && o.received < o.requests.size();
      if (waiting) continue;
      if (now - o.last_sent >= options_.heartbeat) {
        pings.push_back(transport_.isend(serverRank(k), comm::FrameMeta{comm::OpKind::kP2P, kPsRequestTag}, ping_));
        o.last_sent = now;
      }
      next_ping = std::min(next_ping, o.last_sent + options_.heartbeat);
    }
    idle.wait(progress, next_ping);
  }
  for (int k : shards)
    for (auto& s : out_[static_cast<std::size_t>(k)]->sends) s.wait();
  for (auto& p : pings) p.wait();
}

std::vector<uint32_t> ParamServerClient::pieceRowIds(const PsPiece& p,
                                                     std::span<const std::vector<int64_t>> rows) const {
  TERSE_CHECK(
      p.tensor < rows.size(), InvalidArgument,
      "parameter server client: rows given for " << rows.size() << " tensors, tensor " << p.tensor << " is row-sparse");
  const uint64_t n = pieceTensorRows(plan_, p);
  const auto [first, last] = pieceRows(plan_, p);
  std::vector<uint32_t> ids;
  for (int64_t r : rows[p.tensor]) {
    TERSE_CHECK(r >= 0 && static_cast<uint64_t>(r) < n, InvalidArgument,
                "parameter server client: row " << r << " of tensor " << p.tensor << " outside 0.." << n - 1);
    if (static_cast<uint64_t>(r) >= first && static_cast<uint64_t>(r) < last) ids.push_back(static_cast<uint32_t>(r));
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

void ParamServerClient::addRequest(Outbox& o, PsRequestHeader h, std::span<const std::byte> body) {
  h.payload_bytes = body.size();
  std::vector<std::byte>& r = o.requests.emplace_back(kPsRequestHeaderBytes);
  r.insert(r.end(), body.begin(), body.end());
  encodePsRequest(h, std::span<std::byte, kPsRequestHeaderBytes>(r.data(), kPsRequestHeaderBytes));
}

std::pair<PsReplyHeader, std::span<const std::byte>> ParamServerClient::pullReply(int shard) const {
  const auto& r = out_[static_cast<std::size_t>(shard)]->replies.at(0);
  const PsReplyHeader h = decodePsReply(r);
  const std::span<const std::byte> body(r.data() + kPsReplyHeaderBytes, static_cast<std::size_t>(h.payload_bytes));
  if (h.status != PsStatus::kOk) throw PsRefused(std::string(reinterpret_cast<const char*>(body.data()), body.size()));
  return {h, body};
}

void ParamServerClient::pullDelta(uint64_t step) {
  std::vector<int> shards;
  for (int k = 0; k < plan_.num_shards; ++k) {
    Outbox& o = *out_[static_cast<std::size_t>(k)];
    o.requests.clear();
    if (plan_.shard_pieces[static_cast<std::size_t>(k)].empty()) continue;
    PsRequestHeader h;
    h.op = PsOp::kPullDelta;
    h.dtype = DType::kF32;  // wire 0: a delta pull names no dtype
    h.step = step;
    addRequest(o, h, {});
    shards.push_back(k);
  }
  exchange(shards);
  for (int k : shards) {
    const auto [h, body] = pullReply(k);
    const auto& ids = plan_.shard_pieces[static_cast<std::size_t>(k)];
    TERSE_CHECK(h.dtype == DType::kF32 && h.piece == ids.size(), InvalidPayload,
                "parameter server client: malformed delta pull reply from shard " << k);
    std::vector<uint64_t> max_payloads, versions(ids.size());
    for (uint64_t id : ids) max_payloads.push_back(pull_max_payloads_[id]);
    const PsDeltaPullBody delta = decodePsDeltaPullBody(body, versions, max_payloads);
    const auto& payloads = delta.payloads;
    pull_payload_bytes_ += h.payload_bytes;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const PsPiece& p = plan_.pieces[ids[i]];
      const auto numel = static_cast<double>(p.numel);
      const auto t0 = rt::now();
      {
        // The shard added the same decoded change to its replica of this copy (processDeltaPull): the same two
        // passes.
        const rt::Kernel kernel({.kind = rt::CostKind::kDecompress,
                                 .size = numel,
                                 .flops = ps_detail::kCodecFlopsPerElement * numel,
                                 .codec = rt::kPullCodec,
                                 .phase = pull_codecs_[ids[i]]->phaseAt(step)});
        pull_codecs_[ids[i]]->decode(step, payloads[i], worker_, decoded_.data(), false);
        float* x = replica_.data() + p.flat_begin;
        for (uint64_t j = 0; j < p.numel; ++j) x[j] += decoded_[j];
      }
      decode_s_ += std::chrono::duration<double>(rt::now() - t0).count();
      versions_[ids[i]] = versions[i];
    }
    const auto [from, to] = plan_.ranges[static_cast<std::size_t>(k)];
    const uint64_t mine = psValuesChecksum(std::span<const float>(replica_).subspan(from, to - from));
    TERSE_CHECK(mine == delta.checksum, InvalidPayload,
                "parameter server client: after a delta pull from shard "
                    << k << " worker " << worker_ << "'s copy is not the shard's replica of it (checksum 0x" << std::hex
                    << mine << " here, 0x" << delta.checksum << std::dec << " there): pull compressor '"
                    << options_.pull_compressor->plugin().name
                    << "' decodes differently on the two sides (its decode depends on the host or on the decoding "
                       "rank), so compressed pulls cannot use it");
  }
}

void ParamServerClient::pull(uint64_t step, std::span<float> params, std::span<const std::vector<int64_t>> rows) {
  TERSE_CHECK(
      params.size() == plan_.total_numel, InvalidArgument,
      "parameter server client: pull into " << params.size() << " elements, the model has " << plan_.total_numel);
  if (options_.pull_compressor && have_replica_) {
    pullDelta(step);
    std::copy(replica_.begin(), replica_.end(), params.begin());
    return;
  }
  std::vector<int> shards;
  // Per shard, per piece: the rows asked for (kPullRows), empty for a dense piece or a dense pull.
  std::vector<std::vector<std::vector<uint32_t>>> asked(out_.size());
  for (int k = 0; k < plan_.num_shards; ++k) {
    Outbox& o = *out_[static_cast<std::size_t>(k)];
    o.requests.clear();
    const auto& ids = plan_.shard_pieces[static_cast<std::size_t>(k)];
    if (ids.empty()) continue;  // an empty shard serves nothing
    auto& want = asked[static_cast<std::size_t>(k)];
    bool row_pull = false;
    if (!rows.empty()) {
      want.resize(ids.size());
      for (std::size_t i = 0; i < ids.size(); ++i) {
        const PsPiece& p = plan_.pieces[ids[i]];
        if (!isRowSparse(plan_, p)) continue;
        want[i] = pieceRowIds(p, rows);
        row_pull = true;
      }
      if (!row_pull) want.clear();  // a shard of dense pieces only: a plain pull
    }
    const std::vector<std::byte> body = row_pull ? encodePsRowPull(plan_, k, want) : std::vector<std::byte>{};
    PsRequestHeader h;
    h.op = row_pull ? PsOp::kPullRows : PsOp::kPull;
    h.dtype = options_.pull_dtype;
    h.step = step;
    addRequest(o, h, body);
    shards.push_back(k);
  }
  exchange(shards);
  for (int k : shards) {
    const auto [h, b] = pullReply(k);
    const auto& ids = plan_.shard_pieces[static_cast<std::size_t>(k)];
    const auto& want = asked[static_cast<std::size_t>(k)];
    const uint64_t expected = want.empty() ? psPullBodyBytes(plan_, k, options_.pull_dtype)
                                           : psRowPullBodyBytes(plan_, k, want, options_.pull_dtype);
    TERSE_CHECK(h.dtype == options_.pull_dtype && h.piece == ids.size() && h.payload_bytes == expected, InvalidPayload,
                "parameter server client: malformed pull reply from shard " << k);
    pull_payload_bytes_ += h.payload_bytes;
    std::vector<uint64_t> versions(ids.size());
    if (want.empty()) {
      const auto [from, to] = plan_.ranges[static_cast<std::size_t>(k)];
      decodePsPullBody(b, h.dtype, versions, params.subspan(from, to - from));
    } else {
      decodePsRowPullBody(plan_, k, want, b, h.dtype, versions, params);
    }
    for (std::size_t i = 0; i < ids.size(); ++i) versions_[ids[i]] = versions[i];
  }
  if (options_.pull_compressor) {
    // The shards set their replicas of this worker to what they sent: the base of every later (delta) pull.
    std::copy(params.begin(), params.end(), replica_.begin());
    have_replica_ = true;
  }
}

void ParamServerClient::push(uint64_t step, std::span<const float> grad, std::span<const std::vector<int64_t>> rows) {
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
      PsRequestHeader h;
      h.op = PsOp::kPush;
      std::vector<std::byte> req;
      uint64_t n;
      if (isRowSparse(plan_, p)) {
        // Compressors serve dense tensors only: the rows go as they are (DESIGN.md section 2).
        const std::vector<uint32_t> row_ids = pieceRowIds(p, rows);
        h.op = PsOp::kPushRows;
        n = psRowPushBytes(plan_, p, row_ids);
        req.resize(kPsRequestHeaderBytes + n);
        encodePsRowPush(plan_, p, row_ids, g, std::span<std::byte>(req).subspan(kPsRequestHeaderBytes));
      } else if (options_.compressor) {
        req.resize(kPsRequestHeaderBytes + codecs_[id]->sizes(0).max_output_bytes);
        // Error feedback (if configured) adds this worker's residual inside encode and keeps the new one here.
        const auto t0 = rt::now();
        {
          const auto numel = static_cast<double>(p.numel);
          const rt::Kernel kernel({.kind = rt::CostKind::kCompress,
                                   .layer = 0,
                                   .size = numel,
                                   .flops = ps_detail::kCodecFlopsPerElement * numel,
                                   .phase = codecs_[id]->phaseAt(step)});
          n = codecs_[id]->encode(step, 0, g, {}, std::span<std::byte>(req).subspan(kPsRequestHeaderBytes));
        }
        encode_s_ += std::chrono::duration<double>(rt::now() - t0).count();
      } else {
        n = p.numel * sizeof(float);
        req.resize(kPsRequestHeaderBytes + n);
        std::memcpy(req.data() + kPsRequestHeaderBytes, g, n);
      }
      req.resize(kPsRequestHeaderBytes + n);
      payload_bytes_ += n;
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
    addRequest(o, c, {});
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
