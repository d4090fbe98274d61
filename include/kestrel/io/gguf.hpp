// kestrel/io/gguf.hpp: a validating reader for GGUF files (versions 2 and 3).
//
// Layout (all little-endian), after the public spec (ggml docs/gguf.md):
//   "GGUF" u32 version, u64 n_tensors, u64 n_kv
//   n_kv x   { string key, u32 value_type, value }
//   n_tensors x { string name, u32 n_dims, u64 dims[n_dims], u32 ggml_type, u64 offset }
//   padding to `general.alignment` (default 32), then the tensor data section;
//   each tensor's offset is relative to the start of that section.
// A string is u64 length + bytes; an array is u32 element type + u64 count + elements.
//
// The file is mmapped and parsed once. Metadata values are not decoded into
// heap objects at load time: each key remembers where its value sits in the
// map, and `get`/`get_array` decode on demand. That keeps opening a file with a
// 100k-string vocabulary to one validating pass over the bytes.
//
// Every count read from the file is checked against the bytes that remain
// before anything is reserved, so a corrupt count cannot make us allocate
// gigabytes or loop for long; every error is a kestrel::file_error naming the
// file, the byte offset and what was expected.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/core/mmap.hpp"

namespace kestrel::io {

/// Metadata value types (gguf_metadata_value_type in the spec).
enum class gguf_type : std::uint32_t {
  uint8 = 0, int8 = 1, uint16 = 2, int16 = 3, uint32 = 4, int32 = 5, float32 = 6,
  bool_ = 7, string = 8, array = 9, uint64 = 10, int64 = 11, float64 = 12
};

/// Tensor element types (ggml_type). Gaps are numbers ggml retired (4, 5:
/// Q4_2/Q4_3; 31-33 and 36-38: repacked layouts that are never stored in files).
enum class ggml_type : std::uint32_t {
  f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8, q8_1 = 9,
  q2_k = 10, q3_k = 11, q4_k = 12, q5_k = 13, q6_k = 14, q8_k = 15,
  iq2_xxs = 16, iq2_xs = 17, iq3_xxs = 18, iq1_s = 19, iq4_nl = 20, iq3_s = 21, iq2_s = 22, iq4_xs = 23,
  i8 = 24, i16 = 25, i32 = 26, i64 = 27, f64 = 28, iq1_m = 29, bf16 = 30,
  tq1_0 = 34, tq2_0 = 35, mxfp4 = 39
};

namespace detail {

/// Storage facts of one ggml type: `block_size` elements take `type_size`
/// bytes. block_size 0 marks a number that is not a known type.
struct ggml_traits {
  std::uint32_t block_size = 0;
  std::uint32_t type_size = 0;
  std::string_view name{};
};

// Sizes follow the block structs of ggml (QK_K = 256 for the k-quants and
// iq types, 32 for the legacy quants); the comments give the byte breakdown.
constexpr ggml_traits traits_of(ggml_type t) noexcept {
  switch (t) {
    case ggml_type::f32: return {1, 4, "F32"};
    case ggml_type::f16: return {1, 2, "F16"};
    case ggml_type::q4_0: return {32, 18, "Q4_0"};     // f16 d + 16 nibble bytes
    case ggml_type::q4_1: return {32, 20, "Q4_1"};     // f16 d, m + 16
    case ggml_type::q5_0: return {32, 22, "Q5_0"};     // f16 d + 4 high bits + 16
    case ggml_type::q5_1: return {32, 24, "Q5_1"};     // f16 d, m + 4 + 16
    case ggml_type::q8_0: return {32, 34, "Q8_0"};     // f16 d + 32
    case ggml_type::q8_1: return {32, 36, "Q8_1"};     // f16 d, s + 32
    case ggml_type::q2_k: return {256, 84, "Q2_K"};    // 16 scales + 64 + f16 d, dmin
    case ggml_type::q3_k: return {256, 110, "Q3_K"};   // 32 hmask + 64 + 12 scales + f16 d
    case ggml_type::q4_k: return {256, 144, "Q4_K"};   // f16 d, dmin + 12 scales + 128
    case ggml_type::q5_k: return {256, 176, "Q5_K"};   // f16 d, dmin + 12 + 32 qh + 128
    case ggml_type::q6_k: return {256, 210, "Q6_K"};   // 128 ql + 64 qh + 16 scales + f16 d
    case ggml_type::q8_k: return {256, 292, "Q8_K"};   // f32 d + 256 + 16 x i16 bsums
    case ggml_type::iq2_xxs: return {256, 66, "IQ2_XXS"};  // f16 d + 32 x u16
    case ggml_type::iq2_xs: return {256, 74, "IQ2_XS"};    // f16 d + 32 x u16 + 8 scales
    case ggml_type::iq3_xxs: return {256, 98, "IQ3_XXS"};  // f16 d + 96
    case ggml_type::iq1_s: return {256, 50, "IQ1_S"};      // f16 d + 32 + 8 x u16
    case ggml_type::iq4_nl: return {32, 18, "IQ4_NL"};     // f16 d + 16
    case ggml_type::iq3_s: return {256, 110, "IQ3_S"};     // f16 d + 64 + 8 qh + 32 signs + 4 scales
    case ggml_type::iq2_s: return {256, 82, "IQ2_S"};      // f16 d + 64 + 8 qh + 8 scales
    case ggml_type::iq4_xs: return {256, 136, "IQ4_XS"};   // f16 d + u16 scales_h + 4 + 128
    case ggml_type::i8: return {1, 1, "I8"};
    case ggml_type::i16: return {1, 2, "I16"};
    case ggml_type::i32: return {1, 4, "I32"};
    case ggml_type::i64: return {1, 8, "I64"};
    case ggml_type::f64: return {1, 8, "F64"};
    case ggml_type::iq1_m: return {256, 56, "IQ1_M"};      // 32 + 16 qh + 8 scales
    case ggml_type::bf16: return {1, 2, "BF16"};
    case ggml_type::tq1_0: return {256, 54, "TQ1_0"};      // 48 + 4 qh + f16 d
    case ggml_type::tq2_0: return {256, 66, "TQ2_0"};      // 64 + f16 d
    case ggml_type::mxfp4: return {32, 17, "MXFP4"};       // u8 shared exponent + 16
  }
  return {};
}

}  // namespace detail

/// True for the ggml type numbers this reader knows the storage size of.
constexpr bool is_known(ggml_type t) noexcept { return detail::traits_of(t).block_size != 0; }
/// Elements per block (1 for plain types, 32 or 256 for quantized ones); 0 if unknown.
constexpr std::uint32_t block_size_of(ggml_type t) noexcept { return detail::traits_of(t).block_size; }
/// Bytes per block; 0 if unknown.
constexpr std::uint32_t type_size_of(ggml_type t) noexcept { return detail::traits_of(t).type_size; }

/// "F32", "Q4_K", ...; "unknown" for a number this reader does not know (the
/// parser rejects such tensors, naming the number, so only direct callers
/// can see it).
constexpr std::string_view name_of(ggml_type t) noexcept {
  const auto n = detail::traits_of(t).name;
  return n.empty() ? std::string_view("unknown") : n;
}

/// "u8", "i32", "f32", "bool", "string", "array", ...; unknown: "type?".
constexpr std::string_view name_of(gguf_type t) noexcept {
  switch (t) {
    case gguf_type::uint8: return "u8";
    case gguf_type::int8: return "i8";
    case gguf_type::uint16: return "u16";
    case gguf_type::int16: return "i16";
    case gguf_type::uint32: return "u32";
    case gguf_type::int32: return "i32";
    case gguf_type::float32: return "f32";
    case gguf_type::bool_: return "bool";
    case gguf_type::string: return "string";
    case gguf_type::array: return "array";
    case gguf_type::uint64: return "u64";
    case gguf_type::int64: return "i64";
    case gguf_type::float64: return "f64";
  }
  return "type?";
}

struct gguf_tensor_info {
  std::string name;
  std::vector<std::uint64_t> dims;  // ggml order: dims[0] = ne0, the contiguous (input) dimension
  ggml_type type = ggml_type::f32;
  std::uint64_t offset = 0;         // absolute byte offset in the file
  std::uint64_t size_bytes = 0;     // from dims and the type's block size
  const std::byte* data = nullptr;  // into the mmap, aligned to the file's alignment (>= 8) up to the page size

