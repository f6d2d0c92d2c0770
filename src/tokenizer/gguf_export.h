// Writes a vocabulary as GGUF tokenizer.ggml.* keys (llama.cpp's conventions), for `ultra convert`.
#pragma once

#include <cstddef>
#include <string>

#include "tokenizer/vocab.h"

namespace ultra::gguf {
class Writer;
}

namespace ultra::tok {

// Byte-level BPE vocabularies become tokenizer.ggml.model "gpt2" with the tokenizer.ggml.pre name whose
// regexes equal the vocabulary's pre-tokenizer. The token list is padded to n_vocab (the model's embedding
// rows) with "[PAD{id}]" tokens of type UNUSED, which also fill ids the vocabulary leaves undefined, as
// llama.cpp's converter does. Throws ultra::Error when the vocabulary has no GGUF form here
// (SentencePiece-style tokenizer.json, or a pre-tokenizer matching no known name) or has more than n_vocab
// tokens.
void write_gguf_vocab(const Vocab& v, gguf::Writer& w, size_t n_vocab);

// The GGUF pre-tokenizer name for a byte-level BPE vocabulary's split rules, or "" when none matches.
std::string find_pre_name(const Vocab& v);

}  // namespace ultra::tok
