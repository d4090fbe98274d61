// kestrel/io/llama2c.hpp: the legacy llama2.c checkpoint (`.bin`, version 0).
//
// Layout (little-endian), as llama2.c's run.c reads it:
//   7 x int32: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
//              (vocab_size < 0: a separate classifier wcls follows; > 0: wcls = token_embedding)
//   float32 arrays, row-major [out, in]:
//     token_embedding (vocab, dim)
//     rms_att   (n_layers, dim)
//     wq        (n_layers, dim, dim)
//     wk        (n_layers, kv_dim, dim)
//     wv        (n_layers, kv_dim, dim)
//     wo        (n_layers, dim, dim)
//     rms_ffn   (n_layers, dim)
//     w1        (n_layers, hidden_dim, dim)
//     w2        (n_layers, dim, hidden_dim)
//     w3        (n_layers, hidden_dim, dim)
//     rms_final (dim)
//     freq_cis  2 x (seq_len * head_size / 2) floats: legacy RoPE tables, skipped
//     wcls      (vocab, dim), only when the classifier is unshared
// The weights are used in place from the map. The file must be exactly the
// size the header implies: a checkpoint with bytes missing or left over was
// exported with other settings, and reading it would give garbage silently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>

#include "kestrel/core/error.hpp"
#include "kestrel/core/mmap.hpp"

namespace kestrel::io {

struct llama2c_config {
  std::size_t dim = 0;         // n_embd
  std::size_t hidden_dim = 0;  // FFN width
  std::size_t n_layers = 0;
  std::size_t n_heads = 0;
  std::size_t n_kv_heads = 0;
  std::size_t vocab_size = 0;  // always positive; the sign in the file went to shared_classifier
  bool shared_classifier = true;
  std::size_t seq_len = 0;     // n_ctx the model was trained with

  std::size_t head_size() const noexcept { return dim / n_heads; }
  std::size_t kv_dim() const noexcept { return dim / n_heads * n_kv_heads; }
};

class llama2c_checkpoint {
 public:
  static constexpr std::size_t header_bytes = 7 * sizeof(std::int32_t);

  /// Maps and validates the file; throws kestrel::file_error on bad input.
  explicit llama2c_checkpoint(const std::filesystem::path& path) : file_(path) { parse(); }

  const std::string& path() const noexcept { return file_.path(); }
  const llama2c_config& config() const noexcept { return config_; }
  const mapped_file& file() const noexcept { return file_; }

  const float* token_embedding() const noexcept { return at(token_embedding_); }  // (vocab, dim)
  const float* rms_att(std::size_t l) const { return layer(rms_att_, l, c().dim); }                 // (dim)
  const float* wq(std::size_t l) const { return layer(wq_, l, c().dim * c().dim); }                 // (dim, dim)
  const float* wk(std::size_t l) const { return layer(wk_, l, c().kv_dim() * c().dim); }            // (kv_dim, dim)
  const float* wv(std::size_t l) const { return layer(wv_, l, c().kv_dim() * c().dim); }            // (kv_dim, dim)
  const float* wo(std::size_t l) const { return layer(wo_, l, c().dim * c().dim); }                 // (dim, dim)
  const float* rms_ffn(std::size_t l) const { return layer(rms_ffn_, l, c().dim); }                 // (dim)
  const float* w1(std::size_t l) const { return layer(w1_, l, c().hidden_dim * c().dim); }          // (hidden, dim)
  const float* w2(std::size_t l) const { return layer(w2_, l, c().dim * c().hidden_dim); }          // (dim, hidden)
  const float* w3(std::size_t l) const { return layer(w3_, l, c().hidden_dim * c().dim); }          // (hidden, dim)
  const float* rms_final() const noexcept { return at(rms_final_); }                                // (dim)
  /// (vocab, dim); the same pointer as token_embedding() when the classifier is shared.
  const float* wcls() const noexcept { return at(wcls_); }

 private:
  const llama2c_config& c() const noexcept { return config_; }
  // Offsets below are in floats from the end of the header.
  const float* at(std::size_t off) const noexcept {
    // The map is page-aligned and the header is 28 bytes, so floats are 4-byte aligned.
    return reinterpret_cast<const float*>(file_.data() + header_bytes) + off;
  }
  const float* layer(std::size_t base, std::size_t l, std::size_t per_layer) const {
    if (l >= config_.n_layers)
      throw invalid_argument("llama2c_checkpoint: layer " + std::to_string(l) + " out of range (n_layers = " +
                             std::to_string(config_.n_layers) + ")");
    return at(base + l * per_layer);
  }

  [[noreturn]] void fail(std::uint64_t at, const std::string& what) const { throw file_error(path(), at, what); }

  void parse();