  std::uint64_t n_elements() const noexcept {
    std::uint64_t n = 1;
    for (auto d : dims) n *= d;  // checked against overflow when the file was read
    return n;
  }
  std::span<const std::byte> bytes() const noexcept { return {data, static_cast<std::size_t>(size_bytes)}; }
};

namespace detail {

constexpr bool is_valid(gguf_type t) noexcept { return static_cast<std::uint32_t>(t) <= 12; }

constexpr bool is_integer(gguf_type t) noexcept {
  switch (t) {
    case gguf_type::uint8: case gguf_type::int8: case gguf_type::uint16: case gguf_type::int16:
    case gguf_type::uint32: case gguf_type::int32: case gguf_type::uint64: case gguf_type::int64:
      return true;
    default:
      return false;
  }
}

constexpr bool is_signed(gguf_type t) noexcept {
  return t == gguf_type::int8 || t == gguf_type::int16 || t == gguf_type::int32 || t == gguf_type::int64;
}

/// Bytes of one value of a fixed-size type; 0 for string and array.
constexpr std::size_t fixed_size(gguf_type t) noexcept {
  switch (t) {
    case gguf_type::uint8: case gguf_type::int8: case gguf_type::bool_: return 1;
    case gguf_type::uint16: case gguf_type::int16: return 2;
    case gguf_type::uint32: case gguf_type::int32: case gguf_type::float32: return 4;
    case gguf_type::uint64: case gguf_type::int64: case gguf_type::float64: return 8;
    default: return 0;
  }
}

/// The fewest bytes one value can take: what bounds a count read from the file.
constexpr std::size_t min_size(gguf_type t) noexcept {
  return t == gguf_type::string ? 8 : fixed_size(t);
}

template <class T>
T load(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof(T));  // little-endian host assumed, as in core/mmap.hpp
  return v;
}

/// A GGUF string at the reader's position: u64 length + bytes, viewing the
/// map. The length is checked against the bytes left before use; `ctx` names
/// the string (text or a callable, built only on failure).
template <class Ctx>
std::string_view read_string(byte_reader& c, Ctx&& ctx) {
  const std::size_t at = c.offset();
  const auto len = c.read<std::uint64_t>([&] { return "length of " + kestrel::detail::describe_read(ctx); });
  if (len > c.remaining())
    c.fail(at, "length " + std::to_string(len) + " of " + kestrel::detail::describe_read(ctx) + " exceeds the " +
                   std::to_string(c.remaining()) + " bytes left in the file");
  const auto bytes = c.take(static_cast<std::size_t>(len), "");  // checked above
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

template <class T> inline constexpr bool dependent_false = false;

template <class T>
std::string cpp_type_name() {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_integral_v<T>)
    return std::string(std::is_signed_v<T> ? "i" : "u") + std::to_string(8 * sizeof(T));
  else if constexpr (std::is_same_v<T, float>) return "float";
  else if constexpr (std::is_same_v<T, double>) return "double";
  else return "string";
}

/// What a value of type T may be read from, for error messages.
template <class T>
std::string accepted_types() {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_integral_v<T>) return "an integer type (u8..i64)";
  else if constexpr (std::is_floating_point_v<T>) return "f32 or f64";
  else return "string";
}

}  // namespace detail

