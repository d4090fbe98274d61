// kestrel/io/gguf_stream.hpp: writing a GGUF v3 file one tensor at a time.
//
// gguf_builder (gguf_write.hpp) holds every tensor's bytes until write();
// for a 1B-parameter model that is gigabytes, twice over. This writer takes
// the metadata from a gguf_builder that holds no tensors, declares every
// tensor's name, shape and type up front (so the header and all offsets are
// known), writes the header at once and then each tensor's bytes as the
// caller produces them, in declaration order. Memory: one tensor at a time.
//
//   io::gguf_builder meta;  meta.set("general.architecture", std::string("llama")); ...
//   io::gguf_stream_writer w("out.gguf", meta, {{"token_embd.weight", {64, 512}, io::ggml_type::f32}, ...});
//   w.write_tensor(bytes_of_token_embd);  ...
//   w.finish();
//
// The bytes are those gguf_builder would write for the same metadata and
// tensors. The bytes go to "<path>.part", renamed to `path` by finish(); a
// writer destroyed before finish() (an exception on the way) removes it, so
// a failed or killed run never leaves a truncated model under `path`.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/io/gguf_write.hpp"

namespace kestrel::io {

/// A tensor as the header describes it: dims in ggml order (dims[0] contiguous).
struct gguf_tensor_decl {
  std::string name;
  std::vector<std::uint64_t> dims;
  ggml_type type = ggml_type::f32;
};

/// Bytes of a tensor of `type` and `dims`; invalid_argument when dims[0] is
/// not a whole number of blocks or the type is unknown.
inline std::uint64_t tensor_bytes(ggml_type type, std::span<const std::uint64_t> dims, std::string_view name = "") {
  if (!is_known(type)) throw invalid_argument("tensor " + std::string(name) + ": unknown ggml type");
  if (dims.empty() || dims.size() > 4)
    throw invalid_argument("tensor " + std::string(name) + " has " + std::to_string(dims.size()) + " dimensions (1..4)");
  const std::uint64_t bs = block_size_of(type);
  if (dims[0] % bs)
    throw invalid_argument("tensor " + std::string(name) + ": a row of " + std::to_string(dims[0]) +
                           " values is not a whole number of " + std::string(name_of(type)) + " blocks of " +
                           std::to_string(bs));
  std::uint64_t n = 1;
  for (auto d : dims) n *= d;
  return n / bs * type_size_of(type);
}

/// Throws invalid_argument when `out` is the file `in` (what a tool reads
/// while it writes `out`; the writer's rename at the end would replace
/// it). `what` names `in` in the message: "input", "vocabulary".
inline void refuse_to_overwrite(const std::filesystem::path& in, const std::filesystem::path& out, std::string_view what) {
  std::error_code ec;
  if (std::filesystem::exists(out, ec) && std::filesystem::equivalent(in, out, ec))
    throw invalid_argument("the output file " + out.string() + " is the " + std::string(what) +
                           " file; write to a new file");
}

class gguf_stream_writer {
 public:
  /// Opens `path`, writes the header (the metadata of `meta`, which must
  /// hold no tensors, then the tensor table for `tensors`).
  gguf_stream_writer(std::filesystem::path path, const gguf_builder& meta, std::vector<gguf_tensor_decl> tensors)
      : path_(std::move(path)), decls_(std::move(tensors)) {
    const std::string m = meta.bytes();
    // meta.bytes() = "GGUF", u32 version, u64 n_tensors (0), u64 n_kv, the
    // pairs, zero padding. Walk the pairs to find where they end (the padding
    // cannot be told from a value's trailing zero bytes) and general.alignment.
    std::uint64_t n_tensors_meta = 0, n_kv = 0;
    std::memcpy(&n_tensors_meta, m.data() + 8, 8);
    std::memcpy(&n_kv, m.data() + 16, 8);
    if (n_tensors_meta != 0) throw invalid_argument("gguf_stream_writer: the metadata builder must hold no tensors");
    const std::size_t kv_end = walk_pairs(m, static_cast<std::size_t>(n_kv));

    std::string head("GGUF", 4);
    put(head, std::uint32_t{3});
    put(head, static_cast<std::uint64_t>(decls_.size()));
    put(head, n_kv);
    head.append(m, 24, kv_end - 24);
    std::uint64_t offset = 0;
    sizes_.reserve(decls_.size());
    std::unordered_set<std::string_view> names;  // a pairwise check took minutes at 100000 layers
    names.reserve(decls_.size());
    for (const auto& t : decls_) {
      const std::uint64_t bytes = tensor_bytes(t.type, t.dims, t.name);
      if (!names.insert(t.name).second)
        throw invalid_argument("gguf_stream_writer: tensor " + t.name + " declared twice");
      put(head, static_cast<std::uint64_t>(t.name.size()));
      head += t.name;
      put(head, static_cast<std::uint32_t>(t.dims.size()));
      for (auto d : t.dims) put(head, d);
      put(head, static_cast<std::uint32_t>(t.type));
      put(head, offset);
      sizes_.push_back(bytes);
      offset = padded(offset + bytes);
    }
    head.resize(padded(head.size()), '\0');

    part_ = path_;
    part_ += ".part";
    out_.open(part_, std::ios::binary | std::ios::trunc);
    if (!out_) throw file_error(part_.string(), "cannot open for writing");
    open_ = true;
    emit(head.data(), head.size());
  }
  gguf_stream_writer(const gguf_stream_writer&) = delete;
  gguf_stream_writer& operator=(const gguf_stream_writer&) = delete;
  ~gguf_stream_writer() {
    if (open_) {  // not finished: an error is on its way; leave no partial file
      out_.close();
      std::error_code ec;
      std::filesystem::remove(part_, ec);
    }
  }

