// kestrel/io/pytorch.hpp: reads the tensors of a PyTorch checkpoint
// (torch.save of a state dict, e.g. an HF pytorch_model.bin) WITHOUT unpickling.
//
// Since torch 1.6 a checkpoint is a ZIP archive (APPNOTE.TXT) whose entries sit
// under one top folder (named after the file at save time, or "archive"):
//   <top>/data.pkl      the pickled object (protocol 2), tensors as
//                       _rebuild_tensor_v2(storage, offset, size, stride, ...)
//                       whose storage is a persistent id
//                       ('storage', torch.FloatStorage, key, location, numel)
//   <top>/data/<key>    the raw little-endian bytes of each storage
//   <top>/version, <top>/byteorder (newer torch), ...
// torch writes every entry STORED (uncompressed) and pads local headers so
// that data start on 64-byte boundaries, which is what makes zero copy work.
//
// data.pkl is never executed. A small stack machine understands the opcodes
// and globals a state dict uses (listed in detail::pickle_machine) and turns
// everything else (any other opcode, any other global) into a file_error that
// names it and its offset. Tensors must be contiguous (row-major) and inside
// their storage; they are views into the mapping.
//
// Errors are kestrel::file_error "PATH: offset N: what" with N a file offset;
// for pickle errors the message also gives the offset inside data.pkl, as
// Python's pickletools.dis shows it.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/core/mmap.hpp"
#include "kestrel/io/tensor_ref.hpp"

