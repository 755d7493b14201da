// terse plugin SDK: a communication scheduler as a C++ class, exported as the ABI's terse_scheduler_v1 by one macro.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>

#include "terse/resolved_params_v1.h"
#include "terse/scheduler_v1.h"
#include "terse/sdk/abi_checks.hpp"
#include "terse/sdk/error.hpp"
#include "terse/sdk/host.hpp"
#include "terse/sdk/params.hpp"

namespace terse::sdk {

// Base of a scheduler (see scheduler_v1.h for the contract). The derived class's constructor takes
// (sdk::Params&, sdk::Host&). All calls of one instance come from one thread, so members need no locks. Decisions
// must depend only on what was enqueued and completed, the flags and the credit: every rank must pick the same groups.
class Scheduler {
 public:
  virtual ~Scheduler() = default;
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // struct_size and the reserved flags are filled by the SDK; set credit_bytes (0: unlimited).
  virtual terse_scheduler_caps_v1 caps() const = 0;
  // Elements per chunk for a tensor that just became ready; 0 keeps it whole.
  virtual uint64_t partition(const terse_sched_tensor_v1& tensor) = 0;
  // The chunks of one tensor, in offset order; copy what you keep.
  virtual void enqueue(std::span<const terse_chunk_v1> chunks) = 0;
  // Writes the next group's chunk ids to the front of `out` and returns how many (0: nothing now). The group's
  // wire_bytes must fit credit_left unless flags has TERSE_SCHED_NOTHING_IN_FLIGHT.
  virtual size_t next(uint64_t credit_left, uint32_t flags, std::span<uint64_t> out) = 0;
  // A group handed out by next has been communicated.
  virtual void onComplete(std::span<const uint64_t> chunk_ids, uint64_t wire_bytes) = 0;

 protected:
  Scheduler() = default;
};

namespace detail {

template <class Export>
struct SchedulerAdapter {
  using Class = typename Export::Type;
  static_assert(std::is_base_of_v<Scheduler, Class>,
                "TERSE_EXPORT_SCHEDULER: the class must derive from sdk::Scheduler");
  static_assert(std::is_constructible_v<Class, Params&, Host&>,
                "TERSE_EXPORT_SCHEDULER: the class needs a constructor taking (sdk::Params&, sdk::Host&)");

  struct Context {
    explicit Context(const terse_host_v1* h) : host(h) {}
    Host host;
    std::unique_ptr<Class> instance;
    ResolvedParams resolved;  // terse_scheduler_resolved_params_v1
  };

  static terse_status_v1 init(const terse_param_v1* params, size_t num_params, const terse_host_v1* host,
                              void** ctx) noexcept {
    if (ctx != nullptr) *ctx = nullptr;
    if (host == nullptr || host->log == nullptr) return TERSE_ERR_INVALID_ARGUMENT;  // nowhere to say why
    return guard(host, Export::kName, [&] {
      checkedPointer(ctx, "init: ctx");
      auto context = std::make_unique<Context>(host);
      Params p(Export::kName, params, num_params);
      context->instance = std::make_unique<Class>(p, context->host);
      p.finish();
      context->resolved.set(p.resolved());
      *ctx = context.release();
    });
  }

  static terse_status_v1 finalize(void* ctx) noexcept {
    if (ctx == nullptr) return TERSE_ERR_INVALID_ARGUMENT;
    auto* c = static_cast<Context*>(ctx);
    const terse_host_v1* host = c->host.raw();
    return guard(host, Export::kName, [&] { delete c; });
  }

  static terse_status_v1 getCaps(void* ctx, terse_scheduler_caps_v1* caps) noexcept {
    if (ctx == nullptr) return TERSE_ERR_INVALID_ARGUMENT;
    auto* c = static_cast<Context*>(ctx);
    return guard(c->host.raw(), Export::kName, [&] {
      checkedPointer(caps, "get_caps: caps");
      checkStructSize(caps->struct_size, sizeof(terse_scheduler_caps_v1), "get_caps: caps");
      terse_scheduler_caps_v1 out = c->instance->caps();
      out.struct_size = sizeof(terse_scheduler_caps_v1);
      out.flags = 0;
      *caps = out;
    });
  }

