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
// (backend.hpp instantiates the attention templates for the cache's element
// types here, as it does in any program's KESTREL_SEPARATE_IMPL source.)