namespace kestrel::io {

// ---------------------------------------------------------------------------
// ZIP (read-only, STORED entries, zip64 aware)

/// One entry of a ZIP archive's central directory.
struct zip_entry {
  std::string name;
  std::uint16_t method = 0;          // 0 = stored, 8 = deflate, ...
  std::uint16_t flags = 0;           // bit 0: encrypted
  std::uint32_t crc32 = 0;
  std::uint64_t compressed_size = 0;
  std::uint64_t size = 0;            // uncompressed
  std::uint64_t header_offset = 0;   // of the local header
  std::uint64_t data_offset = 0;     // of the entry's bytes (after the local header)
  std::uint64_t directory_offset = 0;  // of its central directory record, for messages
};

namespace detail {

/// CRC-32 (ISO-HDLC, reflected polynomial 0xEDB88320), as ZIP stores it.
inline std::uint32_t crc32(std::span<const std::byte> bytes) noexcept {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  std::uint32_t c = 0xFFFFFFFFu;
  for (auto b : bytes) c = table[(c ^ static_cast<std::uint8_t>(b)) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

inline std::string method_name(std::uint16_t m) {
  switch (m) {
    case 0: return "stored";
    case 8: return "deflate";
    case 9: return "deflate64";
    case 12: return "bzip2";
    case 14: return "lzma";
    case 93: return "zstd";
    default: return "method " + std::to_string(m);
  }
}

}  // namespace detail

/// The central directory of a ZIP archive held in memory (a mapping). Entries
/// are validated (names, sizes, local headers inside the file) when read;
/// `data()` of an entry that is compressed or encrypted is an error.
class zip_archive {
 public:
  zip_archive(std::span<const std::byte> bytes, std::string path) : bytes_(bytes), path_(std::move(path)) { parse(); }

  const std::vector<zip_entry>& entries() const noexcept { return entries_; }
  const zip_entry* find(std::string_view name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &entries_[it->second];
  }
  /// The bytes of a STORED entry; throws for a compressed or encrypted one.
  std::span<const std::byte> data(const zip_entry& e) const {
    if (e.flags & 1u) fail(e.directory_offset, "entry '" + e.name + "' is encrypted");
    if (e.method != 0)
      fail(e.directory_offset, "entry '" + e.name + "' is compressed (" + detail::method_name(e.method) +
                                   "); only stored entries can be mapped (torch.save writes them stored)");
    return bytes_.subspan(static_cast<std::size_t>(e.data_offset), static_cast<std::size_t>(e.size));
  }
  /// Throws unless the entry's bytes match its CRC-32.
  void verify_crc(const zip_entry& e) const {
    const auto got = detail::crc32(data(e));
    if (got != e.crc32)
      fail(e.data_offset, "entry '" + e.name + "' fails its CRC-32 check (stored " + hex(e.crc32) + ", computed " +
                              hex(got) + "): corrupt file");
  }

 private:
  [[noreturn]] void fail(std::uint64_t at, const std::string& what) const { throw file_error(path_, at, what); }
  static std::string hex(std::uint32_t v) {
    static constexpr char d[] = "0123456789abcdef";
    std::string s = "0x";
    for (int i = 7; i >= 0; --i) s += d[(v >> (4 * i)) & 15u];
    return s;
  }
  template <class T>
  T load(std::uint64_t off) const noexcept {
    T v;
    std::memcpy(&v, bytes_.data() + off, sizeof(T));  // little-endian host
    return v;
  }

  void parse();
  void parse_entry(byte_reader& c, std::uint64_t cd_end);

  std::span<const std::byte> bytes_;
  std::string path_;
  std::vector<zip_entry> entries_;
  std::map<std::string, std::size_t, std::less<>> index_;
};

inline void zip_archive::parse() {
  const std::uint64_t size = bytes_.size();
  constexpr std::uint32_t eocd_sig = 0x06054b50, z64_locator_sig = 0x07064b50, z64_eocd_sig = 0x06064b50;
  constexpr std::uint64_t eocd_len = 22;
  if (size < eocd_len) fail(0, "truncated: " + std::to_string(size) + " bytes cannot hold a ZIP end record");

  // The end-of-central-directory record is the last 22 bytes plus a comment
  // of up to 65535 bytes: search backwards for a signature whose comment
  // length reaches exactly to the end of the file.
  std::optional<std::uint64_t> eocd;
  const std::uint64_t lowest = size - eocd_len > 65535 ? size - eocd_len - 65535 : 0;
  for (std::uint64_t p = size - eocd_len + 1; p-- > lowest;) {
    if (load<std::uint32_t>(p) == eocd_sig && p + eocd_len + load<std::uint16_t>(p + 20) == size) {
      eocd = p;
      break;
    }
  }
  if (!eocd) fail(size, "no ZIP end-of-central-directory record: truncated or not a ZIP archive");

  const std::uint64_t e = *eocd;
  const auto disk = load<std::uint16_t>(e + 4), cd_disk = load<std::uint16_t>(e + 6);
  std::uint64_t n_entries = load<std::uint16_t>(e + 10);
  std::uint64_t cd_size = load<std::uint32_t>(e + 12);
  std::uint64_t cd_offset = load<std::uint32_t>(e + 16);
  std::uint64_t cd_end_limit = e;  // the central directory ends before the (zip64) end record
  if (disk != 0 || cd_disk != 0) fail(e, "multi-disk (split) ZIP archives are not supported");

  // zip64: a locator sits right before the end record and points at a zip64 end record.
  if (e >= 20 && load<std::uint32_t>(e - 20) == z64_locator_sig) {
    const std::uint64_t z = load<std::uint64_t>(e - 20 + 8);
    if (z > size || size - z < 56 || z + 56 > e - 20)
      fail(e - 20, "zip64 end record offset " + std::to_string(z) + " is outside the file");
    if (load<std::uint32_t>(z) != z64_eocd_sig) fail(z, "bad zip64 end record signature");
    if (load<std::uint32_t>(z + 16) != 0 || load<std::uint32_t>(z + 20) != 0)
      fail(z, "multi-disk (split) ZIP archives are not supported");
    n_entries = load<std::uint64_t>(z + 32);
    cd_size = load<std::uint64_t>(z + 40);
    cd_offset = load<std::uint64_t>(z + 48);
    cd_end_limit = z;
  }
  if (cd_offset > cd_end_limit || cd_size > cd_end_limit - cd_offset)
    fail(e, "central directory (" + std::to_string(cd_size) + " bytes at offset " + std::to_string(cd_offset) +
                ") is outside the file (" + std::to_string(size) + " bytes)");
  constexpr std::uint64_t min_record = 46;
  if (n_entries > cd_size / min_record)
    fail(e, std::to_string(n_entries) + " entries cannot fit in a central directory of " + std::to_string(cd_size) +
                " bytes");

  byte_reader c(bytes_.first(static_cast<std::size_t>(cd_offset + cd_size)), path_);
  c.seek(static_cast<std::size_t>(cd_offset), "central directory");
  entries_.reserve(static_cast<std::size_t>(n_entries));
  for (std::uint64_t i = 0; i < n_entries; ++i) parse_entry(c, cd_offset);
}

inline void zip_archive::parse_entry(byte_reader& c, std::uint64_t cd_offset) {
  constexpr std::uint32_t cd_sig = 0x02014b50, local_sig = 0x04034b50;
  zip_entry z;
  z.directory_offset = c.offset();
  const auto what = [&] { return "central directory record #" + std::to_string(entries_.size()); };
  if (c.read<std::uint32_t>(what) != cd_sig) fail(z.directory_offset, "bad signature of " + what());
  c.skip(4, what);  // versions made by / needed
  z.flags = c.read<std::uint16_t>(what);
  z.method = c.read<std::uint16_t>(what);
  c.skip(4, what);  // time, date
  z.crc32 = c.read<std::uint32_t>(what);
  std::uint64_t csize = c.read<std::uint32_t>(what);
  std::uint64_t usize = c.read<std::uint32_t>(what);
  const auto name_len = c.read<std::uint16_t>(what);
  const auto extra_len = c.read<std::uint16_t>(what);
  const auto comment_len = c.read<std::uint16_t>(what);
  const auto disk = c.read<std::uint16_t>(what);
  c.skip(6, what);  // internal, external attributes
  std::uint64_t local = c.read<std::uint32_t>(what);
  const auto name = c.take(name_len, what);
  z.name.assign(reinterpret_cast<const char*>(name.data()), name.size());
  const std::size_t extra_at = c.offset();
  const auto extra = c.take(extra_len, what);
  c.skip(comment_len, what);

  // zip64 extended information (header id 1): the 64-bit values of those
  // fields whose 32-bit slot is 0xFFFFFFFF, in this order.
  for (std::size_t p = 0; p + 4 <= extra.size();) {
    std::uint16_t id, len;
    std::memcpy(&id, extra.data() + p, 2);
    std::memcpy(&len, extra.data() + p + 2, 2);
    if (p + 4 + len > extra.size()) fail(extra_at + p, "extra field of '" + z.name + "' runs past its record");
    if (id == 1) {
      std::size_t q = p + 4;
      auto next = [&](std::uint64_t& v) {
        if (q + 8 > p + 4 + len) fail(extra_at + p, "zip64 extra field of '" + z.name + "' is too short");
        std::memcpy(&v, extra.data() + q, 8);
        q += 8;
      };
      if (usize == 0xFFFFFFFFu) next(usize);
      if (csize == 0xFFFFFFFFu) next(csize);
      if (local == 0xFFFFFFFFu) next(local);
    }
    p += 4 + len;
  }
  if (disk != 0 && disk != 0xFFFF) fail(z.directory_offset, "entry '" + z.name + "' is on another disk");
  z.compressed_size = csize;
  z.size = usize;
  z.header_offset = local;
  if (z.method == 0 && csize != usize)
    fail(z.directory_offset, "stored entry '" + z.name + "' has compressed size " + std::to_string(csize) +
                                 " != size " + std::to_string(usize));

  // The local header: fixed 30 bytes, then its own name and extra lengths
  // (which may differ from the central ones; torch pads data with the extra).
  if (local > cd_offset || cd_offset - local < 30)
    fail(z.directory_offset, "local header of '" + z.name + "' at offset " + std::to_string(local) +
                                 " is outside the archive's data");
  if (load<std::uint32_t>(local) != local_sig) fail(local, "bad local header signature for '" + z.name + "'");
  const auto lname = load<std::uint16_t>(local + 26), lextra = load<std::uint16_t>(local + 28);
  if (lname != name_len || cd_offset - local - 30 < lname ||
      std::memcmp(bytes_.data() + local + 30, z.name.data(), lname) != 0)
    fail(local, "local header name differs from the central directory's '" + z.name + "'");
  z.data_offset = local + 30 + lname + lextra;
  if (z.data_offset > cd_offset || csize > cd_offset - z.data_offset)
    fail(local, "data of '" + z.name + "' (" + std::to_string(csize) + " bytes at offset " +
                    std::to_string(z.data_offset) + ") run past the start of the central directory (" +
                    std::to_string(cd_offset) + "): truncated or corrupt archive");

  auto [it, fresh] = index_.try_emplace(z.name, entries_.size());
  if (!fresh) fail(z.directory_offset, "duplicate entry '" + z.name + "'");
  entries_.push_back(std::move(z));
}

// ---------------------------------------------------------------------------
// The checkpoint

/// A tensor of a PyTorch checkpoint: the stored_tensor plus where it lives.
struct pytorch_tensor_info : stored_tensor {
  std::string storage_key;             // the data/<key> entry
  std::size_t storage_offset = 0;      // in elements
  std::size_t storage_numel = 0;       // elements in the storage
  std::vector<std::size_t> strides;    // in elements, as pickled (row-major, checked)
};

namespace detail {

/// Pickle opcodes the machine accepts (names as in Python's pickletools).
enum : std::uint8_t {
  op_mark = '(', op_stop = '.', op_binint = 'J', op_binint1 = 'K', op_binint2 = 'M', op_none = 'N',
  op_binpersid = 'Q', op_reduce = 'R', op_binunicode = 'X', op_empty_list = ']', op_append = 'a',
  op_build = 'b', op_global = 'c', op_appends = 'e', op_binget = 'h', op_long_binget = 'j',
  op_binput = 'q', op_long_binput = 'r', op_setitem = 's', op_tuple = 't', op_setitems = 'u',
  op_empty_dict = '}', op_empty_tuple = ')', op_binfloat = 'G',
  op_proto = 0x80, op_tuple1 = 0x85, op_tuple2 = 0x86, op_tuple3 = 0x87, op_newtrue = 0x88,
  op_newfalse = 0x89, op_long1 = 0x8a, op_short_binunicode = 0x8c, op_binunicode8 = 0x8d,
  op_stack_global = 0x93, op_memoize = 0x94, op_frame = 0x95
};

/// Executes the data-building subset of pickle that torch.save emits for a
/// state dict, never calling anything: the only "callables" are the few
/// allowed globals, each interpreted here. Nodes live in an arena and refer
/// to each other by pointer, so a hostile pickle (cycles, deep nesting)
/// cannot make destruction recurse.
class pickle_machine {
 public:
  struct node {
    enum class kind : std::uint8_t { none, boolean, integer, floating, string, tuple, list, dict, global, storage, tensor };
    enum class callable : std::uint8_t { none, rebuild_tensor_v2, rebuild_parameter, ordered_dict, storage_type };
    kind k = kind::none;
    callable fn = callable::none;
    std::int64_t i = 0;          // integer, boolean
    double f = 0;
    std::string s;               // string; global "module name"; storage key
    std::vector<node*> items;    // tuple, list; dict as key, value, key, value...
    element_type element{};      // storage_type global, storage, tensor
    std::size_t numel = 0;       // storage
    const node* storage = nullptr;  // tensor
    std::size_t storage_offset = 0;
    std::vector<std::size_t> shape, strides;  // tensor
    std::size_t at = 0;          // pickle offset of the opcode that made it
  };

  /// `base` is the file offset of the pickle's first byte (for messages).
  pickle_machine(std::span<const std::byte> pk, std::string path, std::uint64_t base, std::string entry)
      : pk_(pk), path_(std::move(path)), base_(base), entry_(std::move(entry)) {}

  /// Runs to STOP and returns the one value left.
  const node& run();

  [[noreturn]] void fail(std::size_t at, const std::string& what) const {
    throw file_error(path_, base_ + at, entry_ + " offset " + std::to_string(at) + ": " + what);
  }
  /// The file offset of pickle offset `at`.
  std::uint64_t file_offset(std::size_t at) const noexcept { return base_ + at; }

 private:
  node* make(node::kind k, std::size_t at) {
    arena_.emplace_back();
    arena_.back().k = k;
    arena_.back().at = at;
    return &arena_.back();
  }
  node* pop(std::size_t at, const char* op) {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back()))
      fail(at, std::string(op) + " needs a value on the stack, found none");
    node* n = stack_.back();
    stack_.pop_back();
    return n;
  }
  std::vector<node*> pop_to_mark(std::size_t at, const char* op) {
    if (marks_.empty()) fail(at, std::string(op) + " without a MARK");
    const std::size_t m = marks_.back();
    marks_.pop_back();
    std::vector<node*> out(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return out;
  }
  node* top(std::size_t at, const char* op) {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back()))
      fail(at, std::string(op) + " needs a value on the stack, found none");
    return stack_.back();
  }
  template <class T>
  T arg(std::size_t& p, const char* op) {
    if (pk_.size() - p < sizeof(T)) fail(p, std::string("truncated argument of ") + op);
    T v;
    std::memcpy(&v, pk_.data() + p, sizeof(T));
    p += sizeof(T);
    return v;
  }
  std::string_view bytes_arg(std::size_t& p, std::uint64_t n, const char* op) {
    if (pk_.size() - p < n)
      fail(p, std::string(op) + " claims " + std::to_string(n) + " bytes, only " + std::to_string(pk_.size() - p) +
                  " are left");
    std::string_view s(reinterpret_cast<const char*>(pk_.data() + p), static_cast<std::size_t>(n));
    p += static_cast<std::size_t>(n);
    return s;
  }
  std::string_view line_arg(std::size_t& p, const char* op) {
    const std::size_t start = p;
    while (p < pk_.size() && static_cast<char>(pk_[p]) != '\n') ++p;
    if (p == pk_.size()) fail(start, std::string("unterminated line argument of ") + op);
    return {reinterpret_cast<const char*>(pk_.data() + start), p++ - start};
  }
  node* memo_get(std::size_t at, std::uint32_t idx) {
    auto it = memo_.find(idx);
    if (it == memo_.end()) fail(at, "memo entry " + std::to_string(idx) + " read before it was written");
    return it->second;
  }

