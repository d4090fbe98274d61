// src/load.cpp: load_model_file, with every file format's reader and the
// tokenizers' loaders, compiled once for this repository's own programs (as
// src/backend.cpp, which says how; core/separate.hpp).
#define KESTREL_SEPARATE_IMPL
#include "kestrel/model/load.hpp"

#if !defined(KESTREL_SEPARATE)
#error "src/load.cpp is built with KESTREL_SEPARATE, as the programs that link it"
#endif
