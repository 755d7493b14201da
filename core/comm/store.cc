#include "core/comm/store.h"

#include <charconv>
#include <limits>

#include "core/comm/transport.h"
#include "core/common/error.h"

namespace terse::comm {

int64_t parseStoreCounter(std::string_view key, std::string_view text) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  TERSE_CHECK(ec == std::errc() && ptr == end && !text.empty(), InvalidArgument,
              "store: key '" << key << "' holds " << text.size() << " bytes that are not a counter (add() needs a "
                             << "decimal int64)");
  return value;
}

void MemoryStore::set(const std::string& key, std::string_view value) {
  {
    std::lock_guard lock(mutex_);
    values_.insert_or_assign(key, std::string(value));
  }
  changed_.notify_all();
}

std::string MemoryStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  const bool found = changed_.wait_for(lock, timeout, [&] { return values_.find(key) != values_.end(); });
  if (!found) {
    TERSE_THROW(CommError, "store: key '" << key << "' did not appear within " << timeout.count() << " ms");
  }
  return values_.find(key)->second;
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t now = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = values_.find(key);
    const int64_t old = it == values_.end() ? 0 : parseStoreCounter(key, it->second);
    TERSE_CHECK(!__builtin_add_overflow(old, delta, &now), InvalidArgument,
                "store: add(" << delta << ") to key '" << key << "' overflows its value " << old);
    values_.insert_or_assign(key, std::to_string(now));
  }
  changed_.notify_all();
  return now;
}

bool MemoryStore::check(const std::string& key) {
  std::lock_guard lock(mutex_);
  return values_.find(key) != values_.end();
}

}  // namespace terse::comm
