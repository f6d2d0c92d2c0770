// Encoding a text that arrives in pieces (a file read in chunks), in memory bounded by the chunk rather than
// the text, with exactly the ids of Tokenizer::encode of the whole text.
//
// The text is cut only where the whole-text encoder's result cannot depend on what lies across the cut:
//   - special / added tokens: an occurrence is taken once the bytes after its start cover the longest such
//     token (leftmost-longest is then decided); with a token that strips the whitespace on its left, a
//     trailing run of whitespace waits for what follows it;
//   - between them, the normalised raw text (spaces escaped, the prefix rule applied once at the text's or
//     the fragment's start) is encoded as it grows past `chunk` bytes:
//       byte-level / SentencePiece-style BPE with a pre-tokenizer: up to the last pre-token that is certain,
//         found by running the first split regex with PCRE2's hard partial matching (see
//         PreTokenizer::split_from); each pre-token is encoded on its own, as in the whole text;
//       SentencePiece (scores): up to a point that no token's text straddles (SpmModel::cut);
//       BPE without a pre-tokenizer: the fragment is one word, encoded when it ends.
//   When no cut is found (one pre-token of megabytes, a fragment no cut fits), the text is held until one
//   is: more memory, never different ids. The next look for a cut waits until the held text has doubled,
//   so the work stays linear.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace ultra::tok {

class EncodeStream {
 public:
  // As Tokenizer::encode(text, out, add_special, parse_special) of the concatenated input. chunk: bytes of
  // raw text to gather before looking for a cut (small values put cuts everywhere, for tests).
  EncodeStream(const Tokenizer& tok, bool add_special, bool parse_special, size_t chunk = 1 << 16);
  ~EncodeStream();
  EncodeStream(EncodeStream&&) noexcept;
  EncodeStream& operator=(EncodeStream&&) noexcept;

  // Appends to out the ids that the input so far determines; the rest of it is held back.
  void feed(std::string_view text, std::vector<int32_t>& out);
  // End of the input: appends the remaining ids. Afterwards the stream may only be destroyed.
  void finish(std::vector<int32_t>& out);
  // Bytes of input held back (not yet encoded).
  size_t held() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace ultra::tok
