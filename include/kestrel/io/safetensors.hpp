// kestrel/io/safetensors.hpp: a validating reader for .safetensors files.
//
// Layout, after the format's public description (huggingface/safetensors README):
//   u64 N (little-endian), then N bytes of UTF-8 JSON (may end in spaces),
//   then the data buffer. The JSON is one object:
//     "__metadata__": { string: string, ... }              (optional)
//     "<tensor name>": { "dtype": "F32", "shape": [d0, d1, ...],
//                        "data_offsets": [begin, end] }     (per tensor)
//   offsets are relative to the start of the data buffer, shapes are
//   outermost first and the data row-major, little-endian. The tensors cover
//   the buffer exactly: no overlaps, no gaps, nothing after the last one.
//
// The file is mmapped; tensors are views into the map (zero copy). The map is
// held by a shared_ptr that every tensor_ref shares, so views outlive this
// object. Every error is a kestrel::file_error "PATH: offset N: what", N being
// the file offset of the offending header value.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/core/mmap.hpp"
#include "kestrel/io/json.hpp"
#include "kestrel/io/tensor_ref.hpp"

namespace kestrel::io {

/// The element type named by a safetensors dtype string, or nullopt.
inline std::optional<element_type> parse_safetensors_dtype(std::string_view s) noexcept {
  static constexpr element_type all[] = {
      element_type::bool_, element_type::u8, element_type::i8, element_type::f8_e4m3, element_type::f8_e5m2,
      element_type::i16, element_type::u16, element_type::f16, element_type::bf16, element_type::i32,
      element_type::u32, element_type::f32, element_type::i64, element_type::u64, element_type::f64};
  for (auto t : all)
    if (name_of(t) == s) return t;
  return std::nullopt;
}

class safetensors_file {
 public:
  /// Headers above this size are rejected before they are parsed (the
  /// reference implementation has the same limit): a corrupt length cannot
  /// make us parse a gigabyte of tensor data as JSON.
  static constexpr std::uint64_t max_header_bytes = 100'000'000;

  /// Maps and validates the whole file. Throws kestrel::file_error on any bad input.
  explicit safetensors_file(const std::filesystem::path& path)
      : file_(std::make_shared<const mapped_file>(path)) {
    parse();
  }

  const std::string& path() const noexcept { return file_->path(); }
  /// File offset of the data buffer (8 + header length).
  std::uint64_t data_offset() const noexcept { return data_offset_; }

  /// "__metadata__", in file order (empty when absent).
  const std::vector<std::pair<std::string, std::string>>& metadata() const noexcept { return metadata_; }
  /// One metadata value, or nullopt.
  std::optional<std::string_view> metadata(std::string_view key) const {
    for (const auto& [k, v] : metadata_)
      if (k == key) return std::string_view(v);
    return std::nullopt;
  }

  /// All tensors, in header order, whatever their element type.
  const std::vector<stored_tensor>& tensors() const noexcept { return tensors_; }
  /// nullptr if there is no tensor `name`.
  const stored_tensor* find(std::string_view name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second];
  }
  /// Throws file_error "missing tensor NAME".
  const stored_tensor& info(std::string_view name) const {
    if (const auto* t = find(name)) return *t;
    throw file_error(path(), "missing tensor '" + std::string(name) + "'");
  }
  /// A view with a kernel dtype; throws if `name` is missing or its element
  /// type has no kernel dtype (naming the tensor and the type).
  tensor_ref tensor(std::string_view name) const { return detail::make_tensor_ref(info(name), file_, path()); }

  const mapped_file& file() const noexcept { return *file_; }
  /// The mapping, shared: holding it keeps every tensor's data valid.
  std::shared_ptr<const mapped_file> shared_file() const noexcept { return file_; }

 private:
  [[noreturn]] void fail(std::uint64_t at, const std::string& what) const { throw file_error(path(), at, what); }

  void parse();
  void parse_metadata(const json_value& v);
  void parse_tensor(const std::string& name, const json_value& v, std::uint64_t buffer_size,
                    std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges);
  /// A non-negative integer JSON number, exactly (the text, not the double).
  std::uint64_t to_u64(const json_value& v, const std::string& what) const;
  std::uint64_t at(const json_value& v) const noexcept { return 8 + v.offset(); }

  std::shared_ptr<const mapped_file> file_;
  std::uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, std::string>> metadata_;
  std::vector<stored_tensor> tensors_;                        // header order
  std::map<std::string, std::size_t, std::less<>> index_;    // name -> tensors_ index
};

