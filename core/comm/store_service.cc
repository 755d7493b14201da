// The rendezvous store's request semantics (store_service.h).
#include "core/comm/store_service.h"

#include <algorithm>

#include "core/comm/store.h"
#include "core/comm/tcp_store.h"
#include "core/common/error.h"

namespace terse::comm {

std::string storeKeyProblem(std::string_view key) {
  if (key.empty()) return "the key is empty";
  if (key.size() > kStoreMaxKeyBytes)
    return "the key is " + std::to_string(key.size()) + " bytes, over the limit of " +
           std::to_string(kStoreMaxKeyBytes);
  for (char c : key) {
    if (c < 0x20 || c > 0x7e) return "the key holds a byte that is not printable ASCII";
  }
  return {};
}

storepb::Request parseStoreRequest(std::span<const char> body) {
  storepb::Request request;
  TERSE_CHECK(request.ParseFromArray(body.data(), static_cast<int>(body.size())), InvalidPayload,
              "a request of " << body.size() << " bytes that is not a store message");
  TERSE_CHECK(request.op_case() != storepb::Request::OP_NOT_SET, InvalidPayload,
              "a store request without an operation");
  return request;
}

const std::string* StoreTable::find(std::string_view key) const {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

StoreOutcome StoreTable::apply(const storepb::Request& request) {
  StoreOutcome out;
  storepb::Response& response = out.response;
  auto fail = [&](storepb::Error::Code code, const std::string& message) {
    response.mutable_error()->set_code(code);
    response.mutable_error()->set_message(message);
  };
  auto badKey = [&](const std::string& key) {
    const std::string problem = storeKeyProblem(key);
    if (!problem.empty()) fail(storepb::Error::INVALID_ARGUMENT, "store: " + problem);
    return !problem.empty();
  };
  switch (request.op_case()) {
    case storepb::Request::kSet: {
      const auto& set = request.set();
      if (badKey(set.key())) break;
      if (set.value().size() > kStoreMaxValueBytes) {
        fail(storepb::Error::INVALID_ARGUMENT, "store: the value for key '" + set.key() + "' is " +
                                                   std::to_string(set.value().size()) + " bytes, over the limit of " +
                                                   std::to_string(kStoreMaxValueBytes));
        break;
      }
      values_.insert_or_assign(set.key(), set.value());
      response.mutable_ok();
      out.changed = set.key();
      break;
    }
    case storepb::Request::kAdd: {
      const auto& add = request.add();
      if (badKey(add.key())) break;
      try {
        auto it = values_.find(add.key());
        const int64_t old = it == values_.end() ? 0 : parseStoreCounter(add.key(), it->second);
        int64_t now = 0;
        TERSE_CHECK(!__builtin_add_overflow(old, add.delta(), &now), InvalidArgument,
                    "store: add(" << add.delta() << ") to key '" << add.key() << "' overflows its value " << old);
        values_.insert_or_assign(add.key(), std::to_string(now));
        response.set_counter(now);
        out.changed = add.key();
      } catch (const InvalidArgument& e) {
        fail(storepb::Error::INVALID_ARGUMENT, e.what());
      }
      break;
    }
    case storepb::Request::kCheck:
      if (badKey(request.check().key())) break;
      response.set_exists(values_.count(request.check().key()) != 0);
      break;
    case storepb::Request::kGet: {
      const auto& get = request.get();
      if (badKey(get.key())) break;
      if (auto it = values_.find(get.key()); it != values_.end()) {
        response.set_value(it->second);
        break;
      }
      out.wait = true;
      out.wait_key = get.key();
      out.wait_for = std::chrono::milliseconds(
          static_cast<int64_t>(std::min<uint64_t>(get.timeout_ms(), uint64_t(kMaxGetWait.count()))));
      break;
    }
    case storepb::Request::OP_NOT_SET:
      fail(storepb::Error::INVALID_ARGUMENT, "store: a request without an operation");
      break;
  }
  return out;
}

}  // namespace terse::comm
