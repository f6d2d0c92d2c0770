#include "grammar/grammar_matcher.h"

#include <algorithm>

#include "core/error.h"

namespace ultra::grammar {

namespace matcher_detail {

// Smallest code point that a UTF-8 sequence of len bytes may encode (shorter forms are overlong).
uint32_t min_code_point(uint8_t len) {
  return len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
}

bool is_surrogate(uint32_t c) {
  return c >= 0xD800 && c <= 0xDFFF;
}

size_t hash_node(uint32_t elem, uint32_t parent) {
  uint64_t h = ((uint64_t)elem << 32 | parent) * 0x9E3779B97F4A7C15ull;
  return (size_t)(h ^ (h >> 29));
}

}  // namespace matcher_detail

Matcher::Matcher(std::shared_ptr<const Grammar> grammar, Limits limits)
    : g_(std::move(grammar)), limits_(limits) {
  if (!g_ || g_->elements.size() < 2 || g_->elements[Grammar::kStart].op != Op::Rule) {
    fail("grammar matcher: no grammar (parse one with parse_gbnf)");
  }
  limits_.max_nodes = std::min<size_t>(std::max<size_t>(limits_.max_nodes, 2), kFree - 1);
  nodes_.reserve(limits_.reserve_nodes);
  mark_.reserve(limits_.reserve_nodes);
  heads_.reserve(limits_.reserve_heads);
  next_.reserve(limits_.reserve_heads);
  todo_.reserve(limits_.reserve_heads);
  nodes_.push_back({Grammar::kStart + 1, kFree});  // the empty stack: nothing left to match
  mark_.push_back(0);
  size_t n_slots = 16;
  while (n_slots < 2 * limits_.reserve_nodes) n_slots *= 2;
  rehash(n_slots);
  begin_step();
  closure(intern(Grammar::kStart, kEmptyStack));
  initial_ = next_;
  set_heads(initial_);
}

void Matcher::rehash(size_t n_slots) {
  slots_.assign(n_slots, kFree);
  const size_t mask = n_slots - 1;
  for (uint32_t id = 1; id < nodes_.size(); ++id) {
    size_t i = matcher_detail::hash_node(nodes_[id].elem, nodes_[id].parent) & mask;
    while (slots_[i] != kFree) i = (i + 1) & mask;
    slots_[i] = id;
  }
}

uint32_t Matcher::intern(uint32_t elem, uint32_t parent) {
  const size_t mask = slots_.size() - 1;
  size_t i = matcher_detail::hash_node(elem, parent) & mask;
  while (slots_[i] != kFree) {
    const Node& n = nodes_[slots_[i]];
    if (n.elem == elem && n.parent == parent) return slots_[i];
    i = (i + 1) & mask;
  }
  if (nodes_.size() >= limits_.max_nodes) {
    fail("grammar matcher: more than {} distinct parser stacks (input nested too deeply)", limits_.max_nodes);
  }
  const auto id = (uint32_t)nodes_.size();
  nodes_.push_back({elem, parent});
  mark_.push_back(0);
  slots_[i] = id;
  if (2 * nodes_.size() > slots_.size()) rehash(2 * slots_.size());
  return id;
}

void Matcher::begin_step() {
  if (++epoch_ == 0) {  // wrapped: forget every mark
    std::fill(mark_.begin(), mark_.end(), 0);
    epoch_ = 1;
  }
  next_.clear();
}

void Matcher::closure(uint32_t start) {
  const Grammar& g = *g_;
  todo_.push_back(start);
  while (!todo_.empty()) {
    const uint32_t n = todo_.back();
    todo_.pop_back();
    if (mark_[n] == epoch_) continue;
    mark_[n] = epoch_;
    if (n == kEmptyStack) {
      next_.push_back(n);
      continue;
    }
    const Node node = nodes_[n];  // a copy: intern() below may move nodes_
    const Element& e = g.elements[node.elem];
    if (e.op == Op::Chars) {
      next_.push_back(n);
      continue;
    }
    // A rule reference: replace it by each alternative, with what follows it in its own body beneath.
    const uint32_t after = node.elem + 1;
    const uint32_t base = g.ends_alternative(after) ? node.parent : intern(after, node.parent);
    for (uint32_t k = g.rule_alts[e.a]; k < g.rule_alts[e.a + 1]; ++k) {
      const uint32_t s = g.alt_start[k];
      todo_.push_back(g.ends_alternative(s) ? base : intern(s, base));
    }
  }
}

void Matcher::set_heads(const std::vector<uint32_t>& heads) {
  heads_.assign(heads.begin(), heads.end());
  complete_ = std::find(heads_.begin(), heads_.end(), kEmptyStack) != heads_.end();
}

bool Matcher::accept_code_point(uint32_t c) {
  if (n_remain_ != 0 || c > kMaxCodePoint || matcher_detail::is_surrogate(c)) return false;
  const Grammar& g = *g_;
  begin_step();
  for (uint32_t h : heads_) {
    if (h == kEmptyStack) continue;
    const Node node = nodes_[h];
    if (!g.matches(node.elem, c)) continue;
    const uint32_t after = node.elem + 1;
    closure(g.ends_alternative(after) ? node.parent : intern(after, node.parent));
  }
  if (next_.empty()) return false;
  heads_.swap(next_);
  complete_ = std::find(heads_.begin(), heads_.end(), kEmptyStack) != heads_.end();
  return true;
}

bool Matcher::allows_any_in(uint32_t lo, uint32_t hi) const {
  for (uint32_t h : heads_) {
    if (h != kEmptyStack && g_->matches_any_in(nodes_[h].elem, lo, hi)) return true;
  }
  return false;
}

bool Matcher::accept_byte(uint8_t b) {
  // A pending sequence of n_len bytes with `remain` still to come can become any well-formed code point
  // in [bits << 6*remain, that | (2^(6*remain) - 1)]: accept the byte if the grammar allows one of them.
  const auto possible = [&](uint32_t bits, int remain, uint8_t len) {
    uint32_t lo = bits << (6 * remain), hi = lo | ((1u << (6 * remain)) - 1);
    lo = std::max(lo, matcher_detail::min_code_point(len));
    hi = std::min(hi, kMaxCodePoint);
    if (lo > hi) return false;
    if (lo < 0xD800 && allows_any_in(lo, std::min<uint32_t>(hi, 0xD7FF))) return true;
    return hi > 0xDFFF && allows_any_in(std::max<uint32_t>(lo, 0xE000), hi);
  };
  if (n_remain_ == 0) {
    if (b < 0x80) return accept_code_point(b);
    uint8_t len;
    uint32_t bits;
    if ((b & 0xE0) == 0xC0) {
      len = 2, bits = b & 0x1Fu;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3, bits = b & 0x0Fu;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4, bits = b & 0x07u;
    } else {
      return false;  // a continuation byte or 0xF8..0xFF
    }
    if (!possible(bits, len - 1, len)) return false;
    partial_ = bits, n_remain_ = (uint8_t)(len - 1), n_len_ = len;
    return true;
  }
  if ((b & 0xC0) != 0x80) return false;
  const uint32_t bits = (partial_ << 6) | (b & 0x3Fu);
  if (n_remain_ > 1) {
    if (!possible(bits, n_remain_ - 1, n_len_)) return false;
    partial_ = bits, --n_remain_;
    return true;
  }
  if (bits < matcher_detail::min_code_point(n_len_) || bits > kMaxCodePoint ||
      matcher_detail::is_surrogate(bits))
    return false;
  n_remain_ = 0;
  if (!accept_code_point(bits)) {
    n_remain_ = 1;
    return false;
  }
  partial_ = 0, n_len_ = 0;
  return true;
}

size_t Matcher::accept_bytes(std::string_view bytes) {
  size_t n = 0;
  while (n < bytes.size() && accept_byte((uint8_t)bytes[n])) ++n;
  return n;
}

bool Matcher::can_continue() const {
  if (n_remain_ != 0) return true;
  for (uint32_t h : heads_) {
    if (h != kEmptyStack) return true;
  }
  return false;
}

void Matcher::reset() {
  set_heads(initial_);
  partial_ = 0, n_remain_ = 0, n_len_ = 0;
}

void Matcher::save(Snapshot& out) const {
  out.heads.assign(heads_.begin(), heads_.end());
  out.partial = partial_;
  out.n_remain = n_remain_;
  out.n_len = n_len_;
}

void Matcher::restore(const Snapshot& s) {
  for (uint32_t h : s.heads) {
    if (h >= nodes_.size() || (h != kEmptyStack && g_->elements[nodes_[h].elem].op != Op::Chars)) {
      fail("grammar matcher: the snapshot does not belong to this matcher (unknown stack {})", h);
    }
  }
  if (s.n_remain > 3 || (s.n_remain != 0 && (s.n_len < 2 || s.n_len > 4 || s.n_remain >= s.n_len))) {
    fail("grammar matcher: the snapshot's pending UTF-8 sequence is malformed");
  }
  set_heads(s.heads);
  partial_ = s.partial, n_remain_ = s.n_remain, n_len_ = s.n_len;
}

void Matcher::restore_trusted(const Snapshot& s) {
  set_heads(s.heads);
  partial_ = s.partial, n_remain_ = s.n_remain, n_len_ = s.n_len;
}

void Matcher::set_single_head(uint32_t node) {
  heads_.clear();
  heads_.push_back(node);
  complete_ = node == kEmptyStack;
  partial_ = 0, n_remain_ = 0, n_len_ = 0;
}

int Matcher::stack_top(uint32_t node, int depth, uint32_t* elems, bool* cut) const {
  int k = 0;
  for (; k < depth && node != kEmptyStack; ++k) {
    elems[k] = nodes_[node].elem;
    node = nodes_[node].parent;
  }
  *cut = node != kEmptyStack;
  return k;
}

uint32_t Matcher::push_stack(const uint32_t* elems, int n) {
  for (int k = 0; k < n; ++k) {
    const bool ok = elems[k] < g_->elements.size() && (g_->elements[elems[k]].op == Op::Chars ||
                                                       (k > 0 && g_->elements[elems[k]].op == Op::Rule));
    if (!ok) fail("grammar matcher: element {} cannot be a stack entry here", elems[k]);
  }
  uint32_t p = kEmptyStack;
  while (n > 0) p = intern(elems[--n], p);
  return p;
}

bool grammar_accepts(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  Matcher m(g);
  return m.accept_bytes(text) == text.size() && m.is_complete();
}

bool grammar_accepts_prefix(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  Matcher m(g);
  return m.accept_bytes(text) == text.size();
}

}  // namespace ultra::grammar
