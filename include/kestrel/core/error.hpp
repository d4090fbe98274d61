// kestrel/core/error.hpp: the one exception family the library throws.
//
// Every message names what was wrong and where: the file, the byte offset or
// tensor, and what was expected. Callers catch `kestrel::error` (or its
// std::runtime_error base) and print `what()`.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kestrel {

/// Base of all kestrel errors.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// An argument or parameter that cannot be honoured (negative temperature,
/// a prompt longer than the context, a dimension mismatch).
class invalid_argument : public error {
 public:
  using error::error;
};

/// Bad content in a file: truncated, corrupt, or of the wrong shape.
/// The message reads "PATH: offset N: WHAT" (offset omitted when unknown).
class file_error : public error {
 public:
  static constexpr std::uint64_t no_offset = ~std::uint64_t{0};

  file_error(std::string path, std::uint64_t offset, std::string_view what)
      : error(compose(path, offset, what)), path_(std::move(path)), offset_(offset) {}
  file_error(std::string path, std::string_view what) : file_error(std::move(path), no_offset, what) {}

  const std::string& path() const noexcept { return path_; }
  std::uint64_t offset() const noexcept { return offset_; }

 private:
  static std::string compose(const std::string& path, std::uint64_t offset, std::string_view what) {
    std::string m = path.empty() ? std::string("<memory>") : path;
    if (offset != no_offset) m += ": offset " + std::to_string(offset);
    m += ": ";
    m += what;
    return m;
  }
  std::string path_;
  std::uint64_t offset_;
};

/// Throws invalid_argument with `what` unless `cond` holds.
inline void require(bool cond, std::string_view what) {
  if (!cond) throw invalid_argument(std::string(what));
}

}  // namespace kestrel
