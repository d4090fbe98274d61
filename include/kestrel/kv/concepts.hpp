// kestrel/kv/concepts.hpp: the KvCache concept.
//
// What it models: the per-layer store of the keys and values of every
// position a sequence has processed, so that decode attends over them
// instead of recomputing the whole sequence.
//
// Required expressions, for a cache `c` (and `cc` const):
//   cc.n_ctx(), cc.n_layer(), cc.kv_dim()  -> std::size_t   capacity and shape
//   cc.size()                              -> std::size_t   positions filled
//   c.key(layer, pos), c.value(layer, pos) -> float*        the kv_dim row to write for `pos`
//   cc.keys(layer), cc.values(layer)       -> kv_rows       read access: row t at base + t * stride
//   c.resize(n)                            -> void          mark positions [0, n) valid (n <= n_ctx)
//   c.clear()                              -> void          forget everything (size() == 0)
//
// Semantics: rows for positions < size() hold the K (after RoPE) and V of
// those positions; writing a row for pos >= size() and then resize(pos + 1)
// appends. key()/value() for pos >= n_ctx() is a precondition violation the
// model checks before calling (a prompt longer than the context is an error).
//
// Models: contiguous_kv_cache (kv/contiguous.hpp). Paged and quantized caches
// come later; they will add a block-table access next to kv_rows.
#pragma once

#include <concepts>
#include <cstddef>

namespace kestrel {

/// Strided read access to the cached rows of one layer.
struct kv_rows {
  const float* base;   // row 0
  std::size_t stride;  // floats between consecutive positions
};

template <class C>
concept KvCache = requires(C& c, const C& cc, std::size_t layer, std::size_t pos) {
  { cc.n_ctx() } -> std::same_as<std::size_t>;
  { cc.n_layer() } -> std::same_as<std::size_t>;
  { cc.kv_dim() } -> std::same_as<std::size_t>;
  { cc.size() } -> std::same_as<std::size_t>;
  { c.key(layer, pos) } -> std::same_as<float*>;
  { c.value(layer, pos) } -> std::same_as<float*>;
  { cc.keys(layer) } -> std::same_as<kv_rows>;
  { cc.values(layer) } -> std::same_as<kv_rows>;
  c.resize(pos);
  c.clear();
};

}  // namespace kestrel
