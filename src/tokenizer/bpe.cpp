#include "tokenizer/bpe.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace ultra::tok {

namespace {

const char kBpeHex[] = "0123456789ABCDEF";

std::string byte_token(uint8_t b) {
  return std::string{'<', '0', 'x', kBpeHex[b >> 4], kBpeHex[b & 15], '>'};
}

}  // namespace

BpeModel::BpeModel(const Vocab& v, const TokenIndex& index)
    : index_(index),
      byte_level_(v.byte_level),
      ignore_merges_(v.ignore_merges),
      whole_newlines_(v.whole_newlines),
      byte_fallback_(v.byte_fallback),
      fuse_unk_(v.fuse_unk),
      unk_(v.unk) {
  for (int b = 0; b < 256; ++b) {
    unit_id_[b] = index.find(utf8::byte_to_unicode((uint8_t)b));
    fallback_id_[b] = index.find(byte_token((uint8_t)b));
  }
  size_t cap = 16;
  while (cap < v.merges.size() * 2 + 16) cap <<= 1;
  table_.assign(cap, Slot{kEmpty, 0, 0});
  mask_ = cap - 1;
  std::string joined;
  for (size_t rank = 0; rank < v.merges.size(); ++rank) {
    const auto& [l, r] = v.merges[rank];
    if (l.empty() || r.empty()) fail("{}: merge #{} '{} {}' has an empty side", v.source, rank, l, r);
    const int32_t a = index.find(l), b = index.find(r);
    if (a < 0) fail("{}: merge #{} '{} {}': '{}' is not in the vocabulary", v.source, rank, l, r, l);
    if (b < 0) fail("{}: merge #{} '{} {}': '{}' is not in the vocabulary", v.source, rank, l, r, r);
    joined.assign(l).append(r);
    const int32_t m = index.find(joined);
    if (m < 0)
      fail("{}: merge #{} '{} {}': the merged token '{}' is not in the vocabulary", v.source, rank, l, r,
           joined);
    // Like llama.cpp, the first (lowest-rank) occurrence of a repeated pair wins.
    if (!find_merge(a, b)) insert_merge(a, b, (int32_t)rank, m);
  }
  n_merges_ = v.merges.size();
}

void BpeModel::insert_merge(int32_t a, int32_t b, int32_t rank, int32_t id) {
  const uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
  uint64_t h = key * 0x9E3779B97F4A7C15ull;
  for (uint64_t i = (h ^ (h >> 29)) & mask_;; i = (i + 1) & mask_) {
    if (table_[i].key == kEmpty) {
      table_[i] = Slot{key, rank, id};
      return;
    }
  }
}

namespace {

struct BpeSym {
  int32_t id;
  int32_t prev, next;
};

struct BpeCand {
  int32_t rank;
  int32_t left, right;
  int32_t left_id, right_id, new_id;
};

// Min-heap order: lowest rank, then leftmost.
struct BpeCandAfter {
  bool operator()(const BpeCand& a, const BpeCand& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

struct BpeScratch {
  std::vector<BpeSym> syms;
  std::vector<BpeCand> heap;
  std::string mapped;
};

BpeScratch& bpe_scratch() {
  thread_local BpeScratch s;
  return s;
}

}  // namespace

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  BpeScratch& s = bpe_scratch();

  if (ignore_merges_ || (whole_newlines_ && word.find_first_not_of('\n') == std::string_view::npos)) {
    std::string_view key = word;
    if (byte_level_) {
      s.mapped.clear();
      for (unsigned char c : word) s.mapped += utf8::byte_to_unicode(c);
      key = s.mapped;
    }
    const int32_t id = index_.find(key);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }

  // Units -> initial symbols, with byte fallback and unknown handling as in HF's BPE::merge_word.
  auto& syms = s.syms;
  syms.clear();
  bool pending_unk = false;
  auto add = [&](int32_t id) {
    syms.push_back(BpeSym{id, (int32_t)syms.size() - 1, (int32_t)syms.size() + 1});
  };
  auto flush_unk = [&] {
    if (pending_unk) add(unk_);
    pending_unk = false;
  };
  const size_t n = word.size();
  for (size_t i = 0; i < n;) {
    size_t len;
    int32_t id;
    std::string_view unit;
    if (byte_level_) {
      len = 1;
      id = unit_id_[(unsigned char)word[i]];
      unit = utf8::byte_to_unicode((unsigned char)word[i]);
    } else {
      len = utf8::unit_len(word.data() + i, n - i);
      unit = word.substr(i, len);
      id = index_.find(unit);
    }
    i += len;
    if (id >= 0) {
      flush_unk();
      add(id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : unit) all = all && fallback_id_[c] >= 0;
      if (all) {
        flush_unk();
        for (unsigned char c : unit) add(fallback_id_[c]);
        continue;
      }
    }
    if (unk_ >= 0) {
      if (!(pending_unk && fuse_unk_)) {
        flush_unk();
        pending_unk = true;
      }
    }
    // No unknown token: the unit is dropped (HF does the same).
  }
  flush_unk();
  if (syms.empty()) return;
  syms.back().next = -1;

  auto& heap = s.heap;
  heap.clear();
  auto try_pair = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const Slot* m = find_merge(syms[l].id, syms[r].id);
    if (!m) return;
    heap.push_back(BpeCand{m->rank, l, r, syms[l].id, syms[r].id, m->id});
    std::push_heap(heap.begin(), heap.end(), BpeCandAfter{});
  };
  for (int32_t i = 0; i + 1 < (int32_t)syms.size(); ++i) try_pair(i, i + 1);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), BpeCandAfter{});
    const BpeCand c = heap.back();
    heap.pop_back();
    BpeSym& L = syms[c.left];
    // Stale: the left symbol was absorbed or grew, or its right neighbour changed.
    if (L.id != c.left_id || L.next != c.right || syms[c.right].id != c.right_id) continue;
    BpeSym& R = syms[c.right];
    L.id = c.new_id;
    L.next = R.next;
    if (R.next >= 0) syms[R.next].prev = c.left;
    R.id = -2;  // dead
    R.next = R.prev = -1;
    try_pair(L.prev, c.left);
    try_pair(c.left, L.next);
  }

  for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

}  // namespace ultra::tok