class gguf_file {
 public:
  /// Maps and validates the whole file. Throws kestrel::file_error on any bad input.
  explicit gguf_file(const std::filesystem::path& path) : file_(path) { parse(); }

  const std::string& path() const noexcept { return file_.path(); }
  std::uint32_t version() const noexcept { return version_; }
  /// `general.alignment`, or 32 when absent.
  std::size_t alignment() const noexcept { return alignment_; }
  /// Absolute offset of the tensor data section (end of the tensor table,
  /// rounded up to the alignment). May exceed the file size when there are no tensors.
  std::uint64_t data_offset() const noexcept { return data_offset_; }

  bool has(std::string_view key) const { return index_.find(key) != index_.end(); }
  /// The value type of `key` (gguf_type::array for arrays). Throws if missing.
  gguf_type type_of(std::string_view key) const { return entry(key).type; }
  /// The element type of array `key`. Throws if missing or not an array.
  gguf_type array_type_of(std::string_view key) const { return array_entry(key).elem; }

  /// A scalar. Integers convert among integer types with a range check; float
  /// and double read f32 or f64; bool reads bool; std::string and
  /// std::string_view (a view into the map, valid while this object lives)
  /// read string. Missing key or wrong type -> file_error naming key and types.
  template <class T>
  T get(std::string_view key) const {
    return scalar<T>(entry(key));
  }
  /// nullopt if `key` is missing; an error if it is present with the wrong type.
  template <class T>
  std::optional<T> get_optional(std::string_view key) const {
    auto it = index_.find(key);
    if (it == index_.end()) return std::nullopt;
    return scalar<T>(entries_[it->second]);
  }
  /// An array, element by element converted as in get<T>. T is std::string,
  /// std::string_view (views into the map), float, double, bool or an integer type.
  template <class T>
  std::vector<T> get_array(std::string_view key) const;
  /// Number of elements of array `key`. Throws if missing or not an array.
  std::size_t array_size(std::string_view key) const { return static_cast<std::size_t>(array_entry(key).count); }
  /// All keys, in file order.
  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    out.reserve(entries_.size());
    for (const auto& e : entries_) out.emplace_back(e.key);
    return out;
  }

  /// All tensors, in file order.
  const std::vector<gguf_tensor_info>& tensors() const noexcept { return tensors_; }
  /// nullptr if there is no tensor `name`.
  const gguf_tensor_info* find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
  }
  /// Throws file_error "missing tensor NAME".
  const gguf_tensor_info& tensor(std::string_view name) const {
    if (const auto* t = find_tensor(name)) return *t;
    throw file_error(path(), "missing tensor " + std::string(name));
  }
  const mapped_file& file() const noexcept { return file_; }

 private:
  // One metadata pair. `key` views the map. For a scalar, `value` is the
  // offset of the value (of the u64 length for a string); for an array, of its
  // first element, with `elem` and `count` describing it.
  struct kv_entry {
    std::string_view key;
    gguf_type type;
    gguf_type elem;
    std::uint64_t count;
    std::size_t key_offset;
    std::size_t value;
  };

  [[noreturn]] void fail(std::uint64_t at, const std::string& what) const { throw file_error(path(), at, what); }

  const kv_entry& entry(std::string_view key) const {
    auto it = index_.find(key);
    if (it == index_.end()) throw file_error(path(), "missing key '" + std::string(key) + "'");
    return entries_[it->second];
  }
  const kv_entry& array_entry(std::string_view key) const {
    const auto& e = entry(key);
    if (e.type != gguf_type::array)
      fail(e.key_offset, "key '" + std::string(key) + "' holds a " + std::string(name_of(e.type)) +
                             ", expected an array");
    return e;
  }

  static std::string describe(const kv_entry& e) {
    if (e.type == gguf_type::array)
      return "an array of " + std::to_string(e.count) + " " + std::string(name_of(e.elem));
    return "a " + std::string(name_of(e.type));
  }

  std::string_view string_at(std::size_t off) const {
    const auto len = detail::load<std::uint64_t>(file_.data() + off);  // validated by parse()
    return {reinterpret_cast<const char*>(file_.data() + off + 8), static_cast<std::size_t>(len)};
  }

  // Decodes one value of type `t` at `off` into T, or throws naming `key`.
  // `index` is the array element number, or -1 for a scalar (for messages).
  template <class T>
  T convert(gguf_type t, std::size_t off, const kv_entry& e, std::int64_t index) const {
    const std::byte* p = file_.data() + off;
    auto mismatch = [&]() -> std::string {
      std::string where = "key '" + std::string(e.key) + "'";
      if (index >= 0) where += " element " + std::to_string(index);
      return where + " is a " + std::string(name_of(t)) + ", expected " + detail::accepted_types<T>() +
             " to read as " + detail::cpp_type_name<T>();
    };
    if constexpr (std::is_same_v<T, bool>) {
      if (t != gguf_type::bool_) fail(e.key_offset, mismatch());
      return detail::load<std::uint8_t>(p) != 0;
    } else if constexpr (std::is_integral_v<T>) {
      static_assert(!std::is_same_v<T, char> && !std::is_same_v<T, char8_t> && !std::is_same_v<T, char16_t> &&
                        !std::is_same_v<T, char32_t> && !std::is_same_v<T, wchar_t>,
                    "gguf_file: read integers as std::int8_t / std::uint8_t and so on, not as a character type");
      if (!detail::is_integer(t)) fail(e.key_offset, mismatch());
      auto out_of_range = [&](auto v) -> std::string {
        std::string where = "key '" + std::string(e.key) + "'";
        if (index >= 0) where += " element " + std::to_string(index);
        return where + " value " + std::to_string(v) + " (" + std::string(name_of(t)) + ") does not fit in " +
               detail::cpp_type_name<T>();
      };
      if (detail::is_signed(t)) {
        std::int64_t v = 0;
        switch (t) {
          case gguf_type::int8: v = detail::load<std::int8_t>(p); break;
          case gguf_type::int16: v = detail::load<std::int16_t>(p); break;
          case gguf_type::int32: v = detail::load<std::int32_t>(p); break;
          default: v = detail::load<std::int64_t>(p); break;
        }
        if (!std::in_range<T>(v)) fail(off, out_of_range(v));
        return static_cast<T>(v);
      } else {
        std::uint64_t v = 0;
        switch (t) {
          case gguf_type::uint8: v = detail::load<std::uint8_t>(p); break;
          case gguf_type::uint16: v = detail::load<std::uint16_t>(p); break;
          case gguf_type::uint32: v = detail::load<std::uint32_t>(p); break;
          default: v = detail::load<std::uint64_t>(p); break;
        }
        if (!std::in_range<T>(v)) fail(off, out_of_range(v));
        return static_cast<T>(v);
      }
    } else if constexpr (std::is_floating_point_v<T>) {
      if (t == gguf_type::float32) return static_cast<T>(detail::load<float>(p));
      if (t != gguf_type::float64) fail(e.key_offset, mismatch());
      const double v = detail::load<double>(p);
      if constexpr (sizeof(T) < sizeof(double)) {
        // A finite f64 beyond float's range would silently become infinity.
        if (std::isfinite(v) && std::fabs(v) > static_cast<double>(std::numeric_limits<T>::max()))
          fail(off, "key '" + std::string(e.key) + "' value " + std::to_string(v) + " does not fit in float");
      }
      return static_cast<T>(v);
    } else if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, std::string_view>) {
      if (t != gguf_type::string) fail(e.key_offset, mismatch());
      return T(string_at(off));
    } else {
      static_assert(detail::dependent_false<T>,
                    "gguf_file::get<T>: T must be bool, an integer, float, double, std::string or std::string_view");
    }
  }

  template <class T>
  T scalar(const kv_entry& e) const {
    if (e.type == gguf_type::array)
      fail(e.key_offset, "key '" + std::string(e.key) + "' is " + describe(e) + ", expected a single " +
                             detail::accepted_types<T>() + " value");
    return convert<T>(e.type, e.value, e, -1);
  }

  void parse();
  void parse_value(byte_reader& c, kv_entry& e);
  void parse_tensor(byte_reader& c, std::size_t i);
  void read_alignment();

  mapped_file file_;
  std::uint32_t version_ = 0;
  std::size_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::vector<kv_entry> entries_;                             // file order
  std::unordered_map<std::string_view, std::size_t> index_;   // key (viewing the map) -> entries_ index
  std::vector<gguf_tensor_info> tensors_;                     // file order
  std::vector<std::size_t> tensor_info_offsets_;              // where each tensor's info starts, for messages
  std::unordered_map<std::string_view, std::size_t> tensor_index_;  // name (viewing the map) -> tensors_ index
};

