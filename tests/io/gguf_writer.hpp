// tests/io/gguf_writer.hpp: builds GGUF bytes in memory for the reader tests.
//
// Deliberately low level: each call appends exactly the bytes named, so a test
// can also write malformed files (wrong counts, bad types, odd offsets).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace kestrel::test {

class gguf_writer {
 public:
  std::string bytes;

  template <class T>
  gguf_writer& raw(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    bytes.append(b, sizeof(T));
    return *this;
  }
  gguf_writer& u32(std::uint32_t v) { return raw(v); }
  gguf_writer& u64(std::uint64_t v) { return raw(v); }
  gguf_writer& str(std::string_view s) {
    u64(s.size());
    bytes.append(s);
    return *this;
  }
  /// Magic, version, tensor count, kv count.
  gguf_writer& header(std::uint32_t version, std::uint64_t n_tensors, std::uint64_t n_kv) {
    bytes.append("GGUF");
    return u32(version).u64(n_tensors).u64(n_kv);
  }
  /// Key and value type; the caller appends the value.
  gguf_writer& key(std::string_view k, std::uint32_t type) { return str(k).u32(type); }
  template <class T>
  gguf_writer& kv(std::string_view k, std::uint32_t type, T v) {
    return key(k, type).raw(v);
  }
  gguf_writer& kv_str(std::string_view k, std::string_view v) { return key(k, 8).str(v); }
  template <class T>
  gguf_writer& kv_array(std::string_view k, std::uint32_t elem_type, const std::vector<T>& v) {
    key(k, 9).u32(elem_type).u64(v.size());
    for (const auto& x : v) raw(x);
    return *this;
  }
  gguf_writer& kv_str_array(std::string_view k, const std::vector<std::string>& v) {
    key(k, 9).u32(8).u64(v.size());
    for (const auto& s : v) str(s);
    return *this;
  }
  gguf_writer& tensor_info(std::string_view name, const std::vector<std::uint64_t>& dims, std::uint32_t type,
                           std::uint64_t offset) {
    str(name).u32(static_cast<std::uint32_t>(dims.size()));
    for (auto d : dims) u64(d);
    return u32(type).u64(offset);
  }
  gguf_writer& pad(std::size_t alignment) {
    while (bytes.size() % alignment) bytes.push_back('\0');
    return *this;
  }
  gguf_writer& zeros(std::size_t n) {
    bytes.append(n, '\0');
    return *this;
  }
};

}  // namespace kestrel::test
