// A worker's side of the parameter server (param_server_shard.h): pulls every shard's range (or, for row-sparse
// tensors, the rows its next batch reads), pushes its gradient piece by piece through its own codec chain (error
// feedback's residual lives here, on the worker; row-sparse pieces go as their rows, uncompressed), completes each step
// on every shard, and pings the shards it is not waiting on so that a long SSP hold on one shard does not get it
// declared dead by the others. With a pull compressor (param_server_shard.h, "Compressed pulls") the client keeps its
// own copy of the parameters: the first pull is a full f32 one, each later pull adds every piece's decoded change.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/transport.h"
#include "core/common/dtype.h"
#include "core/common/error.h"
#include "core/compress/codec.h"
#include "core/compress/make_codec.h"
#include "core/train/param_server_plan.h"
#include "core/train/param_server_wire.h"

namespace terse::train {

struct ClientOptions {
  std::shared_ptr<const Compressor> compressor;  // must match the server's; null = raw f32
  CodecOptions codec;                            // error feedback residual lives here, on the worker
  uint64_t run_seed = 0;
  DType pull_dtype = DType::kF32;  // values cast to f16/bf16 on the way down when set
  // The shards' pull compressor (must match theirs); null = pulls carry the parameters. Needs pull_dtype f32 and a plan
  // without row-sparse tensors.
  std::shared_ptr<const Compressor> pull_compressor;
  std::chrono::milliseconds heartbeat{200};
};

// A shard refused a request; the message is the shard's.
class PsRefused : public InvalidPayload {
 public:
  explicit PsRefused(const std::string& m) : InvalidPayload(m) {}
};

class ParamServerClient {
 public:
  ParamServerClient(comm::Transport& transport, PsPlan plan, int worker, int num_workers, ClientOptions options);
  ~ParamServerClient();

  // Pulls every shard's range into params (total_numel elements) for step `step`; blocks while SSP holds it. With
  // `rows` (per tensor; used for the plan's row-sparse tensors, any order, repeats allowed) only those rows of the
  // row-sparse tensors travel (kPullRows) and the rest of their values in params stay as they were; empty = all.
  void pull(uint64_t step, std::span<float> params, std::span<const std::vector<int64_t>> rows = {});
  // Compresses and pushes every piece of grad (total_numel elements) computed on the last pulled versions, then
  // completes step `step` (kClock) on every shard. A row-sparse tensor's pieces are pushed as the rows `rows` names
  // for it (per tensor, any order, repeats allowed; grad must be zero in every other row), outside the codec: required
  // when the plan has row-sparse tensors. Throws PsRefused when a shard refused a piece, InvalidArgument for a row
  // out of range.
  void push(uint64_t step, std::span<const float> grad, std::span<const std::vector<int64_t>> rows = {});
  // Leaves the job: the shards stop counting this worker. No reply.
  void bye();

  const PsPlan& plan() const { return plan_; }
  const std::vector<uint64_t>& versions() const { return versions_; }  // per piece, as last pulled
  double encodeSeconds() const { return encode_s_; }                   // codec encode time of every push so far
  double decodeSeconds() const { return decode_s_; }  // pull compressor decode time (and add) of every pull so far
  uint64_t payloadBytes() const { return payload_bytes_; }  // compressed (or raw f32) payload bytes pushed so far
  // Bodies of the pull replies received so far (the values in pull_dtype and a u64 version per piece; for a row pull,
  // its rows): what the shards sent down beside their reply headers.
  uint64_t pullPayloadBytes() const { return pull_payload_bytes_; }

 private:
  struct Outbox;
  // Appends a request of header `h` (its payload_bytes set here) and `body` to `o`'s requests.
  static void addRequest(Outbox& o, PsRequestHeader h, std::span<const std::byte> body);
  // A delta pull (kPullDelta) from every shard, its decoded changes added to replica_.
  void pullDelta(uint64_t step);
  // `shard`'s one reply of the last exchange: its header and body (a view of the reply buffer); a refusal is thrown as
  // PsRefused with the shard's message.
  std::pair<PsReplyHeader, std::span<const std::byte>> pullReply(int shard) const;
  // Sends one request to each listed shard and waits for all replies, pinging idle shards meanwhile.
  void exchange(const std::vector<int>& shards);
  // The distinct rows of `rows` (of piece p's tensor) that overlap piece p, ascending.
  std::vector<uint32_t> pieceRowIds(const PsPiece& p, std::span<const std::vector<int64_t>> rows) const;

  comm::Transport& transport_;
  PsPlan plan_;
  int worker_;
  int num_workers_;
  ClientOptions options_;
  std::vector<std::unique_ptr<TensorCodec>> codecs_;  // per piece
  // Compressed pulls: the pull compressor's decoder per piece, each piece's largest payload, this worker's copy of the
  // parameters (what the shards' replicas of it hold) once the first full pull filled it, and a decode scratch.
  std::vector<std::unique_ptr<TensorCodec>> pull_codecs_;
  std::vector<uint64_t> pull_max_payloads_;
  std::vector<float> replica_;
  bool have_replica_ = false;
  std::vector<float> decoded_;
  std::vector<uint64_t> versions_;
  std::vector<std::unique_ptr<Outbox>> out_;  // per shard
  std::array<std::byte, kPsRequestHeaderBytes> ping_{};
  double encode_s_ = 0;
  double decode_s_ = 0;
  uint64_t payload_bytes_ = 0;
  uint64_t pull_payload_bytes_ = 0;
};

}  // namespace terse::train
