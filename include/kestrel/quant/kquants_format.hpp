// kestrel/quant/kquants_format.hpp: the GGUF "k-quant" block formats q2_K, q3_K,
// q4_K, q5_K, q6_K (weights) and q8_K (activations), byte-identical to
// ggml's, so tensors in Q4_K_M / Q5_K_M / Q6_K files are used as they lie in
// the mmap.
//
// Every format packs a super-block of QK_K = 256 values: one or two f16
// super-scales and per-sub-block scales (and mins) quantized against them.
//   q2_K: 16 x 16 values, x = d*sc*q - dmin*m,  q in [0, 3],  sc, m 4-bit
//   q3_K: 16 x 16 values, x = d*(sc-32)*q,      q in [-4, 3], sc 6-bit
//   q4_K:  8 x 32 values, x = d*sc*q - dmin*m,  q in [0, 15], sc, m 6-bit
//   q5_K:  8 x 32 values, x = d*sc*q - dmin*m,  q in [0, 31], sc, m 6-bit
//   q6_K: 16 x 16 values, x = d*sc*(q-32),      q in [0, 63], sc int8
//   q8_K: 256 values,     x = d*q,              q in [-127, 127], f32 d
//
// API (namespace kestrel::quant), n a multiple of 256, else invalid_argument:
//   dequantize_row(const block_*_K* x, float* y, n)
//   quantize_row(const float* x, block_*_K* y, n)
// `unpack` decodes one block into integer quants plus a float scale and min
// per 16 values; dequantize and the scalar dot (ref/kquants.hpp) are both
// written on it, so they agree on every rounding of the scales (the dot
// differs from dequantize-then-dot only in summation order). The dots with
// q8_K activations, fast and scalar, are in kquants.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "kestrel/core/dtype.hpp"
#include "kestrel/core/error.hpp"

