#include "tokenizer/utf8.h"

#include <array>

namespace ultra::tok::utf8 {

namespace {

struct ByteMap {
  std::array<uint32_t, 256> cp{};
  std::array<int16_t, 512> inv{};
  std::array<std::string, 256> text;
  ByteMap() {
    inv.fill(-1);
    auto printable = [](unsigned b) {
      return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    };
    uint32_t n = 0;
    for (unsigned b = 0; b < 256; ++b) {
      cp[b] = printable(b) ? b : 256 + n++;
      inv[cp[b]] = (int16_t)b;
      append(text[b], cp[b]);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

}  // namespace

uint32_t byte_to_cp(uint8_t b) {
  return byte_map().cp[b];
}

int cp_to_byte(uint32_t cp) {
  return cp < 512 ? byte_map().inv[cp] : -1;
}

std::string_view byte_to_unicode(uint8_t b) {
  return byte_map().text[b];
}

}  // namespace ultra::tok::utf8
