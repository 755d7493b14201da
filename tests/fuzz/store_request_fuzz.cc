// Fuzz target: the rendezvous store's server side (core/comm/store_service.h) as an authenticated but hostile client
// drives it -- a stream of frames (frame.h) carrying protobuf requests (store.proto), applied in order to one table.
// Every request is either refused before the table sees it or answered; an answer must survive the trip to the
// client, and the table must hold what a successful set wrote.
#include <string>

#include "core/comm/frame.h"
#include "core/comm/store_service.h"
#include "core/comm/tcp_store.h"
#include "core/common/error.h"
#include "tests/fuzz/fuzz_util.h"

using namespace terse;
using namespace terse::comm;

namespace {
void serve(StoreTable& table, std::span<const std::byte> body) {
  storepb::Request request;
  try {
    request = parseStoreRequest(std::span<const char>(reinterpret_cast<const char*>(body.data()), body.size()));
  } catch (const InvalidPayload&) {
    return;  // the server drops the connection
  }
  const StoreOutcome out = table.apply(request);
  if (out.wait) {
    TERSE_FUZZ_CHECK(request.op_case() == storepb::Request::kGet, "only a get waits");
    TERSE_FUZZ_CHECK(out.wait_for <= kMaxGetWait, "a wait beyond the bound");
    TERSE_FUZZ_CHECK(storeKeyProblem(out.wait_key).empty() && table.find(out.wait_key) == nullptr,
                     "a wait for a bad or present key");
    return;
  }
  storepb::Response back;
  TERSE_FUZZ_CHECK(back.ParseFromString(out.response.SerializeAsString()), "an answer the client cannot parse");
  TERSE_FUZZ_CHECK(out.response.result_case() != storepb::Response::RESULT_NOT_SET, "a request without an answer");
  if (request.op_case() == storepb::Request::kSet && out.response.has_ok()) {
    const std::string* v = table.find(request.set().key());
    TERSE_FUZZ_CHECK(v != nullptr && *v == request.set().value(), "a set that did not stick");
    TERSE_FUZZ_CHECK(out.changed == request.set().key(), "a set that wakes no waiter");
  }
  if (out.response.has_error()) TERSE_FUZZ_CHECK(out.changed.empty(), "a refused request changed the table");
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  StoreTable table;
  if ((in.byte() & 1) != 0) {
    // One bare request body: the shortest way for the fuzzer into the protobuf and the table.
    serve(table, in.rest());
    return 0;
  }
  // A connection's stream: each frame's header is validated before its length is trusted.
  while (!in.empty()) {
    const auto raw = in.take(kFrameHeaderBytes);
    FrameHeader h;
    try {
      h = decodeFrameHeader(raw, kStoreMaxMessageBytes, "store request");
    } catch (const InvalidPayload&) {
      return 0;  // the server drops the connection
    }
    if (h.meta.kind != OpKind::kControl) return 0;
    const auto body = in.take(static_cast<std::size_t>(h.length));
    if (body.size() < h.length) return 0;  // the client hung up mid-message
    serve(table, body);
  }
  return 0;
}
