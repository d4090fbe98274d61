// kestrel/cpu/rope.hpp: rotary position embedding.
//
// Two pairings of a head's dims, as GGML names them:
//   normal -- adjacent pairs (2i, 2i+1) rotate together: llama2.c and GGUF
//             llama files (whose converter permutes the q/k rows for it);
//   neox   -- dim i pairs with dim i + n_rot/2: Hugging Face checkpoints
//             ("rotate_half"), and GGUF qwen2 / phi3 files.
// Pair i turns by pos * freq_scale * theta^(-2i/n_rot) / freq_factors[i]:
// freq_scale < 1 is linear position interpolation (rope.scaling.type
// linear), freq_factors are per-pair divisors (Llama 3's rope scaling,
// stored as the rope_freqs.weight tensor in GGUF files).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kestrel/core/diagnostics.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

KESTREL_INTRINSICS_BEGIN  // GCC 12 (core/diagnostics.hpp)

namespace kestrel::cpu {

enum class rope_mode { normal, neox };

struct rope_spec {
  std::size_t n_rot = 0;                // rotated dims per head (even, <= head_dim)
  float theta = 10000.0f;               // frequency base
  rope_mode mode = rope_mode::normal;
  float freq_scale = 1.0f;              // positions are multiplied by this
  const float* freq_factors = nullptr;  // (n_rot / 2) divisors of the frequencies, or none
};

/// cos and sin of the angle of pair i at position pos. Computed in float
/// exactly as llama2.c does when there is no scaling (freq = 1 / powf(theta,
/// 2i / n_rot); val = pos * freq; cosf, sinf), so its golden outputs match
/// bit for bit (multiplying by freq_scale 1 is exact). The fast kernel and
/// the scalar twin both call this function, so their angles are identical and
/// only the rotation's rounding may differ.
inline void rope_cos_sin(std::size_t pos, std::size_t i, const rope_spec& r, float& c, float& s) noexcept {
  float freq = 1.0f / std::pow(r.theta, static_cast<float>(2 * i) / static_cast<float>(r.n_rot));
  if (r.freq_factors) freq /= r.freq_factors[i];
  const float val = static_cast<float>(pos) * r.freq_scale * freq;
  c = std::cos(val);
  s = std::sin(val);
}

/// The dims pair i rotates: (first, second).
inline void rope_pair(const rope_spec& r, std::size_t i, std::size_t& a, std::size_t& b) noexcept {
  if (r.mode == rope_mode::normal) {
    a = 2 * i;
    b = 2 * i + 1;
  } else {
    a = i;
    b = i + r.n_rot / 2;
  }
}

/// cs[i], sn[i] = the cos and sin of pair i at position pos (rope_cos_sin)
/// for every pair i < n_rot / 2: one position's angles, which every layer's
/// q and k at that position turn by.
inline void rope_angles(std::size_t pos, const rope_spec& r, float* cs, float* sn) noexcept {
  for (std::size_t i = 0; i < r.n_rot / 2; ++i) rope_cos_sin(pos, i, r, cs[i], sn[i]);
}

namespace detail {

/// One pair's rotation, the formula every path runs: a' = fma(a, c, -(b s)),
/// b' = fma(b, c, a s) (two roundings each), so a pair's bits do not depend
/// on which path or chunk took it. (Without FMA hardware the plain
/// expressions, which the compiler may contract as it likes.)
inline void rope_rotate_one(float& a, float& b, float c, float s) noexcept {
  const float a0 = a;
#if defined(__FMA__)
  a = std::fma(a0, c, -(b * s));
  b = std::fma(b, c, a0 * s);
#else
  a = a0 * c - b * s;
  b = a0 * s + b * c;
#endif
}

/// Rotates pairs [p0, p1) of each of n_heads heads by the angles cs[i - p0],
/// sn[i - p0].
/// With AVX-512, 8 pairs at a time: the normal pairing's (2i, 2i + 1) as one
/// register (the partner by an in-lane swap, -s / s interleaved), neox's
/// (i, i + n_rot / 2) as two; per pair rope_rotate_one's operations, so the
/// same bits as the scalar loop. Measured: bench/README.md, "RoPE".
inline void rope_rotate_pairs(float* x, std::size_t n_heads, std::size_t head_dim, std::size_t p0, std::size_t p1,
                              const float* cs, const float* sn, const rope_spec& r) noexcept {
  const std::size_t n_pairs = r.n_rot / 2;
  const std::size_t stride = r.mode == rope_mode::normal ? 2 : 1, partner = r.mode == rope_mode::normal ? 1 : n_pairs;
  std::size_t v0 = p0;  // pairs [p0, v0) go 8 at a time
#if defined(__AVX512F__)
  v0 = p0 + (p1 - p0) / 8 * 8;
  if (r.mode == rope_mode::normal) {
    // lane 2j and 2j + 1 of a register: pair j's c; -s and s
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512 sign = _mm512_castsi512_ps(_mm512_setr_epi32(
        INT32_MIN, 0, INT32_MIN, 0, INT32_MIN, 0, INT32_MIN, 0, INT32_MIN, 0, INT32_MIN, 0, INT32_MIN, 0, INT32_MIN, 0));
    for (std::size_t i = p0; i < v0; i += 8) {
      const __m512 c = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(cs + (i - p0))));
      const __m512 s = _mm512_xor_ps(_mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(sn + (i - p0)))), sign);
      for (std::size_t h = 0; h < n_heads; ++h) {
        float* v = x + h * head_dim + 2 * i;
        const __m512 ab = _mm512_loadu_ps(v), ba = _mm512_permute_ps(ab, 0xb1);  // (b, a) in each pair
        // lane 2j: fma(a, c, b (-s)) = fma(a, c, -(b s)); lane 2j + 1: fma(b, c, a s)
        _mm512_storeu_ps(v, _mm512_fmadd_ps(ab, c, _mm512_mul_ps(ba, s)));
      }
    }
  } else {
    for (std::size_t i = p0; i < v0; i += 8) {
      const __m256 c = _mm256_loadu_ps(cs + (i - p0)), s = _mm256_loadu_ps(sn + (i - p0));
      for (std::size_t h = 0; h < n_heads; ++h) {
        float* v = x + h * head_dim + i;
        const __m256 a = _mm256_loadu_ps(v), b = _mm256_loadu_ps(v + n_pairs);
        _mm256_storeu_ps(v, _mm256_fmadd_ps(a, c, _mm256_xor_ps(_mm256_mul_ps(b, s), _mm256_set1_ps(-0.0f))));
        _mm256_storeu_ps(v + n_pairs, _mm256_fmadd_ps(b, c, _mm256_mul_ps(a, s)));
      }
    }
  }
