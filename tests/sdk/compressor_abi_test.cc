// The C entry points TERSE_EXPORT_COMPRESSOR generates, called through the exported struct exactly as the core's loader
// calls them: status codes, logged messages, argument checks, and the test plugins' behaviour (test_lossy,
// test_rounds, test_throws from tests/plugins, plus a probe plugin compiled into this test).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sdk_test_util.h"
#include "terse/sdk.hpp"

// ---- A probe plugin exported from this executable by the macro (inside a namespace, which the macro allows). Its
// `mode` parameter picks what compress, reduce and the constructor do, to reach every path of the C boundary.
namespace probe_plugin {

namespace sdk = terse::sdk;

class Probe : public sdk::Compressor {
 public:
  Probe(sdk::Params& params, sdk::Host& host)
      : mode_(params.getChoice("mode", "ok",
                               {"ok", "too_many", "payload", "unsupported", "device", "oom", "ok_status", "logic",
                                "int", "prefixed", "ctor_throws", "ctor_oom", "defer"})),
        host_(host) {
    if (mode_ == "ctor_throws") throw std::runtime_error("constructor refused");
    if (mode_ == "ctor_oom") throw std::bad_alloc();
    host_.info("probe ready");
  }

  terse_compressor_caps_v1 caps(terse_dtype_v1 /*dtype*/) const override {
    terse_compressor_caps_v1 caps{};
    caps.devices = TERSE_DEVICE_HOST;
    caps.aggregation = TERSE_AGG_CUSTOM;
    caps.num_rounds = 1;
    return caps;
  }
  terse_compressor_sizes_v1 sizes(const terse_tensor_info_v1& info) const override {
    terse_compressor_sizes_v1 sizes{};
    sizes.max_output_bytes = 4 * info.numel;
    sizes.max_reduced_bytes = 4 * info.numel;
    sizes.reserved0 = 99;  // the SDK zeroes it
    return sizes;
  }
  uint64_t compress(const sdk::CompressArgs& args) const override {
    act();
    std::span<const float> in = args.input<float>();
    // "defer": a prev of other than 4 bytes an element is left in the deferred call's word (as a device check would
    // leave it), nothing written; the ordinary call refuses it.
    if (mode_ == "defer" && !args.prev.empty() && args.prev.size() != 4 * in.size()) {
      if (args.deferredVerdict() == nullptr)
        throw sdk::InvalidPayload("prev has " + std::to_string(args.prev.size()) + " bytes");
      *args.deferredVerdict() = 5;
      return 4 * in.size();
    }
    sdk::ByteWriter w(args.output);
    for (float x : in) w.put(x);
    return mode_ == "too_many" ? args.output.size() + 1 : w.offset();
  }
  void decompress(const sdk::DecompressArgs& args) const override {
    std::span<float> out = args.output<float>();
    // "defer": a payload of the wrong size is left in the deferred call's word (as a device check would leave it),
    // nothing written.
    if (mode_ == "defer" && args.deferredVerdict() != nullptr && args.payload.size() != 4 * out.size()) {
      *args.deferredVerdict() = 7;
      return;
    }
    sdk::ByteReader r(args.payload);
    std::span<const float> v = r.getArray<float>(out.size(), "values");
    r.expectEnd();
    for (size_t i = 0; i < out.size(); ++i) out[i] = args.accumulate ? out[i] + v[i] : v[i];
  }
  // Concatenates a and b: enough to see the spans arrive.
  uint64_t reduce(const sdk::ReduceArgs& args) const override {
    sdk::ByteWriter w(args.output);
    w.putBytes(args.a);
    w.putBytes(args.b);
    return mode_ == "too_many" ? args.output.size() + 1 : w.offset();
  }

 private:
  void act() const {
    if (mode_ == "payload") throw sdk::InvalidPayload("bad bytes");
    if (mode_ == "unsupported") throw sdk::Unsupported("not this one");
    if (mode_ == "device") throw sdk::DeviceError("cudaMemcpyAsync failed: invalid argument");
    if (mode_ == "oom") throw std::bad_alloc();
    if (mode_ == "ok_status") throw sdk::Error(TERSE_OK, "an error that claims success");
    if (mode_ == "logic") throw std::logic_error("broken invariant");
    if (mode_ == "int") throw 7;
    if (mode_ == "prefixed") throw sdk::InvalidArgument("probe: already named");
  }

  std::string mode_;
  sdk::Host host_;
};

TERSE_EXPORT_COMPRESSOR(Probe, "probe", "test probe", "0.0.1");

}  // namespace probe_plugin

namespace terse::sdk {
namespace {

using testing::makeInfo;
using testing::PluginFile;
using testing::RecordingHost;

// ---- Reduce detection, checked on classes that never get exported.
class NoReduce : public Compressor {
 public:
  NoReduce(Params&, Host&) {}
  terse_compressor_caps_v1 caps(terse_dtype_v1) const override { return {}; }
  terse_compressor_sizes_v1 sizes(const terse_tensor_info_v1&) const override { return {}; }
  uint64_t compress(const CompressArgs&) const override { return 0; }
  void decompress(const DecompressArgs&) const override {}
};
class ReduceInBase : public NoReduce {
 public:
  using NoReduce::NoReduce;
  uint64_t reduce(const ReduceArgs&) const override { return 0; }
};
class ReduceInheritedFromBase final : public ReduceInBase {
 public:
  using ReduceInBase::ReduceInBase;
};
template <class C>
struct ExportOf {
  using Type = C;
  static constexpr const char* kName = "x";
  static constexpr const char* kDescription = "";
  static constexpr const char* kVersion = "";
};
static_assert(!detail::CompressorAdapter<ExportOf<NoReduce>>::kHasReduce);
static_assert(detail::CompressorAdapter<ExportOf<ReduceInBase>>::kHasReduce);
static_assert(detail::CompressorAdapter<ExportOf<ReduceInheritedFromBase>>::kHasReduce);
static_assert(detail::CompressorAdapter<ExportOf<NoReduce>>::table().reduce == nullptr);
static_assert(detail::isValidPluginName("top_k8"));
static_assert(!detail::isValidPluginName("TopK") && !detail::isValidPluginName("") &&
              !detail::isValidPluginName("top-k"));

// A 16-byte aligned byte buffer (operator new's alignment), as the ABI promises for every buffer.
std::vector<std::byte> buffer(uint64_t bytes) {
  std::vector<std::byte> b(bytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 16, 0u);
  return b;
}

// One instance of a compressor plugin, finalized at the end of the test.
class Instance {
 public:
  Instance(const terse_compressor_v1* api, std::vector<std::pair<std::string, std::string>> params = {})
      : api_(api), params_(std::move(params)) {
    std::vector<terse_param_v1> raw;
    for (const auto& [k, v] : params_) raw.push_back({k.c_str(), v.c_str()});
    status_ = api_->init(raw.data(), raw.size(), host_.get(), &ctx_);
  }
  ~Instance() {
    if (ctx_ != nullptr) {
      EXPECT_EQ(api_->finalize(ctx_), TERSE_OK);
    }
  }
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  terse_status_v1 initStatus() const { return status_; }
  void* ctx() const { return ctx_; }
  RecordingHost& host() { return host_; }
  const terse_compressor_v1& api() const { return *api_; }

