// kestrel/io/gguf_write.hpp: writing GGUF v3 files.
//
//   io::gguf_builder b;                       // alignment 32 (general.alignment if set)
//   b.set("general.architecture", std::string("llama"));
//   b.set("llama.block_count", std::uint32_t{5});
//   b.set_array("tokenizer.ggml.scores", scores);   // std::vector<float>
//   b.add_tensor("token_embd.weight", {64, 512}, io::ggml_type::f32, bytes);
//   b.write("out.gguf");
//
// Keys keep the order they were first set in; tensors keep theirs, and their
// data is laid out in that order, each at a multiple of the alignment.
// Reading back what was written gives the same metadata and the same bytes.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/io/gguf.hpp"

namespace kestrel::io {

class gguf_builder {
 public:
  explicit gguf_builder(std::size_t alignment = 32) : alignment_(alignment) { check_alignment(alignment); }

  /// Scalars: std::uint8_t .. std::int64_t, float, double, bool, std::string.
  template <class T>
  void set(std::string_view key, const T& value) {
    std::string v;
    put(v, static_cast<std::uint32_t>(type_for<T>()));
    put_value(v, value);
    store(key, std::move(v));
    if (key == "general.alignment") {
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        check_alignment(static_cast<std::size_t>(value));
        alignment_ = static_cast<std::size_t>(value);
      } else {
        throw invalid_argument("gguf_builder: general.alignment must be an integer");
      }
    }
  }

  /// Arrays of one element type (any of the scalar types).
  template <class T>
  void set_array(std::string_view key, std::span<const T> values) {
    set_range<T>(key, values);
  }
  template <class T>
  void set_array(std::string_view key, const std::vector<T>& values) {
    set_range<T>(key, values);  // std::vector<bool> has no span
  }

  /// Copies key `key` of `f`, whatever its type, as it is.
  void copy_kv(const gguf_file& f, std::string_view key) {
    switch (f.type_of(key)) {
      case gguf_type::uint8: return set(key, f.get<std::uint8_t>(key));
      case gguf_type::int8: return set(key, f.get<std::int8_t>(key));
      case gguf_type::uint16: return set(key, f.get<std::uint16_t>(key));
      case gguf_type::int16: return set(key, f.get<std::int16_t>(key));
      case gguf_type::uint32: return set(key, f.get<std::uint32_t>(key));
      case gguf_type::int32: return set(key, f.get<std::int32_t>(key));
      case gguf_type::uint64: return set(key, f.get<std::uint64_t>(key));
      case gguf_type::int64: return set(key, f.get<std::int64_t>(key));
      case gguf_type::float32: return set(key, f.get<float>(key));
      case gguf_type::float64: return set(key, f.get<double>(key));
      case gguf_type::bool_: return set(key, f.get<bool>(key));
      case gguf_type::string: return set(key, f.get<std::string>(key));
      case gguf_type::array: break;
    }
    switch (f.array_type_of(key)) {
      case gguf_type::uint8: return set_array(key, f.get_array<std::uint8_t>(key));
      case gguf_type::int8: return set_array(key, f.get_array<std::int8_t>(key));
      case gguf_type::uint16: return set_array(key, f.get_array<std::uint16_t>(key));
      case gguf_type::int16: return set_array(key, f.get_array<std::int16_t>(key));
      case gguf_type::uint32: return set_array(key, f.get_array<std::uint32_t>(key));
      case gguf_type::int32: return set_array(key, f.get_array<std::int32_t>(key));
      case gguf_type::uint64: return set_array(key, f.get_array<std::uint64_t>(key));
      case gguf_type::int64: return set_array(key, f.get_array<std::int64_t>(key));
      case gguf_type::float32: return set_array(key, f.get_array<float>(key));
      case gguf_type::float64: return set_array(key, f.get_array<double>(key));
      case gguf_type::bool_: return set_array(key, f.get_array<bool>(key));
      case gguf_type::string: return set_array(key, f.get_array<std::string>(key));
      case gguf_type::array: break;
    }
    throw file_error(f.path(), "key " + std::string(key) + ": nested arrays cannot be copied");
  }

  /// A tensor: `dims` in ggml order (dims[0] contiguous); `data` must hold
  /// exactly the bytes the type and dims imply. The bytes are copied.
  void add_tensor(std::string name, std::vector<std::uint64_t> dims, ggml_type type, std::span<const std::byte> data) {
    if (dims.empty() || dims.size() > 4)
      throw invalid_argument("gguf_builder: tensor " + name + " has " + std::to_string(dims.size()) + " dimensions (1..4)");
    if (!is_known(type)) throw invalid_argument("gguf_builder: tensor " + name + " has an unknown type");
    const std::uint64_t bs = block_size_of(type);
    if (dims[0] % bs)
      throw invalid_argument("gguf_builder: tensor " + name + ": a row of " + std::to_string(dims[0]) +
                             " values is not a whole number of " + std::string(name_of(type)) + " blocks");
    std::uint64_t n = 1;
    for (auto d : dims) n *= d;
    const std::uint64_t bytes = n / bs * type_size_of(type);
    if (bytes != data.size())
      throw invalid_argument("gguf_builder: tensor " + name + " needs " + std::to_string(bytes) + " bytes of " +
                             std::string(name_of(type)) + ", got " + std::to_string(data.size()));
    for (const auto& t : tensors_)
      if (t.name == name) throw invalid_argument("gguf_builder: tensor " + name + " added twice");
    tensors_.push_back({std::move(name), std::move(dims), type, std::vector<std::byte>(data.begin(), data.end())});
  }

