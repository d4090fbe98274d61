// kestrel/tokenizer/sentencepiece_model.hpp: reading SentencePiece's
// tokenizer.model (the vocabulary of Hugging Face llama / mistral
// directories) into an spm_vocab.
//
// The file is a serialized protocol buffer, ModelProto, of which we read:
//   1  repeated SentencePiece pieces  { 1 string piece; 2 float score; 3 enum type }
//   2  TrainerSpec                     { 3 enum model_type (1 unigram, 2 BPE, 3 word, 4 char);
//                                        40 unk_id; 41 bos_id; 42 eos_id (int32, -1: none) }
//   3  NormalizerSpec                  { 3 bool add_dummy_prefix }
// and skip every other field by its wire type. The piece types are the same
// numbers as token_type:: (normal 1 ... byte 6). Only BPE models are
// accepted: kestrel's SentencePiece encoder is the BPE one.
//
// Wire format: each field is a varint key (field number << 3 | wire type);
// wire types 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32. Every
// length is checked against the bytes that remain.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include "kestrel/core/error.hpp"
#include "kestrel/core/mmap.hpp"
#include "kestrel/tokenizer/vocab.hpp"

namespace kestrel {

namespace detail {

class proto_reader {
 public:
  proto_reader(const std::byte* p, std::size_t n, std::size_t base, const std::string& path)
      : p_(p), n_(n), base_(base), path_(path) {}

  bool done() const noexcept { return at_ >= n_; }
  std::size_t offset() const noexcept { return base_ + at_; }

  std::uint64_t varint(const char* what) {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at_ >= n_) fail(std::string("truncated varint (") + what + ")");
      const auto b = static_cast<std::uint8_t>(p_[at_++]);
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    fail(std::string("varint longer than 10 bytes (") + what + ")");
  }

  /// The next field's number and wire type.
  void key(std::uint32_t& field, std::uint32_t& wire) {
    const std::uint64_t k = varint("field key");
    field = static_cast<std::uint32_t>(k >> 3);
    wire = static_cast<std::uint32_t>(k & 7);
    if (field == 0) fail("field number 0");
  }

  /// A length-delimited field's bytes, as a reader of its own.
  proto_reader sub(const char* what) {
    const std::uint64_t len = varint(what);
    if (len > n_ - at_) fail(std::string(what) + ": length " + std::to_string(len) + " runs past the end");
    proto_reader r(p_ + at_, static_cast<std::size_t>(len), base_ + at_, path_);
    at_ += static_cast<std::size_t>(len);
    return r;
  }

  std::string_view bytes(const char* what) {
    proto_reader r = sub(what);
    return {reinterpret_cast<const char*>(r.p_), r.n_};
  }

  float fixed32_float(const char* what) {
    if (n_ - at_ < 4) fail(std::string("truncated float (") + what + ")");
    float f;
    std::memcpy(&f, p_ + at_, 4);  // little-endian, as protobuf's fixed32
    at_ += 4;
    return f;
  }

  void skip(std::uint32_t wire) {
    switch (wire) {
      case 0: (void)varint("skipped field"); return;
      case 1: advance(8); return;
      case 2: (void)sub("skipped field"); return;
      case 5: advance(4); return;
      default: fail("unsupported wire type " + std::to_string(wire));
    }
  }

  [[noreturn]] void fail(const std::string& what) const { throw file_error(path_, offset(), what); }

 private:
  void advance(std::size_t k) {
    if (n_ - at_ < k) fail("truncated fixed-size field");
    at_ += k;
  }

  const std::byte* p_;
  std::size_t n_, at_ = 0, base_;
  const std::string& path_;
};

}  // namespace detail

/// Parses a tokenizer.model image; `path` names it in errors.
inline spm_vocab parse_sentencepiece_model(std::span<const std::byte> bytes, const std::string& path) {
  detail::proto_reader in(bytes.data(), bytes.size(), 0, path);
  spm_vocab v;
  int model_type = 1;  // SentencePiece's default: unigram
  std::int64_t unk = 0, bos = 1, eos = 2;
  bool add_dummy_prefix = true;
  while (!in.done()) {
    std::uint32_t field, wire;
    in.key(field, wire);
    if (field == 1 && wire == 2) {  // a piece
      auto p = in.sub("piece");
      std::string piece;
      float score = 0;
      std::int32_t type = token_type::normal;
      while (!p.done()) {
        std::uint32_t f, w;
        p.key(f, w);
        if (f == 1 && w == 2) piece = std::string(p.bytes("piece text"));
        else if (f == 2 && w == 5) score = p.fixed32_float("piece score");
        else if (f == 3 && w == 0) type = static_cast<std::int32_t>(p.varint("piece type"));
        else p.skip(w);
      }
      if (type < token_type::normal || type > token_type::byte)
        p.fail("piece " + std::to_string(v.pieces.size()) + " has type " + std::to_string(type) + ", expected 1..6");
      v.pieces.push_back(std::move(piece));
      v.scores.push_back(score);
      v.types.push_back(type);
    } else if (field == 2 && wire == 2) {  // trainer spec
      auto t = in.sub("trainer_spec");
      while (!t.done()) {
        std::uint32_t f, w;
        t.key(f, w);
        // int32 fields: negative values arrive as 10-byte varints of their two's complement.
        auto i32 = [&](const char* what) { return static_cast<std::int64_t>(static_cast<std::int32_t>(t.varint(what))); };
        if (f == 3 && w == 0) model_type = static_cast<int>(t.varint("model_type"));
        else if (f == 40 && w == 0) unk = i32("unk_id");
        else if (f == 41 && w == 0) bos = i32("bos_id");
        else if (f == 42 && w == 0) eos = i32("eos_id");
        else t.skip(w);
      }
    } else if (field == 3 && wire == 2) {  // normalizer spec
      auto ns = in.sub("normalizer_spec");
      while (!ns.done()) {
        std::uint32_t f, w;
        ns.key(f, w);
        if (f == 3 && w == 0) add_dummy_prefix = ns.varint("add_dummy_prefix") != 0;
        else ns.skip(w);
      }
    } else {
      in.skip(wire);
    }
  }
  if (v.pieces.empty()) throw file_error(path, "no pieces: not a SentencePiece model");
  if (model_type != 2)
    throw file_error(path, "SentencePiece model_type " + std::to_string(model_type) +
                               (model_type == 1 ? " (unigram)" : "") + " is not supported: kestrel encodes BPE models (type 2)");
  auto id = [&](std::int64_t x, const char* what) -> token_id {
    if (x < 0) return no_token;
    if (x >= static_cast<std::int64_t>(v.pieces.size()))
      throw file_error(path, std::string(what) + " " + std::to_string(x) + " is outside the vocabulary of " +
                                 std::to_string(v.pieces.size()));
    return static_cast<token_id>(x);
  };
  v.unk = id(unk, "unk_id");
  v.bos = id(bos, "bos_id");
  v.eos = id(eos, "eos_id");
  v.add_bos = v.bos != no_token;
  v.add_space_prefix = add_dummy_prefix;
  validate_from_file(v, path);
  return v;
}

inline spm_vocab load_sentencepiece_model(const std::filesystem::path& path) {
  const mapped_file file(path);
  return parse_sentencepiece_model(file.bytes(), file.path());
}

}  // namespace kestrel
