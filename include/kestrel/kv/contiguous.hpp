// kestrel/kv/contiguous.hpp: a KV cache of one preallocated block per layer.
#pragma once

#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>

#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "kestrel/core/buffer.hpp"
#include "kestrel/core/diagnostics.hpp"
#include "kestrel/core/dtype.hpp"
#include "kestrel/core/error.hpp"
#include "kestrel/kv/concepts.hpp"

KESTREL_INTRINSICS_BEGIN  // GCC 12 (core/diagnostics.hpp)

namespace kestrel {

/// Keys and values of every layer in two flat buffers of T (float, or f16
/// as llama.cpp's default cache: half the memory, and half the bytes decode
/// reads at depth), allocated once; each KV head's positions in one run:
/// (layer, KV head, position, head_dim). Decode never allocates. Memory: 2
/// * n_layer * n_ctx * kv_dim * sizeof(T) bytes. store() rounds f32 to f16
/// to nearest (core/dtype.hpp); the attention kernels convert back exactly.
/// An f16 cache holds |values| up to 65504 (larger ones become +-inf, as in
/// llama.cpp's f16 cache); models whose keys or values exceed that need the
/// f32 cache. Measured (110M shape q4_0, 2 threads, depth 1024,
/// `kestrel-bench -p 0 -n 64 -d 1024 -ctk f16` against `-ctk f32`,
/// alternated): 172-183 t/s against 124-125.
///
/// Why head-major: decode's attention makes one pass over the cached
/// positions per KV head (cpu/attend.hpp, cpu/attend_block.hpp). With a
/// position's heads side by side, each pass reads head_dim floats of every
/// kv_dim-float row, a strided pattern the hardware prefetchers do not
/// follow: a plain read of 92 MB that way, 256 of every 1024 bytes in 4
/// passes, took 14.5 ms on one Zen 4 core against 3.7 ms for one
/// sequential pass over it (/tmp harness, caches evicted, median of 11).
/// Attention itself (one thread, caches evicted before each token, medians
/// of 15): the 110M shape (12 heads of 64, 1024 positions) 4.1-4.8 ms
/// per token of 12 layers against 6.2-6.7 ms (attend over a position's
/// heads as one run) and 10-13 ms (attend per head) with the heads side by
/// side; TinyLlama's (4 KV heads of 64, groups of 8, 2048 positions, 22
/// layers, attend_block's transposed key tiles both) 12-17 ms against
/// 15-22 ms.
template <class T>
class basic_contiguous_kv_cache {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, f16>, "a KV cache holds float or f16");

 public:
  using element_type = T;
  basic_contiguous_kv_cache() = default;
  /// kv_dim = n_head_kv * head_dim floats per position and layer, for each
  /// of keys and values; n_head_kv must divide kv_dim.
  basic_contiguous_kv_cache(std::size_t n_layer, std::size_t n_ctx, std::size_t kv_dim, std::size_t n_head_kv = 1)
      : n_layer_(n_layer), n_ctx_(n_ctx), kv_dim_(kv_dim), n_head_kv_(checked_heads(kv_dim, n_head_kv)),
        head_dim_(kv_dim / n_head_kv_), k_(checked_size(n_layer, n_ctx, kv_dim)), v_(n_layer * n_ctx * kv_dim) {}

  std::size_t n_ctx() const noexcept { return n_ctx_; }
  std::size_t n_layer() const noexcept { return n_layer_; }
  std::size_t kv_dim() const noexcept { return kv_dim_; }
  std::size_t n_head_kv() const noexcept { return n_head_kv_; }
  std::size_t size() const noexcept { return size_; }