  /// The whole file as bytes.
  std::string bytes() const {
    std::string out("GGUF", 4);
    put(out, std::uint32_t{3});
    put(out, static_cast<std::uint64_t>(tensors_.size()));
    put(out, static_cast<std::uint64_t>(kv_.size()));
    for (const auto& [k, v] : kv_) {
      put_string(out, k);
      out += v;
    }
    std::uint64_t offset = 0;
    for (const auto& t : tensors_) {
      put_string(out, t.name);
      put(out, static_cast<std::uint32_t>(t.dims.size()));
      for (auto d : t.dims) put(out, d);
      put(out, static_cast<std::uint32_t>(t.type));
      put(out, offset);
      offset = padded(offset + t.data.size());
    }
    out.resize(padded(out.size()), '\0');
    for (const auto& t : tensors_) {
      out.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
      out.resize(padded(out.size()), '\0');
    }
    return out;
  }

  void write(const std::filesystem::path& path) const {
    const std::string b = bytes();
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) throw file_error(path.string(), "cannot open for writing");
    f.write(b.data(), static_cast<std::streamsize>(b.size()));
    if (!f) throw file_error(path.string(), "write failed");
  }

 private:
  struct tensor {
    std::string name;
    std::vector<std::uint64_t> dims;
    ggml_type type;
    std::vector<std::byte> data;
  };

  static void check_alignment(std::size_t a) {
    if (a < 8 || a > (std::size_t{1} << 30) || (a & (a - 1)) || a % 8)
      throw invalid_argument("gguf_builder: alignment " + std::to_string(a) + " is not a power of two from 8 to 2^30");
  }
  std::size_t padded(std::size_t n) const { return (n + alignment_ - 1) / alignment_ * alignment_; }

  template <class T>
  static constexpr gguf_type type_for() {
    if constexpr (std::is_same_v<T, bool>) return gguf_type::bool_;
    else if constexpr (std::is_same_v<T, std::uint8_t>) return gguf_type::uint8;
    else if constexpr (std::is_same_v<T, std::int8_t>) return gguf_type::int8;
    else if constexpr (std::is_same_v<T, std::uint16_t>) return gguf_type::uint16;
    else if constexpr (std::is_same_v<T, std::int16_t>) return gguf_type::int16;
    else if constexpr (std::is_same_v<T, std::uint32_t>) return gguf_type::uint32;
    else if constexpr (std::is_same_v<T, std::int32_t>) return gguf_type::int32;
    else if constexpr (std::is_same_v<T, std::uint64_t>) return gguf_type::uint64;
    else if constexpr (std::is_same_v<T, std::int64_t>) return gguf_type::int64;
    else if constexpr (std::is_same_v<T, float>) return gguf_type::float32;
    else if constexpr (std::is_same_v<T, double>) return gguf_type::float64;
    else if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, std::string_view>) return gguf_type::string;
    else static_assert(sizeof(T) == 0, "gguf_builder: no GGUF value type for this C++ type");
  }
  template <class T>
  static void put(std::string& out, T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out.append(b, sizeof(T));
  }
  static void put_string(std::string& out, std::string_view s) {
    put(out, static_cast<std::uint64_t>(s.size()));
    out.append(s);
  }
  template <class T>
  static void put_value(std::string& out, const T& v) {
    if constexpr (std::is_same_v<T, bool>) put(out, static_cast<std::uint8_t>(v ? 1 : 0));
    else if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, std::string_view>) put_string(out, v);
    else put(out, v);
  }
  template <class T, class Range>
  void set_range(std::string_view key, const Range& values) {
    std::string v;
    put(v, static_cast<std::uint32_t>(gguf_type::array));
    put(v, static_cast<std::uint32_t>(type_for<T>()));
    put(v, static_cast<std::uint64_t>(values.size()));
    for (const auto& x : values) put_value(v, static_cast<T>(x));
    store(key, std::move(v));
  }
  void store(std::string_view key, std::string value) {
    for (auto& [k, v] : kv_)
      if (k == key) {
        v = std::move(value);
        return;
      }
    kv_.emplace_back(std::string(key), std::move(value));
  }

  std::size_t alignment_;
  std::vector<std::pair<std::string, std::string>> kv_;  // key, serialised type + value
  std::vector<tensor> tensors_;
};

}  // namespace kestrel::io