inline std::uint64_t safetensors_file::to_u64(const json_value& v, const std::string& what) const {
  if (!v.is_number())
    fail(at(v), what + " is " + json_value::name_of(v.type()) + ", expected a non-negative integer");
  const std::string& s = v.as_string();  // the number's source text
  std::uint64_t out = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  if (r.ec == std::errc::result_out_of_range) fail(at(v), what + " " + s + " does not fit in 64 bits");
  if (r.ec != std::errc() || r.ptr != s.data() + s.size())
    fail(at(v), what + " is " + s + ", expected a non-negative integer");
  return out;
}

inline void safetensors_file::parse() {
  const std::uint64_t size = file_->size();
  if (size < 8)
    fail(0, "truncated: a safetensors file starts with an 8-byte header length, the file has " +
                std::to_string(size) + " bytes");
  std::uint64_t n = 0;
  std::memcpy(&n, file_->data(), 8);  // little-endian host assumed, as in core/mmap.hpp
  if (n > size - 8)
    fail(0, "header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(size - 8) +
                " bytes follow the length): truncated or not a safetensors file");
  if (n > max_header_bytes)
    fail(0, "header length " + std::to_string(n) + " exceeds the limit of " + std::to_string(max_header_bytes) +
                " bytes");
  if (n < 2 || static_cast<char>(file_->data()[8]) != '{')
    fail(8, "the JSON header (" + std::to_string(n) + " bytes) does not start with '{': not a safetensors file");
  data_offset_ = 8 + n;
  const std::uint64_t buffer_size = size - data_offset_;

  const std::string_view text(reinterpret_cast<const char*>(file_->data()) + 8, static_cast<std::size_t>(n));
  json_value header;
  try {
    header = parse_json(text, path());
  } catch (const file_error& e) {
    // The JSON parser counts offsets from the start of the header: report file offsets.
    std::string what = e.what();
    const std::string prefix = path() + ": offset " + std::to_string(e.offset()) + ": ";
    if (e.offset() != file_error::no_offset && what.compare(0, prefix.size(), prefix) == 0) {
      what.erase(0, prefix.size());
      fail(8 + e.offset(), "in the header: " + what);
    }
    throw;
  }
  if (!header.is_object()) fail(8, std::string("the header is ") + json_value::name_of(header.type()) + ", expected an object");

  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;  // [begin, end) per tensor, tensors_ order
  tensors_.reserve(header.size());
  bool seen_metadata = false;
  for (const auto& [key, value] : header.as_object()) {
    if (key == "__metadata__") {
      if (seen_metadata) fail(at(value), "duplicate \"__metadata__\"");
      seen_metadata = true;
      parse_metadata(value);
      continue;
    }
    if (index_.count(key))
      fail(at(value), "duplicate tensor name '" + key + "' (first at offset " +
                          std::to_string(tensors_[index_.find(key)->second].file_offset) + ")");
    parse_tensor(key, value, buffer_size, ranges);
  }

  // The tensors must tile the buffer: sorted by offset, each begins where the
  // previous one ended, and the last one ends at the end of the file.
  std::vector<std::size_t> order(tensors_.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return ranges[a] < ranges[b]; });
  std::uint64_t end = 0;
  const stored_tensor* prev = nullptr;
  auto span_text = [](std::pair<std::uint64_t, std::uint64_t> r) {
    return "[" + std::to_string(r.first) + ", " + std::to_string(r.second) + ")";
  };
  for (std::size_t i : order) {
    const auto& t = tensors_[i];
    const auto r = ranges[i];
    if (r.first < end)
      fail(t.file_offset, "tensor '" + t.name + "' bytes " + span_text(r) + " overlap tensor '" + prev->name +
                              "' (which ends at " + std::to_string(end) + ")");
    if (r.first > end)
      fail(t.file_offset, "data buffer bytes [" + std::to_string(end) + ", " + std::to_string(r.first) +
                              ") belong to no tensor (gap before tensor '" + t.name + "')");
    end = r.second;
    prev = &t;
  }
  if (end != buffer_size)
    fail(data_offset_ + end, "the data buffer has " + std::to_string(buffer_size - end) +
                                 " bytes after the last tensor (tensors cover " + std::to_string(end) + " of " +
                                 std::to_string(buffer_size) + " bytes)");
}

