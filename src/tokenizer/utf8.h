// UTF-8 helpers shared by the tokenizer: well-formedness per Unicode 15 table 3-7 (no overlongs, no
// surrogates, nothing above U+10FFFF), and the GPT-2 byte <-> unicode mapping of byte-level BPE.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ultra::tok::utf8 {

// Classifies the bytes at s[0..n) (n >= 1):
//   > 0: a complete well-formed sequence of that many bytes;
//   = 0: a well-formed but truncated prefix (all n bytes belong to it; more input could complete it);
//   < 0: -k, where the first k bytes are the maximal ill-formed subpart (k >= 1), to be replaced by one
//        U+FFFD as in the WHATWG / Unicode "maximal subpart" practice.
inline int classify(const unsigned char* s, size_t n) {
  const unsigned c = s[0];
  if (c < 0x80) return 1;
  int len;
  unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int i = 1; i < len; ++i) {
    if ((size_t)i >= n) return 0;
    const unsigned b = s[i];
    const unsigned l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) return -i;
  }
  return len;
}

// Length of the unit starting at s[0..n): a well-formed sequence, or 1 for any ill-formed or truncated
// byte (which then stands for itself).
inline size_t unit_len(const char* s, size_t n) {
  const int k = classify(reinterpret_cast<const unsigned char*>(s), n);
  return k > 0 ? (size_t)k : 1;
}

// Decodes the well-formed sequence of length len at s.
inline uint32_t decode(const char* s, size_t len) {
  const auto* u = reinterpret_cast<const unsigned char*>(s);
  switch (len) {
    case 1:
      return u[0];
    case 2:
      return ((u[0] & 0x1Fu) << 6) | (u[1] & 0x3Fu);
    case 3:
      return ((u[0] & 0x0Fu) << 12) | ((u[1] & 0x3Fu) << 6) | (u[2] & 0x3Fu);
    default:
      return ((u[0] & 0x07u) << 18) | ((u[1] & 0x3Fu) << 12) | ((u[2] & 0x3Fu) << 6) | (u[3] & 0x3Fu);
  }
}

inline void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += (char)cp;
  } else if (cp < 0x800) {
    out += (char)(0xC0 | (cp >> 6));
    out += (char)(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += (char)(0xE0 | (cp >> 12));
    out += (char)(0x80 | ((cp >> 6) & 0x3F));
    out += (char)(0x80 | (cp & 0x3F));
  } else {
    out += (char)(0xF0 | (cp >> 18));
    out += (char)(0x80 | ((cp >> 12) & 0x3F));
    out += (char)(0x80 | ((cp >> 6) & 0x3F));
    out += (char)(0x80 | (cp & 0x3F));
  }
}

// U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's visible space.
inline constexpr std::string_view kMetaSpace = "\xE2\x96\x81";
// U+FFFD REPLACEMENT CHARACTER.
inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// GPT-2 bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100...
// byte_to_cp(b) is that code point; cp_to_byte(cp) is the inverse, or -1 for a code point outside the map.
uint32_t byte_to_cp(uint8_t b);
int cp_to_byte(uint32_t cp);
// The UTF-8 text of byte_to_cp(b) (1 or 2 bytes).
std::string_view byte_to_unicode(uint8_t b);

}  // namespace ultra::tok::utf8
