// ultra tokenize -m MODEL "text": the token ids and pieces of a text.
//   MODEL: a .gguf (a vocabulary-only file is enough), a tokenizer.json, or a directory holding one.
//   --ids           only the ids, space-separated on one line
//   -f FILE         read the text from FILE ("-": standard input) instead of the argument
//   --add-special   add BOS/EOS as the vocabulary asks (without it none are added)
//   --no-parse-special  treat control-token text such as "<|endoftext|>" as plain text
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iterator>

#include "cli/commands.h"
#include "cli/common.h"
#include "ultra/model.h"

namespace ultra::cli {

namespace {

// Length of the well-formed UTF-8 sequence at p (1 to 4 bytes; Unicode 15, table 3-7), 0 if ill-formed.
int utf8_len(const unsigned char* p, size_t n) {
  const unsigned c = p[0];
  int len = 0;
  unsigned lo = 0x80, hi = 0xBF;  // bounds of the second byte
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF)
    len = 2;
  else if (c >= 0xE0 && c <= 0xEF)
    len = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4)
    len = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  else
    return 0;
  if (n < (size_t)len || p[1] < lo || p[1] > hi) return 0;
  for (int k = 2; k < len; ++k)
    if (p[k] < 0x80 || p[k] > 0xBF) return 0;
  return len;
}

// A piece for display: valid UTF-8 as is, control characters and ill-formed bytes escaped.
std::string printable(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
    const int k = utf8_len(p, s.size() - i);
    if (k > 1) {
      out.append(s.data() + i, (size_t)k);
      i += (size_t)k;
      continue;
    }
    const unsigned char c = *p;
    if (k == 1 && c >= 0x20 && c != 0x7F && c != '\\' && c != '\'') {
      out += (char)c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c == '\'') {
      out += "\\'";
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
    ++i;
  }
  return out;
}

}  // namespace

int cmd_tokenize(int argc, char** argv) {
  CLI::App app{"Print the token ids and pieces of a text", "ultra tokenize"};
  std::string model, file, text;
  bool ids_only = false, add_special = false, no_parse_special = false;
  app.add_option("-m,--model", model,
                 "model: .gguf (vocabulary-only is fine), tokenizer.json or HF directory")
      ->required();
  app.add_option("text", text, "the text to tokenize");
  app.add_option("-f,--file", file, "read the text from FILE ('-': standard input)");
  app.add_flag("--ids", ids_only, "print only the space-separated ids");
  app.add_flag("--add-special", add_special, "add BOS/EOS as the vocabulary asks");
  app.add_flag("--no-parse-special", no_parse_special, "do not recognise control tokens written in the text");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const bool has_text = app.count("text") > 0;
  if (has_text == !file.empty()) fail("give the text either as an argument or with -f FILE (exactly one)");

  const Tokenizer tok = Tokenizer::load(model);
  // The text is read in chunks and encoded as it comes (EncodeStream: the ids of the whole text), and the
  // listing (about 20 bytes per id) is written in chunks of about 64 KiB as it is formatted: the memory is
  // the tokenizer and a few chunks, whatever the size of the text.
  constexpr size_t kChunk = 1 << 16;
  std::string out;
  out.reserve(kChunk + 256);
  std::vector<int32_t> ids;
  size_t n_ids = 0;
  const auto list = [&] {
    for (const int32_t id : ids) {
      if (ids_only)
        fmt::format_to(std::back_inserter(out), "{}{}", n_ids ? " " : "", id);
      else
        fmt::format_to(std::back_inserter(out), "{:>7} -> '{}'\n", id, printable(tok.token_to_piece(id)));
      ++n_ids;
      if (out.size() >= kChunk) {
        write_stdout(out);
        out.clear();
      }
    }
    ids.clear();
  };
  EncodeStream enc(tok, add_special, !no_parse_special);
  if (file.empty()) {
    enc.feed(text, ids);
  } else {
    read_text_chunks(file, "input text file", [&](std::string_view chunk) {
      enc.feed(chunk, ids);
      list();
    });
  }
  enc.finish(ids);
  list();
  if (ids_only) out += '\n';
  write_stdout(out, /*flush=*/true);
  return 0;
}

}  // namespace ultra::cli
