// kestrel/kv/contiguous.hpp: a KV cache of one preallocated block per layer.
#pragma once

#include <cstddef>
#include <string>

#include "kestrel/core/buffer.hpp"
#include "kestrel/core/error.hpp"
#include "kestrel/kv/concepts.hpp"

namespace kestrel {

/// Keys and values of every layer in two flat f32 buffers, allocated once.
/// Decode never allocates. Memory: 2 * n_layer * n_ctx * kv_dim * 4 bytes.
class contiguous_kv_cache {
 public:
  contiguous_kv_cache() = default;
  contiguous_kv_cache(std::size_t n_layer, std::size_t n_ctx, std::size_t kv_dim)
      : n_layer_(n_layer), n_ctx_(n_ctx), kv_dim_(kv_dim),
        k_(checked_size(n_layer, n_ctx, kv_dim)), v_(n_layer * n_ctx * kv_dim) {}

  std::size_t n_ctx() const noexcept { return n_ctx_; }
  std::size_t n_layer() const noexcept { return n_layer_; }
  std::size_t kv_dim() const noexcept { return kv_dim_; }
  std::size_t size() const noexcept { return size_; }

  float* key(std::size_t layer, std::size_t pos) noexcept { return k_.data() + offset(layer, pos); }
  float* value(std::size_t layer, std::size_t pos) noexcept { return v_.data() + offset(layer, pos); }
  kv_rows keys(std::size_t layer) const noexcept { return {k_.data() + offset(layer, 0), kv_dim_}; }
  kv_rows values(std::size_t layer) const noexcept { return {v_.data() + offset(layer, 0), kv_dim_}; }

  void resize(std::size_t n) {
    if (n > n_ctx_)
      throw invalid_argument("KV cache: " + std::to_string(n) + " positions exceed the context of " +
                             std::to_string(n_ctx_));
    size_ = n;
  }
  void clear() noexcept { size_ = 0; }

  /// The explicit copy (e.g. to fork a sequence); the cache is not copyable otherwise.
  contiguous_kv_cache copy() const {
    contiguous_kv_cache c;
    c.n_layer_ = n_layer_, c.n_ctx_ = n_ctx_, c.kv_dim_ = kv_dim_, c.size_ = size_;
    c.k_ = k_.copy();
    c.v_ = v_.copy();
    return c;
  }

 private:
  static std::size_t checked_size(std::size_t n_layer, std::size_t n_ctx, std::size_t kv_dim) {
    // Refuse absurd requests with a message instead of a bad_alloc deep inside.
    const double bytes = 2.0 * static_cast<double>(n_layer) * static_cast<double>(n_ctx) * static_cast<double>(kv_dim) * 4;
    if (bytes > 64.0 * (1ull << 30))
      throw invalid_argument("KV cache of " + std::to_string(n_ctx) + " positions would need " +
                             std::to_string(static_cast<unsigned long long>(bytes / (1 << 20))) + " MiB; lower the context (-c)");
    return n_layer * n_ctx * kv_dim;
  }
  std::size_t offset(std::size_t layer, std::size_t pos) const noexcept { return (layer * n_ctx_ + pos) * kv_dim_; }

  std::size_t n_layer_ = 0, n_ctx_ = 0, kv_dim_ = 0, size_ = 0;
  aligned_buffer<float> k_;  // (n_layer, n_ctx, kv_dim)
  aligned_buffer<float> v_;  // (n_layer, n_ctx, kv_dim)
};

static_assert(KvCache<contiguous_kv_cache>);

}  // namespace kestrel