  const std::vector<gguf_tensor_decl>& tensors() const noexcept { return decls_; }
  /// The declaration of the tensor write_tensor() expects next.
  const gguf_tensor_decl& next() const { return decls_.at(written_); }
  /// Bytes of tensor `i` as declared.
  std::uint64_t size_of(std::size_t i) const { return sizes_.at(i); }
  std::size_t alignment() const noexcept { return alignment_; }

  /// The next tensor's bytes, exactly as many as its declaration implies.
  void write_tensor(std::span<const std::byte> data) {
    if (written_ >= decls_.size())
      throw invalid_argument("gguf_stream_writer: all " + std::to_string(decls_.size()) + " tensors are written already");
    const auto& t = decls_[written_];
    if (data.size() != sizes_[written_])
      throw invalid_argument("gguf_stream_writer: tensor " + t.name + " needs " + std::to_string(sizes_[written_]) +
                             " bytes of " + std::string(name_of(t.type)) + ", got " + std::to_string(data.size()));
    emit(reinterpret_cast<const char*>(data.data()), data.size());
    const std::size_t pad = padded(data.size()) - data.size();
    static constexpr char zeros[64] = {};
    for (std::size_t left = pad; left;) {
      const std::size_t k = std::min(left, sizeof zeros);
      emit(zeros, k);
      left -= k;
    }
    ++written_;
  }

  /// Checks that every declared tensor was written and closes the file.
  void finish() {
    if (written_ != decls_.size())
      throw invalid_argument("gguf_stream_writer: " + std::to_string(written_) + " of " +
                             std::to_string(decls_.size()) + " tensors written; next is " + decls_[written_].name);
    out_.flush();
    if (!out_) throw file_error(part_.string(), "write failed (disk full?)");
    out_.close();
    if (out_.fail()) throw file_error(part_.string(), "close failed");
    std::error_code ec;
    std::filesystem::rename(part_, path_, ec);
    if (ec) throw file_error(path_.string(), "cannot rename " + part_.string() + " to it: " + ec.message());
    open_ = false;
  }

 private:
  template <class T>
  static void put(std::string& out, T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out.append(b, sizeof(T));
  }
  std::size_t padded(std::size_t n) const { return (n + alignment_ - 1) / alignment_ * alignment_; }

  void emit(const char* p, std::size_t n) {
    out_.write(p, static_cast<std::streamsize>(n));
    if (!out_) throw file_error(part_.string(), "write failed (disk full?)");
  }

  // Returns the offset just past the last pair; reads general.alignment on the way.
  std::size_t walk_pairs(const std::string& m, std::size_t n_kv) {
    std::size_t p = 24;
    auto u32 = [&](std::size_t at) { std::uint32_t v; std::memcpy(&v, m.data() + at, 4); return v; };
    auto u64 = [&](std::size_t at) { std::uint64_t v; std::memcpy(&v, m.data() + at, 8); return v; };
    auto skip_one = [&](gguf_type t, std::size_t at) -> std::size_t {
      if (t == gguf_type::string) return at + 8 + static_cast<std::size_t>(u64(at));
      return at + detail::fixed_size(t);
    };
    for (std::size_t i = 0; i < n_kv; ++i) {
      const auto klen = static_cast<std::size_t>(u64(p));
      const std::string_view key(m.data() + p + 8, klen);
      p += 8 + klen;
      const auto type = static_cast<gguf_type>(u32(p));
      p += 4;
      if (type == gguf_type::array) {
        const auto elem = static_cast<gguf_type>(u32(p));
        const auto count = u64(p + 4);
        p += 12;
        for (std::uint64_t k = 0; k < count; ++k) p = skip_one(elem, p);
      } else {
        if (key == "general.alignment" && detail::is_integer(type)) {
          std::uint64_t a = 0;
          std::memcpy(&a, m.data() + p, detail::fixed_size(type));  // little-endian: low bytes first
          alignment_ = static_cast<std::size_t>(a);                 // gguf_builder checked it
        }
        p = skip_one(type, p);
      }
    }
    return p;
  }

  std::filesystem::path path_;
  std::filesystem::path part_;  // path_ + ".part" while writing
  std::vector<gguf_tensor_decl> decls_;
  std::vector<std::uint64_t> sizes_;  // bytes of each declared tensor
  std::size_t alignment_ = 32;
  std::size_t written_ = 0;
  std::ofstream out_;
  bool open_ = false;  // the file exists and is not finished
};

}  // namespace kestrel::io