  /// Copies position pos's keys k and values v (kv_dim floats each, the KV
  /// heads side by side) into each head's run.
  void store(std::size_t layer, std::size_t pos, const float* k, const float* v) noexcept {
    for (std::size_t h = 0; h < n_head_kv_; ++h) {
      T* kd = k_.data() + offset(layer, h, pos);
      T* vd = v_.data() + offset(layer, h, pos);
      if constexpr (std::is_same_v<T, float>) {
        std::memcpy(kd, k + h * head_dim_, head_dim_ * sizeof(float));
        std::memcpy(vd, v + h * head_dim_, head_dim_ * sizeof(float));
      } else {
        round_to_f16(k + h * head_dim_, kd, head_dim_);
        round_to_f16(v + h * head_dim_, vd, head_dim_);
      }
    }
  }
  basic_kv_rows<T> keys(std::size_t layer) const noexcept {
    return {k_.data() + offset(layer, 0, 0), head_dim_, n_ctx_ * head_dim_};
  }
  basic_kv_rows<T> values(std::size_t layer) const noexcept {
    return {v_.data() + offset(layer, 0, 0), head_dim_, n_ctx_ * head_dim_};
  }

  void resize(std::size_t n) {
    if (n > n_ctx_)
      throw invalid_argument("KV cache: " + std::to_string(n) + " positions exceed the context of " +
                             std::to_string(n_ctx_));
    size_ = n;
  }
  void clear() noexcept { size_ = 0; }

  /// The explicit copy (e.g. to fork a sequence); the cache is not copyable otherwise.
  basic_contiguous_kv_cache copy() const {
    basic_contiguous_kv_cache c;
    c.n_layer_ = n_layer_, c.n_ctx_ = n_ctx_, c.kv_dim_ = kv_dim_, c.size_ = size_;
    c.n_head_kv_ = n_head_kv_, c.head_dim_ = head_dim_;
    c.k_ = k_.copy();
    c.v_ = v_.copy();
    return c;
  }

 private:
  /// dst[i] = to_f16(src[i]), 16 or 8 at a time by the hardware conversion
  /// where the build has it (round to nearest even, overflow to infinity,
  /// subnormals kept: the same bits; tests/kv/test_contiguous.cpp). Prefill
  /// stores 2 kv_dim values per token and layer: with the scalar conversion
  /// the 110M shape's q4_0 pp512 (kestrel-bench, 2 threads, alternated) ran
  /// at 1367-2063 t/s against 1772-2569 with this, which matches the f32
  /// cache (1970-2293 against 1792-2192).
  static void round_to_f16(const float* src, f16* dst, std::size_t n) noexcept {
    std::size_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                          _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < n; ++i) dst[i] = to_f16(src[i]);
  }

  static std::size_t checked_heads(std::size_t kv_dim, std::size_t n_head_kv) {
    if (n_head_kv == 0 || kv_dim % n_head_kv != 0)
      throw invalid_argument("KV cache: " + std::to_string(n_head_kv) + " KV heads do not divide kv_dim " +
                             std::to_string(kv_dim));
    return n_head_kv;
  }
  static std::size_t checked_size(std::size_t n_layer, std::size_t n_ctx, std::size_t kv_dim) {
    // Refuse absurd requests with a message instead of a bad_alloc deep inside.
    const double bytes = 2.0 * static_cast<double>(n_layer) * static_cast<double>(n_ctx) * static_cast<double>(kv_dim) * sizeof(T);
    if (bytes > 64.0 * (1ull << 30))
      throw invalid_argument("KV cache of " + std::to_string(n_ctx) + " positions would need " +
                             std::to_string(static_cast<unsigned long long>(bytes / (1 << 20))) + " MiB; lower the context (-c)");
    return n_layer * n_ctx * kv_dim;
  }
  std::size_t offset(std::size_t layer, std::size_t head, std::size_t pos) const noexcept {
    return ((layer * n_head_kv_ + head) * n_ctx_ + pos) * head_dim_;
  }

  std::size_t n_layer_ = 0, n_ctx_ = 0, kv_dim_ = 0, n_head_kv_ = 1, head_dim_ = 0, size_ = 0;
  aligned_buffer<T> k_;  // (n_layer, n_head_kv, n_ctx, head_dim)
  aligned_buffer<T> v_;  // (n_layer, n_head_kv, n_ctx, head_dim)
};

/// The f32 cache (exact: the default) and the f16 one.
using contiguous_kv_cache = basic_contiguous_kv_cache<float>;
using f16_kv_cache = basic_contiguous_kv_cache<f16>;

static_assert(KvCache<contiguous_kv_cache>);
static_assert(KvCache<f16_kv_cache>);

}  // namespace kestrel
KESTREL_INTRINSICS_END
