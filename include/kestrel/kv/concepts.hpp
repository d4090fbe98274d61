// kestrel/kv/concepts.hpp: the KvCache concept.
//
// What it models: the per-layer store of the keys and values of every
// position a sequence has processed, so that decode attends over them
// instead of recomputing the whole sequence.
//
// Required expressions, for a cache `c` (and `cc` const):
//   cc.n_ctx(), cc.n_layer(), cc.kv_dim()  -> std::size_t   capacity and shape
//   cc.size()                              -> std::size_t   positions filled
//   c.store(layer, pos, k, v)              -> void          copy one position's keys and values in
//                                                           (k, v: kv_dim floats each, every KV head's
//                                                           head_dim side by side, as the model computes them)
//   cc.keys(layer), cc.values(layer)       -> basic_kv_rows<T> read access (below), T float or f16
//   c.resize(n)                            -> void          mark positions [0, n) valid (n <= n_ctx)
//   c.clear()                              -> void          forget everything (size() == 0)
//
// Semantics: positions < size() hold the K (after RoPE) and V of those
// positions; store() for pos >= size() and then resize(pos + 1) appends.
// store() for pos >= n_ctx() is a precondition violation the model checks
// before calling (a prompt longer than the context is an error). Reading:
// element d of KV head h at position t is base[h * head_stride + t * stride
// + d], so a cache may keep a position's heads side by side (head_stride =
// head_dim, stride = kv_dim) or each head's positions in one run (stride =
// head_dim), which is what contiguous_kv_cache does: decode's attention
// reads every KV head of a layer as a separate pass over the cached
// positions, and a pass over one contiguous run streams where a pass that
// takes head_dim floats of every kv_dim-float row does not (measured in
// kv/contiguous.hpp).
//
// Models: contiguous_kv_cache (kv/contiguous.hpp). Paged and quantized caches
// come later; they will add a block-table access next to kv_rows.
#pragma once

#include <concepts>
#include <cstddef>

namespace kestrel {

/// Strided read access to the cached rows of one layer: element d of KV
/// head h at position t is base[h * head_stride + t * stride + d]. T: the
/// cache's element type, float or f16 (the attention kernels take both).
template <class T>
struct basic_kv_rows {
  using element_type = T;
  const T* base;            // head 0, position 0
  std::size_t stride;       // elements between consecutive positions of a head
  std::size_t head_stride;  // elements between consecutive KV heads at a position
  /// KV head h's row at position t.
  const T* at(std::size_t h, std::size_t t) const noexcept { return base + h * head_stride + t * stride; }
};
using kv_rows = basic_kv_rows<float>;

namespace detail {
template <class R> inline constexpr bool is_kv_rows = false;
template <class T> inline constexpr bool is_kv_rows<basic_kv_rows<T>> = true;
}  // namespace detail

template <class C>
concept KvCache = requires(C& c, const C& cc, std::size_t layer, std::size_t pos, const float* row) {
  { cc.n_ctx() } -> std::same_as<std::size_t>;
  { cc.n_layer() } -> std::same_as<std::size_t>;
  { cc.kv_dim() } -> std::same_as<std::size_t>;
  { cc.size() } -> std::same_as<std::size_t>;
  c.store(layer, pos, row, row);
  requires detail::is_kv_rows<decltype(cc.keys(layer))>;
  { cc.values(layer) } -> std::same_as<decltype(cc.keys(layer))>;
  c.resize(pos);
  c.clear();
};

}  // namespace kestrel
