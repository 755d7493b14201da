// A fixed-size host array aligned to 64 bytes, allocated once and zero-filled: the per-tensor buffers of the codec
// pipeline (plugin workspace and state, error-feedback residuals). 64 bytes is the ABI's promise for scratch memory
// (terse_scratch_v1) and a cache line, so vectorized loops never split a line at the start of a buffer. An empty
// array holds no allocation and data() is nullptr, which is exactly the ABI's "NULL when the size is 0".
//
// It lives here until core/common grows its host/device buffer types (DESIGN.md section 1); then it moves there.
#pragma once

#include <cstddef>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <span>
#include <type_traits>

namespace terse {

template <class T>
class HostArray {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                "HostArray holds plain data only: it zero-fills with memset and never runs destructors");

 public:
  static constexpr std::size_t kAlignment = 64;

  HostArray() = default;
  // Throws std::bad_alloc like any allocation; sizes come from validated plugin answers.
  explicit HostArray(std::size_t count) : size_(count) {
    if (count == 0) return;
    if (count > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_alloc();
    data_.reset(static_cast<T*>(::operator new (count * sizeof(T), std::align_val_t{kAlignment})));
    std::memset(static_cast<void*>(data_.get()), 0, count * sizeof(T));
  }

  T* data() noexcept { return data_.get(); }
  const T* data() const noexcept { return data_.get(); }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  std::span<T> span() noexcept { return {data_.get(), size_}; }
  std::span<const T> span() const noexcept { return {data_.get(), size_}; }
  T& operator[](std::size_t i) noexcept { return data_[i]; }
  const T& operator[](std::size_t i) const noexcept { return data_[i]; }

  void zero() noexcept {
    if (size_ != 0) std::memset(static_cast<void*>(data_.get()), 0, size_ * sizeof(T));
  }

 private:
  struct Free {
    void operator()(T* p) const noexcept { ::operator delete (static_cast<void*>(p), std::align_val_t{kAlignment}); }
  };
  std::unique_ptr<T[], Free> data_;
  std::size_t size_ = 0;
};

}  // namespace terse