  terse_compressor_caps_v1 caps(terse_dtype_v1 dtype = TERSE_DTYPE_F32) {
    terse_compressor_caps_v1 caps{};
    caps.struct_size = sizeof caps;
    EXPECT_EQ(api_->get_caps(ctx_, dtype, &caps), TERSE_OK) << host_.lastError();
    return caps;
  }
  terse_compressor_sizes_v1 sizes(const terse_tensor_info_v1& info) {
    terse_compressor_sizes_v1 sizes{};
    sizes.struct_size = sizeof sizes;
    EXPECT_EQ(api_->get_sizes(ctx_, &info, &sizes), TERSE_OK) << host_.lastError();
    return sizes;
  }
  // compress into a buffer of max_output_bytes, resized to what was written.
  std::vector<std::byte> compress(const terse_tensor_info_v1& info, const std::vector<float>& input,
                                  const std::vector<std::byte>& prev = {},
                                  std::vector<std::byte>* workspace = nullptr) {
    std::vector<std::byte> out = buffer(sizes(info).max_output_bytes);
    terse_scratch_v1 scratch{};
    if (workspace != nullptr && !workspace->empty()) {
      scratch.workspace = workspace->data();
      scratch.workspace_bytes = workspace->size();
    }
    uint64_t n = 0;
    EXPECT_EQ(api_->compress(ctx_, &info, input.empty() ? nullptr : input.data(), prev.empty() ? nullptr : prev.data(),
                             prev.size(), &scratch, out.empty() ? nullptr : out.data(), out.size(), &n, nullptr),
              TERSE_OK)
        << host_.lastError();
    out.resize(n);
    return out;
  }
  terse_status_v1 decompress(const terse_tensor_info_v1& info, const std::vector<std::byte>& payload,
                             std::vector<float>& out, bool accumulate = false,
                             std::vector<std::byte>* workspace = nullptr) {
    terse_scratch_v1 scratch{};
    if (workspace != nullptr && !workspace->empty()) {
      scratch.workspace = workspace->data();
      scratch.workspace_bytes = workspace->size();
    }
    return api_->decompress(ctx_, &info, payload.empty() ? nullptr : payload.data(), payload.size(), &scratch,
                            out.empty() ? nullptr : out.data(), accumulate ? 1 : 0, nullptr);
  }