// ---------------------------------------------------------------------------
// Parsing

inline void gguf_file::parse() {
  byte_reader c(file_.bytes(), file_.path());

  // Magic: compare bytes, so the message can show what the file does start with.
  if (file_.size() < 4 || std::memcmp(file_.data(), "GGUF", 4) != 0) {
    std::string got;
    for (std::size_t i = 0; i < std::min<std::size_t>(4, file_.size()); ++i) {
      static constexpr char hex[] = "0123456789abcdef";
      const auto b = static_cast<unsigned>(file_.data()[i]);
      got += hex[b >> 4];
      got += hex[b & 15];
      got += ' ';
    }
    fail(0, "not a GGUF file: starts with bytes " + (got.empty() ? std::string("(none) ") : got) +
                "expected 47 47 55 46 (\"GGUF\")");
  }
  c.skip(4, [] { return "magic"; });

  const std::size_t version_at = c.offset();
  version_ = c.read<std::uint32_t>([] { return "version"; });
  if (version_ != 2 && version_ != 3) {
    const std::uint32_t swapped = __builtin_bswap32(version_);
    if (swapped >= 1 && swapped <= 3)
      fail(version_at, "GGUF version field reads " + std::to_string(version_) + ": a big-endian file (version " +
                           std::to_string(swapped) + "), which is not supported; expected a little-endian v2 or v3");
    if (version_ == 1)
      fail(version_at, "unsupported GGUF version 1 (32-bit counts, before Sept 2023); expected version 2 or 3");
    fail(version_at, "unsupported GGUF version " + std::to_string(version_) + "; expected version 2 or 3");
  }

  const std::size_t n_tensors_at = c.offset();
  const auto n_tensors = c.read<std::uint64_t>([] { return "tensor count"; });
  const std::size_t n_kv_at = c.offset();
  const auto n_kv = c.read<std::uint64_t>([] { return "metadata pair count"; });

  // Bound both counts by the bytes that follow before reserving anything: a
  // pair takes at least 13 bytes (key length, type, 1-byte value), a tensor
  // info at least 32 (name length, n_dims, one dim, type, offset).
  constexpr std::uint64_t min_kv = 8 + 4 + 1, min_tensor = 8 + 4 + 8 + 4 + 8;
  if (n_kv > c.remaining() / min_kv)
    fail(n_kv_at, std::to_string(n_kv) + " metadata pairs cannot fit in the " + std::to_string(c.remaining()) +
                      " bytes that follow (each needs at least " + std::to_string(min_kv) +
                      "): truncated or corrupt file");
  if (n_tensors > (c.remaining() - n_kv * min_kv) / min_tensor)
    fail(n_tensors_at, std::to_string(n_tensors) + " tensor infos cannot fit in the bytes that follow the " +
                           std::to_string(n_kv) + " metadata pairs (each needs at least " +
                           std::to_string(min_tensor) + "): truncated or corrupt file");

  entries_.reserve(static_cast<std::size_t>(n_kv));
  index_.reserve(static_cast<std::size_t>(n_kv));
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    kv_entry e{};
    e.key_offset = c.offset();
    e.key = detail::read_string(c, [&] { return "key of metadata pair #" + std::to_string(i); });
    const std::size_t type_at = c.offset();
    e.type = static_cast<gguf_type>(
        c.read<std::uint32_t>([&] { return "value type of key '" + std::string(e.key) + "'"; }));
    if (!detail::is_valid(e.type))
      fail(type_at, "key '" + std::string(e.key) + "' has unknown value type " +
                        std::to_string(static_cast<std::uint32_t>(e.type)) + ", expected 0..12");
    parse_value(c, e);
    auto [it, fresh] = index_.try_emplace(e.key, entries_.size());
    if (!fresh)
      fail(e.key_offset, "duplicate key '" + std::string(e.key) + "' (first at offset " +
                             std::to_string(entries_[it->second].key_offset) + ")");
    entries_.push_back(e);
  }

  read_alignment();

  tensors_.reserve(static_cast<std::size_t>(n_tensors));
  tensor_info_offsets_.reserve(static_cast<std::size_t>(n_tensors));
  tensor_index_.reserve(static_cast<std::size_t>(n_tensors));
  for (std::uint64_t i = 0; i < n_tensors; ++i) parse_tensor(c, static_cast<std::size_t>(i));

  // The data section starts at the end of the tensor table rounded up to the
  // alignment (no overflow: pos <= file size and alignment <= 2^30).
  data_offset_ = (c.offset() + alignment_ - 1) / alignment_ * alignment_;

  const std::uint64_t size = file_.size();
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    auto& t = tensors_[i];
    const std::uint64_t rel = t.offset;
    const bool past = rel > size || data_offset_ > size - rel || t.size_bytes > size - (data_offset_ + rel);
    if (past)
      fail(tensor_info_offsets_[i],
           "tensor '" + t.name + "' data (" + std::to_string(t.size_bytes) + " bytes at data section offset " +
               std::to_string(rel) + ", absolute " + std::to_string(data_offset_) + " + " + std::to_string(rel) +
               ") runs past the end of the file (" + std::to_string(size) + " bytes)");
    t.offset = data_offset_ + rel;
    t.data = file_.data() + t.offset;
  }
}

