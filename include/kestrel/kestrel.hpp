// kestrel/kestrel.hpp: the one public header.
//
//   #include <kestrel/kestrel.hpp>
//   auto file = kestrel::load_model_file("stories260K.gguf");
//   kestrel::llama_model<> model(file.weights, /*n_ctx=*/0, kestrel::cpu_backend(2));
//   const auto& tok = file.tokenizer;
//   kestrel::sampler_chain sampler({.temperature = 0.8f, .seed = 42});
//   auto prompt = tok.encode("Once upon a time", /*add_bos=*/true);
//   kestrel::generate(model, sampler, tok, prompt, 64, [](std::string_view s) { std::cout << s; });
#pragma once

#include "kestrel/core/buffer.hpp"
#include "kestrel/core/dtype.hpp"
#include "kestrel/core/error.hpp"
#include "kestrel/core/extents.hpp"
#include "kestrel/core/mmap.hpp"
#include "kestrel/core/tensor.hpp"
#include "kestrel/core/token.hpp"
#include "kestrel/cpu/kernels.hpp"
#include "kestrel/cpu/thread_pool.hpp"
#include "kestrel/engine/generate.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/io/gguf_write.hpp"
#include "kestrel/io/hf_model.hpp"
#include "kestrel/io/llama2c.hpp"
#include "kestrel/kv/concepts.hpp"
#include "kestrel/kv/contiguous.hpp"
#include "kestrel/model/backend.hpp"
#include "kestrel/model/config.hpp"
#include "kestrel/model/gguf_types.hpp"
#include "kestrel/model/hf.hpp"
#include "kestrel/model/llama.hpp"
#include "kestrel/model/load.hpp"
#include "kestrel/model/save.hpp"
#include "kestrel/model/weights.hpp"
#include "kestrel/quant/kquants.hpp"
#include "kestrel/quant/legacy.hpp"
#include "kestrel/sampler/samplers.hpp"
#include "kestrel/tokenizer/any.hpp"
#include "kestrel/tokenizer/bpe.hpp"
#include "kestrel/tokenizer/bpe_loaders.hpp"
#include "kestrel/tokenizer/chat_template.hpp"
#include "kestrel/tokenizer/detokenizer.hpp"
#include "kestrel/tokenizer/gguf_vocab.hpp"
#include "kestrel/tokenizer/llama2c_vocab.hpp"
#include "kestrel/tokenizer/pretokenize.hpp"
#include "kestrel/tokenizer/sentencepiece_model.hpp"
#include "kestrel/tokenizer/special.hpp"
#include "kestrel/tokenizer/spm.hpp"
