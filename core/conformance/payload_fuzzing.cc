// The checks that a plugin treats a payload as untrusted input (DESIGN.md section 4): valid payloads from the
// simulator, truncated, extended, header-corrupted, byte-flipped and replaced by noise, each decoded (or reduced, or
// fed back as prev) between guard zones; each must be rejected with TERSE_ERR_INVALID_PAYLOAD or decoded without
// writing outside the output. And the deferred decompress (terse/device_verdict_v1.h) must give decompress's verdict
// on each, whether it leaves it in its word or returns it.
#include "core/conformance/checks.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/common/error.h"
#include "core/conformance/message.h"
#include "core/plugin/plugin_support.h"

namespace terse::conformance {
namespace {

// How a call refused, as a check's message names it. Status 6 is the plugin's ("plugin error") only when the plugin
// raised it (PluginError): terse's own faults -- InternalError, a simulation's or a communicator's -- carry it too, and
// a harness fault must not read as the plugin's.
struct Refusal {
  terse_status_v1 status;
  bool plugins;
  bool operator==(const Refusal&) const = default;
  std::string name() const {
    return status == TERSE_ERR_INTERNAL && !plugins ? std::string("internal error (terse's)")
                                                    : detail::statusName(status);
  }
};

Refusal refusalOf(const Error& e) {
  return {e.status(), dynamic_cast<const PluginError*>(&e) != nullptr};
}

// One call of an ordinary-versus-deferred comparison: how it refused, none when it returned. A contract violation
// is the check's failure, named by `where`.
template <class Fn>
std::optional<Refusal> refusalOfCall(const std::string& where, Fn&& fn) {
  try {
    fn();
  } catch (const Violation& v) {
    throw Violation(cat(where, ": ", v.what()));
  } catch (const Error& e) {
    return refusalOf(e);
  }
  return std::nullopt;
}

// Payloads up to this size get every byte flipped; larger ones a fixed sample of positions.
constexpr std::size_t kExhaustiveFlipBytes = 512;

// One valid payload and how to decode it.
struct Specimen {
  std::shared_ptr<Simulation> sim;
  uint64_t step;
  Bytes payload;
  int source;
  std::string label;  // "1001, rank 0's payload"
};

// Valid payloads to corrupt: for the smallest and the representative shape, a rank's own payload (decoded with its
// source rank, as error feedback and allgather do) and, for SUM and CUSTOM, the aggregate of three ranks (source -1).
std::vector<Specimen> specimens(Context& c) {
  std::vector<ConformanceShape> shapes;
  if (auto s = c.smallest()) shapes.push_back(*s);
  if (auto r = c.representative(); r && (shapes.empty() || r->label() != shapes[0].label())) shapes.push_back(*r);
  // And the smallest matrix: a low-rank compressor sends its real format only for matrices (flat tensors may pass
  // through), and that format must be fuzzed too.
  std::optional<ConformanceShape> matrix;
  for (const auto& s : c.moderate())
    if (s.ndim >= 2 && s.numel > 0 && (!matrix || s.numel < matrix->numel)) matrix = s;
  if (matrix) shapes.push_back(*matrix);
  std::vector<Specimen> out;
  for (const auto& shape : shapes) {
    const int w = c.options.world_size;
    auto sim = std::make_shared<Simulation>(c.sim(shape, w));
    const RankInputs in = rankInputs(c, shape, 12, w);
    const Step s = sim->run(0, in.pointers);
    out.push_back({sim, 0, s.payloads.back()[0], 0, tag(shape) + ", rank 0's payload"});
    if (sim->aggregated()) out.push_back({sim, 0, s.aggregates.back(), -1, tag(shape) + ", aggregate"});
  }
  return out;
}

// Tallies decodes of corrupted payloads. Rejections must carry TERSE_ERR_INVALID_PAYLOAD; memory damage (a
// Violation from the guard zones) ends the check with the mutation named.
class Attempts {
 public:
  enum class Result { kAccepted, kRejected };

  Result decode(Specimen& sp, std::span<const std::byte> payload, const std::string& mutation) {
    return run(sp.label, mutation, [&] {
      Floats out(sp.sim->numel(), 0.0f);
      sp.sim->decompress(0, sp.step, payload, sp.source, out, false);
    });
  }

