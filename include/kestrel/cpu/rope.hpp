// kestrel/cpu/rope.hpp: rotary position embedding, llama / GGML "normal"
// mode (adjacent pairs (2i, 2i+1) rotate together).
#pragma once

#include <cmath>
#include <cstddef>

namespace kestrel::cpu {

/// cos and sin of the angle of pair i (dims 2i, 2i+1) at position pos:
/// angle = pos * theta^(-2i / n_rot). Computed in float exactly as llama2.c
/// does (freq = 1 / powf(theta, 2i / n_rot); val = pos * freq; cosf, sinf),
/// so its golden outputs match bit for bit. The fast kernel and the scalar
/// twin both call this function, so their angles are identical and only the
/// rotation's rounding may differ.
inline void rope_cos_sin(std::size_t pos, std::size_t i, std::size_t n_rot, float theta, float& c, float& s) noexcept {
  const float freq = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(n_rot));
  const float val = static_cast<float>(pos) * freq;
  c = std::cos(val);
  s = std::sin(val);
}

/// Rotates the first n_rot dims (n_rot even, <= head_dim) of each of n_heads
/// heads at position pos. x: (n_heads, head_dim), in place.
///
/// The cost that matters is the n_rot/2 cos/sin pairs, so they are computed
/// once per call (in chunks on the stack) and reused for every head; the
/// rotation itself is a handful of multiplies per pair.
inline void rope(float* x, std::size_t n_heads, std::size_t head_dim, std::size_t n_rot, std::size_t pos,
                 float theta) noexcept {
  constexpr std::size_t chunk = 128;  // pairs per stack table: head_dim <= 256 needs one chunk
  float cs[chunk], sn[chunk];
  const std::size_t n_pairs = n_rot / 2;
  for (std::size_t p0 = 0; p0 < n_pairs; p0 += chunk) {
    const std::size_t p1 = n_pairs < p0 + chunk ? n_pairs : p0 + chunk;
    for (std::size_t i = p0; i < p1; ++i) rope_cos_sin(pos, i, n_rot, theta, cs[i - p0], sn[i - p0]);
    for (std::size_t h = 0; h < n_heads; ++h) {
      float* v = x + h * head_dim;
      for (std::size_t i = p0; i < p1; ++i) {
        const float c = cs[i - p0], s = sn[i - p0];
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * c - b * s;
        v[2 * i + 1] = a * s + b * c;
      }
    }
  }
}

}  // namespace kestrel::cpu