inline void gguf_file::parse_value(byte_reader& c, kv_entry& e) {
  auto key = [&] { return std::string(e.key); };
  e.elem = e.type;
  e.count = 1;
  if (e.type == gguf_type::array) {
    const std::size_t elem_at = c.offset();
    e.elem = static_cast<gguf_type>(c.read<std::uint32_t>([&] { return "element type of array '" + key() + "'"; }));
    if (e.elem == gguf_type::array)
      fail(elem_at, "array '" + key() + "' holds arrays; nested arrays are not supported");
    if (!detail::is_valid(e.elem))
      fail(elem_at, "array '" + key() + "' has unknown element type " +
                        std::to_string(static_cast<std::uint32_t>(e.elem)) + ", expected 0..8 or 10..12");
    const std::size_t count_at = c.offset();
    e.count = c.read<std::uint64_t>([&] { return "length of array '" + key() + "'"; });
    const std::size_t min = detail::min_size(e.elem);
    if (e.count > c.remaining() / min)
      fail(count_at, "array '" + key() + "' claims " + std::to_string(e.count) + " elements of type " +
                         std::string(name_of(e.elem)) + " (at least " + std::to_string(min) +
                         " bytes each), but only " + std::to_string(c.remaining()) + " bytes are left");
  }
  e.value = c.offset();

  if (e.elem == gguf_type::string) {
    for (std::uint64_t i = 0; i < e.count; ++i) {
      // Context strings are built only on failure; this loop runs once per vocabulary entry.
      detail::read_string(c, [&] {
        return e.type == gguf_type::array ? "element " + std::to_string(i) + " of array '" + key() + "'"
                                          : "string value of key '" + key() + "'";
      });
    }
    return;
  }
  const std::size_t bytes = static_cast<std::size_t>(e.count) * detail::fixed_size(e.elem);  // bounded above
  const std::size_t start = c.offset();
  c.skip(bytes, [&] { return "value of key '" + key() + "'"; });
  if (e.elem == gguf_type::bool_) {
    // The spec allows only 0 and 1; anything else means a corrupt file or a buggy writer.
    for (std::size_t i = 0; i < bytes; ++i) {
      const auto b = static_cast<std::uint8_t>(file_.data()[start + i]);
      if (b > 1)
        fail(start + i, "bool " + (e.type == gguf_type::array ? "element " + std::to_string(i) + " of array '"
                                                               : std::string("value of key '")) +
                            key() + "' is " + std::to_string(b) + ", expected 0 or 1");
    }
  }
}