  template <class Fn>
  Result run(const std::string& where, const std::string& mutation, Fn&& fn,
             std::initializer_list<terse_status_v1> allowed = {TERSE_ERR_INVALID_PAYLOAD}) {
    ++total_;
    try {
      fn();
      ++accepted_;
      return Result::kAccepted;
    } catch (const Violation& v) {
      throw Violation(cat(where, ", ", mutation, ": ", v.what()));
    } catch (const Error& e) {
      ++rejected_;
      if (std::find(allowed.begin(), allowed.end(), e.status()) == allowed.end() && wrong_status_.empty()) {
        wrong_status_ = cat(where, ", ", mutation, ": rejected with '", refusalOf(e).name(),
                            "' instead of 'invalid payload': ", e.what());
      }
      return Result::kRejected;
    }
  }

  std::size_t total() const { return total_; }
  std::size_t accepted() const { return accepted_; }
  std::size_t rejected() const { return rejected_; }
  const std::string& wrongStatus() const { return wrong_status_; }

 private:
  std::size_t total_ = 0, accepted_ = 0, rejected_ = 0;
  std::string wrong_status_;
};

// Every mutation here makes the payload invalid, so each must be rejected.
class MustReject {
 public:
  void expect(Attempts& a, Specimen& sp, const Bytes& payload, const std::string& mutation) {
    ++count_;
    if (a.decode(sp, payload, mutation) == Attempts::Result::kAccepted) {
      ++accepted_;
      if (example_.empty()) example_ = sp.label + ", " + mutation;
    }
  }
  std::size_t count() const { return count_; }
  std::size_t accepted() const { return accepted_; }
  const std::string& example() const { return example_; }