  node* global(std::size_t at, std::string_view module, std::string_view name);
  node* reduce(std::size_t at, node* fn, node* args);
  node* persistent_load(std::size_t at, node* pid);
  void set_items(std::size_t at, node* dict, const std::vector<node*>& kv, const char* op);

  std::span<const std::byte> pk_;
  std::string path_;
  std::uint64_t base_;
  std::string entry_;
  std::deque<node> arena_;
  std::vector<node*> stack_;
  std::vector<std::size_t> marks_;  // stack sizes at each MARK
  std::unordered_map<std::uint32_t, node*> memo_;
};

inline std::string_view opcode_name(std::uint8_t op) noexcept {
  // Names of the opcodes we reject, for messages (pickletools' spelling).
  switch (op) {
    case 'I': return "INT";
    case 'L': return "LONG";
    case 'F': return "FLOAT";
    case 'S': return "STRING";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'V': return "UNICODE";
    case 'P': return "PERSID";
    case 'g': return "GET";
    case 'p': return "PUT";
    case 'd': return "DICT";
    case 'l': return "LIST";
    case 'i': return "INST";
    case 'o': return "OBJ";
    case 0x81: return "NEWOBJ";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x8b: return "LONG4";
    case 0x8e: return "BINBYTES8";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x92: return "NEWOBJ_EX";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    default: return "";
  }
}

inline const pickle_machine::node& pickle_machine::run() {
  std::size_t p = 0;
  while (p < pk_.size()) {
    const std::size_t at = p;
    const auto op = static_cast<std::uint8_t>(pk_[p++]);
    switch (op) {
      case op_proto: {
        const auto v = arg<std::uint8_t>(p, "PROTO");
        if (v < 2 || v > 5) fail(at, "pickle protocol " + std::to_string(v) + ", expected 2..5");
        break;
      }
      case op_frame: (void)arg<std::uint64_t>(p, "FRAME"); break;  // framing only groups opcodes
      case op_stop: {
        if (!marks_.empty()) fail(at, "STOP with an open MARK");
        if (stack_.size() != 1)
          fail(at, "STOP with " + std::to_string(stack_.size()) + " values on the stack, expected 1");
        if (p != pk_.size())
          fail(p, std::to_string(pk_.size() - p) + " bytes after STOP");
        return *stack_.back();
      }
      case op_mark: marks_.push_back(stack_.size()); break;
      case op_none: stack_.push_back(make(node::kind::none, at)); break;
      case op_newtrue: case op_newfalse: {
        auto* n = make(node::kind::boolean, at);
        n->i = op == op_newtrue;
        stack_.push_back(n);
        break;
      }
      case op_binint: case op_binint1: case op_binint2: {
        auto* n = make(node::kind::integer, at);
        n->i = op == op_binint ? arg<std::int32_t>(p, "BININT")
             : op == op_binint1 ? arg<std::uint8_t>(p, "BININT1") : arg<std::uint16_t>(p, "BININT2");
        stack_.push_back(n);
        break;
      }
      case op_long1: {
        // Little-endian two's complement of n bytes; torch uses it for values
        // past 2^31 (element counts of big storages).
        const auto n = arg<std::uint8_t>(p, "LONG1");
        if (n > 8) fail(at, "LONG1 of " + std::to_string(n) + " bytes does not fit in 64 bits");
        const auto b = bytes_arg(p, n, "LONG1");
        std::uint64_t u = 0;
        for (std::size_t k = 0; k < n; ++k) u |= std::uint64_t(static_cast<std::uint8_t>(b[k])) << (8 * k);
        if (n > 0 && n < 8 && (static_cast<std::uint8_t>(b[n - 1]) & 0x80u)) u |= ~std::uint64_t{0} << (8 * n);
        auto* v = make(node::kind::integer, at);
        v->i = static_cast<std::int64_t>(u);
        stack_.push_back(v);
        break;
      }
      case op_binfloat: {
        const auto raw = arg<std::uint64_t>(p, "BINFLOAT");  // big-endian IEEE double
        auto* v = make(node::kind::floating, at);
        v->f = std::bit_cast<double>(__builtin_bswap64(raw));
        stack_.push_back(v);
        break;
      }
      case op_binunicode: case op_short_binunicode: case op_binunicode8: {
        const char* nm = op == op_binunicode ? "BINUNICODE" : op == op_short_binunicode ? "SHORT_BINUNICODE" : "BINUNICODE8";
        const std::uint64_t n = op == op_binunicode ? arg<std::uint32_t>(p, nm)
                              : op == op_short_binunicode ? arg<std::uint8_t>(p, nm) : arg<std::uint64_t>(p, nm);
        auto* v = make(node::kind::string, at);
        v->s = bytes_arg(p, n, nm);
        stack_.push_back(v);
        break;
      }
      case op_empty_tuple: stack_.push_back(make(node::kind::tuple, at)); break;
      case op_empty_list: stack_.push_back(make(node::kind::list, at)); break;
      case op_empty_dict: stack_.push_back(make(node::kind::dict, at)); break;
      case op_tuple: {
        auto items = pop_to_mark(at, "TUPLE");
        auto* t = make(node::kind::tuple, at);
        t->items = std::move(items);
        stack_.push_back(t);
        break;
      }
      case op_tuple1: case op_tuple2: case op_tuple3: {
        const std::size_t n = op - op_tuple1 + 1;
        auto* t = make(node::kind::tuple, at);
        t->items.resize(n);
        for (std::size_t k = n; k-- > 0;) t->items[k] = pop(at, "TUPLE1..3");
        stack_.push_back(t);
        break;
      }
      case op_append: {
        node* v = pop(at, "APPEND");
        node* l = top(at, "APPEND");
        if (l->k != node::kind::list) fail(at, "APPEND to a value that is not a list");
        l->items.push_back(v);
        break;
      }
      case op_appends: {
        auto items = pop_to_mark(at, "APPENDS");
        node* l = top(at, "APPENDS");
        if (l->k != node::kind::list) fail(at, "APPENDS to a value that is not a list");
        l->items.insert(l->items.end(), items.begin(), items.end());
        break;
      }
      case op_setitem: {
        node* v = pop(at, "SETITEM");
        node* k = pop(at, "SETITEM");
        set_items(at, top(at, "SETITEM"), {k, v}, "SETITEM");
        break;
      }
      case op_setitems: {
        auto kv = pop_to_mark(at, "SETITEMS");
        set_items(at, top(at, "SETITEMS"), kv, "SETITEMS");
        break;
      }
      case op_binput: case op_long_binput: case op_memoize: {
        const std::uint32_t idx = op == op_binput ? arg<std::uint8_t>(p, "BINPUT")
                                : op == op_long_binput ? arg<std::uint32_t>(p, "LONG_BINPUT")
                                                       : static_cast<std::uint32_t>(memo_.size());
        memo_[idx] = top(at, "BINPUT");
        break;
      }
      case op_binget: stack_.push_back(memo_get(at, arg<std::uint8_t>(p, "BINGET"))); break;
      case op_long_binget: stack_.push_back(memo_get(at, arg<std::uint32_t>(p, "LONG_BINGET"))); break;
      case op_global: {
        const auto module = line_arg(p, "GLOBAL");
        const auto name = line_arg(p, "GLOBAL");
        stack_.push_back(global(at, module, name));
        break;
      }
      case op_stack_global: {
        node* name = pop(at, "STACK_GLOBAL");
        node* module = pop(at, "STACK_GLOBAL");
        if (name->k != node::kind::string || module->k != node::kind::string)
          fail(at, "STACK_GLOBAL needs two strings");
        stack_.push_back(global(at, module->s, name->s));
        break;
      }
      case op_binpersid: stack_.push_back(persistent_load(at, pop(at, "BINPERSID"))); break;
      case op_reduce: {
        node* args = pop(at, "REDUCE");
        node* fn = pop(at, "REDUCE");
        stack_.push_back(reduce(at, fn, args));
        break;
      }
      case op_build: {
        // BUILD sets an object's state. torch's state_dict() is an OrderedDict
        // carrying a `_metadata` attribute (per-module versions): that is the
        // one case, and the state carries nothing we need.
        node* state = pop(at, "BUILD");
        node* obj = top(at, "BUILD");
        if (obj->k != node::kind::dict)
          fail(at, "BUILD on a value that is not a dict (state from offset " + std::to_string(state->at) + ")");
        break;
      }
      default: {
        const auto name = opcode_name(op);
        static constexpr char hx[] = "0123456789abcdef";
        const std::string code = std::string("0x") + hx[op >> 4] + hx[op & 15];
        fail(at, "pickle opcode " + (name.empty() ? code : std::string(name) + " (" + code + ")") +
                     " is not part of a torch state dict; refusing to interpret it");
      }
    }
  }
  fail(pk_.size(), "pickle ends without STOP (truncated)");
}

inline pickle_machine::node* pickle_machine::global(std::size_t at, std::string_view module, std::string_view name) {
  auto* g = make(node::kind::global, at);
  g->s = std::string(module) + " " + std::string(name);
  if (module == "torch._utils" && name == "_rebuild_tensor_v2") g->fn = node::callable::rebuild_tensor_v2;
  else if (module == "torch._utils" && name == "_rebuild_parameter") g->fn = node::callable::rebuild_parameter;
  else if (module == "collections" && name == "OrderedDict") g->fn = node::callable::ordered_dict;
  else if (module == "torch") {
    static constexpr std::pair<std::string_view, element_type> storages[] = {
        {"FloatStorage", element_type::f32}, {"HalfStorage", element_type::f16},
        {"BFloat16Storage", element_type::bf16}, {"DoubleStorage", element_type::f64},
        {"LongStorage", element_type::i64}, {"IntStorage", element_type::i32},
        {"ShortStorage", element_type::i16}, {"CharStorage", element_type::i8},
        {"ByteStorage", element_type::u8}, {"BoolStorage", element_type::bool_}};
    for (const auto& [n, t] : storages)
      if (name == n) {
        g->fn = node::callable::storage_type;
        g->element = t;
      }
  }
  if (g->fn == node::callable::none)
    fail(at, "GLOBAL '" + g->s + "' is not allowed (a state dict uses only torch._utils._rebuild_tensor_v2, "
             "collections.OrderedDict and torch.*Storage)");
  return g;
}

inline pickle_machine::node* pickle_machine::persistent_load(std::size_t at, node* pid) {
  // ('storage', <storage class>, key, location, numel)
  const auto& it = pid->items;
  if (pid->k != node::kind::tuple || it.size() != 5 || it[0]->k != node::kind::string || it[0]->s != "storage")
    fail(at, "BINPERSID: persistent id is not a ('storage', type, key, location, numel) tuple");
  if (it[1]->k != node::kind::global || it[1]->fn != node::callable::storage_type)
    fail(at, "BINPERSID: the storage type is not a torch.*Storage class");
  if (it[2]->k != node::kind::string || it[3]->k != node::kind::string)
    fail(at, "BINPERSID: storage key and location must be strings");
  if (it[4]->k != node::kind::integer || it[4]->i < 0)
    fail(at, "BINPERSID: storage size must be a non-negative integer");
  auto* s = make(node::kind::storage, at);
  s->element = it[1]->element;
  s->s = it[2]->s;
  s->numel = static_cast<std::size_t>(it[4]->i);
  return s;
}

inline void pickle_machine::set_items(std::size_t at, node* dict, const std::vector<node*>& kv, const char* op) {
  if (dict->k != node::kind::dict) fail(at, std::string(op) + " on a value that is not a dict");
  if (kv.size() % 2 != 0) fail(at, std::string(op) + " with an odd number of values");
  dict->items.insert(dict->items.end(), kv.begin(), kv.end());
}

inline pickle_machine::node* pickle_machine::reduce(std::size_t at, node* fn, node* args) {
  if (fn->k != node::kind::global) fail(at, "REDUCE of a value that is not one of the allowed globals");
  if (args->k != node::kind::tuple) fail(at, "REDUCE of '" + fn->s + "' with arguments that are not a tuple");
  const auto& a = args->items;
  switch (fn->fn) {
    case node::callable::ordered_dict:
      if (!a.empty()) fail(at, "collections.OrderedDict called with arguments");
      return make(node::kind::dict, at);
    case node::callable::rebuild_parameter:
      // (tensor, requires_grad, backward_hooks): the tensor is all we keep.
      if (a.size() != 3 || a[0]->k != node::kind::tensor) fail(at, "_rebuild_parameter: expected (tensor, bool, hooks)");
      return a[0];
    case node::callable::rebuild_tensor_v2: {
      // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
      if (a.size() != 6 && a.size() != 7)
        fail(at, "_rebuild_tensor_v2 with " + std::to_string(a.size()) + " arguments, expected 6 or 7");
      if (a[0]->k != node::kind::storage) fail(at, "_rebuild_tensor_v2: first argument is not a storage");
      if (a[1]->k != node::kind::integer || a[1]->i < 0)
        fail(at, "_rebuild_tensor_v2: storage offset is not a non-negative integer");
      auto ints = [&](const node* t, const char* what) {
        if (t->k != node::kind::tuple) fail(at, std::string("_rebuild_tensor_v2: ") + what + " is not a tuple");
        std::vector<std::size_t> out;
        for (const node* d : t->items) {
          if (d->k != node::kind::integer || d->i < 0)
            fail(at, std::string("_rebuild_tensor_v2: ") + what + " holds a value that is not a non-negative integer");
          out.push_back(static_cast<std::size_t>(d->i));
        }
        return out;
      };
      auto* t = make(node::kind::tensor, at);
      t->storage = a[0];
      t->element = a[0]->element;
      t->storage_offset = static_cast<std::size_t>(a[1]->i);
      t->shape = ints(a[2], "size");
      t->strides = ints(a[3], "stride");
      if (t->shape.size() != t->strides.size())
        fail(at, "_rebuild_tensor_v2: size has " + std::to_string(t->shape.size()) + " dimensions, stride " +
                     std::to_string(t->strides.size()));
      if (a[4]->k != node::kind::boolean) fail(at, "_rebuild_tensor_v2: requires_grad is not a bool");
      return t;
    }
    default:
      fail(at, "REDUCE of '" + fn->s + "', which is not callable here");
  }
}

}  // namespace detail