  static terse_status_v1 partition(void* ctx, const terse_sched_tensor_v1* tensor, uint64_t* chunk_numel) noexcept {
    if (ctx == nullptr) return TERSE_ERR_INVALID_ARGUMENT;
    auto* c = static_cast<Context*>(ctx);
    return guard(c->host.raw(), Export::kName, [&] {
      checkedPointer(tensor, "partition: tensor");
      checkStructSize(tensor->struct_size, sizeof(terse_sched_tensor_v1), "partition: tensor");
      checkedPointer(chunk_numel, "partition: chunk_numel");
      *chunk_numel = c->instance->partition(*tensor);
    });
  }

  static terse_status_v1 enqueue(void* ctx, const terse_chunk_v1* chunks, uint64_t count) noexcept {
    if (ctx == nullptr) return TERSE_ERR_INVALID_ARGUMENT;
    auto* c = static_cast<Context*>(ctx);
    return guard(c->host.raw(), Export::kName, [&] {
      if (chunks == nullptr && count > 0) throw InvalidArgument("enqueue: chunks is NULL");
      c->instance->enqueue(std::span<const terse_chunk_v1>(chunks, static_cast<size_t>(count)));
    });
  }

  static terse_status_v1 next(void* ctx, uint64_t credit_left, uint32_t flags, uint64_t* chunk_ids, uint64_t capacity,
                              uint64_t* count) noexcept {
    if (ctx == nullptr) return TERSE_ERR_INVALID_ARGUMENT;
    auto* c = static_cast<Context*>(ctx);
    return guard(c->host.raw(), Export::kName, [&] {
      checkedPointer(count, "next: count");
      *count = 0;
      if (chunk_ids == nullptr && capacity > 0) throw InvalidArgument("next: chunk_ids is NULL");
      const size_t n =
          c->instance->next(credit_left, flags, std::span<uint64_t>(chunk_ids, static_cast<size_t>(capacity)));
      if (n > capacity) {
        throw Error(TERSE_ERR_INTERNAL,
                    "next reported " + std::to_string(n) + " chunks but the array holds " + std::to_string(capacity));
      }
      *count = n;
    });
  }

  static terse_status_v1 onComplete(void* ctx, const uint64_t* chunk_ids, uint64_t count,
                                    uint64_t wire_bytes) noexcept {
    if (ctx == nullptr) return TERSE_ERR_INVALID_ARGUMENT;
    auto* c = static_cast<Context*>(ctx);
    return guard(c->host.raw(), Export::kName, [&] {
      if (chunk_ids == nullptr && count > 0) throw InvalidArgument("on_complete: chunk_ids is NULL");
      c->instance->onComplete(std::span<const uint64_t>(chunk_ids, static_cast<size_t>(count)), wire_bytes);
    });
  }

  static constexpr terse_scheduler_v1 table() {
    return terse_scheduler_v1{TERSE_SCHEDULER_ABI_V1,
                              sizeof(terse_scheduler_v1),
                              Export::kName,
                              Export::kDescription,
                              Export::kVersion,
                              &init,
                              &finalize,
                              &getCaps,
                              &partition,
                              &enqueue,
                              &next,
                              &onComplete};
  }
};

}  // namespace detail
}  // namespace terse::sdk

// A scheduler plugin has no optional symbol of its kind's own (TERSE_SDK_DETAIL_EXPORT_PLUGIN, params.hpp).
#define TERSE_SDK_DETAIL_EXPORT_KIND_Scheduler(Export_)

// Exports Class as the plugin's struct, terse_scheduler_plugin_v1, terse_scheduler_resolved_params_v1 and
// terse_scheduler_build_info_v1; the rules of TERSE_EXPORT_COMPRESSOR apply.
#define TERSE_EXPORT_SCHEDULER(Class_, name_, description_, version_) \
  TERSE_SDK_DETAIL_EXPORT_PLUGIN("TERSE_EXPORT_SCHEDULER", Scheduler, scheduler, Class_, name_, description_, version_)