 private:
  std::size_t count_ = 0, accepted_ = 0;
  std::string example_;
};
}  // namespace

Outcome checkWrongLength(Context& c) {
  Attempts attempts;
  MustReject must;
  auto sps = specimens(c);
  for (auto& sp : sps) {
    const std::size_t len = sp.payload.size();
    std::set<std::size_t> cuts;
    for (std::size_t k = 0; k < std::min<std::size_t>(len, 65); ++k) cuts.insert(k);
    for (std::size_t k :
         {len / 2, len / 3 * 2, len - std::min<std::size_t>(len, 16), len - std::min<std::size_t>(len, 4)})
      if (k < len) cuts.insert(k);
    if (len > 0) cuts.insert(len - 1);
    for (std::size_t k : cuts) {
      must.expect(attempts, sp, Bytes(sp.payload.begin(), sp.payload.begin() + static_cast<std::ptrdiff_t>(k)),
                  cat("truncated to ", k, " of ", len, " bytes"));
    }
    for (std::size_t extra : {1, 16}) {
      Bytes longer = sp.payload;
      longer.resize(len + extra, std::byte{0});
      must.expect(attempts, sp, longer, cat("extended by ", extra, " zero bytes to ", len + extra));
    }
  }
  if (must.accepted() > 0) {
    return fail(cat("accepted ", must.accepted(), " of ", must.count(),
                    " payloads of the wrong length (a truncated payload must be rejected, never decoded from what is "
                    "there), e.g. ",
                    must.example()));
  }
  if (!attempts.wrongStatus().empty()) return fail(attempts.wrongStatus());
  return pass(cat("rejected all ", must.count(), " truncated or extended copies of ", sps.size(),
                  " valid payloads with 'invalid payload'"));
}

Outcome checkWrongHeader(Context& c) {
  Attempts attempts;
  MustReject must;
  std::size_t magic = 0, field = 0;
  auto sps = specimens(c);
  for (auto& sp : sps) {
    const std::size_t len = sp.payload.size();
    // Magic: any change in the first four bytes.
    for (std::size_t i = 0; i < std::min<std::size_t>(len, 4); ++i) {
      Bytes p = sp.payload;
      p[i] ^= std::byte{0xFF};
      must.expect(attempts, sp, p, cat("byte ", i, " (magic) flipped"));
      ++magic;
    }
    // The SDK's PayloadHeader keeps numel at bytes 8..15; when that is what this payload holds, lie there.
    uint64_t header_numel = 0;
    if (len >= 16) std::memcpy(&header_numel, sp.payload.data() + 8, 8);
    if (len >= 16 && header_numel == sp.sim->numel()) {
      const uint64_t n = sp.sim->numel();
      for (uint64_t lie : {n + 1, n - 1, n + (uint64_t{1} << 32), uint64_t{1} << 63, ~uint64_t{0}}) {
        Bytes p = sp.payload;
        std::memcpy(p.data() + 8, &lie, 8);
        must.expect(attempts, sp, p, cat("header numel set to ", lie));
        ++field;
      }
    }
  }
  // A payload for n elements decoded as a tensor of n + 1 or n - 1 (flat shapes). The simulation for the other size
  // runs a valid step first, so a multi-round plugin has its workspace prepared and only the payload is wrong.
  MustReject mismatch;
  for (auto& sp : sps) {
    if (sp.source != 0 || sp.sim->shape().ndim != 0) continue;
    const uint64_t n = sp.sim->numel();
    for (uint64_t other : {n + 1, n - 1}) {
      if (other == n) continue;
      const ConformanceShape shape = ConformanceShape::flat(other);
      std::shared_ptr<Simulation> sim;
      try {
        sim = std::make_shared<Simulation>(c.sim(shape, 1));
      } catch (const Unsupported&) {
        continue;  // a size the plugin does not take cannot test this
      }
      sim->runOne(sp.step, normalInput(other, c.inputSeed(shape, 13)));
      Specimen as_other{sim, sp.step, sp.payload, 0, sp.label};
      mismatch.expect(attempts, as_other, sp.payload, cat("decoded as a tensor of ", other, " elements"));
    }
  }
  const std::size_t total = magic + field + mismatch.count();
  const std::size_t accepted = must.accepted() + mismatch.accepted();
  if (accepted > 0) {
    return fail(cat("accepted ", accepted, " of ", total,
                    " payloads with a wrong header or for another tensor size, e.g. ",
                    mismatch.accepted() ? mismatch.example() : must.example()));
  }
  if (!attempts.wrongStatus().empty()) return fail(attempts.wrongStatus());
  return pass(cat("rejected ", magic, " magic corruptions, ", mismatch.count(), " numel mismatches",
                  field ? cat(" and ", field, " lies in the header's numel field") : std::string(),
                  " with 'invalid payload'"));
}

Outcome checkByteFlips(Context& c) {
  Attempts attempts;
  auto sps = specimens(c);
  std::mt19937_64 rng(mixSeed(c.options.seed, 14));
  for (auto& sp : sps) {
    const std::size_t len = sp.payload.size();
    std::vector<std::size_t> positions;
    if (len <= kExhaustiveFlipBytes) {
      for (std::size_t i = 0; i < len; ++i) positions.push_back(i);
    } else {
      for (std::size_t i = 0; i < 64; ++i) positions.push_back(i);
      std::uniform_int_distribution<std::size_t> pick(64, len - 1);
      for (std::size_t i = 64; i < kExhaustiveFlipBytes; ++i) positions.push_back(pick(rng));
    }
    for (std::size_t i : positions) {
      for (uint8_t v : {uint8_t{0x00}, uint8_t{0x7F}, uint8_t{0x80}, uint8_t{0xFF}, uint8_t(~uint8_t(sp.payload[i]))}) {
        if (std::byte{v} == sp.payload[i]) continue;
        Bytes p = sp.payload;
        p[i] = std::byte{v};
        attempts.decode(sp, p, cat("byte ", i, " set to ", int{v}));
      }
    }
    // Counts and lengths as huge words at every aligned offset of small payloads.
    for (std::size_t i = 0; i + 4 <= len && i < 4 * kExhaustiveFlipBytes; i += 4) {
      for (uint32_t v : {0xFFFFFFFFu, 0x7FFFFFFFu, 0x80000000u}) {
        Bytes p = sp.payload;
        std::memcpy(p.data() + i, &v, 4);
        attempts.decode(sp, p, cat("u32 at ", i, " set to ", v));
      }
    }
    for (std::size_t i = 0; i + 8 <= len && i < 8 * kExhaustiveFlipBytes; i += 8) {
      for (uint64_t v : {~uint64_t{0}, uint64_t{1} << 63, uint64_t{1} << 40}) {
        Bytes p = sp.payload;
        std::memcpy(p.data() + i, &v, 8);
        attempts.decode(sp, p, cat("u64 at ", i, " set to ", v));
      }
    }
  }
  if (!attempts.wrongStatus().empty()) return fail(attempts.wrongStatus());
  return pass(cat(attempts.total(), " single-field corruptions of ", sps.size(), " payloads: ", attempts.rejected(),
                  " rejected with 'invalid payload', ", attempts.accepted(),
                  " still valid and decoded without writing outside the output"));
}

Outcome checkRandomPayloads(Context& c) {
  Attempts attempts;
  auto sps = specimens(c);
  std::mt19937_64 rng(mixSeed(c.options.seed, 15));
  auto randomBytes = [&](std::size_t n) {
    Bytes b(n);
    for (auto& x : b) x = static_cast<std::byte>(rng() & 0xFF);
    return b;
  };
  const int count = std::max(1, c.options.fuzz_payloads);
  for (auto& sp : sps) {
    const std::size_t len = sp.payload.size();
    std::uniform_int_distribution<std::size_t> length(0, 2 * len + 64);
    for (int i = 0; i < count; ++i) {
      // A third pure noise; a third behind a valid header, so that parsing gets past the magic; a third of exactly
      // the valid length behind a valid header, so that it gets past the length checks too.
      const int kind = i % 3;
      Bytes p = randomBytes(kind == 2 ? len : length(rng));
      if (kind > 0) std::copy_n(sp.payload.begin(), std::min({p.size(), len, std::size_t{16}}), p.begin());
      attempts.decode(sp, p, cat("random ", p.size(), " bytes (", kind == 0 ? "noise" : "valid header", ")"));
    }
  }
  std::string extra;
  // CUSTOM: reduce sees untrusted payloads too (validate both, says the ABI).
  if (c.caps.aggregation == Aggregation::kCustom) {
    std::size_t n = 0;
    for (auto& sp : sps) {
      if (sp.source != 0) continue;
      const int round = sp.sim->lastRound();
      for (int i = 0; i < count / 2; ++i) {
        Bytes junk = randomBytes(std::uniform_int_distribution<std::size_t>(0, 2 * sp.payload.size() + 64)(rng));
        if (i % 2)
          std::copy_n(sp.payload.begin(), std::min({junk.size(), sp.payload.size(), std::size_t{16}}), junk.begin());
        const bool left = i % 4 < 2;
        attempts.run(sp.label,
                     cat("reduce with a random ", junk.size(), "-byte ", left ? "first" : "second", " operand"),
                     [&] { sp.sim->reduce(0, sp.step, round, left ? junk : sp.payload, left ? sp.payload : junk); });
        ++n;
      }
    }
    extra += cat(", ", n, " reduces with a random operand");
  }
  // Multi-round: the last round's compress reads prev, an aggregate that came over the network.
  if (c.caps.num_rounds > 1) {
    std::size_t n = 0;
    for (auto& sp : sps) {
      if (sp.source != 0) continue;
      const int round = sp.sim->lastRound();
      const Floats x = normalInput(sp.sim->numel(), c.inputSeed(sp.sim->shape(), 16));
      for (int i = 0; i < count / 2; ++i) {
        const std::size_t prev_len = sp.sim->sizes(round - 1).max_output_bytes;
        Bytes prev = randomBytes(i % 2 ? prev_len : std::uniform_int_distribution<std::size_t>(0, 2 * prev_len)(rng));
        attempts.run(sp.label, cat("compress round ", round, " with a random ", prev.size(), "-byte prev"),
                     [&] { sp.sim->compress(0, sp.step, round, x, prev); },
                     {TERSE_ERR_INVALID_PAYLOAD, TERSE_ERR_INVALID_ARGUMENT});
        ++n;
      }
    }
    extra += cat(", ", n, " compresses with a random prev");
  }
  if (!attempts.wrongStatus().empty()) return fail(attempts.wrongStatus());
  return pass(cat(attempts.total(), " random byte strings (", count, " per payload", extra, "): ", attempts.rejected(),
                  " rejected, ", attempts.accepted(), " accepted without writing outside the output"));
}

// How a deferred call's verdict -- `deferred`, the status it threw (none: it returned), and `raised`, its word --
// disagrees with the ordinary `call`'s (`ordinary`) on the same input, in words; empty where they agree: both accept
// (the word at zero), or both refuse (the same status, or the word).
static std::string verdictDisagreement(std::string_view call, const std::optional<Refusal>& ordinary,
                                       const std::optional<Refusal>& deferred, bool raised) {
  if (!ordinary) {
    if (!deferred && !raised) return {};
    return cat(call, " accepts it, the deferred ", call, " ",
               deferred ? cat("refuses it with '", deferred->name(), "'") : std::string("raises its verdict word"));
  }
  if (!deferred && !raised) {
    return cat(call, " refuses it with '", ordinary->name(), "', the deferred ", call,
               " accepts it (status ok, word not raised)");
  }
  if (deferred && *deferred != *ordinary) {
    return cat(call, " refuses it with '", ordinary->name(), "', the deferred ", call, " with '", deferred->name(),
               "'");
  }
  return {};
}

// The deferred decompress (terse/device_verdict_v1.h) against decompress, on the same payloads: every valid specimen,
// written and accumulated, and its corruptions (the first bytes and a sample of the rest flipped, truncated, extended).
// Where decompress accepts, the deferred call must too, with the same output bytes and the word left at zero; where it
// refuses, the deferred call must refuse with the same status or raise its word, and then leave the output as it was.
// A plugin without the entry point has nothing to check.
Outcome checkDeferredVerdicts(Context& c) {
  auto sps = specimens(c);
  if (sps.empty()) return skip("no shape to make a payload of");
  if (!sps[0].sim->defersVerdicts())
    return skip(
        "the plugin does not export terse_compressor_decompress_deferred_v1: every decompress returns its "
        "verdict");
  std::size_t total = 0, accepted = 0, in_word = 0, at_once = 0;
  std::mt19937_64 rng(mixSeed(c.options.seed, 17));
  for (auto& sp : sps) {
    const std::size_t len = sp.payload.size();
    std::vector<std::pair<std::string, Bytes>> payloads = {{"the valid payload", sp.payload}};
    for (std::size_t i = 0; i < std::min<std::size_t>(len, 64); ++i) {
      Bytes p = sp.payload;
      p[i] ^= std::byte{0xFF};
      payloads.emplace_back(cat("byte ", i, " flipped"), std::move(p));
    }
    if (len > 64) {
      std::uniform_int_distribution<std::size_t> pick(64, len - 1);
      for (int k = 0; k < 32; ++k) {
        const std::size_t i = pick(rng);
        Bytes p = sp.payload;
        p[i] ^= std::byte{0xFF};
        payloads.emplace_back(cat("byte ", i, " flipped"), std::move(p));
      }
    }
    if (len > 0)
      payloads.emplace_back(cat("truncated to ", len - 1, " bytes"), Bytes(sp.payload.begin(), sp.payload.end() - 1));
    Bytes longer = sp.payload;
    longer.push_back(std::byte{0});
    payloads.emplace_back(cat("extended to ", len + 1, " bytes"), std::move(longer));

    const Floats base = normalInput(sp.sim->numel(), c.inputSeed(sp.sim->shape(), 18));
    for (const auto& [mutation, payload] : payloads) {
      for (const bool accumulate : {false, true}) {
        const std::string where = cat(sp.label, ", ", mutation, accumulate ? ", accumulated" : ", written");
        ++total;
        Floats want = base, got = base;
        const std::optional<Refusal> ordinary =
            refusalOfCall(where, [&] { sp.sim->decompress(0, sp.step, payload, sp.source, want, accumulate); });
        bool raised = false;
        const std::optional<Refusal> deferred = refusalOfCall(cat(where, " (deferred)"), [&] {
          raised = sp.sim->decompressDeferred(0, sp.step, payload, sp.source, got, accumulate);
        });
        if (const std::string d = verdictDisagreement("decompress", ordinary, deferred, raised); !d.empty())
          return fail(cat(where, ": ", d));
        if (!ordinary) {
          if (std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) != 0)
            return fail(cat(where, ": the deferred decompress decodes other bytes than decompress"));
          ++accepted;
          continue;
        }
        if (std::memcmp(base.data(), got.data(), base.size() * sizeof(float)) != 0)
          return fail(cat(where, ": the deferred decompress refused it and changed the output"));
        ++(deferred ? at_once : in_word);
      }
    }
  }
  // The deferred compress's check of prev (a multi-round plugin's last round): a fresh step's aggregate of the round
  // before and its corruptions, as the decodes above. Where compress accepts, the deferred call must too, with the
  // same payload and the word at zero; where it refuses, the deferred call must refuse with the same status or raise
  // its word (its payload is then undefined: the step's decompress refuses, which the device tests hold the built-ins
  // to).
  std::string prev_text;
  if (c.caps.num_rounds > 1 && sps[0].sim->defersPrevVerdicts()) {
    std::size_t prevs = 0, prev_accepted = 0, prev_in_word = 0, prev_at_once = 0;
    for (auto& sp : sps) {
      if (sp.source != 0) continue;
      Simulation& sim = *sp.sim;
      const int round = sim.lastRound();
      const uint64_t step = sp.step + 1000;  // a step of its own, after every specimen's
      const Floats x = normalInput(sim.numel(), c.inputSeed(sim.shape(), 19));
      const Step st = sim.runOne(step, x);
      const Bytes valid = st.aggregates.at(static_cast<std::size_t>(round - 1));
      // Rank 0's rounds before the last again, as the core runs them before it (a plugin's workspace may require
      // them: test_rounds checks the stage its round 0 left).
      const auto earlier = [&] {
        for (int r = 0; r < round; ++r)
          (void)sim.compress(0, step, r, x, r == 0 ? Bytes{} : st.aggregates.at(static_cast<std::size_t>(r - 1)));
      };
      std::vector<std::pair<std::string, Bytes>> mutations = {{"the valid prev", valid}};
      for (std::size_t i = 0; i < std::min<std::size_t>(valid.size(), 16); ++i) {
        Bytes p = valid;
        p[i] ^= std::byte{0xFF};
        mutations.emplace_back(cat("prev byte ", i, " flipped"), std::move(p));
      }
      if (valid.size() > 16) {
        Bytes p = valid;
        p[valid.size() - 1] ^= std::byte{0xFF};  // the last value's top byte: NaN or a huge one in a float body
        mutations.emplace_back(cat("prev byte ", valid.size() - 1, " flipped"), std::move(p));
      }
      if (!valid.empty()) mutations.emplace_back("prev truncated", Bytes(valid.begin(), valid.end() - 1));
      Bytes longer = valid;
      longer.push_back(std::byte{0});
      mutations.emplace_back("prev extended", std::move(longer));
      for (const auto& [mutation, prev] : mutations) {
        const std::string where = cat(sp.label, ", round ", round, ", ", mutation);
        ++prevs;
        Bytes want, got;
        bool raised = false;
        const std::optional<Refusal> ordinary = refusalOfCall(where, [&] {
          earlier();
          want = sim.compress(0, step, round, x, prev);
        });
        const std::optional<Refusal> deferred = refusalOfCall(cat(where, " (deferred)"), [&] {
          earlier();
          got = sim.compressDeferred(0, step, round, x, prev, &raised);
        });
        if (const std::string d = verdictDisagreement("compress", ordinary, deferred, raised); !d.empty())
          return fail(cat(where, ": ", d));
        if (!ordinary) {
          if (want != got) return fail(cat(where, ": the deferred compress writes other bytes than compress"));
          ++prev_accepted;
          continue;
        }
        ++(deferred ? prev_at_once : prev_in_word);
      }
    }
    prev_text =
        cat("; ", prevs, " deferred compresses of a prev and its corruptions agree with compress: ", prev_accepted,
            " accepted with the same bytes, ", prev_in_word, " refused in the word and ", prev_at_once, " at once");
  }
  return pass(cat(total, " deferred decodes of ", sps.size(), " payloads and their corruptions agree with decompress: ",
                  accepted, " accepted with the same bytes, ", in_word, " refused in the word and ", at_once,
                  " at once, the output untouched", prev_text));
}

}  // namespace terse::conformance