#endif
  for (std::size_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    for (std::size_t i = v0; i < p1; ++i) rope_rotate_one(v[stride * i], v[stride * i + partner], cs[i - p0], sn[i - p0]);
  }
}

}  // namespace detail

/// Rotates the first n_rot dims of each of n_heads heads at position pos.
/// x: (n_heads, head_dim), in place.
///
/// The cost that matters is the n_rot/2 cos/sin pairs, so they are computed
/// once per call (in chunks on the stack) and reused for every head; the
/// rotation itself is a handful of multiplies per pair. A model computes
/// them once per position for all its layers with rope_angles and calls
/// rope_rotate, which gives the same bits.
inline void rope(float* x, std::size_t n_heads, std::size_t head_dim, std::size_t pos, const rope_spec& r) noexcept {
  constexpr std::size_t chunk = 128;  // pairs per stack table: head_dim <= 256 needs one chunk
  float cs[chunk], sn[chunk];
  const std::size_t n_pairs = r.n_rot / 2;
  for (std::size_t p0 = 0; p0 < n_pairs; p0 += chunk) {
    const std::size_t p1 = n_pairs < p0 + chunk ? n_pairs : p0 + chunk;
    for (std::size_t i = p0; i < p1; ++i) rope_cos_sin(pos, i, r, cs[i - p0], sn[i - p0]);
    detail::rope_rotate_pairs(x, n_heads, head_dim, p0, p1, cs, sn, r);
  }
}

/// rope() of one position with its angles given: cs, sn from
/// rope_angles(pos, r, cs, sn). The same bits as rope(x, n_heads, head_dim,
/// pos, r).
inline void rope_rotate(float* x, std::size_t n_heads, std::size_t head_dim, const float* cs, const float* sn,
                        const rope_spec& r) noexcept {
  detail::rope_rotate_pairs(x, n_heads, head_dim, 0, r.n_rot / 2, cs, sn, r);
}

/// The llama2.c form: normal pairing, no scaling.
inline void rope(float* x, std::size_t n_heads, std::size_t head_dim, std::size_t n_rot, std::size_t pos,
                 float theta) noexcept {
  cpu::rope(x, n_heads, head_dim, pos, rope_spec{n_rot, theta});
}

}  // namespace kestrel::cpu
KESTREL_INTRINSICS_END