  mapped_file file_;
  llama2c_config config_;
  std::size_t token_embedding_ = 0, rms_att_ = 0, wq_ = 0, wk_ = 0, wv_ = 0, wo_ = 0, rms_ffn_ = 0;
  std::size_t w1_ = 0, w2_ = 0, w3_ = 0, rms_final_ = 0, wcls_ = 0;
};

inline void llama2c_checkpoint::parse() {
  if (file_.size() < header_bytes)
    fail(0, "truncated header: file is " + std::to_string(file_.size()) + " bytes, a llama2.c checkpoint header needs " +
                std::to_string(header_bytes));
  std::int32_t h[7];
  std::memcpy(h, file_.data(), sizeof h);

  // llama2.c's later export versions start with the magic "ak42" (0x616b3432);
  // only the legacy version 0 (no magic) is read here.
  if (static_cast<std::uint32_t>(h[0]) == 0x616b3432u)
    fail(0, "llama2.c export version " + std::to_string(h[1]) +
                " (magic \"ak42\") is not supported; expected a legacy version-0 checkpoint (7 x int32 header)");

  static constexpr const char* names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size",
                                           "seq_len"};
  for (int i = 0; i < 7; ++i) {
    const bool ok = i == 5 ? h[i] != 0 && h[i] != INT32_MIN : h[i] > 0;
    if (!ok)
      fail(4 * static_cast<std::uint64_t>(i), std::string("header field ") + names[i] + " is " + std::to_string(h[i]) + ", expected " +
                      (i == 5 ? "a non-zero vocabulary size" : "a positive value"));
  }
  auto& cfg = config_;
  cfg.dim = static_cast<std::size_t>(h[0]);
  cfg.hidden_dim = static_cast<std::size_t>(h[1]);
  cfg.n_layers = static_cast<std::size_t>(h[2]);
  cfg.n_heads = static_cast<std::size_t>(h[3]);
  cfg.n_kv_heads = static_cast<std::size_t>(h[4]);
  cfg.shared_classifier = h[5] > 0;
  cfg.vocab_size = static_cast<std::size_t>(h[5] > 0 ? h[5] : -static_cast<std::int64_t>(h[5]));
  cfg.seq_len = static_cast<std::size_t>(h[6]);

  if (cfg.dim % cfg.n_heads != 0)
    fail(12, "dim " + std::to_string(cfg.dim) + " is not divisible by n_heads " + std::to_string(cfg.n_heads));
  if (cfg.n_heads % cfg.n_kv_heads != 0)
    fail(16, "n_heads " + std::to_string(cfg.n_heads) + " is not a multiple of n_kv_heads " +
                 std::to_string(cfg.n_kv_heads) + " (each kv head serves n_heads / n_kv_heads query heads)");
  // RoPE rotates pairs within a head, and the freq_cis block is sized by head_size / 2.
  if (cfg.head_size() % 2 != 0)
    fail(12, "head size dim / n_heads = " + std::to_string(cfg.head_size()) + " is odd; RoPE needs an even head size");

  // Expected size, every step overflow-checked: the header values are up to
  // 2^31 each, and their products can exceed 64 bits in a corrupt header.
  bool overflow = false;
  auto mul = [&](std::uint64_t a, std::uint64_t b) {
    std::uint64_t r;
    overflow |= __builtin_mul_overflow(a, b, &r);
    return r;
  };
  auto add = [&](std::uint64_t a, std::uint64_t b) {
    std::uint64_t r;
    overflow |= __builtin_add_overflow(a, b, &r);
    return r;
  };
  const std::uint64_t dim = cfg.dim, hid = cfg.hidden_dim, L = cfg.n_layers, kv = cfg.kv_dim();
  const std::uint64_t V = cfg.vocab_size, hs = cfg.head_size();
  std::uint64_t n = 0;
  auto place = [&](std::size_t& field, std::uint64_t count) {
    field = static_cast<std::size_t>(n);
    n = add(n, count);
  };
  place(token_embedding_, mul(V, dim));
  place(rms_att_, mul(L, dim));
  place(wq_, mul(L, mul(dim, dim)));
  place(wk_, mul(L, mul(kv, dim)));
  place(wv_, mul(L, mul(kv, dim)));
  place(wo_, mul(L, mul(dim, dim)));
  place(rms_ffn_, mul(L, dim));
  place(w1_, mul(L, mul(hid, dim)));
  place(w2_, mul(L, mul(dim, hid)));
  place(w3_, mul(L, mul(hid, dim)));
  place(rms_final_, dim);
  // freq_cis_real and freq_cis_imag, each seq_len * head_size / 2 (run.c's integer arithmetic).
  const std::uint64_t freq = mul(2, mul(cfg.seq_len, hs) / 2);
  n = add(n, freq);
  const std::uint64_t floats_shared = n;
  if (cfg.shared_classifier) {
    wcls_ = token_embedding_;
  } else {
    place(wcls_, mul(V, dim));
  }
  const std::uint64_t expected = add(header_bytes, mul(n, 4));
  const std::string header_text = "dim=" + std::to_string(cfg.dim) + " hidden_dim=" + std::to_string(cfg.hidden_dim) +
                                  " n_layers=" + std::to_string(cfg.n_layers) + " n_heads=" +
                                  std::to_string(cfg.n_heads) + " n_kv_heads=" + std::to_string(cfg.n_kv_heads) +
                                  " vocab_size=" + std::to_string(h[5]) + " seq_len=" + std::to_string(cfg.seq_len);
  if (overflow || expected > static_cast<std::uint64_t>(SIZE_MAX / 2))
    fail(0, "header (" + header_text + ") implies a size that overflows; the header is corrupt");
  if (expected != file_.size()) {
    std::string msg = "file is " + std::to_string(file_.size()) + " bytes, but the header (" + header_text +
                      ") implies exactly " + std::to_string(expected) + " bytes (28-byte header + " +
                      std::to_string(n) + " floats, " +
                      (cfg.shared_classifier ? "shared classifier" : "separate classifier") + ")";
    // A common mistake is the sign of vocab_size: say so when the other choice fits.
    const std::uint64_t other =
        header_bytes + 4 * (cfg.shared_classifier ? floats_shared + V * dim : floats_shared);
    if (other == file_.size())
      msg += "; the size would fit a " + std::string(cfg.shared_classifier ? "separate" : "shared") +
             " classifier, so the sign of vocab_size looks wrong";
    fail(file_.size() < expected ? file_.size() : expected, msg);
  }
}

}  // namespace kestrel::io