inline void safetensors_file::parse_metadata(const json_value& v) {
  if (!v.is_object())
    fail(at(v), std::string("\"__metadata__\" is ") + json_value::name_of(v.type()) + ", expected an object of strings");
  for (const auto& [k, val] : v.as_object()) {
    if (!val.is_string())
      fail(at(val), "\"__metadata__\" value of '" + k + "' is " + json_value::name_of(val.type()) +
                        ", expected a string");
    for (const auto& [k2, _] : metadata_)
      if (k2 == k) fail(at(val), "duplicate \"__metadata__\" key '" + k + "'");
    metadata_.emplace_back(k, val.as_string());
  }
}

inline void safetensors_file::parse_tensor(const std::string& name, const json_value& v, std::uint64_t buffer_size,
                                           std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges) {
  const std::string who = "tensor '" + name + "'";
  if (!v.is_object()) fail(at(v), who + " is " + json_value::name_of(v.type()) + ", expected an object");
  const json_value *dtype_v = nullptr, *shape_v = nullptr, *offsets_v = nullptr;
  for (const auto& [k, val] : v.as_object()) {
    const json_value** slot = k == "dtype" ? &dtype_v : k == "shape" ? &shape_v : k == "data_offsets" ? &offsets_v : nullptr;
    if (!slot) fail(at(val), who + " has unknown field \"" + k + "\" (expected dtype, shape, data_offsets)");
    if (*slot) fail(at(val), who + " has field \"" + k + "\" twice");
    *slot = &val;
  }
  if (!dtype_v || !shape_v || !offsets_v)
    fail(at(v), who + " lacks field \"" + std::string(!dtype_v ? "dtype" : !shape_v ? "shape" : "data_offsets") + "\"");

  stored_tensor t;
  t.name = name;
  t.file_offset = at(v);
  if (!dtype_v->is_string())
    fail(at(*dtype_v), who + " dtype is " + json_value::name_of(dtype_v->type()) + ", expected a string");
  const auto et = parse_safetensors_dtype(dtype_v->as_string());
  if (!et)
    fail(at(*dtype_v), who + " has unknown dtype \"" + dtype_v->as_string() +
                           "\" (known: BOOL, U8, I8, F8_E4M3, F8_E5M2, I16, U16, F16, BF16, I32, U32, F32, I64, U64, F64)");
  t.element = *et;

  if (!shape_v->is_array())
    fail(at(*shape_v), who + " shape is " + json_value::name_of(shape_v->type()) + ", expected an array");
  // The element count, saturating; a zero dimension makes it 0 whatever the others are.
  constexpr auto u64_max = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t n_elements = 1;
  bool overflow = false, empty = false;
  for (std::size_t d = 0; d < shape_v->size(); ++d) {
    const auto& dv = shape_v->as_array()[d];
    const auto dim = to_u64(dv, who + " dimension " + std::to_string(d));
    if (dim > std::numeric_limits<std::size_t>::max()) fail(at(dv), who + " dimension " + std::to_string(d) + " is too large");
    if (dim == 0) empty = true;
    else if (n_elements > u64_max / dim) overflow = true;
    else n_elements *= dim;
    t.shape.push_back(static_cast<std::size_t>(dim));
  }
  if (empty) {
    overflow = false;
    n_elements = 0;
  }
  const std::uint64_t es = size_of(t.element);
  if (overflow || n_elements > u64_max / es)
    fail(at(*shape_v), who + " shape " + detail::shape_string(t.shape) + " has more bytes than 2^64");
  const std::uint64_t want = n_elements * es;

  if (!offsets_v->is_array() || offsets_v->size() != 2)
    fail(at(*offsets_v), who + " data_offsets must be an array [begin, end]");
  const auto begin = to_u64(offsets_v->as_array()[0], who + " data_offsets begin");
  const auto end = to_u64(offsets_v->as_array()[1], who + " data_offsets end");
  if (end < begin)
    fail(at(*offsets_v), who + " data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                             "] end before they begin");
  if (end > buffer_size)
    fail(at(*offsets_v), who + " data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                             "] run past the end of the data buffer (" + std::to_string(buffer_size) +
                             " bytes): truncated file?");
  if (end - begin != want)
    fail(at(*offsets_v), who + " data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] hold " +
                             std::to_string(end - begin) + " bytes, but shape " + detail::shape_string(t.shape) +
                             " of " + std::string(name_of(t.element)) + " needs " + std::to_string(want));
  t.data = file_->data() + data_offset_ + begin;
  t.nbytes = static_cast<std::size_t>(want);  // <= the file size

  index_.emplace(name, tensors_.size());
  tensors_.push_back(std::move(t));
  ranges.emplace_back(begin, end);
}

}  // namespace kestrel::io
