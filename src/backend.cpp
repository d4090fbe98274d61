// src/backend.cpp: cpu_backend's kernels and cpu_ref_backend's products
// (which share their dispatch), compiled once for this repository's own
// programs (the examples, the model and tools tests, kestrel-bench-cache).
// Those programs include the headers with KESTREL_SEPARATE defined and link
// the library kestrel_separate (meson.build), built from this file and
// src/load.cpp, two sources so that they compile in parallel. The library
// itself stays header-only for its users; see core/separate.hpp.
#define KESTREL_SEPARATE_IMPL
#include "kestrel/model/backend.hpp"

#if !defined(KESTREL_SEPARATE)
#error "src/backend.cpp is built with KESTREL_SEPARATE, as the programs that link it"
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