inline void gguf_file::read_alignment() {
  auto it = index_.find(std::string_view("general.alignment"));
  if (it == index_.end()) return;
  const auto& e = entries_[it->second];
  // The spec says u32; any integer type is accepted, the value is what matters.
  if (e.type == gguf_type::array || !detail::is_integer(e.type))
    fail(e.key_offset, "general.alignment is " + describe(e) + ", expected a u32");
  const auto a = convert<std::uint64_t>(e.type, e.value, e, -1);
  // A power of two is what makes pointer alignment meaningful. The spec
  // requires a multiple of 8: with it (and offsets that are multiples of it,
  // checked in parse_tensor), every tensor's data pointer is aligned for its
  // f32/f16/f64 elements, which the kernels' scalar tails read directly.
  // 1 GiB is far above any real use and keeps the round-up arithmetic free
  // of overflow.
  if (a == 0 || (a & (a - 1)) != 0 || a > (std::uint64_t{1} << 30))
    fail(e.value, "general.alignment is " + std::to_string(a) + ", expected a power of two from 8 to 2^30");
  if (a % 8 != 0)
    fail(e.value, "general.alignment is " + std::to_string(a) +
                      ", expected a multiple of 8 (the GGUF spec requires it; tensor data would be misaligned)");
  alignment_ = static_cast<std::size_t>(a);
}

