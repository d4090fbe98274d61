// kestrel/quant/ref/kquants.hpp: the scalar twin of the k-quant dot products
// in kestrel/quant/kquants.hpp, namespace kestrel::quant::ref, same
// signature. Written on `unpack` (the decoder dequantize_row uses and the
// tests check bit for bit against gguf-py), plain loops in index order: the
// reference the fast dots are compared against.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kestrel/quant/kquants_format.hpp"

namespace kestrel::quant::ref {

/// sum_i w[i] * a[i] over n values (n a multiple of 256, else
/// invalid_argument). Integer sums per 16 values (exact), then per 16 one
/// float product for the scale and one for the min (sum q8 * min via the
/// block's bsums), their difference, a running float sum over the 16, and
/// one d8 product and running sum per block.
template <weight_block B>
inline float vec_dot(const B* w, const block_q8_K* a, std::size_t n) {
  quant::detail::check_n(n, "vec_dot");
  unpacked u;
  float sum = 0.0f;
  for (std::size_t bi = 0; bi < n / qk_k; ++bi) {
    unpack(w[bi], u);
    float s = 0.0f;
    for (int g = 0; g < 16; ++g) {
      std::int32_t isum = 0;
      for (int i = 16 * g; i < 16 * g + 16; ++i) isum += std::int32_t(u.q[i]) * std::int32_t(a[bi].qs[i]);
      s += u.scale[g] * static_cast<float>(isum) - u.min[g] * static_cast<float>(a[bi].bsums[g]);
    }
    sum += a[bi].d * s;
  }
  return sum;
}

}  // namespace kestrel::quant::ref
