// Helpers for the SDK tests: a host that records what plugins log, a dlopen'ed plugin file, tensor infos.
#pragma once

#include <dlfcn.h>

#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "terse/compressor_v1.h"
#include "terse/types_v1.h"

namespace terse::sdk::testing {

// A terse_host_v1 whose log callback keeps every message.
class RecordingHost {
 public:
  RecordingHost() {
    host_.struct_size = sizeof(terse_host_v1);
    host_.user = this;
    host_.log = [](void* user, terse_log_level_v1 level, const char* message) {
      static_cast<RecordingHost*>(user)->messages_.emplace_back(level, message);
    };
  }
  RecordingHost(const RecordingHost&) = delete;
  RecordingHost& operator=(const RecordingHost&) = delete;

  const terse_host_v1* get() const { return &host_; }
  const std::vector<std::pair<terse_log_level_v1, std::string>>& messages() const { return messages_; }
  // The last ERROR message, "" if none.
  std::string lastError() const {
    for (auto it = messages_.rbegin(); it != messages_.rend(); ++it) {
      if (it->first == TERSE_LOG_ERROR) return it->second;
    }
    return "";
  }
  void clear() { messages_.clear(); }

 private:
  terse_host_v1 host_{};
  std::vector<std::pair<terse_log_level_v1, std::string>> messages_;
};

// One plugin file, dlopen'ed for the test's lifetime (and mapped until exit: RTLD_NODELETE as in the core's loader,
// core/plugin/plugin_support.cc).
class PluginFile {
 public:
  explicit PluginFile(const std::string& path) : handle_(dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)) {
    if (handle_ == nullptr) ADD_FAILURE() << "dlopen(" << path << "): " << dlerror();
  }
  ~PluginFile() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  PluginFile(const PluginFile&) = delete;
  PluginFile& operator=(const PluginFile&) = delete;

  template <class T>
  const T* symbol(const char* name) const {
    return handle_ == nullptr ? nullptr : static_cast<const T*>(dlsym(handle_, name));
  }

 private:
  void* handle_;
};

inline terse_tensor_info_v1 makeInfo(uint64_t numel, int32_t rank = 0, int32_t world_size = 1, int32_t round = 0) {
  terse_tensor_info_v1 info{};
  info.struct_size = sizeof(terse_tensor_info_v1);
  info.dtype = TERSE_DTYPE_F32;
  info.numel = numel;
  info.ndim = 1;
  info.device = TERSE_DEVICE_HOST;
  info.shape[0] = static_cast<int64_t>(numel);
  info.tensor_id = 7;
  info.rank = rank;
  info.world_size = world_size;
  info.round = round;
  info.source_rank = rank;
  info.device_index = -1;
  return info;
}

}  // namespace terse::sdk::testing
