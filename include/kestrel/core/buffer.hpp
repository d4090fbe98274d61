// kestrel/core/buffer.hpp: an owning, 64-byte aligned, zero-initialised array.
//
// Copying is explicit (`copy()`), because buffers hold KV caches and
// activations whose silent copy would be a performance bug.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <type_traits>
#include <utility>

namespace kestrel {

inline constexpr std::size_t buffer_alignment = 64;  // one cache line, one zmm register

template <class T>
class aligned_buffer {
  static_assert(std::is_trivially_copyable_v<T>, "aligned_buffer holds plain numeric data");

 public:
  aligned_buffer() = default;
  explicit aligned_buffer(std::size_t n) : size_(n) {
    if (n) {
      data_ = static_cast<T*>(::operator new[](n * sizeof(T), std::align_val_t{buffer_alignment}));
      std::memset(static_cast<void*>(data_), 0, n * sizeof(T));
    }
  }
  aligned_buffer(aligned_buffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  aligned_buffer& operator=(aligned_buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  aligned_buffer(const aligned_buffer&) = delete;
  aligned_buffer& operator=(const aligned_buffer&) = delete;
  ~aligned_buffer() { release(); }

  /// The explicit, visible copy.
  aligned_buffer copy() const {
    aligned_buffer out(size_);
    if (size_) std::memcpy(static_cast<void*>(out.data_), data_, size_ * sizeof(T));
    return out;
  }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  T& operator[](std::size_t i) noexcept { return data_[i]; }
  const T& operator[](std::size_t i) const noexcept { return data_[i]; }
  T* begin() noexcept { return data_; }
  T* end() noexcept { return data_ + size_; }
  const T* begin() const noexcept { return data_; }
  const T* end() const noexcept { return data_ + size_; }
  std::span<T> span() noexcept { return {data_, size_}; }
  std::span<const T> span() const noexcept { return {data_, size_}; }
  operator std::span<T>() noexcept { return span(); }
  operator std::span<const T>() const noexcept { return span(); }

 private:
  void release() noexcept {
    if (data_) ::operator delete[](data_, std::align_val_t{buffer_alignment});
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace kestrel