/// A PyTorch zip checkpoint holding a state dict (name -> tensor), mapped.
class pytorch_checkpoint {
 public:
  /// Maps the file and reads its ZIP directory and pickle; every tensor is
  /// checked (storage entry present and stored, size, bounds, contiguity).
  explicit pytorch_checkpoint(const std::filesystem::path& path)
      : file_(std::make_shared<const mapped_file>(path)) {
    parse();
  }

  const std::string& path() const noexcept { return file_->path(); }
  /// The top folder of the archive's entries ("archive", "pytorch_model", ...).
  const std::string& archive_name() const noexcept { return top_; }

  /// All tensors, in the state dict's order, whatever their element type.
  const std::vector<pytorch_tensor_info>& tensors() const noexcept { return tensors_; }
  const pytorch_tensor_info* find(std::string_view name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second];
  }
  /// Throws file_error "missing tensor NAME".
  const pytorch_tensor_info& info(std::string_view name) const {
    if (const auto* t = find(name)) return *t;
    throw file_error(path(), "missing tensor '" + std::string(name) + "'");
  }
  /// A view with a kernel dtype; throws if missing or not F32/F16/BF16.
  tensor_ref tensor(std::string_view name) const { return detail::make_tensor_ref(info(name), file_, path()); }

  /// Checks the CRC-32 of every storage entry (reads all the data: the
  /// constructor only checks data.pkl's).
  void verify_checksums() const {
    for (const auto& e : zip_->entries())
      if (e.name.starts_with(top_ + "/data/")) zip_->verify_crc(e);
  }

  const zip_archive& zip() const noexcept { return *zip_; }
  const mapped_file& file() const noexcept { return *file_; }
  std::shared_ptr<const mapped_file> shared_file() const noexcept { return file_; }

 private:
  [[noreturn]] void fail(std::uint64_t at, const std::string& what) const { throw file_error(path(), at, what); }
  void parse();
  void add_tensor(const std::string& name, const detail::pickle_machine::node& t, const detail::pickle_machine& m);

  std::shared_ptr<const mapped_file> file_;
  std::optional<zip_archive> zip_;
  std::string top_;
  std::vector<pytorch_tensor_info> tensors_;
  std::map<std::string, std::size_t, std::less<>> index_;
};

