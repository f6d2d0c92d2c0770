// Writes a vocabulary as GGUF tokenizer.ggml.* keys (llama.cpp's conventions), for `ultra convert`.
#pragma once

#include <string>

#include "tokenizer/vocab.h"

namespace ultra::gguf {
class Writer;
}

namespace ultra::tok {

// Byte-level BPE vocabularies become tokenizer.ggml.model "gpt2" with the tokenizer.ggml.pre name whose
// regexes equal the vocabulary's pre-tokenizer. Throws ultra::Error when the vocabulary has no GGUF form
// here (SentencePiece-style tokenizer.json, or a pre-tokenizer matching no known name).
void write_gguf_vocab(const Vocab& v, gguf::Writer& w);

// The GGUF pre-tokenizer name for a byte-level BPE vocabulary's split rules, or "" when none matches.
std::string find_pre_name(const Vocab& v);

}  // namespace ultra::tok