 private:
  const terse_compressor_v1* api_;
  std::vector<std::pair<std::string, std::string>> params_;
  RecordingHost host_;
  void* ctx_ = nullptr;
  terse_status_v1 status_ = TERSE_ERR_INTERNAL;
};

// The core's SUM path: header bytes carried through (and identical on every rank), the rest summed as f32.
std::vector<std::byte> sumPayloads(const std::vector<std::vector<std::byte>>& payloads, size_t header_bytes) {
  std::vector<std::byte> total = payloads.at(0);
  for (size_t r = 1; r < payloads.size(); ++r) {
    EXPECT_EQ(payloads[r].size(), total.size());
    EXPECT_EQ(std::memcmp(payloads[r].data(), total.data(), header_bytes), 0) << "headers differ between ranks";
    for (size_t off = header_bytes; off + 4 <= total.size(); off += 4) {
      float a, b;
      std::memcpy(&a, total.data() + off, 4);
      std::memcpy(&b, payloads[r].data() + off, 4);
      a += b;
      std::memcpy(total.data() + off, &a, 4);
    }
  }
  return total;
}

const terse_compressor_v1* probeApi() {
  return &probe_plugin::terse_compressor_plugin_v1;
}

// ---- The probe: every path of the boundary.

TEST(SdkCompressorAbi, TableFromTheMacro) {
  const terse_compressor_v1& t = *probeApi();
  EXPECT_EQ(t.abi_version, TERSE_COMPRESSOR_ABI_V1);
  EXPECT_EQ(t.struct_size, sizeof(terse_compressor_v1));
  EXPECT_STREQ(t.name, "probe");
  EXPECT_STREQ(t.description, "test probe");
  EXPECT_STREQ(t.version, "0.0.1");
  EXPECT_NE(t.init, nullptr);
  EXPECT_NE(t.reduce, nullptr);  // Probe overrides reduce
}

// The build info describes the file that expanded the macro, this one (compiled at -O0 in optimised builds, see
// terse_add_test): the loader can only tell a plugin's optimisation from what its own compiler defined.
TEST(SdkCompressorAbi, BuildInfoFromTheMacroDescribesThisFile) {
  const terse_build_info_v1& b = probe_plugin::terse_compressor_build_info_v1;
  EXPECT_EQ(b.struct_size, sizeof(terse_build_info_v1));
#ifdef __OPTIMIZE__
  EXPECT_EQ(b.flags, TERSE_BUILD_OPTIMIZED);
#else
  EXPECT_EQ(b.flags, 0u);
#endif
}

TEST(SdkCompressorAbi, ExceptionsBecomeStatusesWithLoggedMessages) {
  struct Case {
    const char* mode;
    terse_status_v1 status;
    const char* message;
  };
  const Case cases[] = {
      {"payload", TERSE_ERR_INVALID_PAYLOAD, "probe: bad bytes"},
      {"unsupported", TERSE_ERR_UNSUPPORTED, "probe: not this one"},
      {"device", TERSE_ERR_DEVICE, "probe: cudaMemcpyAsync failed: invalid argument"},
      {"oom", TERSE_ERR_OUT_OF_MEMORY, "probe: out of memory (std::bad_alloc)"},
      {"ok_status", TERSE_ERR_INTERNAL, "probe: an error that claims success"},
      {"logic", TERSE_ERR_INTERNAL, "probe: broken invariant"},
      {"int", TERSE_ERR_INTERNAL, "probe: unknown exception (not derived from std::exception)"},
      {"prefixed", TERSE_ERR_INVALID_ARGUMENT, "probe: already named"},
      {"too_many", TERSE_ERR_INTERNAL,
       "probe: compress reported 9 output bytes but the output holds 8; compress must return the bytes it wrote, at "
       "most args.output.size()"},
  };
  for (const Case& c : cases) {
    Instance inst(probeApi(), {{"mode", c.mode}});
    ASSERT_EQ(inst.initStatus(), TERSE_OK) << c.mode;
    const terse_tensor_info_v1 info = makeInfo(2);
    const float in[2] = {1, 2};
    std::vector<std::byte> out = buffer(8);
    uint64_t n = 123;
    terse_scratch_v1 scratch{};
    inst.host().clear();
    EXPECT_EQ(inst.api().compress(inst.ctx(), &info, in, nullptr, 0, &scratch, out.data(), out.size(), &n, nullptr),
              c.status)
        << c.mode;
    EXPECT_EQ(n, 0u) << c.mode;
    ASSERT_EQ(inst.host().messages().size(), 1u) << c.mode;
    EXPECT_EQ(inst.host().messages()[0].first, TERSE_LOG_ERROR);
    EXPECT_EQ(inst.host().messages()[0].second, c.message);
  }
}

// terse_compressor_phases_v1 (terse/phases_v1.h) through the adapter the export macro instantiates: the class's
// phaseSteps(), asked once at init; a list that breaks the contract refuses init with the plugin's name and the step.
template <uint64_t... Steps>
class Phased : public NoReduce {
 public:
  using NoReduce::NoReduce;
  std::vector<uint64_t> phaseSteps() const override { return {Steps...}; }
};
class TooManyPhases : public NoReduce {
 public:
  using NoReduce::NoReduce;
  std::vector<uint64_t> phaseSteps() const override {
    std::vector<uint64_t> s(TERSE_MAX_PHASES_V1 + 1);
    for (size_t i = 0; i < s.size(); ++i) s[i] = i + 1;
    return s;
  }
};
TEST(SdkCompressorAbi, PhasesAreTheClasssCheckedSteps) {
  RecordingHost host;
  void* ctx = nullptr;
  const uint64_t* steps = nullptr;
  size_t n = 99;
  using Good = detail::CompressorAdapter<ExportOf<Phased<3, 5, 8>>>;
  ASSERT_EQ(Good::init(nullptr, 0, host.get(), &ctx), TERSE_OK) << host.lastError();
  ASSERT_EQ(Good::phases(ctx, &steps, &n), TERSE_OK);
  EXPECT_EQ(std::vector<uint64_t>(steps, steps + n), (std::vector<uint64_t>{3, 5, 8}));
  EXPECT_EQ(Good::phases(ctx, nullptr, &n), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(Good::finalize(ctx), TERSE_OK);
  using None = detail::CompressorAdapter<ExportOf<NoReduce>>;
  ASSERT_EQ(None::init(nullptr, 0, host.get(), &ctx), TERSE_OK);
  ASSERT_EQ(None::phases(ctx, &steps, &n), TERSE_OK);
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(None::finalize(ctx), TERSE_OK);
  EXPECT_EQ(None::phases(nullptr, &steps, &n), TERSE_ERR_INVALID_ARGUMENT);
  for (const auto& [init, message] : std::vector<std::pair<decltype(terse_compressor_v1::init), std::string>>{
           {&detail::CompressorAdapter<ExportOf<Phased<5, 5>>>::init,
            "x: phaseSteps: step 5 at position 1: the steps must be above 0 and strictly increasing"},
           {&detail::CompressorAdapter<ExportOf<Phased<0, 2>>>::init,
            "x: phaseSteps: step 0 at position 0: the steps must be above 0 and strictly increasing"},
           {&detail::CompressorAdapter<ExportOf<TooManyPhases>>::init, "x: phaseSteps: 65 phase steps, at most 64"}}) {
    ctx = reinterpret_cast<void*>(0x1);
    EXPECT_EQ(init(nullptr, 0, host.get(), &ctx), TERSE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ctx, nullptr);
    EXPECT_EQ(host.lastError(), message);
  }
}

TEST(SdkCompressorAbi, InitFailures) {
  {
    Instance inst(probeApi(), {{"mode", "ctor_throws"}});
    EXPECT_EQ(inst.initStatus(), TERSE_ERR_INTERNAL);
    EXPECT_EQ(inst.ctx(), nullptr);
    EXPECT_EQ(inst.host().lastError(), "probe: constructor refused");
  }
  {
    Instance inst(probeApi(), {{"mode", "ctor_oom"}});
    EXPECT_EQ(inst.initStatus(), TERSE_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(inst.ctx(), nullptr);
  }
  {
    Instance inst(probeApi(), {{"mode", "nope"}});
    EXPECT_EQ(inst.initStatus(), TERSE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(inst.host().lastError(),
              "probe: 'mode' must be one of {ok, too_many, payload, unsupported, device, oom, ok_status, logic, int, "
              "prefixed, ctor_throws, ctor_oom, defer}, got 'nope'");
  }
  {
    Instance inst(probeApi(), {{"mode", "ok"}, {"mdoe", "x"}});
    EXPECT_EQ(inst.initStatus(), TERSE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(inst.ctx(), nullptr);
    EXPECT_EQ(inst.host().lastError(), "probe: unknown parameter 'mdoe' (known: mode)");
  }
  {
    Instance inst(probeApi(), {{"mode", "ok"}, {"mode", "ok"}});
    EXPECT_EQ(inst.initStatus(), TERSE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(inst.host().lastError(), "probe: parameter 'mode' is given twice ('ok' and 'ok')");
  }
  // No host: nowhere to log, still no crash.
  void* ctx = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(probeApi()->init(nullptr, 0, nullptr, &ctx), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ctx, nullptr);
  RecordingHost host;
  EXPECT_EQ(probeApi()->init(nullptr, 0, host.get(), nullptr), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(host.lastError(), "probe: init: ctx is NULL");
  EXPECT_EQ(probeApi()->init(nullptr, 3, host.get(), &ctx), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(host.lastError(), "probe: parameter list is NULL but holds 3 entries");
}

TEST(SdkCompressorAbi, TheInstanceLogsThroughItsHost) {
  Instance inst(probeApi());
  ASSERT_EQ(inst.initStatus(), TERSE_OK);
  ASSERT_EQ(inst.host().messages().size(), 1u);
  EXPECT_EQ(inst.host().messages()[0].first, TERSE_LOG_INFO);
  EXPECT_EQ(inst.host().messages()[0].second, "probe ready");
}

TEST(SdkCompressorAbi, StructSizesAreFilledAndChecked) {
  Instance inst(probeApi());
  ASSERT_EQ(inst.initStatus(), TERSE_OK);
  const terse_compressor_caps_v1 caps = inst.caps();
  EXPECT_EQ(caps.struct_size, sizeof(terse_compressor_caps_v1));
  EXPECT_EQ(caps.aggregation, TERSE_AGG_CUSTOM);
  const terse_compressor_sizes_v1 sizes = inst.sizes(makeInfo(3));
  EXPECT_EQ(sizes.struct_size, sizeof(terse_compressor_sizes_v1));
  EXPECT_EQ(sizes.reserved0, 0u);
  EXPECT_EQ(sizes.max_output_bytes, 12u);

  terse_compressor_caps_v1 small{};
  small.struct_size = 8;
  EXPECT_EQ(inst.api().get_caps(inst.ctx(), TERSE_DTYPE_F32, &small), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(inst.host().lastError(), "probe: get_caps: caps: struct_size is 8, expected at least 24");
  EXPECT_EQ(inst.api().get_caps(inst.ctx(), TERSE_DTYPE_F32, nullptr), TERSE_ERR_INVALID_ARGUMENT);
  terse_compressor_caps_v1 ok{};
  ok.struct_size = sizeof ok;
  EXPECT_EQ(inst.api().get_caps(inst.ctx(), 42, &ok), TERSE_ERR_UNSUPPORTED);
  EXPECT_EQ(inst.host().lastError(), "probe: get_caps: unknown dtype 42");
  EXPECT_EQ(inst.api().get_caps(nullptr, TERSE_DTYPE_F32, &ok), TERSE_ERR_INVALID_ARGUMENT);

  terse_compressor_sizes_v1 sz{};
  sz.struct_size = sizeof sz;
  terse_tensor_info_v1 info = makeInfo(3);
  info.struct_size = 16;
  EXPECT_EQ(inst.api().get_sizes(inst.ctx(), &info, &sz), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(inst.host().lastError(), "probe: get_sizes: tensor info: struct_size is 16, expected at least 104");
  info = makeInfo(3);
  info.dtype = 77;
  EXPECT_EQ(inst.api().get_sizes(inst.ctx(), &info, &sz), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(inst.host().lastError(), "probe: get_sizes: tensor info has unknown dtype 77");
  EXPECT_EQ(inst.api().get_sizes(inst.ctx(), nullptr, &sz), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(inst.host().lastError(), "probe: get_sizes: tensor info is NULL");
}

TEST(SdkCompressorAbi, CompressArgumentChecks) {
  Instance inst(probeApi());
  ASSERT_EQ(inst.initStatus(), TERSE_OK);
  const terse_tensor_info_v1 info = makeInfo(2);
  const float in[2] = {1, 2};
  std::vector<std::byte> out = buffer(8);
  uint64_t n = 0;
  const terse_compressor_v1& api = inst.api();
  EXPECT_EQ(api.compress(inst.ctx(), &info, in, nullptr, 0, nullptr, out.data(), 8, nullptr, nullptr),
            TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(inst.host().lastError(), "probe: compress: output_bytes is NULL");
  EXPECT_EQ(api.compress(inst.ctx(), &info, nullptr, nullptr, 0, nullptr, out.data(), 8, &n, nullptr),
            TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(inst.host().lastError(), "probe: compress: input is NULL");
  EXPECT_EQ(api.compress(inst.ctx(), &info, in, nullptr, 4, nullptr, out.data(), 8, &n, nullptr),
            TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(inst.host().lastError(), "probe: compress: prev is NULL but 4 bytes long");
  terse_scratch_v1 bad_scratch{};
  bad_scratch.state_bytes = 64;
  EXPECT_EQ(api.compress(inst.ctx(), &info, in, nullptr, 0, &bad_scratch, out.data(), 8, &n, nullptr),
            TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(inst.host().lastError(), "probe: compress: scratch state is NULL but 64 bytes long");
  // Too little output space: the writer refuses instead of writing past the end.
  EXPECT_EQ(api.compress(inst.ctx(), &info, in, nullptr, 0, nullptr, out.data(), 6, &n, nullptr),
            TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(inst.host().lastError(),
            "probe: payload writer: no room for 4 bytes of value at offset 4: the output holds 6 bytes");
  // A dtype the typed accessor cannot view.
  terse_tensor_info_v1 f64 = makeInfo(1);
  f64.dtype = TERSE_DTYPE_F64;
  EXPECT_EQ(api.compress(inst.ctx(), &f64, in, nullptr, 0, nullptr, out.data(), 8, &n, nullptr), TERSE_ERR_UNSUPPORTED);
  EXPECT_EQ(inst.host().lastError(), "probe: cannot view the f64 input as f32");
  // Empty tensors need no pointers at all.
  const terse_tensor_info_v1 empty = makeInfo(0);
  EXPECT_EQ(api.compress(inst.ctx(), &empty, nullptr, nullptr, 0, nullptr, nullptr, 0, &n, nullptr), TERSE_OK);
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(api.compress(inst.ctx(), &info, in, nullptr, 0, nullptr, out.data(), 8, &n, nullptr), TERSE_OK);
  EXPECT_EQ(n, 8u);
}

TEST(SdkCompressorAbi, ReduceForwardsBothPayloads) {
  Instance inst(probeApi());
  ASSERT_EQ(inst.initStatus(), TERSE_OK);
  const terse_tensor_info_v1 info = makeInfo(2);
  const std::byte a[3] = {std::byte{1}, std::byte{2}, std::byte{3}};
  const std::byte b[2] = {std::byte{4}, std::byte{5}};
  std::vector<std::byte> out = buffer(8);
  uint64_t n = 0;
  ASSERT_EQ(inst.api().reduce(inst.ctx(), &info, a, 3, b, 2, nullptr, out.data(), out.size(), &n, nullptr), TERSE_OK);
  ASSERT_EQ(n, 5u);
  EXPECT_EQ(out[0], std::byte{1});
  EXPECT_EQ(out[4], std::byte{5});
  EXPECT_EQ(inst.api().reduce(inst.ctx(), &info, nullptr, 3, b, 2, nullptr, out.data(), out.size(), &n, nullptr),
            TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(inst.host().lastError(), "probe: reduce: a is NULL but 3 bytes long");

  Instance liar(probeApi(), {{"mode", "too_many"}});
  EXPECT_EQ(liar.api().reduce(liar.ctx(), &info, a, 3, b, 2, nullptr, out.data(), out.size(), &n, nullptr),
            TERSE_ERR_INTERNAL);
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(liar.host().lastError(),
            "probe: reduce reported 9 output bytes but the output holds 8; reduce must return the bytes it wrote, at "
            "most args.output.size()");
}

// The macro's terse_compressor_decompress_deferred_v1 (terse/device_verdict_v1.h): the plugin sees the core's word in
// DecompressArgs::deferredVerdict, the ordinary decompress sees none, and a null word is refused before the plugin
// runs.
TEST(SdkCompressorAbi, DeferredDecompressHandsThePluginTheVerdictWord) {
  Instance inst(probeApi(), {{"mode", "defer"}});
  ASSERT_EQ(inst.initStatus(), TERSE_OK);
  const terse_tensor_info_v1 info = makeInfo(2);
  const std::vector<float> in = {1.5f, -2.0f};
  const std::vector<std::byte> good = inst.compress(info, in);
  const std::vector<std::byte> bad(good.begin(), good.end() - 1);
  std::vector<float> out = {9.0f, 9.0f};
  uint32_t word = 0;
  const auto deferred = [&](const std::vector<std::byte>& payload, uint32_t* verdict) {
    return probe_plugin::terse_compressor_decompress_deferred_v1(inst.ctx(), &info, payload.data(), payload.size(),
                                                                 nullptr, out.data(), 0, verdict, nullptr);
  };
  // A clean payload decodes as decompress does and leaves the word alone.
  ASSERT_EQ(deferred(good, &word), TERSE_OK) << inst.host().lastError();
  EXPECT_EQ(word, 0u);
  EXPECT_EQ(out, in);
  // A bad one is left in the word, the output untouched, and the call succeeds.
  out = {9.0f, 9.0f};
  ASSERT_EQ(deferred(bad, &word), TERSE_OK) << inst.host().lastError();
  EXPECT_EQ(word, 7u);
  EXPECT_EQ(out, (std::vector<float>{9.0f, 9.0f}));
  // The ordinary entry point has no word: the same payload is refused with the plugin's message.
  EXPECT_EQ(inst.decompress(info, bad, out), TERSE_ERR_INVALID_PAYLOAD);
  EXPECT_EQ(out, (std::vector<float>{9.0f, 9.0f}));
  // No word: refused, naming the call.
  EXPECT_EQ(deferred(good, nullptr), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(inst.host().lastError(), "probe: decompress_deferred: verdict is NULL");
  EXPECT_EQ(probe_plugin::terse_compressor_decompress_deferred_v1(nullptr, &info, good.data(), good.size(), nullptr,
                                                                  out.data(), 0, &word, nullptr),
            TERSE_ERR_INVALID_ARGUMENT);
}

// The macro's terse_compressor_compress_deferred_v1 (terse/device_verdict_v1.h), as the deferred decompress above: the
// plugin sees the word in CompressArgs::deferredVerdict, the ordinary compress sees none, a null word is refused.
TEST(SdkCompressorAbi, DeferredCompressHandsThePluginTheVerdictWord) {
  Instance inst(probeApi(), {{"mode", "defer"}});
  ASSERT_EQ(inst.initStatus(), TERSE_OK);
  const terse_tensor_info_v1 info = makeInfo(2);
  const std::vector<float> in = {1.5f, -2.0f};
  const std::vector<std::byte> good_prev(8, std::byte{1});
  const std::vector<std::byte> bad_prev(7, std::byte{1});
  const std::vector<std::byte> want = inst.compress(info, in, good_prev);
  std::vector<std::byte> out = buffer(8);
  uint64_t n = 99;
  uint32_t word = 0;
  const auto deferred = [&](void* ctx, const std::vector<std::byte>& prev, uint32_t* verdict) {
    return probe_plugin::terse_compressor_compress_deferred_v1(ctx, &info, in.data(), prev.data(), prev.size(), nullptr,
                                                               out.data(), out.size(), &n, verdict, nullptr);
  };
  // A clean prev compresses as compress does and leaves the word alone.
  ASSERT_EQ(deferred(inst.ctx(), good_prev, &word), TERSE_OK) << inst.host().lastError();
  EXPECT_EQ(word, 0u);
  ASSERT_EQ(n, want.size());
  EXPECT_EQ(std::vector<std::byte>(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n)), want);
  // A bad one is left in the word, and the call succeeds with the size a valid prev gives.
  ASSERT_EQ(deferred(inst.ctx(), bad_prev, &word), TERSE_OK) << inst.host().lastError();
  EXPECT_EQ(word, 5u);
  EXPECT_EQ(n, 8u);
  // The ordinary entry point has no word: the same prev is refused with the plugin's message.
  EXPECT_EQ(inst.api().compress(inst.ctx(), &info, in.data(), bad_prev.data(), bad_prev.size(), nullptr, out.data(),
                                out.size(), &n, nullptr),
            TERSE_ERR_INVALID_PAYLOAD);
  EXPECT_EQ(inst.host().lastError(), "probe: prev has 7 bytes");
  // No word: refused, naming the call; no context: refused.
  EXPECT_EQ(deferred(inst.ctx(), good_prev, nullptr), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(inst.host().lastError(), "probe: compress_deferred: verdict is NULL");
  EXPECT_EQ(deferred(nullptr, good_prev, &word), TERSE_ERR_INVALID_ARGUMENT);
}

TEST(SdkCompressorAbi, NullContextIsRejectedWithoutCrashing) {
  const terse_compressor_v1& api = *probeApi();
  uint64_t n = 0;
  const terse_tensor_info_v1 info = makeInfo(0);
  EXPECT_EQ(api.finalize(nullptr), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api.compress(nullptr, &info, nullptr, nullptr, 0, nullptr, nullptr, 0, &n, nullptr),
            TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api.decompress(nullptr, &info, nullptr, 0, nullptr, nullptr, 0, nullptr), TERSE_ERR_INVALID_ARGUMENT);
}

// ---- test_lossy: the SUM quantizer.

class SdkTestLossy : public ::testing::Test {
 protected:
  PluginFile file_{TERSE_TEST_PLUGIN_DIR "/terse_compressor_test_lossy.so"};
  const terse_compressor_v1* api_ = file_.symbol<terse_compressor_v1>(TERSE_COMPRESSOR_PLUGIN_V1_SYMBOL);
};

TEST_F(SdkTestLossy, ExportsOneStructWithoutReduce) {
  ASSERT_NE(api_, nullptr);
  EXPECT_STREQ(api_->name, "test_lossy");
  EXPECT_EQ(api_->abi_version, TERSE_COMPRESSOR_ABI_V1);
  EXPECT_EQ(api_->reduce, nullptr);
  EXPECT_EQ(file_.symbol<void>(TERSE_SCHEDULER_PLUGIN_V1_SYMBOL), nullptr);
}

TEST_F(SdkTestLossy, BadParametersAreInvalidArguments) {
  ASSERT_NE(api_, nullptr);
  {
    Instance inst(api_, {{"step", "0"}});
    EXPECT_EQ(inst.initStatus(), TERSE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(inst.ctx(), nullptr);
    EXPECT_EQ(inst.host().lastError(), "test_lossy: 'step' must be > 0, got 0");
  }
  {
    Instance inst(api_, {{"step", "half"}});
    EXPECT_EQ(inst.initStatus(), TERSE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(inst.host().lastError(), "test_lossy: 'step' must be a number, got 'half'");
  }
  {
    Instance inst(api_, {{"stepp", "0.5"}});
    EXPECT_EQ(inst.initStatus(), TERSE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(inst.host().lastError(), "test_lossy: unknown parameter 'stepp' (known: step)");
  }
}

TEST_F(SdkTestLossy, CapsAndSizes) {
  ASSERT_NE(api_, nullptr);
  Instance inst(api_);
  ASSERT_EQ(inst.initStatus(), TERSE_OK) << inst.host().lastError();
  const terse_compressor_caps_v1 caps = inst.caps();
  EXPECT_EQ(caps.devices, TERSE_DEVICE_HOST);
  EXPECT_EQ(caps.aggregation, TERSE_AGG_SUM);
  EXPECT_EQ(caps.wire_dtype, TERSE_DTYPE_F32);
  EXPECT_EQ(caps.flags, TERSE_CAP_FIXED_SIZE);
  EXPECT_EQ(caps.num_rounds, 1);
  const terse_compressor_sizes_v1 sizes = inst.sizes(makeInfo(5));
  EXPECT_EQ(sizes.max_output_bytes, 16u + 20u);
  EXPECT_EQ(sizes.sum_header_bytes, 16u);
  EXPECT_EQ(sizes.workspace_bytes, 0u);
  EXPECT_EQ(sizes.state_bytes, 0u);

  terse_compressor_caps_v1 f16{};
  f16.struct_size = sizeof f16;
  EXPECT_EQ(inst.api().get_caps(inst.ctx(), TERSE_DTYPE_F16, &f16), TERSE_ERR_UNSUPPORTED);
  EXPECT_EQ(inst.host().lastError(), "test_lossy: only f32 gradients are supported, got f16");
}

TEST_F(SdkTestLossy, TruncatesTowardZeroAndRoundTrips) {
  ASSERT_NE(api_, nullptr);
  Instance inst(api_, {{"step", "0.5"}});
  ASSERT_EQ(inst.initStatus(), TERSE_OK);
  const terse_tensor_info_v1 info = makeInfo(6);
  const std::vector<float> in = {1.3f, -1.3f, 0.49f, 2.0f, -0.75f, 7.9f};
  const std::vector<float> expected = {1.0f, -1.0f, 0.0f, 2.0f, -0.5f, 7.5f};
  const std::vector<std::byte> payload = inst.compress(info, in);
  EXPECT_EQ(payload.size(), 16u + 24u);

  std::vector<float> out(6, 99.0f);
  ASSERT_EQ(inst.decompress(info, payload, out), TERSE_OK) << inst.host().lastError();
  EXPECT_EQ(out, expected);
  std::vector<float> acc(6, 1.0f);
  ASSERT_EQ(inst.decompress(info, payload, acc, /*accumulate=*/true), TERSE_OK);
  for (size_t i = 0; i < acc.size(); ++i) EXPECT_EQ(acc[i], expected[i] + 1.0f) << i;

  Instance coarse(api_, {{"step", "2"}});
  std::vector<float> c(6);
  ASSERT_EQ(coarse.decompress(info, coarse.compress(info, in), c), TERSE_OK);
  EXPECT_EQ(c, (std::vector<float>{0, 0, 0, 2, 0, 6}));
}

TEST_F(SdkTestLossy, EmptyTensor) {
  ASSERT_NE(api_, nullptr);
  Instance inst(api_);
  const terse_tensor_info_v1 info = makeInfo(0);
  const std::vector<std::byte> payload = inst.compress(info, {});
  EXPECT_EQ(payload.size(), 16u);
  std::vector<float> out;
  EXPECT_EQ(inst.decompress(info, payload, out), TERSE_OK) << inst.host().lastError();
}

TEST_F(SdkTestLossy, SummedAcrossRanksDecodesToTheSumOfQuantizedInputs) {
  ASSERT_NE(api_, nullptr);
  Instance inst(api_, {{"step", "0.25"}});
  const std::vector<std::vector<float>> inputs = {{0.3f, -2.6f, 1.0f}, {0.3f, 0.9f, -0.1f}};
  std::vector<std::vector<std::byte>> payloads;
  for (int r = 0; r < 2; ++r) payloads.push_back(inst.compress(makeInfo(3, r, 2), inputs[r]));
  const std::vector<std::byte> total = sumPayloads(payloads, inst.sizes(makeInfo(3)).sum_header_bytes);
  terse_tensor_info_v1 info = makeInfo(3, 0, 2);
  info.source_rank = -1;
  std::vector<float> out(3);
  ASSERT_EQ(inst.decompress(info, total, out), TERSE_OK) << inst.host().lastError();
  EXPECT_EQ(out, (std::vector<float>{0.25f + 0.25f, -2.5f + 0.75f, 1.0f + 0.0f}));
}

TEST_F(SdkTestLossy, MalformedPayloadsAreRejectedWithoutWriting) {
  ASSERT_NE(api_, nullptr);
  Instance inst(api_);
  const terse_tensor_info_v1 info = makeInfo(3);
  const std::vector<std::byte> good = inst.compress(info, {1, 2, 3});
  struct Case {
    const char* what;
    std::vector<std::byte> payload;
    terse_tensor_info_v1 info;
    const char* message;
  };
  std::vector<std::byte> bad_magic = good;
  bad_magic[0] ^= std::byte{0xff};
  std::vector<std::byte> longer = good;
  longer.resize(longer.size() + 4);
  terse_tensor_info_v1 more = makeInfo(4);
  const std::vector<Case> cases = {
      {"magic", bad_magic, info, "test_lossy: payload magic 0x59534cab is not test_lossy's (0x59534c54)"},
      {"numel", good, more, "test_lossy: payload numel 3 does not match the tensor's 4"},
      {"truncated", std::vector<std::byte>(good.begin(), good.end() - 1), info,
       "test_lossy: payload truncated at offset 16: expected 3 elements of 4 bytes (values), only 11 of 27 bytes left"},
      {"header only", std::vector<std::byte>(good.begin(), good.begin() + 16), info,
       "test_lossy: payload truncated at offset 16: expected 3 elements of 4 bytes (values), only 0 of 16 bytes left"},
      {"short header", std::vector<std::byte>(good.begin(), good.begin() + 5), info,
       "test_lossy: payload of 5 bytes is too short for the 16-byte header"},
      {"empty", {}, info, "test_lossy: payload of 0 bytes is too short for the 16-byte header"},
      {"trailing", longer, info, "test_lossy: payload has 4 unexpected trailing bytes: expected 28 bytes, got 32"},
  };
  for (const Case& c : cases) {
    std::vector<float> out(c.info.numel, 42.0f);
    EXPECT_EQ(inst.decompress(c.info, c.payload, out), TERSE_ERR_INVALID_PAYLOAD) << c.what;
    EXPECT_EQ(inst.host().lastError(), c.message) << c.what;
    for (float v : out) EXPECT_EQ(v, 42.0f) << c.what << ": output touched";
  }
}

// ---- test_throws: the deliberately broken fixture.

TEST(SdkTestThrows, ExceptionsComeBackAsInternalErrors) {
  PluginFile file(TERSE_TEST_FIXTURE_PLUGIN_DIR "/terse_compressor_test_throws.so");
  const auto* api = file.symbol<terse_compressor_v1>(TERSE_COMPRESSOR_PLUGIN_V1_SYMBOL);
  ASSERT_NE(api, nullptr);
  EXPECT_STREQ(api->name, "test_throws");
  Instance inst(api);
  ASSERT_EQ(inst.initStatus(), TERSE_OK);
  EXPECT_EQ(inst.caps().aggregation, TERSE_AGG_ALLGATHER);
  const terse_tensor_info_v1 info = makeInfo(2);
  const float in[2] = {1, 2};
  std::vector<std::byte> out = buffer(inst.sizes(info).max_output_bytes);
  uint64_t n = 0;
  EXPECT_EQ(api->compress(inst.ctx(), &info, in, nullptr, 0, nullptr, out.data(), out.size(), &n, nullptr),
            TERSE_ERR_INTERNAL);
  EXPECT_EQ(inst.host().lastError(), "test_throws: deliberate failure in compress");
  inst.host().clear();
  float dst[2] = {0, 0};
  EXPECT_EQ(api->decompress(inst.ctx(), &info, out.data(), out.size(), nullptr, dst, 0, nullptr), TERSE_ERR_INTERNAL);
  EXPECT_EQ(inst.host().lastError(), "test_throws: unknown exception (not derived from std::exception)");
}

// ---- test_rounds: two rounds over three in-process ranks, summed by hand as the core would.

class SdkTestRounds : public ::testing::Test {
 protected:
  // Runs one step over `inputs.size()` ranks and returns every rank's decoded aggregate.
  std::vector<std::vector<float>> runStep(Instance& inst, const std::vector<std::vector<float>>& inputs,
                                          uint64_t step) {
    const int world = static_cast<int>(inputs.size());
    const uint64_t numel = inputs[0].size();
    std::vector<std::vector<std::byte>> workspaces;
    for (int r = 0; r < world; ++r) {
      terse_tensor_info_v1 info = makeInfo(numel, r, world, 0);
      const terse_compressor_sizes_v1 s0 = inst.sizes(info);
      info.round = 1;
      const terse_compressor_sizes_v1 s1 = inst.sizes(info);
      EXPECT_GT(s0.workspace_bytes, 0u);
      // Undefined at the start of a step: fill with garbage so the plugin cannot rely on zeros.
      workspaces.emplace_back(std::max(s0.workspace_bytes, s1.workspace_bytes), std::byte{0xa5});
    }
    std::vector<std::byte> prev;
    last_payloads_.clear();
    for (int round = 0; round < 2; ++round) {
      std::vector<std::vector<std::byte>> payloads;
      for (int r = 0; r < world; ++r) {
        terse_tensor_info_v1 info = makeInfo(numel, r, world, round);
        info.step = step;
        payloads.push_back(inst.compress(info, inputs[r], prev, &workspaces[r]));
      }
      prev = sumPayloads(payloads, 16);
      if (round == 1) last_payloads_ = payloads;
    }
    std::vector<std::vector<float>> decoded;
    for (int r = 0; r < world; ++r) {
      terse_tensor_info_v1 info = makeInfo(numel, r, world, 1);
      info.step = step;
      info.source_rank = -1;
      std::vector<float> out(numel, -1.0f);
      EXPECT_EQ(inst.decompress(info, prev, out, false, &workspaces[r]), TERSE_OK) << inst.host().lastError();
      decoded.push_back(out);
    }
    // Each rank's own payload decodes to that rank's contribution (what error feedback relies on), and decoding them
    // all with accumulate gives the aggregate's decode.
    std::vector<float> sum(numel, 0.0f);
    for (int r = 0; r < world; ++r) {
      terse_tensor_info_v1 info = makeInfo(numel, r, world, 1);
      info.step = step;
      std::vector<float> own(numel, -1.0f);
      EXPECT_EQ(inst.decompress(info, last_payloads_[r], own, false, &workspaces[r]), TERSE_OK)
          << inst.host().lastError();
      EXPECT_EQ(own, inputs[r]) << "rank " << r;
      EXPECT_EQ(inst.decompress(info, last_payloads_[r], sum, true, &workspaces[r]), TERSE_OK);
    }
    EXPECT_EQ(sum, decoded[0]);
    return decoded;
  }

  std::vector<std::vector<std::byte>> last_payloads_;  // round 1's, per rank

  PluginFile file_{TERSE_TEST_PLUGIN_DIR "/terse_compressor_test_rounds.so"};
  const terse_compressor_v1* api_ = file_.symbol<terse_compressor_v1>(TERSE_COMPRESSOR_PLUGIN_V1_SYMBOL);
};

TEST_F(SdkTestRounds, CapsAndSizesPerRound) {
  ASSERT_NE(api_, nullptr);
  Instance inst(api_);
  ASSERT_EQ(inst.initStatus(), TERSE_OK);
  const terse_compressor_caps_v1 caps = inst.caps();
  EXPECT_EQ(caps.num_rounds, 2);
  EXPECT_EQ(caps.aggregation, TERSE_AGG_SUM);
  EXPECT_EQ(inst.sizes(makeInfo(10, 0, 3, 0)).max_output_bytes, 20u);
  EXPECT_EQ(inst.sizes(makeInfo(10, 0, 3, 1)).max_output_bytes, 56u);
  EXPECT_EQ(inst.sizes(makeInfo(10, 0, 3, 1)).workspace_bytes, 16u);
}

TEST_F(SdkTestRounds, ThreeRanksDecodeTheExactSum) {
  ASSERT_NE(api_, nullptr);
  Instance inst(api_);
  ASSERT_EQ(inst.initStatus(), TERSE_OK);
  // Integer-valued inputs with a mean far from zero, so the round-1 offset is large and must be added back exactly.
  std::vector<std::vector<float>> inputs(3, std::vector<float>(7));
  std::vector<float> expected(7, 0.0f);
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 7; ++i) {
      inputs[r][i] = static_cast<float>(1000 + 17 * r - 5 * i + (i * r) % 3);
      expected[i] += inputs[r][i];
    }
  }
  for (uint64_t step : {0u, 1u}) {
    for (const std::vector<float>& out : runStep(inst, inputs, step)) EXPECT_EQ(out, expected) << "step " << step;
  }
  // Empty tensors too.
  for (const auto& out : runStep(inst, std::vector<std::vector<float>>(3), 2)) EXPECT_TRUE(out.empty());
}

TEST_F(SdkTestRounds, RoundOneValidatesPrevAndTheWorkspace) {
  ASSERT_NE(api_, nullptr);
  Instance inst(api_);
  ASSERT_EQ(inst.initStatus(), TERSE_OK);
  const std::vector<float> in = {1, 2, 3};
  std::vector<std::byte> ws(16);
  terse_tensor_info_v1 r0 = makeInfo(3, 0, 1, 0);
  terse_tensor_info_v1 r1 = makeInfo(3, 0, 1, 1);
  const std::vector<std::byte> p0 = inst.compress(r0, in, {}, &ws);
  ASSERT_EQ(p0.size(), 20u);

  auto compressRound1 = [&](const std::vector<std::byte>& prev, std::vector<std::byte>& workspace) {
    std::vector<std::byte> out = buffer(28);
    uint64_t n = 0;
    terse_scratch_v1 scratch{workspace.data(), workspace.size(), nullptr, 0};
    return inst.api().compress(inst.ctx(), &r1, in.data(), prev.empty() ? nullptr : prev.data(), prev.size(), &scratch,
                               out.data(), out.size(), &n, nullptr);
  };
  std::vector<std::byte> corrupt = p0;
  corrupt[1] ^= std::byte{1};
  EXPECT_EQ(compressRound1(corrupt, ws), TERSE_ERR_INVALID_PAYLOAD);
  EXPECT_EQ(inst.host().lastError(), "test_rounds: payload magic 0x30525354 is not test_rounds's (0x30525254)");
  EXPECT_EQ(compressRound1(std::vector<std::byte>(p0.begin(), p0.end() - 2), ws), TERSE_ERR_INVALID_PAYLOAD);
  // A workspace that round 0 never wrote (the core lost it) is refused rather than decoded wrongly.
  std::vector<std::byte> fresh(16);
  EXPECT_EQ(compressRound1(p0, fresh), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(inst.host().lastError().find("found a workspace not prepared"), std::string::npos);
  // Round 1's payload passed off as round 0's prev: wrong magic.
  ASSERT_EQ(compressRound1(p0, ws), TERSE_OK);
  std::vector<float> out(3);
  EXPECT_EQ(inst.decompress(r1, p0, out, false, &ws), TERSE_ERR_INVALID_PAYLOAD);
  EXPECT_EQ(inst.host().lastError(), "test_rounds: payload magic 0x30525254 is not test_rounds's (0x31525254)");
}

}  // namespace
}  // namespace terse::sdk