inline void pytorch_checkpoint::parse() {
  const auto bytes = file_->bytes();
  if (bytes.size() < 4 || std::memcmp(bytes.data(), "PK\x03\x04", 4) != 0) {
    // torch < 1.6 wrote a bare pickle stream starting with PROTO 2 and a magic number.
    if (bytes.size() >= 2 && static_cast<std::uint8_t>(bytes[0]) == 0x80)
      fail(0, "a legacy (torch < 1.6, non-ZIP) PyTorch checkpoint, which is not supported: re-save it with a "
              "newer torch or convert it to safetensors");
    fail(0, "not a PyTorch checkpoint: does not start with a ZIP local header (\"PK\\3\\4\")");
  }
  zip_.emplace(bytes, path());

  // The pickle is <top>/data.pkl for exactly one top folder.
  const zip_entry* pkl = nullptr;
  for (const auto& e : zip_->entries()) {
    const auto slash = e.name.find('/');
    if (slash == std::string::npos || slash == 0 || e.name.substr(slash) != "/data.pkl") continue;
    if (pkl) fail(e.directory_offset, "two pickles in the archive: '" + pkl->name + "' and '" + e.name + "'");
    pkl = &e;
    top_ = e.name.substr(0, slash);
  }
  if (!pkl) fail(0, "no <folder>/data.pkl entry: not a torch.save archive");
  if (const auto* bo = zip_->find(top_ + "/byteorder")) {
    const auto d = zip_->data(*bo);
    const std::string_view order(reinterpret_cast<const char*>(d.data()), d.size());
    if (order != "little")
      fail(bo->data_offset, "byteorder is '" + std::string(order) + "'; only little-endian checkpoints are supported");
  }
  const auto pk = zip_->data(*pkl);
  zip_->verify_crc(*pkl);

  detail::pickle_machine m(pk, path(), pkl->data_offset, pkl->name);
  using node = detail::pickle_machine::node;
  const node& root = m.run();
  if (root.k != node::kind::dict) m.fail(root.at, "the pickled object is not a dict (state dict) of tensors");
  tensors_.reserve(root.items.size() / 2);
  for (std::size_t i = 0; i + 1 < root.items.size(); i += 2) {
    const node& k = *root.items[i];
    const node& v = *root.items[i + 1];
    if (k.k != node::kind::string) m.fail(k.at, "a state dict key that is not a string");
    if (v.k != node::kind::tensor) m.fail(v.at, "state dict entry '" + k.s + "' is not a tensor");
    if (index_.count(k.s)) m.fail(k.at, "duplicate state dict key '" + k.s + "'");
    add_tensor(k.s, v, m);
  }
}

