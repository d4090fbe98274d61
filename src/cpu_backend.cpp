// src/cpu_backend.cpp: cpu_backend's kernels (and cpu_ref_backend's products, which
// share their dispatch) compiled once for this
// project's own programs (examples, the model tests, kestrel-bench-cache),
// which include the headers with KESTREL_CPU_BACKEND_EXTERN defined and link
// the library kestrel_cpu_backend (meson.build). The library itself stays
// header-only for its users; see model/backend.hpp.
#define KESTREL_CPU_BACKEND_IMPL
#include "kestrel/model/backend.hpp"

#if !defined(KESTREL_CPU_BACKEND_EXTERN)
#error "src/cpu_backend.cpp is built with KESTREL_CPU_BACKEND_EXTERN, as the programs that link it"
#endif

namespace kestrel {
// The attention templates for the KV cache's element types (kv/contiguous.hpp).
template void cpu_backend::attend<float>(const float*, const float*, const float*, std::size_t, std::size_t,
                                         std::size_t, float, float*, float*);
template void cpu_backend::attend<f16>(const float*, const f16*, const f16*, std::size_t, std::size_t, std::size_t,
                                       float, float*, float*);
template void cpu_backend::attend_block<float>(const cpu::basic_attend_block_args<float>&);
template void cpu_backend::attend_block<f16>(const cpu::basic_attend_block_args<f16>&);
}  // namespace kestrel
