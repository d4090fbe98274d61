// kestrel/model/concepts.hpp: the Backend and GenerativeModel concepts.
//
// Backend
//
// What it models: where the model's arithmetic runs. A backend provides the
// handful of operations a decoder layer is made of, over f32 activations and
// weights whose element type is a run-time fact (`weight_view::type`).
//
// Required expressions, for a backend `b`, weights `w`, activations `x`, `y`:
//   b.matvec(w, x, y)                    y(rows) = W x                      -- decode
//   b.matmul(w, x, n, y)                 Y(n, rows) = X(n, cols) W^T        -- prefill
//   b.row_to_f32(w, row, y)              embedding lookup
//   b.rmsnorm(y, x, weight, n, eps), b.layernorm(y, x, weight, bias, n, eps),
//   b.rope(x, n_heads, head_dim, pos, rope_spec), b.swiglu(y, gate, up, n), b.gelu(y, x, n),
//   b.add(y, x, n),
//   b.attend(q, k, v, n_kv, head_dim, kv_stride, scale, out, scratch)
//   b.parallel_for(n, f, work)           f(begin, end) over a split of [0, n); `work`
//                                        (multiply-adds) lets the backend run small jobs inline
//   b.n_threads()                        -> std::size_t
//
// Optional expressions (llama_model detects them with `requires` and falls
// back to the required ones). Fusions that save decode one parallel region
// each, bit-identical to the unfused calls (fallback: one matvec per matrix):
//   b.matvec_fused(jobs, x)              y_j = W_j x for a span of cpu::matvec_job {&w, y}
//   b.matvec_swiglu(gate, up, x, h, s)   h = silu(gate x) * (up x); s: (rows) scratch
// Prefill's products of one X (q, k, v; gate, up), bit-identical to one
// matmul per matrix; the backend may quantize X once (fallback: matmul each):
//   b.matmul_shared(jobs, x, n)          Y_j = X W_j^T for cpu::matvec_job {&w, y}, X (n, cols)
// and SwiGLU's two products with silu applied as they are made, bit-identical
// to matmul_shared of gate and up then b.swiglu (the fallback):
//   b.matmul_swiglu(gate, up, x, n, h, s) h = silu(X gate^T) * (X up^T); s: (n, rows) scratch
// Attention of a block of consecutive queries x the query heads of one KV
// head (prefill; decode with grouped-query attention, one query), each row
// within attend()'s tolerance of attend of that query, or a prompt's (no
// args.scratch) within the bf16 splits' (cpu/attend_amx.hpp) (fallback:
// attend per (token, head)); called from inside parallel_for, so it must be
// safe on several threads at once; args.scratch, when set, is the caller's;
// and, optional beside it, the rows per prompt task its kernel wants
// (without it, 32):
//   b.attend_block(args)                 cpu::attend_block_args (cpu/attend_block.hpp)
//   b.attend_block_rows(head_dim)        std::size_t
// RoPE with one position's angles computed by the model, once for all
// layers (cpu::rope_angles: cs[i], sn[i] for pair i < n_rot / 2), the same
// bits as b.rope at that position (fallback: b.rope, which computes them):
//   b.rope_rotate(x, n_heads, head_dim, cs, sn, rope_spec)
// Once, when the model is built, before any other call: place the weights
// where the backend reads them best (the views may then point elsewhere,
// to the same values, in the same layout or, with a new dtype, in one of the
// backend's own such as q4_k_x16; weights.copy owns what they point to):
//   b.prepare_weights(weights)           llama_weights& (model/weights.hpp)
//
// Semantics: every operation has the meaning of its scalar twin in
// cpu/ref/; a backend may reorder floating-point sums (tolerances in the
// tests are derived for that) but nothing else.
//
// Models: cpu_backend and cpu_ref_backend (model/backend.hpp); the CUDA
// backend will model the same concept.
//
// GenerativeModel
// ---------------
// What it models: a sequence model the generation loop can drive.
// Required: m.prefill(tokens) and m.decode(token) -> logits (n_vocab floats,
// valid until the next call), m.n_past() (positions in the cache),
// m.n_ctx() (capacity). Semantics: prefill appends all tokens at positions
// n_past().., decode appends one; both throw invalid_argument rather than
// overflow the context. Models: llama_model (model/llama.hpp).
#pragma once

#include <concepts>
#include <cstddef>
#include <span>

#include "kestrel/core/tensor.hpp"
#include "kestrel/core/token.hpp"
#include "kestrel/cpu/rope.hpp"

namespace kestrel {

namespace detail {
struct range_fn {
  void operator()(std::size_t, std::size_t) const {}
};
}  // namespace detail

template <class B>
concept Backend = requires(B& b, const weight_view& w, const float* cx, float* y, std::size_t n, float f,
                           const cpu::rope_spec& r) {
  b.matvec(w, cx, y);
  b.matmul(w, cx, n, y);
  b.row_to_f32(w, n, y);
  b.rmsnorm(y, cx, cx, n, f);
  b.layernorm(y, cx, cx, cx, n, f);
  b.rope(y, n, n, n, r);
  b.swiglu(y, cx, cx, n);
  b.gelu(y, cx, n);
  b.add(y, cx, n);
  b.attend(cx, cx, cx, n, n, n, f, y, y);
  b.parallel_for(n, detail::range_fn{}, n);
  { b.n_threads() } -> std::convertible_to<std::size_t>;
};

template <class M>
concept GenerativeModel = requires(M& m, std::span<const token_id> tokens, token_id t) {
  { m.prefill(tokens) } -> std::convertible_to<std::span<const float>>;
  { m.decode(t) } -> std::convertible_to<std::span<const float>>;
  { m.n_past() } -> std::convertible_to<std::size_t>;
  { m.n_ctx() } -> std::convertible_to<std::size_t>;
};

}  // namespace kestrel