namespace kestrel::quant {

inline constexpr std::size_t qk_k = 256;

// Field order and sizes follow ggml-common.h; all members are bytes or
// 16-bit, so there is no padding.
struct block_q2_K {
  std::uint8_t scales[qk_k / 16];  // (16,) low nibble: scale, high nibble: min
  std::uint8_t qs[qk_k / 4];       // (64,) 2-bit quants
  f16 d;                           // super-scale of the scales
  f16 dmin;                        // super-scale of the mins
};
struct block_q3_K {
  std::uint8_t hmask[qk_k / 8];  // (32,) high bit of each quant
  std::uint8_t qs[qk_k / 4];     // (64,) low 2 bits
  std::uint8_t scales[12];       // 16 x 6-bit scales
  f16 d;
};
struct block_q4_K {
  f16 d;
  f16 dmin;
  std::uint8_t scales[12];     // 8 x 6-bit scales, 8 x 6-bit mins
  std::uint8_t qs[qk_k / 2];   // (128,) 4-bit quants
};
struct block_q5_K {
  f16 d;
  f16 dmin;
  std::uint8_t scales[12];
  std::uint8_t qh[qk_k / 8];   // (32,) fifth bit
  std::uint8_t qs[qk_k / 2];   // (128,) low 4 bits
};
struct block_q6_K {
  std::uint8_t ql[qk_k / 2];     // (128,) low 4 bits
  std::uint8_t qh[qk_k / 4];     // (64,) high 2 bits
  std::int8_t scales[qk_k / 16]; // (16,)
  f16 d;
};
struct block_q8_K {
  float d;
  std::int8_t qs[qk_k];            // (256,)
  std::int16_t bsums[qk_k / 16];   // (16,) sum of each 16 quants
};

static_assert(sizeof(block_q2_K) == 84);
static_assert(sizeof(block_q3_K) == 110);
static_assert(sizeof(block_q4_K) == 144);
static_assert(sizeof(block_q5_K) == 176);
static_assert(sizeof(block_q6_K) == 210);
static_assert(sizeof(block_q8_K) == 292);

/// One super-block decoded: value i is scale[i/16] * q[i] - min[i/16],
/// each product and difference rounded to float, as gguf-py and ggml do.
struct unpacked {
  std::array<std::int8_t, qk_k> q;
  std::array<float, qk_k / 16> scale;
  std::array<float, qk_k / 16> min;
};

namespace detail {

inline void check_n(std::size_t n, const char* what) {
  if (n % qk_k != 0)
    throw invalid_argument(std::string(what) + ": n = " + std::to_string(n) + " is not a multiple of 256");
}

inline int nearest_int(float f) { return static_cast<int>(std::lrintf(f)); }

/// The 12-byte scale field of q4_K / q5_K: eight 6-bit scales and eight
/// 6-bit mins. j < 4: low 6 bits of bytes j (scale) and j+4 (min); j >= 4:
/// a nibble of byte j+4 and the top two bits of bytes j-4 and j.
inline void get_scale_min_k4(int j, const std::uint8_t* s, std::uint8_t& sc, std::uint8_t& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = static_cast<std::uint8_t>((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
    m = static_cast<std::uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}
inline void set_scale_min_k4(std::uint8_t* s, const std::uint8_t* sc, const std::uint8_t* m) {
  for (int j = 0; j < 12; ++j) s[j] = 0;
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] = sc[j];
      s[j + 4] = m[j];
    } else {
      s[j + 4] = static_cast<std::uint8_t>((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
      s[j - 4] |= static_cast<std::uint8_t>((sc[j] >> 4) << 6);
      s[j] |= static_cast<std::uint8_t>((m[j] >> 4) << 6);
    }
  }
}

/// q3_K's 12-byte field: scale s's low nibble is in byte s%8 (low nibble for
/// s < 8, high for s >= 8), its top two bits in byte 8 + s%4 at bit 2*(s/4).
inline int get_scale_k3(int s, const std::uint8_t* b) {
  const int lo = (b[s % 8] >> (4 * (s / 8))) & 0xF;
  const int hi = (b[8 + s % 4] >> (2 * (s / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}
inline void set_scales_k3(std::uint8_t* b, const int* sc /* 16 values in [0, 63] */) {
  for (int j = 0; j < 12; ++j) b[j] = 0;
  for (int s = 0; s < 16; ++s) {
    b[s % 8] |= static_cast<std::uint8_t>((sc[s] & 0xF) << (4 * (s / 8)));
    b[8 + s % 4] |= static_cast<std::uint8_t>((sc[s] >> 4) << (2 * (s / 4)));
  }
}

// Position of value i in the 2-bit layouts of q2_K / q3_K (and q6_K's high
// bits): each 128-value half uses 32 bytes, four 32-value runs at shifts
// 0, 2, 4, 6 of the same bytes.
inline int byte2(int i) { return 32 * (i / 128) + i % 32; }
inline int shift2(int i) { return 2 * ((i % 128) / 32); }
// 4-bit layouts of q4_K / q5_K: each 64 values use 32 bytes, low nibble
// first. q6_K's low bits: each 128 values use 64 bytes, low nibble first.
inline int byte4(int i) { return 32 * (i / 64) + i % 32; }
inline int shift4(int i) { return 4 * ((i % 64) / 32); }
inline int byte6l(int i) { return 64 * (i / 128) + i % 64; }
inline int shift6l(int i) { return 4 * ((i % 128) / 64); }
// The single high bit of q3_K / q5_K: value i is bit i/32 of byte i%32.
// In every layout a run of 32 values r .. r + 31 (r a multiple of 32) sits
// in consecutive bytes at one shift: byte(r + l) = byte(r) + l, shift(r +
// l) = shift(r). The unpack loops below walk such runs, which compilers
// vectorize; a loop over i with the divisions inside they did not.

}  // namespace detail

// ---- unpack: the one place each layout is read ----

inline void unpack(const block_q2_K& b, unpacked& u) {
  const float d = to_f32(b.d), dmin = to_f32(b.dmin);
  for (int g = 0; g < 16; ++g) {
    u.scale[g] = d * static_cast<float>(b.scales[g] & 0xF);
    u.min[g] = dmin * static_cast<float>(b.scales[g] >> 4);
  }
  for (int r = 0; r < 256; r += 32) {
    const std::uint8_t* q = b.qs + detail::byte2(r);
    const int sh = detail::shift2(r);
    for (int l = 0; l < 32; ++l) u.q[r + l] = static_cast<std::int8_t>((q[l] >> sh) & 3);
  }
}

inline void unpack(const block_q3_K& b, unpacked& u) {
  const float d = to_f32(b.d);
  for (int g = 0; g < 16; ++g) {
    u.scale[g] = d * static_cast<float>(detail::get_scale_k3(g, b.scales));
    u.min[g] = 0.0f;
  }
  for (int r = 0; r < 256; r += 32) {
    const std::uint8_t* q = b.qs + detail::byte2(r);
    const int sh = detail::shift2(r);
    for (int l = 0; l < 32; ++l) {
      const int lo = (q[l] >> sh) & 3;
      const int hi = (b.hmask[l] >> (r / 32)) & 1;  // a set bit means no offset
      u.q[r + l] = static_cast<std::int8_t>(lo - (hi ? 0 : 4));
    }
  }
}

template <class B>
inline void unpack_k4_scales(const B& b, unpacked& u) {
  const float d = to_f32(b.d), dmin = to_f32(b.dmin);
  for (int j = 0; j < 8; ++j) {
    std::uint8_t sc, m;
    detail::get_scale_min_k4(j, b.scales, sc, m);
    u.scale[2 * j] = u.scale[2 * j + 1] = d * static_cast<float>(sc);
    u.min[2 * j] = u.min[2 * j + 1] = dmin * static_cast<float>(m);
  }
}

inline void unpack(const block_q4_K& b, unpacked& u) {
  unpack_k4_scales(b, u);
  for (int r = 0; r < 256; r += 32) {
    const std::uint8_t* q = b.qs + detail::byte4(r);
    const int sh = detail::shift4(r);
    for (int l = 0; l < 32; ++l) u.q[r + l] = static_cast<std::int8_t>((q[l] >> sh) & 0xF);
  }
}

inline void unpack(const block_q5_K& b, unpacked& u) {
  unpack_k4_scales(b, u);
  for (int r = 0; r < 256; r += 32) {
    const std::uint8_t* q = b.qs + detail::byte4(r);
    const int sh = detail::shift4(r);
    for (int l = 0; l < 32; ++l) {
      const int lo = (q[l] >> sh) & 0xF;
      const int hi = (b.qh[l] >> (r / 32)) & 1;
      u.q[r + l] = static_cast<std::int8_t>(lo | (hi << 4));
    }
  }
}

inline void unpack_k6_scales(const block_q6_K& b, unpacked& u) {
  const float d = to_f32(b.d);
  for (int g = 0; g < 16; ++g) {
    u.scale[g] = d * static_cast<float>(b.scales[g]);
    u.min[g] = 0.0f;
  }
}

inline void unpack(const block_q6_K& b, unpacked& u) {
  unpack_k6_scales(b, u);
  for (int r = 0; r < 256; r += 32) {
    const std::uint8_t* ql = b.ql + detail::byte6l(r);
    const std::uint8_t* qh = b.qh + detail::byte2(r);
    const int shl = detail::shift6l(r), shh = detail::shift2(r);
    for (int l = 0; l < 32; ++l) {
      const int lo = (ql[l] >> shl) & 0xF;
      const int hi = (qh[l] >> shh) & 3;
      u.q[r + l] = static_cast<std::int8_t>((lo | (hi << 4)) - 32);
    }
  }
}

// ---- dequantize ----

template <class B>
concept weight_block = requires(const B& b, unpacked& u) { unpack(b, u); };

/// y[i] = the value block i/256 encodes at i%256; y holds n floats.
template <weight_block B>
inline void dequantize_row(const B* x, float* y, std::size_t n) {
  detail::check_n(n, "dequantize_row");
  unpacked u;
  for (std::size_t bi = 0; bi < n / qk_k; ++bi) {
    unpack(x[bi], u);
    // The references round twice (product, then difference). The product
    // is exact here: scale is an f16's 11 significant bits times a scale of
    // at most 8 bits (exact in float), q at most 6 bits, so the product has
    // at most 24 bits (q6_K: 11 + 7 + 6). A compiler that contracts the two
    // into one FMA therefore rounds once to the same value, and the loop is
    // free to vectorize.
    for (int i = 0; i < 256; ++i) y[bi * qk_k + i] = u.scale[i / 16] * static_cast<float>(u.q[i]) - u.min[i / 16];
  }
}

inline void dequantize_row(const block_q8_K* x, float* y, std::size_t n) {
  detail::check_n(n, "dequantize_row");
  for (std::size_t bi = 0; bi < n / qk_k; ++bi)
    for (std::size_t i = 0; i < qk_k; ++i) y[bi * qk_k + i] = x[bi].d * static_cast<float>(x[bi].qs[i]);
}

// ---- quantize ----

/// q8_K: d = max|x| / 127 (sign chosen so the largest-magnitude value maps
/// to -128 -> clamped to 127), q = round(x / d); bsums filled.
inline void quantize_row(const float* x, block_q8_K* y, std::size_t n) {
  detail::check_n(n, "quantize_row");
  for (std::size_t bi = 0; bi < n / qk_k; ++bi) {
    const float* xb = x + bi * qk_k;
    float amax = 0.0f, vmax = 0.0f;
    for (std::size_t i = 0; i < qk_k; ++i)
      if (std::fabs(xb[i]) > amax) { amax = std::fabs(xb[i]); vmax = xb[i]; }
    block_q8_K& b = y[bi];
    if (amax == 0.0f) {
      std::memset(&b, 0, sizeof b);
      continue;
    }
    const float iscale = -127.0f / vmax;  // the max maps to -127 (ggml uses -128 and clamps)
    for (std::size_t i = 0; i < qk_k; ++i)
      b.qs[i] = static_cast<std::int8_t>(std::clamp(detail::nearest_int(iscale * xb[i]), -127, 127));
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int i = 16 * g; i < 16 * g + 16; ++i) s += b.qs[i];
      b.bsums[g] = static_cast<std::int16_t>(s);
    }
    b.d = 1.0f / iscale;
  }
}

namespace detail {

/// Symmetric fit of m values to integers in [-nmax, nmax-1]: try scales
/// near -nmax/vmax (vmax the largest-magnitude value), keep the one with the
/// least sum w*(x - s*q)^2 after a least-squares rescale. Returns the scale
/// (0 for an all-zero group) and writes q + nmax into L.
inline float fit_symmetric(const float* x, int m, int nmax, std::uint8_t* L) {
  float amax = 0.0f, vmax = 0.0f;
  for (int i = 0; i < m; ++i)
    if (std::fabs(x[i]) > amax) { amax = std::fabs(x[i]); vmax = x[i]; }
  if (amax < 1e-30f) {
    for (int i = 0; i < m; ++i) L[i] = static_cast<std::uint8_t>(nmax);
    return 0.0f;
  }
  float best_scale = 0.0f, best_err = INFINITY;
  for (int is = -9; is <= 9; ++is) {
    const float iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / vmax;
    double sumlx = 0, suml2 = 0;
    int q[32];
    for (int i = 0; i < m; ++i) {
      q[i] = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      const double w = x[i] * x[i];
      sumlx += w * x[i] * q[i];
      suml2 += w * q[i] * q[i];
    }
    if (suml2 <= 0) continue;
    const float scale = static_cast<float>(sumlx / suml2);
    double err = 0;
    for (int i = 0; i < m; ++i) {
      const double e = x[i] - scale * q[i];
      err += x[i] * x[i] * e * e;
    }
    if (err < best_err) { best_err = static_cast<float>(err); best_scale = scale; }
  }
  for (int i = 0; i < m; ++i)
    L[i] = static_cast<std::uint8_t>(std::clamp(nearest_int(x[i] / best_scale), -nmax, nmax - 1) + nmax);
  return best_scale;
}

/// Asymmetric fit x ~ scale*q - min, q in [0, nmax], min >= 0 (the range
/// always holds 0): a grid of candidate ranges, each refined by weighted
/// least squares for (scale, min). Writes q into L, returns scale and min.
inline void fit_affine(const float* x, int m, int nmax, float& scale_out, float& min_out, std::uint8_t* L) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < m; ++i) { lo = std::min(lo, x[i]); hi = std::max(hi, x[i]); }
  lo = std::min(lo, 0.0f);
  if (hi <= lo) {
    for (int i = 0; i < m; ++i) L[i] = 0;
    scale_out = 0.0f;
    min_out = -lo;
    return;
  }
  float best_err = INFINITY, best_s = (hi - lo) / static_cast<float>(nmax), best_lo = lo;
  for (int is = -4; is <= 16; ++is) {
    const float s0 = (hi - lo) / (static_cast<float>(nmax) + 0.1f * static_cast<float>(is));
    if (s0 <= 0) continue;
    int q[32];
    double sw = 0, sx = 0, sq = 0, sqq = 0, sqx = 0;
    for (int i = 0; i < m; ++i) {
      q[i] = std::clamp(nearest_int((x[i] - lo) / s0), 0, nmax);
      const double w = 1.0;
      sw += w; sx += w * x[i]; sq += w * q[i]; sqq += w * q[i] * q[i]; sqx += w * q[i] * x[i];
    }
    // minimise sum (s*q + lo' - x)^2 over s, lo'
    const double det = sw * sqq - sq * sq;
    double s = s0, l = lo;
    if (det > 0) {
      s = (sw * sqx - sq * sx) / det;
      l = (sqq * sx - sq * sqx) / det;
    }
    if (l > 0) {  // the min must stay <= 0: refit the scale alone with lo' = 0
      l = 0;
      s = sqq > 0 ? sqx / sqq : s0;
    }
    if (s <= 0) continue;
    double err = 0;
    for (int i = 0; i < m; ++i) {
      const double e = s * q[i] + l - x[i];
      err += e * e;
    }
    if (err < best_err) { best_err = static_cast<float>(err); best_s = static_cast<float>(s); best_lo = static_cast<float>(l); }
  }
  scale_out = best_s;
  min_out = -best_lo;
  for (int i = 0; i < m; ++i) L[i] = static_cast<std::uint8_t>(std::clamp(nearest_int((x[i] - best_lo) / best_s), 0, nmax));
}

/// Quantizes nonnegative per-group values v[k] against one f16 super-scale
/// with `bits` bits; returns the stored super-scale (as float) and codes.
inline float quantize_scales(const float* v, int k, int maxq, std::uint8_t* codes, f16& stored) {
  float vmax = 0.0f;
  for (int j = 0; j < k; ++j) vmax = std::max(vmax, v[j]);
  stored = to_f16(vmax / static_cast<float>(maxq));
  const float d = to_f32(stored);
  for (int j = 0; j < k; ++j)
    codes[j] = d > 0 ? static_cast<std::uint8_t>(std::clamp(nearest_int(v[j] / d), 0, maxq)) : 0;
  return d;
}

/// The affine types: fit each group, quantize scales and mins, then
/// re-round every value against the scale and min actually stored.
template <int GroupSize, int Nmax, int MaxScaleCode>
inline void quantize_affine(const float* x, std::uint8_t* q /* (256,) */, std::uint8_t* sc, std::uint8_t* mn,
                            f16& d_out, f16& dmin_out) {
  constexpr int ng = 256 / GroupSize;
  float scales[ng], mins[ng];
  std::uint8_t L[32];
  for (int g = 0; g < ng; ++g) fit_affine(x + GroupSize * g, GroupSize, Nmax, scales[g], mins[g], L);
  const float d = quantize_scales(scales, ng, MaxScaleCode, sc, d_out);
  const float dmin = quantize_scales(mins, ng, MaxScaleCode, mn, dmin_out);
  for (int g = 0; g < ng; ++g) {
    const float s = d * static_cast<float>(sc[g]), m = dmin * static_cast<float>(mn[g]);
    for (int i = GroupSize * g; i < GroupSize * (g + 1); ++i)
      q[i] = s > 0 ? static_cast<std::uint8_t>(std::clamp(nearest_int((x[i] + m) / s), 0, Nmax)) : 0;
  }
}

/// The symmetric types (q3_K, q6_K): a signed scale per 16 values quantized
/// against one f16 super-scale into [-ScaleCodes, ScaleCodes-1]; returns
/// signed codes and q in [-Nmax, Nmax-1].
template <int Nmax, int ScaleCodes>
inline void quantize_symmetric(const float* x, int* q, int* sc, f16& d_out) {
  float scales[16];
  std::uint8_t L[16];
  float amax = 0.0f, vmax = 0.0f;
  for (int g = 0; g < 16; ++g) {
    scales[g] = fit_symmetric(x + 16 * g, 16, Nmax, L);
    if (std::fabs(scales[g]) > amax) { amax = std::fabs(scales[g]); vmax = scales[g]; }
  }
  if (amax == 0.0f) {
    d_out = to_f16(0.0f);
    for (int g = 0; g < 16; ++g) sc[g] = 0;
    for (int i = 0; i < 256; ++i) q[i] = 0;
    return;
  }
  // the largest scale maps to -ScaleCodes, the end with the extra code
  d_out = to_f16(-vmax / static_cast<float>(ScaleCodes));
  const float d = to_f32(d_out);
  for (int g = 0; g < 16; ++g) {
    sc[g] = d != 0 ? std::clamp(nearest_int(scales[g] / d), -ScaleCodes, ScaleCodes - 1) : 0;
    const float s = d * static_cast<float>(sc[g]);
    for (int i = 16 * g; i < 16 * g + 16; ++i)
      q[i] = s != 0 ? std::clamp(nearest_int(x[i] / s), -Nmax, Nmax - 1) : 0;
  }
}

}  // namespace detail

inline void quantize_row(const float* x, block_q2_K* y, std::size_t n) {
  detail::check_n(n, "quantize_row");
  for (std::size_t bi = 0; bi < n / qk_k; ++bi) {
    block_q2_K& b = y[bi];
    std::uint8_t q[256], sc[16], mn[16];
    detail::quantize_affine<16, 3, 15>(x + bi * qk_k, q, sc, mn, b.d, b.dmin);
    for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<std::uint8_t>(sc[g] | (mn[g] << 4));
    std::memset(b.qs, 0, sizeof b.qs);
    for (int i = 0; i < 256; ++i) b.qs[detail::byte2(i)] |= static_cast<std::uint8_t>(q[i] << detail::shift2(i));
  }
}

inline void quantize_row(const float* x, block_q3_K* y, std::size_t n) {
  detail::check_n(n, "quantize_row");
  for (std::size_t bi = 0; bi < n / qk_k; ++bi) {
    block_q3_K& b = y[bi];
    int q[256], sc[16];
    detail::quantize_symmetric<4, 32>(x + bi * qk_k, q, sc, b.d);
    for (int g = 0; g < 16; ++g) sc[g] += 32;
    detail::set_scales_k3(b.scales, sc);
    std::memset(b.qs, 0, sizeof b.qs);
    std::memset(b.hmask, 0, sizeof b.hmask);
    for (int i = 0; i < 256; ++i) {
      const int v = q[i] + 4;  // [0, 7]: bit 2 goes to hmask
      b.qs[detail::byte2(i)] |= static_cast<std::uint8_t>((v & 3) << detail::shift2(i));
      if (v & 4) b.hmask[i % 32] |= static_cast<std::uint8_t>(1u << (i / 32));
    }
  }
}

inline void quantize_row(const float* x, block_q4_K* y, std::size_t n) {
  detail::check_n(n, "quantize_row");
  for (std::size_t bi = 0; bi < n / qk_k; ++bi) {
    block_q4_K& b = y[bi];
    std::uint8_t q[256], sc[8], mn[8];
    detail::quantize_affine<32, 15, 63>(x + bi * qk_k, q, sc, mn, b.d, b.dmin);
    detail::set_scale_min_k4(b.scales, sc, mn);
    std::memset(b.qs, 0, sizeof b.qs);
    for (int i = 0; i < 256; ++i) b.qs[detail::byte4(i)] |= static_cast<std::uint8_t>(q[i] << detail::shift4(i));
  }
}

inline void quantize_row(const float* x, block_q5_K* y, std::size_t n) {
  detail::check_n(n, "quantize_row");
  for (std::size_t bi = 0; bi < n / qk_k; ++bi) {
    block_q5_K& b = y[bi];
    std::uint8_t q[256], sc[8], mn[8];
    detail::quantize_affine<32, 31, 63>(x + bi * qk_k, q, sc, mn, b.d, b.dmin);
    detail::set_scale_min_k4(b.scales, sc, mn);
    std::memset(b.qs, 0, sizeof b.qs);
    std::memset(b.qh, 0, sizeof b.qh);
    for (int i = 0; i < 256; ++i) {
      b.qs[detail::byte4(i)] |= static_cast<std::uint8_t>((q[i] & 0xF) << detail::shift4(i));
      if (q[i] & 16) b.qh[i % 32] |= static_cast<std::uint8_t>(1u << (i / 32));
    }
  }
}

inline void quantize_row(const float* x, block_q6_K* y, std::size_t n) {
  detail::check_n(n, "quantize_row");
  for (std::size_t bi = 0; bi < n / qk_k; ++bi) {
    block_q6_K& b = y[bi];
    int q[256], sc[16];
    detail::quantize_symmetric<32, 128>(x + bi * qk_k, q, sc, b.d);
    for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<std::int8_t>(std::clamp(sc[g], -128, 127));
    std::memset(b.ql, 0, sizeof b.ql);
    std::memset(b.qh, 0, sizeof b.qh);
    for (int i = 0; i < 256; ++i) {
      const int v = q[i] + 32;  // [0, 63]
      b.ql[detail::byte6l(i)] |= static_cast<std::uint8_t>((v & 0xF) << detail::shift6l(i));
      b.qh[detail::byte2(i)] |= static_cast<std::uint8_t>((v >> 4) << detail::shift2(i));
    }
  }
}

}  // namespace kestrel::quant
