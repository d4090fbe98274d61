// kestrel/io/hf_model.hpp: a Hugging Face model directory: config.json plus
// the weights, in whichever of the layouts transformers writes:
//   model.safetensors                    one safetensors file
//   model.safetensors.index.json         sharded: {"metadata": {...},
//                                          "weight_map": {tensor name: shard file}}
//   pytorch_model.bin                    one torch.save zip checkpoint
//   pytorch_model.bin.index.json         sharded, same index format
// looked for in that order (as transformers does: safetensors first, a
// single file before an index).
//
// No model knowledge: tensors are found by their HF names; mapping them to a
// model is the loader's job. With an index, the index is the listing: a
// tensor a shard holds but the weight_map does not name is not visible. Every shard is opened once and held by a
// shared_ptr; each tensor_ref shares its shard's mapping, so views stay
// valid after this object is gone.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/io/json.hpp"
#include "kestrel/io/pytorch.hpp"
#include "kestrel/io/safetensors.hpp"
#include "kestrel/io/tensor_ref.hpp"

namespace kestrel::io {

class hf_model {
 public:
  enum class weight_format { safetensors, pytorch };

  /// Opens `dir`: reads config.json, finds the weights, opens every shard
  /// and checks that every indexed tensor is in its shard. Throws
  /// kestrel::file_error on anything missing or malformed.
  explicit hf_model(const std::filesystem::path& dir) : dir_(dir) { open(); }

  const std::filesystem::path& directory() const noexcept { return dir_; }
  /// The parsed config.json (hidden_size, num_hidden_layers, ...).
  const json_value& config() const noexcept { return config_; }
  weight_format format() const noexcept { return format_; }
  /// The index file, or the single weights file.
  const std::filesystem::path& weights_path() const noexcept { return weights_path_; }
  /// The shard files, in the order they were first named.
  std::vector<std::filesystem::path> shard_paths() const {
    std::vector<std::filesystem::path> out;
    for (const auto& s : shards_) out.push_back(std::visit([](const auto& p) { return p->path(); }, s));
    return out;
  }

  /// The shards' file mappings (read-only, private), where tensor() views point.
  std::vector<std::span<const std::byte>> mapped_bytes() const {
    std::vector<std::span<const std::byte>> out;
    for (const auto& s : shards_) out.push_back(std::visit([](const auto& p) { return p->file().bytes(); }, s));
    return out;
  }

  /// Tensor names: the file's order for one file, the index's order for shards.
  const std::vector<std::string>& names() const noexcept { return names_; }
  bool has(std::string_view name) const { return where_.find(name) != where_.end(); }
  /// nullptr if there is no tensor `name`.
  const stored_tensor* find(std::string_view name) const {
    auto it = where_.find(name);
    return it == where_.end() ? nullptr : it->second.info;
  }
  /// Throws file_error naming the weights file when `name` is missing.
  const stored_tensor& info(std::string_view name) const {
    if (const auto* t = find(name)) return *t;
    throw file_error(weights_path_.string(), "missing tensor '" + std::string(name) + "'");
  }
  /// A view with a kernel dtype (F32/F16/BF16); throws if missing or another type.
  tensor_ref tensor(std::string_view name) const {
    auto it = where_.find(name);
    if (it == where_.end()) (void)info(name);  // throws
    return std::visit([&](const auto& p) { return p->tensor(name); }, shards_[it->second.shard]);
  }

 private:
  using shard = std::variant<std::shared_ptr<const safetensors_file>, std::shared_ptr<const pytorch_checkpoint>>;
  struct location {
    std::size_t shard;
    const stored_tensor* info;
  };

  void open();
  void open_index(const std::filesystem::path& index);
  template <class Reader>
  void add_all(const Reader& r, std::size_t shard_index) {
    for (const auto& t : r.tensors()) {
      names_.push_back(t.name);
      where_.emplace(t.name, location{shard_index, &t});
    }
  }

