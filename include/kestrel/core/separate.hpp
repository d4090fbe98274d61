// kestrel/core/separate.hpp: separate compilation of the heavy parts, for a
// program's own build. The header-only use needs none of it.
//
// With KESTREL_SEPARATE defined, the entry points that pull in most of the
// library's code are declared in the headers and not defined:
//   - cpu_backend's kernels (its products, norms, rope, attention,
//     prepare_weights) and cpu_ref_backend's products (model/backend.hpp);
//   - load_model_file, with every file format's reader and the tokenizers'
//     loaders (model/load.hpp).
// So a translation unit that builds a model does not compile them again. A
// translation unit that also defines KESTREL_SEPARATE_IMPL defines those of
// the headers it includes; each header's in exactly one of a program's
// (this repository's src/backend.cpp and src/load.cpp, the library
// kestrel_separate in meson.build). Every translation unit of a program must
// agree on KESTREL_SEPARATE. The same code either way: only where it is
// compiled differs.
//
// Measured on a 2-core Xeon host: examples/simple.cpp compiled in 128-155 s
// header-only (86% of it optimizing and generating code; the kernels 62% of
// its object code, the file readers 20%), 51 s with the kernels apart.
#pragma once

#if !defined(KESTREL_SEPARATE)
#define KESTREL_SEPARATE_DEFINE 1  // the definitions are in the headers
#define KESTREL_SEPARATE_INLINE inline
#elif defined(KESTREL_SEPARATE_IMPL)
#define KESTREL_SEPARATE_DEFINE 1
#define KESTREL_SEPARATE_INLINE  // defined once, with external linkage
#else
#define KESTREL_SEPARATE_DEFINE 0  // declared only
#define KESTREL_SEPARATE_INLINE
#endif
