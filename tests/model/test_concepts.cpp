// The model layer's concepts accept what they should and reject the rest
// (compile-time checks; a wrong policy fails to compile with a concept error).
#include <doctest/doctest.h>

#include "kestrel/kv/contiguous.hpp"
#include "kestrel/model/backend.hpp"
#include "kestrel/model/llama.hpp"

using namespace kestrel;

namespace {
struct no_attend {  // a backend missing one operation
  void matvec(const weight_view&, const float*, float*) {}
  void matmul(const weight_view&, const float*, std::size_t, float*) {}
  void row_to_f32(const weight_view&, std::size_t, float*) {}
  void rmsnorm(float*, const float*, const float*, std::size_t, float) {}
  void layernorm(float*, const float*, const float*, const float*, std::size_t, float) {}
  void rope(float*, std::size_t, std::size_t, std::size_t, const cpu::rope_spec&) {}
  void swiglu(float*, const float*, const float*, std::size_t) {}
  void gelu(float*, const float*, std::size_t) {}
  void add(float*, const float*, std::size_t) {}
  template <class F>
  void parallel_for(std::size_t n, F&& f, std::size_t) { f(std::size_t{0}, n); }
  std::size_t n_threads() const { return 1; }
};
}  // namespace

static_assert(Backend<cpu_backend>);
static_assert(Backend<cpu_ref_backend>);
static_assert(!Backend<int>);
static_assert(!Backend<no_attend>);
static_assert(!Backend<contiguous_kv_cache>);
static_assert(GenerativeModel<llama_model<>>);
static_assert(!GenerativeModel<int>);
static_assert(!GenerativeModel<cpu_backend>);
static_assert(KvCache<contiguous_kv_cache>);
static_assert(!KvCache<cpu_backend>);

TEST_CASE("model concepts: compile-time checks above") { CHECK(true); }
