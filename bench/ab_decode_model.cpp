// bench/ab_decode_model.cpp: one build of kestrel's decode as a shared
// object, for ab_decode.cpp (built by ab_decode.sh from each revision's
// include/). The model is llama_model with cpu_backend and an f16 KV cache,
// as kestrel-bench's default; the C functions below are all it exports
// (-fvisibility=hidden), so two builds of the same header-only code can
// live in one process.
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <type_traits>

#include "kestrel/kestrel.hpp"

namespace {
using model_t = kestrel::llama_model<kestrel::dynamic_llama_config, kestrel::cpu_backend, kestrel::f16_kv_cache>;
struct session {
  kestrel::model_file file;
  std::unique_ptr<model_t> model;
};
std::string last_error;

/// The weights' placement, from AB_PLACEMENT (ab_decode.sh --placement):
/// file, huge_pages, or automatic (the library's default, also when unset).
/// automatic decides per build at load time, so builds loaded one after the
/// other can end up placed differently (the later copies into fresh memory
/// slow enough to stop): a comparison of kernels wants one fixed placement.
kestrel::weight_placement placement_from_env() {
  const char* e = std::getenv("AB_PLACEMENT");
  if (e && std::strcmp(e, "file") == 0) return kestrel::weight_placement::file;
  if (e && std::strcmp(e, "huge_pages") == 0) return kestrel::weight_placement::huge_pages;
  return kestrel::weight_placement::automatic;
}
}  // namespace

#define AB_EXPORT extern "C" __attribute__((visibility("default")))

/// A model of n_ctx positions on n_threads threads, or null (ab_error says why).
AB_EXPORT void* ab_open(const char* path, std::size_t n_ctx, std::size_t n_threads) {
  try {
    auto s = std::make_unique<session>(session{kestrel::load_model_file(path), nullptr});
    s->model = std::make_unique<model_t>(s->file.weights, n_ctx, kestrel::cpu_backend(n_threads, placement_from_env()));
    return s.release();
  } catch (const std::exception& e) {
    last_error = e.what();
    return nullptr;
  }
}
AB_EXPORT const char* ab_error() { return last_error.c_str(); }
AB_EXPORT std::size_t ab_vocab(void* s) { return static_cast<session*>(s)->model->n_vocab(); }
AB_EXPORT void ab_reset(void* s) { static_cast<session*>(s)->model->reset(); }
AB_EXPORT void ab_decode(void* s, int token) {
  static_cast<session*>(s)->model->decode(static_cast<kestrel::token_id>(token));
}
/// Prefills the n tokens at `tokens` from the model's current position
/// (read in place: no copy inside the timed call).
AB_EXPORT void ab_prefill(void* s, const int* tokens, std::size_t n) {
  static_assert(std::is_same_v<kestrel::token_id, int>);
  static_cast<session*>(s)->model->prefill(std::span<const kestrel::token_id>(tokens, n));
}
AB_EXPORT void ab_close(void* s) { delete static_cast<session*>(s); }
