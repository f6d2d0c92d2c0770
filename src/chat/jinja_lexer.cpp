// Jinja lexer: template text and tags to tokens, with jinja2's whitespace control in HF transformers'
// environment (trim_blocks, lstrip_blocks, `-` on either side of a tag, `+` to keep lstrip off).
#include <fmt/format.h>

#include <cctype>

#include "chat/jinja.h"

namespace ultra::jinja {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

struct Lexer {
  const std::string& src;
  size_t pos = 0;
  int line = 1;
  std::vector<Token> out;

  void advance(size_t n) {
    for (size_t k = 0; k < n && pos < src.size(); ++k, ++pos)
      if (src[pos] == '\n') ++line;
  }

  // Tokens of one tag until its closer; returns whether the closer had a `-`.
  bool lex_tag(const char* closer, int open_line) {
    int depth = 0;
    while (true) {
      while (pos < src.size() && is_space(src[pos])) advance(1);
      if (pos >= src.size())
        error_at(open_line, fmt::format("unexpected end of template: '{}' not closed", closer));
      const std::string_view rest(src.data() + pos, src.size() - pos);
      if (depth == 0 || closer[0] != '}') {
        if (rest.substr(0, 3) == std::string("-") + closer ||
            rest.substr(0, 3) == std::string("+") + closer) {
          const bool minus = rest[0] == '-';
          advance(3);
          return minus;
        }
        if (rest.substr(0, 2) == closer) {
          advance(2);
          return false;
        }
      }
      const char c = src[pos];
      Token t{Tok::Op, "", line};
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos;
        while (e < src.size() && (std::isalnum(static_cast<unsigned char>(src[e])) || src[e] == '_')) ++e;
        t.type = Tok::Name;
        t.text = src.substr(pos, e - pos);
        advance(e - pos);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = pos;
        bool is_float = false;
        while (e < src.size() && (std::isdigit(static_cast<unsigned char>(src[e])) || src[e] == '_')) ++e;
        if (e + 1 < src.size() && src[e] == '.' && std::isdigit(static_cast<unsigned char>(src[e + 1]))) {
          is_float = true;
          ++e;
          while (e < src.size() && (std::isdigit(static_cast<unsigned char>(src[e])) || src[e] == '_')) ++e;
        }
        if (e < src.size() && (src[e] == 'e' || src[e] == 'E')) {
          size_t x = e + 1;
          if (x < src.size() && (src[x] == '+' || src[x] == '-')) ++x;
          if (x < src.size() && std::isdigit(static_cast<unsigned char>(src[x]))) {
            is_float = true;
            e = x;
            while (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e]))) ++e;
          }
        }
        std::string spelled;
        for (size_t k = pos; k < e; ++k)
          if (src[k] != '_') spelled += src[k];
        t.text = spelled;
        if (is_float) {
          t.type = Tok::Float;
          t.fval = std::strtod(spelled.c_str(), nullptr);
        } else {
          t.type = Tok::Int;
          errno = 0;
          const unsigned long long v = std::strtoull(spelled.c_str(), nullptr, 10);
          if (errno || v > uint64_t(INT64_MAX)) error_at(line, "integer literal too large");
          t.ival = int64_t(v);
        }
        advance(e - pos);
      } else if (c == '\'' || c == '"') {
        t.type = Tok::String;
        size_t e = pos + 1;
        std::string val;
        while (true) {
          if (e >= src.size()) error_at(line, "unterminated string literal");
          const char d = src[e];
          if (d == c) break;
          if (d == '\\' && e + 1 < src.size()) {
            const char x = src[e + 1];
            e += 2;
            switch (x) {
              case 'n':
                val += '\n';
                break;
              case 't':
                val += '\t';
                break;
              case 'r':
                val += '\r';
                break;
              case 'b':
                val += '\b';
                break;
              case 'f':
                val += '\f';
                break;
              case 'v':
                val += '\v';
                break;
              case 'a':
                val += '\a';
                break;
              case '0':
                val += '\0';
                break;
              case '\\':
                val += '\\';
                break;
              case '\'':
                val += '\'';
                break;
              case '"':
                val += '"';
                break;
              case '\n':
                break;
              case 'x':
              case 'u':
              case 'U': {
                const size_t n = x == 'x' ? 2 : x == 'u' ? 4 : 8;
                if (e + n > src.size()) error_at(line, "truncated escape in string literal");
                uint32_t cp = 0;
                for (size_t k = 0; k < n; ++k) {
                  const char h = src[e + k];
                  if (!std::isxdigit(static_cast<unsigned char>(h)))
                    error_at(line, "bad escape in string literal");
                  cp = cp * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(h))
                                              ? h - '0'
                                              : (std::tolower(h) - 'a' + 10));
                }
                if (cp > 0x10FFFF) error_at(line, "bad escape in string literal");
                append_utf8(val, cp);
                e += n;
                break;
              }
              default:
                val += '\\';
                val += x;
            }
            continue;
          }
          val += d;
          ++e;
        }
        t.text = std::move(val);
        advance(e + 1 - pos);
      } else {
        static const char* const two[] = {"**", "//", "==", "!=", "<=", ">="};
        bool found = false;
        for (const char* op : two)
          if (rest.substr(0, 2) == op) {
            t.text = op;
            found = true;
          }
        if (!found) {
          if (std::string_view("+-*/%~<>=()[]{},.:|").find(c) == std::string_view::npos)
            error_at(line, fmt::format("unexpected character '{}'", c));
          t.text = std::string(1, c);
          if (c == '(' || c == '[' || c == '{') ++depth;
          if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
        }
        advance(t.text.size());
      }
      out.push_back(std::move(t));
    }
  }

  void run() {
    bool line_starting = true;
    bool strip_next = false;  // the previous tag ended with `-`
    while (pos < src.size()) {
      size_t open = pos;
      while (true) {
        open = src.find('{', open);
        if (open == std::string::npos || open + 1 >= src.size()) {
          open = std::string::npos;
          break;
        }
        const char n = src[open + 1];
        if (n == '{' || n == '%' || n == '#') break;
        ++open;
      }
      std::string text = src.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
      if (strip_next) {
        size_t k = 0;
        while (k < text.size() && is_space(text[k])) ++k;
        text.erase(0, k);
      }
      const int text_line = line;
      if (open == std::string::npos) {
        advance(src.size() - pos);
        if (!text.empty()) out.push_back({Tok::Text, std::move(text), text_line});
        break;
      }
      const char kind = src[open + 1];
      const char sign = open + 2 < src.size() ? src[open + 2] : 0;
      if (sign == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (sign != '+' && kind != '{') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting) {
          bool blank = true;
          for (size_t k = l_pos; k < text.size(); ++k)
            if (text[k] != ' ' && text[k] != '\t') blank = false;
          if (blank) text.erase(l_pos);
        }
      }
      advance(open - pos);
      if (!text.empty()) out.push_back({Tok::Text, std::move(text), text_line});
      const int tag_line = line;
      advance(sign == '-' || sign == '+' ? 3 : 2);
      if (kind == '#') {
        size_t close = src.find("#}", pos);
        if (close == std::string::npos) error_at(tag_line, "unterminated comment");
        strip_next = close > pos && src[close - 1] == '-';
        advance(close + 2 - pos);
        if (!strip_next && pos < src.size() && src[pos] == '\n') advance(1);
        line_starting = pos > 0 && src[pos - 1] == '\n';
        continue;
      }
      if (kind == '{') {
        out.push_back({Tok::VarBegin, "", tag_line});
        strip_next = lex_tag("}}", tag_line);
        out.push_back({Tok::VarEnd, "", line});
        line_starting = false;
      } else {
        // {% raw %}...{% endraw %}: the text between, verbatim.
        size_t p = pos;
        while (p < src.size() && is_space(src[p])) ++p;
        if (src.compare(p, 3, "raw") == 0 &&
            (p + 3 >= src.size() || !std::isalnum((unsigned char)src[p + 3]))) {
          const size_t close = src.find("%}", p);
          if (close == std::string::npos) error_at(tag_line, "unterminated raw block");
          const bool strip_after = src[close - 1] == '-';
          advance(close + 2 - pos);
          size_t end = pos;
          size_t body_end;
          while (true) {
            end = src.find("{%", end);
            if (end == std::string::npos) error_at(tag_line, "missing endraw");
            size_t q = end + 2;
            if (q < src.size() && (src[q] == '-' || src[q] == '+')) ++q;
            while (q < src.size() && is_space(src[q])) ++q;
            if (src.compare(q, 6, "endraw") == 0) {
              body_end = end;
              break;
            }
            end += 2;
          }
          std::string body = src.substr(pos, body_end - pos);
          if (strip_after) {
            size_t k = 0;
            while (k < body.size() && is_space(body[k])) ++k;
            body.erase(0, k);
          } else if (!body.empty() && body[0] == '\n') {
            body.erase(0, 1);
          }
          if (src[body_end + 2] == '-')
            while (!body.empty() && is_space(body.back())) body.pop_back();
          const size_t close2 = src.find("%}", body_end);
          if (close2 == std::string::npos) error_at(tag_line, "unterminated endraw");
          strip_next = src[close2 - 1] == '-';
          if (!body.empty()) out.push_back({Tok::Text, std::move(body), tag_line});
          advance(close2 + 2 - pos);
          if (!strip_next && pos < src.size() && src[pos] == '\n') advance(1);
          line_starting = pos > 0 && src[pos - 1] == '\n';
          continue;
        }
        out.push_back({Tok::BlockBegin, "", tag_line});
        strip_next = lex_tag("%}", tag_line);
        out.push_back({Tok::BlockEnd, "", line});
        if (!strip_next && pos < src.size() && src[pos] == '\n') advance(1);
        line_starting = pos > 0 && src[pos - 1] == '\n';
      }
    }
    out.push_back({Tok::End, "", line});
  }
};

}  // namespace

std::vector<Token> lex(const std::string& source) {
  Lexer lx{source, 0, 1, {}};
  lx.run();
  return std::move(lx.out);
}

}  // namespace ultra::jinja
