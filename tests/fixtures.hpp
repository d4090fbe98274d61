// tests/fixtures.hpp: locating the real third-party files of ../shared/fixtures,
// scratch files, and capturing error messages.
//
// The folder is $KESTREL_FIXTURES when set, else ../shared/fixtures beside the
// source tree. A missing fixture fails the test when CI=true and skips it with
// a message elsewhere:
//
//   auto path = kestrel::test::fixture("llama2c/stories260K.bin");
//   if (!path) return;  // skipped (outside CI)
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <unistd.h>

#include "kestrel/core/error.hpp"

namespace kestrel::test {

inline std::filesystem::path fixtures_dir() {
  if (const char* env = std::getenv("KESTREL_FIXTURES"); env && *env) return env;
#ifdef KESTREL_DEFAULT_FIXTURES
  return KESTREL_DEFAULT_FIXTURES;
#else
  return "../shared/fixtures";
#endif
}

inline bool in_ci() {
  const char* ci = std::getenv("CI");
  return ci && std::string_view(ci) == "true";
}

/// The path of fixture `rel`, or nullopt (after failing in CI / printing a
/// skip message elsewhere) when it does not exist.
inline std::optional<std::filesystem::path> fixture(std::string_view rel) {
  auto p = fixtures_dir() / rel;
  if (std::filesystem::exists(p)) return p;
  const std::string msg = "fixture not found: " + p.string() + " (set KESTREL_FIXTURES to the fixtures folder)";
  if (in_ci()) {
    FAIL(msg);
  } else {
    MESSAGE("SKIPPED: " << msg);
  }
  return std::nullopt;
}

/// The folder `rel` beside the test source `file` (pass __FILE__): data
/// committed with the tests. __FILE__ is absolute, or relative to the build
/// directory, which is two levels above the test binary (build/tests/).
inline std::filesystem::path source_data_dir(const char* file, std::string_view rel = "data") {
  namespace fs = std::filesystem;
  const auto p = fs::path(file).parent_path() / rel;
  if (p.is_absolute() || fs::exists(p)) return p;
  std::error_code ec;
  const auto exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && fs::exists(exe.parent_path().parent_path() / p)) return exe.parent_path().parent_path() / p;
  return p;
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// This process's scratch folder, $TMPDIR/kestrel-test-PID, removed with
/// everything in it when the process exits normally (a test binary wrote
/// up to 170 MB there per run, and left it behind), unless
/// KESTREL_KEEP_SCRATCH is set, to look at what a failing test wrote.
inline const std::filesystem::path& scratch_root() {
  struct root {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("kestrel-test-" + std::to_string(::getpid()));
    ~root() {
      const char* keep = std::getenv("KESTREL_KEEP_SCRATCH");
      std::error_code ec;  // nothing to report from an exiting process
      if (!(keep && *keep)) std::filesystem::remove_all(path, ec);
    }
  };
  static const root r;
  return r.path;
}

/// A scratch directory `name` for this process (scratch_root), e.g. for
/// truncated copies.
inline std::filesystem::path scratch_dir(std::string_view name) {
  auto d = scratch_root() / name;
  std::filesystem::create_directories(d);
  return d;
}

inline void write_file(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// Writes `bytes` to scratch_dir(dir) / name and returns that path.
inline std::filesystem::path write_scratch(std::string_view dir, std::string_view name, std::string_view bytes) {
  auto p = scratch_dir(dir) / name;
  write_file(p, bytes);
  return p;
}

/// Runs `f` and returns the message of the E it throws ("" if it throws
/// nothing; any other exception propagates).
template <class E = kestrel::error, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return {};
}

/// what() of the kestrel::invalid_argument that `f` throws ("" if none).
template <class F>
std::string invalid_argument_message(F&& f) {
  return error_of<kestrel::invalid_argument>(std::forward<F>(f));
}

}  // namespace kestrel::test
