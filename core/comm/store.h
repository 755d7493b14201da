// The rendezvous store (DESIGN.md section 6): a small key/value service every rank of a job can reach before the
// ranks can reach each other. Ranks publish their listening addresses here (and later the NCCL unique id), and wait
// for the others'. Same role as torch.distributed's TCPStore / c10d::Store and Gloo's rendezvous store.
//
// Implementations: MemoryStore (below; one process, ranks are threads, and tests) and the TCP store client
// (core/comm/tcp_store.h; a server hosted by rank 0 or by a standalone `terse store`).
//
// Values are opaque bytes. Keys are short printable strings; callers that run several jobs over one store (the
// variants of a study) give each job its own key prefix.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

namespace terse::comm {

class Store {
 public:
  virtual ~Store() = default;

  // Sets key to value (replacing an older value) and wakes every waiter.
  virtual void set(const std::string& key, std::string_view value) = 0;
  // Blocks until key exists, then returns its value. Throws CommError (transport.h) naming the key and the timeout when
  // it does not appear within `timeout`, or when the store is unreachable.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Adds delta to the integer counter at key (a missing key counts as 0) and returns the new value, atomically with
  // respect to every other client. Throws InvalidArgument when key holds a value that is not such a counter.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Whether key exists now (never blocks on the key).
  virtual bool check(const std::string& key) = 0;
};

// A thread-safe in-process store.
class MemoryStore final : public Store {
 public:
  void set(const std::string& key, std::string_view value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::string& key) override;

 private:
  std::mutex mutex_;  // guards values_
  std::condition_variable changed_;
  std::map<std::string, std::string, std::less<>> values_;
};

// Counters are stored as their decimal text, so a TCP store and a memory store hold the same bytes and `get` of a
// counter is readable. Throws InvalidArgument naming the key when `text` is not a decimal int64.
int64_t parseStoreCounter(std::string_view key, std::string_view text);

}  // namespace terse::comm
