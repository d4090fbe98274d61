// kestrel/core/mmap.hpp: a read-only memory map of a whole file (POSIX).
//
// Model weights are used in place from the map (zero copy). Opening a missing
// path, a directory or an empty file is a clear error, never a crash.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kestrel/core/error.hpp"

namespace kestrel {

/// The x86-64 transparent huge page: mapped_file's alignment, huge_page_buffer's grain.
inline constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;

class mapped_file {
 public:
  mapped_file() = default;
  explicit mapped_file(const std::filesystem::path& path) : path_(path.string()) {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw file_error(path_, std::string("cannot open: ") + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      throw file_error(path_, std::string("cannot stat: ") + std::strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
      ::close(fd);
      throw file_error(path_, "is a directory, expected a model or tokenizer file");
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      throw file_error(path_, "is not a regular file");
    }
    if (st.st_size == 0) {
      ::close(fd);
      throw file_error(path_, "file is empty");
    }
    size_ = static_cast<std::size_t>(st.st_size);
    void* p = map_aligned(fd, size_);
    const int e = errno;
    ::close(fd);
    if (p == MAP_FAILED) throw file_error(path_, std::string("cannot mmap: ") + std::strerror(e));
    data_ = static_cast<const std::byte*>(p);
  }
  mapped_file(mapped_file&& o) noexcept
      : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  mapped_file& operator=(mapped_file&& o) noexcept {
    if (this != &o) {
      unmap();
      path_ = std::move(o.path_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file() { unmap(); }

  const std::string& path() const noexcept { return path_; }
  const std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }

 private:
  void unmap() noexcept {
    if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
  }
  /// The file's n bytes mapped read-only, from a 2 MiB boundary where the
  /// file is that large, and marked for huge pages (MADV_HUGEPAGE, a
  /// hint): what the page cache lacks is then read in 2 MiB folios where the
  /// file system makes them, and folios of 2 MiB are mapped as 2 MiB pages
  /// (only on the 2 MiB grid). The model's matrices read in place so take
  /// one TLB entry per 2 MiB (cpu_backend's weight_placement::automatic).
  /// MAP_FAILED (errno set) where it cannot be mapped.
  static void* map_aligned(int fd, std::size_t n) noexcept {
    constexpr std::size_t huge = huge_page_bytes;
    if (n < huge) return ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0);
    // Reserve n + 2 MiB of address space, map the file over its first 2 MiB
    // boundary, give back what lies either side.
    void* r = ::mmap(nullptr, n + huge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0);
    const auto lo = reinterpret_cast<std::uintptr_t>(r);
    const auto at = (lo + huge - 1) / huge * huge;
    void* p = ::mmap(reinterpret_cast<void*>(at), n, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::munmap(r, n + huge);
      errno = e;
      return MAP_FAILED;
    }
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::uintptr_t end = (at + n + page - 1) / page * page, hi = lo + n + huge;
    if (at > lo) ::munmap(r, at - lo);
    if (hi > end) ::munmap(reinterpret_cast<void*>(end), hi - end);
    ::madvise(p, n, MADV_HUGEPAGE);
    return p;
  }

  std::string path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// The machine's physical memory in bytes (sysconf), or 0 where unknown.
inline std::size_t physical_memory_bytes() noexcept {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) : 0;
}

/// Drops the whole pages inside [p, p + n) of a read-only private file
/// mapping from this process's memory (madvise MADV_DONTNEED): the next
/// access reads them back from the file, so nothing is lost. Only for such a
/// mapping: on anonymous memory it would zero the pages. Used once the bytes
/// have been copied where they are read from.
inline void release_pages(const void* p, std::size_t n) noexcept {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto lo = (reinterpret_cast<std::uintptr_t>(p) + page - 1) / page * page;
  const auto hi = (reinterpret_cast<std::uintptr_t>(p) + n) / page * page;
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

/// Asks the kernel to map the whole pages inside [p, p + n) of a file
/// mapping 4 KiB at a time (madvise MADV_NOHUGEPAGE). Where the page cache
/// holds the file in 2 MiB folios (FileHugePages in /proc/meminfo), a read
/// of one byte may otherwise map all 2 MiB around it: a token embedding
/// lookup per token then brought a TinyLlama q8_0 file's whole 70 MB table
/// into the process's memory. A hint: ignored where unsupported.
inline void map_small_pages(const void* p, std::size_t n) noexcept {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto lo = (reinterpret_cast<std::uintptr_t>(p) + page - 1) / page * page;
  const auto hi = (reinterpret_cast<std::uintptr_t>(p) + n) / page * page;
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_NOHUGEPAGE);
}

/// Reads one byte of every 4 KiB page of [p, p + n), so that a file
/// mapping's pages are in memory (brought in from disk where the page cache
/// let them go) before the caller times what it does with them.
inline void touch_pages(const std::byte* p, std::size_t n) noexcept {
  unsigned acc = 0;
  for (std::size_t i = 0; i < n; i += 4096) acc += static_cast<unsigned>(p[i]);
  if (n) acc += static_cast<unsigned>(p[n - 1]);
  asm volatile("" ::"r"(acc));  // the reads are the point: keep them
}

/// Maps every page of [p, p + n) of a file mapping, reading from the file
/// what the page cache does not hold (madvise MADV_POPULATE_READ, Linux
/// 5.14; touch_pages where the kernel lacks it).
inline void populate_pages(const std::byte* p, std::size_t n) noexcept {
#if defined(MADV_POPULATE_READ)
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto lo = reinterpret_cast<std::uintptr_t>(p) / page * page;
  if (n && ::madvise(reinterpret_cast<void*>(lo), reinterpret_cast<std::uintptr_t>(p) + n - lo, MADV_POPULATE_READ) == 0)
    return;
#endif
  touch_pages(p, n);
}

/// How many bytes of [p, p + n) are mapped as 2 MiB pages of a file: the
/// FilePmdMapped of every mapping in /proc/self/smaps that overlaps the
/// range, summed (madvise on part of a mapping, such as map_small_pages on
/// the token embeddings, splits it into several); 0 where that cannot be
/// read (not Linux) or nothing is mapped there. Counts whole mappings, so
/// ask for whole mappings.
inline std::size_t file_pmd_mapped_bytes(const void* p, std::size_t n) {
  std::FILE* f = std::fopen("/proc/self/smaps", "re");
  if (!f) return 0;
  const auto at = reinterpret_cast<std::uintptr_t>(p), end = at + n;
  char line[4096];
  bool inside = false;
  std::size_t bytes = 0;
  while (std::fgets(line, sizeof line, f)) {
    unsigned long lo = 0, hi = 0, kb = 0;
    char dash = 0;
    // A mapping's first line starts "lo-hi " (hex); its fields' lines with a
    // name and a colon ("FilePmdMapped:  2048 kB").
    if (std::sscanf(line, "%lx%c%lx ", &lo, &dash, &hi) == 3 && dash == '-') {
      if (lo >= end) break;  // the mappings come in address order
      inside = lo < end && at < hi;
    } else if (inside && std::sscanf(line, "FilePmdMapped: %lu kB", &kb) == 1) {
      bytes += kb * 1024;
    }
  }
  std::fclose(f);
  return bytes;
}

/// Whether the kernel hands out transparent huge pages to a region that asks
/// for them (Linux: /sys/kernel/mm/transparent_hugepage/enabled is
/// "[always]" or "[madvise]"; false where the file is missing or says
/// "[never]").
inline bool transparent_huge_pages() {
  const int fd = ::open("/sys/kernel/mm/transparent_hugepage/enabled", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[128] = {};
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  const std::string_view s(buf, static_cast<std::size_t>(n));
  return s.find("[always]") != std::string_view::npos || s.find("[madvise]") != std::string_view::npos;
}

/// n bytes of anonymous memory, zeroed, starting on a 2 MiB boundary and
/// marked for transparent huge pages (madvise MADV_HUGEPAGE): streaming
/// through it takes one TLB entry per 2 MiB instead of per 4 KiB.
class huge_page_buffer {
 public:
  static constexpr std::size_t huge_page = huge_page_bytes;

  huge_page_buffer() = default;
  explicit huge_page_buffer(std::size_t n) : size_(n) {
    if (n == 0) return;
    len_ = (n + huge_page - 1) / huge_page * huge_page + huge_page;  // room to align the start
    void* p = ::mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      len_ = 0;
      throw error("cannot map " + std::to_string(n) + " bytes of memory: " + std::strerror(e));
    }
    map_ = p;
    const auto a = (reinterpret_cast<std::uintptr_t>(p) + huge_page - 1) / huge_page * huge_page;
    data_ = reinterpret_cast<std::byte*>(a);
    ::madvise(data_, len_ - (a - reinterpret_cast<std::uintptr_t>(p)), MADV_HUGEPAGE);  // advice: may be refused
  }
  huge_page_buffer(huge_page_buffer&& o) noexcept
      : map_(std::exchange(o.map_, nullptr)), len_(std::exchange(o.len_, 0)), data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  huge_page_buffer& operator=(huge_page_buffer&& o) noexcept {
    if (this != &o) {
      unmap();
      map_ = std::exchange(o.map_, nullptr);
      len_ = std::exchange(o.len_, 0);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  huge_page_buffer(const huge_page_buffer&) = delete;
  huge_page_buffer& operator=(const huge_page_buffer&) = delete;
  ~huge_page_buffer() { unmap(); }

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  void unmap() noexcept {
    if (map_) ::munmap(map_, len_);
    map_ = nullptr;
  }
  void* map_ = nullptr;
  std::size_t len_ = 0;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

namespace detail {

/// What a read was for, as text: `what` is either text or a callable that
/// returns it. The callable form builds its message only when a check fails,
/// so a parser's hot loop (one read per vocabulary string) does no string work.
template <class What>
std::string describe_read(What&& what) {
  if constexpr (std::is_invocable_v<What&>)
    return std::string(what());
  else
    return std::string(std::string_view(what));
}

}  // namespace detail

/// Bounds-checked little-endian reads from a byte range; every failure names
/// the file, the offset and what was being read. Used by all file parsers.
/// Each `what` is text or a callable returning text (see describe_read).
class byte_reader {
 public:
  byte_reader(std::span<const std::byte> bytes, std::string path) : bytes_(bytes), path_(std::move(path)) {}

  std::size_t offset() const noexcept { return pos_; }
  std::size_t size() const noexcept { return bytes_.size(); }
  std::size_t remaining() const noexcept { return bytes_.size() - pos_; }
  const std::string& path() const noexcept { return path_; }
  const std::byte* here() const noexcept { return bytes_.data() + pos_; }

  /// Throws file_error(path, at, what).
  [[noreturn]] void fail(std::uint64_t at, std::string_view what) const { throw file_error(path_, at, what); }

  /// Throws unless `n` more bytes exist.
  template <class What>
  void need(std::size_t n, What&& what) const {
    if (n > remaining())
      fail(pos_, "truncated: reading " + detail::describe_read(what) + " needs " + std::to_string(n) + " bytes, " +
                     std::to_string(remaining()) + " left");
  }
  template <class T, class What>
  T read(What&& what) {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));  // little-endian host assumed (x86-64, aarch64)
    pos_ += sizeof(T);
    return v;
  }
  template <class What>
  std::span<const std::byte> take(std::size_t n, What&& what) {
    need(n, what);
    auto s = bytes_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  template <class What>
  void skip(std::size_t n, What&& what) {
    need(n, what);
    pos_ += n;
  }
  template <class What>
  void seek(std::size_t off, What&& what) {
    if (off > bytes_.size())
      fail(off, "offset past end of file (" + std::to_string(bytes_.size()) + " bytes) for " +
                    detail::describe_read(what));
    pos_ = off;
  }

 private:
  std::span<const std::byte> bytes_;
  std::string path_;
  std::size_t pos_ = 0;
};

}  // namespace kestrel