  std::filesystem::path dir_;
  json_value config_;
  weight_format format_ = weight_format::safetensors;
  std::filesystem::path weights_path_;
  std::vector<shard> shards_;
  std::vector<std::string> names_;
  std::map<std::string, location, std::less<>> where_;
};

inline void hf_model::open() {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec))
    throw file_error(dir_.string(), fs::exists(dir_, ec) ? "is not a directory, expected a Hugging Face model directory"
                                                          : "no such directory");
  const auto config = dir_ / "config.json";
  if (!fs::exists(config, ec))
    throw file_error(config.string(), "missing: a Hugging Face model directory needs config.json");
  config_ = read_json_file(config);
  if (!config_.is_object()) throw file_error(config.string(), 0, "config.json is not a JSON object");

  const fs::path candidates[] = {dir_ / "model.safetensors", dir_ / "model.safetensors.index.json",
                                 dir_ / "pytorch_model.bin", dir_ / "pytorch_model.bin.index.json"};
  for (std::size_t i = 0; i < 4; ++i) {
    if (!fs::exists(candidates[i], ec)) continue;
    weights_path_ = candidates[i];
    format_ = i < 2 ? weight_format::safetensors : weight_format::pytorch;
    if (i % 2 == 1) return open_index(candidates[i]);
    if (format_ == weight_format::safetensors) {
      auto f = std::make_shared<const safetensors_file>(candidates[i]);
      add_all(*f, 0);
      shards_.emplace_back(std::move(f));
    } else {
      auto f = std::make_shared<const pytorch_checkpoint>(candidates[i]);
      add_all(*f, 0);
      shards_.emplace_back(std::move(f));
    }
    return;
  }
  throw file_error(dir_.string(), "no weights: expected model.safetensors, model.safetensors.index.json, "
                                  "pytorch_model.bin or pytorch_model.bin.index.json");
}

inline void hf_model::open_index(const std::filesystem::path& index) {
  namespace fs = std::filesystem;
  const std::string ipath = index.string();
  const json_value doc = read_json_file(index);
  if (!doc.is_object()) throw file_error(ipath, 0, "the index is not a JSON object");
  const json_value* map = doc.find("weight_map");
  if (!map) throw file_error(ipath, doc.offset(), "the index has no \"weight_map\"");
  if (!map->is_object()) throw file_error(ipath, map->offset(), "\"weight_map\" is not an object");

  std::map<std::string, std::size_t, std::less<>> shard_of_file;
  for (const auto& [name, file_v] : map->as_object()) {
    if (!file_v.is_string())
      throw file_error(ipath, file_v.offset(), "weight_map entry '" + name + "' is not a file name string");
    const std::string& file = file_v.as_string();
    // Shards sit beside the index: a name that leaves the directory is refused.
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
        file.find('\\') != std::string::npos)
      throw file_error(ipath, file_v.offset(), "weight_map entry '" + name + "' names shard '" + file +
                                                   "', expected a plain file name in the same directory");
    if (where_.find(name) != where_.end())
      throw file_error(ipath, file_v.offset(), "duplicate weight_map entry '" + name + "'");

    auto it = shard_of_file.find(file);
    if (it == shard_of_file.end()) {
      const fs::path p = dir_ / file;
      std::error_code ec;
      if (!fs::exists(p, ec))
        throw file_error(ipath, file_v.offset(), "weight_map entry '" + name + "' names shard '" + file +
                                                     "', which does not exist in " + dir_.string());
      if (format_ == weight_format::safetensors) shards_.emplace_back(std::make_shared<const safetensors_file>(p));
      else shards_.emplace_back(std::make_shared<const pytorch_checkpoint>(p));
      it = shard_of_file.emplace(file, shards_.size() - 1).first;
    }
    const stored_tensor* t = std::visit([&](const auto& s) -> const stored_tensor* { return s->find(name); },
                                        shards_[it->second]);
    if (!t)
      throw file_error(ipath, file_v.offset(), "weight_map puts tensor '" + name + "' in shard '" + file +
                                                   "', which does not hold it");
    names_.push_back(name);
    where_.emplace(name, location{it->second, t});
  }
}

}  // namespace kestrel::io