inline void pytorch_checkpoint::add_tensor(const std::string& name, const detail::pickle_machine::node& t,
                                           const detail::pickle_machine& m) {
  const std::string who = "tensor '" + name + "'";
  const auto& st = *t.storage;
  const std::size_t es = size_of(t.element);

  pytorch_tensor_info info;
  info.name = name;
  info.element = t.element;
  info.shape = t.shape;
  info.strides = t.strides;
  info.storage_key = st.s;
  info.storage_offset = t.storage_offset;
  info.storage_numel = st.numel;

  // Element count, saturating, with overflow checks; a zero dimension makes it 0.
  constexpr auto max = std::numeric_limits<std::size_t>::max();
  std::size_t n = 1;
  bool overflow = false, empty = false;
  for (auto d : t.shape) {
    if (d == 0) empty = true;
    else if (n > max / d) overflow = true;
    else n *= d;
  }
  if (empty) {
    overflow = false;
    n = 0;
  }
  if (overflow || n > max / es) m.fail(t.at, who + " shape " + detail::shape_string(t.shape) + " overflows");

  // Row-major contiguity: the last stride is 1 and each outer one spans the
  // inner dimensions. A dimension of size 1 may carry any stride (torch
  // leaves them as they fall out of views); an empty tensor has no layout.
  if (n != 0) {
    std::size_t expect = 1;
    for (std::size_t d = t.shape.size(); d-- > 0;) {
      if (t.shape[d] != 1 && t.strides[d] != expect)
        m.fail(t.at, who + " is not contiguous: shape " + detail::shape_string(t.shape) + " has strides " +
                         detail::shape_string(t.strides) + ", expected row-major (call .contiguous() before saving)");
      expect *= t.shape[d];
    }
  }
  if (t.storage_offset > st.numel || n > st.numel - t.storage_offset)
    m.fail(t.at, who + " (" + std::to_string(n) + " elements at offset " + std::to_string(t.storage_offset) +
                     ") runs past its storage '" + st.s + "' of " + std::to_string(st.numel) + " elements");

  const std::string entry = top_ + "/data/" + st.s;
  const zip_entry* e = zip_->find(entry);
  if (!e) m.fail(st.at, who + " uses storage '" + st.s + "', but the archive has no entry '" + entry + "'");
  if (st.numel > max / es || e->size != st.numel * es)
    fail(e->directory_offset, "entry '" + entry + "' holds " + std::to_string(e->size) + " bytes, but its storage of " +
                                  std::to_string(st.numel) + " " + std::string(name_of(st.element)) + " elements needs " +
                                  (st.numel > max / es ? std::string("more than 2^64") : std::to_string(st.numel * es)));
  const auto data = zip_->data(*e);  // throws if compressed
  info.data = data.data() + t.storage_offset * es;
  info.nbytes = n * es;
  info.file_offset = m.file_offset(t.at);
  index_.emplace(name, tensors_.size());
  tensors_.push_back(std::move(info));
}

}  // namespace kestrel::io
