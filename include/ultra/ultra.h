// ultra: a C++20 inference engine for Llama-family language models. The whole public API:
//   model.h       Model::load, Tokenizer, TextStream (streaming detokenizer)
//   context.h     Context (KV slots, one batched step), Batch, per-sequence sampling
//   sampling.h    SamplingParams
//   grammar.h     check_grammar(): GBNF grammars for Context::set_grammar
//   generate.h    generate(): the prompt -> tokens loop on top of Context::step
//   speculative.h generate_speculative(): draft model and prompt-lookup speculation
//   perplexity.h  llama.cpp-style perplexity
//   convert.h     HF checkpoint -> GGUF
//   error.h       ultra::Error, the one exception type
#pragma once

#include "ultra/context.h"
#include "ultra/convert.h"
#include "ultra/error.h"
#include "ultra/generate.h"
#include "ultra/grammar.h"
#include "ultra/model.h"
#include "ultra/perplexity.h"
#include "ultra/sampling.h"
#include "ultra/speculative.h"