inline void gguf_file::parse_tensor(byte_reader& c, std::size_t i) {
  gguf_tensor_info t;
  const std::size_t info_at = c.offset();
  const auto name = detail::read_string(c, [&] { return "name of tensor #" + std::to_string(i); });
  auto who = [&] { return "tensor '" + std::string(name) + "'"; };

  const std::size_t n_dims_at = c.offset();
  const auto n_dims = c.read<std::uint32_t>([&] { return "n_dims of " + who(); });
  if (n_dims < 1 || n_dims > 4)
    fail(n_dims_at, who() + " has n_dims " + std::to_string(n_dims) + ", expected 1..4");

  t.dims.resize(n_dims);
  const std::size_t dims_at = c.offset();
  std::uint64_t n_elements = 1;
  for (std::uint32_t d = 0; d < n_dims; ++d) {
    const auto v = c.read<std::uint64_t>([&] { return "dimension " + std::to_string(d) + " of " + who(); });
    // ggml holds dims and the element count as int64.
    constexpr auto max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    if (v > max) fail(dims_at + 8 * d, who() + " dimension " + std::to_string(d) + " is " + std::to_string(v) +
                                           ", expected at most 2^63-1");
    if (v != 0 && n_elements > max / v)
      fail(dims_at, who() + " has more than 2^63-1 elements (dims overflow)");
    n_elements *= v;
    t.dims[d] = v;
  }

  const std::size_t type_at = c.offset();
  t.type = static_cast<ggml_type>(c.read<std::uint32_t>([&] { return "type of " + who(); }));
  if (!is_known(t.type))
    fail(type_at, who() + " has unknown ggml type " + std::to_string(static_cast<std::uint32_t>(t.type)));
  const std::size_t offset_at = c.offset();
  t.offset = c.read<std::uint64_t>([&] { return "data offset of " + who(); });
  if (t.offset % alignment_ != 0)
    fail(offset_at, who() + " data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                        std::to_string(alignment_));

  // Rows are whole blocks: ne0 must divide into blocks of the type.
  const std::uint64_t bs = block_size_of(t.type), ts = type_size_of(t.type);
  if (t.dims[0] % bs != 0)
    fail(dims_at, who() + " has ne0 = " + std::to_string(t.dims[0]) + ", not a multiple of the " +
                      std::string(name_of(t.type)) + " block size " + std::to_string(bs));
  const std::uint64_t blocks = n_elements / bs;
  if (blocks != 0 && ts > std::numeric_limits<std::uint64_t>::max() / blocks)
    fail(dims_at, who() + " byte size overflows");
  t.size_bytes = blocks * ts;

  auto [it, fresh] = tensor_index_.try_emplace(name, tensors_.size());
  if (!fresh)
    fail(info_at, "duplicate tensor name '" + std::string(name) + "' (first at offset " +
                      std::to_string(tensor_info_offsets_[it->second]) + ")");
  t.name = std::string(name);
  tensors_.push_back(std::move(t));
  tensor_info_offsets_.push_back(info_at);
}

// ---------------------------------------------------------------------------
// Arrays

template <class T>
std::vector<T> gguf_file::get_array(std::string_view key) const {
  const auto& e = array_entry(key);
  const auto n = static_cast<std::size_t>(e.count);
  std::vector<T> out;
  out.reserve(n);  // bounded by the file size at parse time

  if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, std::string_view>) {
    if (e.elem != gguf_type::string)
      fail(e.key_offset, "key '" + std::string(key) + "' is " + describe(e) + ", expected an array of string");
    std::size_t off = e.value;
    for (std::size_t i = 0; i < n; ++i) {
      const auto s = string_at(off);
      out.emplace_back(s);
      off += 8 + s.size();
    }
  } else {
    const std::byte* p = file_.data() + e.value;
    // Same representation: one copy. float from f32 is the vocabulary-scores case.
    if constexpr (!std::is_same_v<T, bool>) {
      bool same = false;
      if constexpr (std::is_same_v<T, float>) same = e.elem == gguf_type::float32;
      else if constexpr (std::is_same_v<T, double>) same = e.elem == gguf_type::float64;
      else if constexpr (std::is_integral_v<T>)
        same = detail::is_integer(e.elem) && detail::fixed_size(e.elem) == sizeof(T) &&
               detail::is_signed(e.elem) == std::is_signed_v<T>;
      if (same) {
        out.resize(n);
        if (n) std::memcpy(out.data(), p, n * sizeof(T));
        return out;
      }
    }
    const std::size_t step = detail::fixed_size(e.elem);
    if (step == 0)  // an array of strings read as numbers
      fail(e.key_offset, "key '" + std::string(key) + "' is " + describe(e) + ", expected an array of " +
                             detail::accepted_types<T>());
    for (std::size_t i = 0; i < n; ++i)
      out.push_back(convert<T>(e.elem, e.value + i * step, e, static_cast<std::int64_t>(i)));
  }
  return out;
}

}  // namespace kestrel::io
