#include "grammar/mask_tables.h"

#include <algorithm>

#include "core/error.h"

namespace ultra::grammar {

bool MaskTables::Top::operator==(const Top& o) const {
  return n == o.n && std::equal(elem, elem + n, o.elem);
}

size_t MaskTables::TopHash::operator()(const Top& t) const {
  uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)t.n;
  for (int i = 0; i < t.n; ++i) h = (h ^ t.elem[i]) * 0x100000001b3ull;
  return (size_t)(h ^ (h >> 31));
}

MaskTables::MaskTables(std::shared_ptr<const Grammar> g, std::shared_ptr<const MaskVocab> v, int depth)
    : g_(std::move(g)), v_(std::move(v)), depth_(std::clamp(depth, 1, kMaxDepth)), m_(g_), walk_(*v_) {}

const MaskTables::Table& MaskTables::get(const Top& top) {
  auto it = tables_.find(top);
  if (it != tables_.end()) return *it->second;
  const MaskVocab& v = *v_;
  auto t = std::make_unique<Table>();
  t->accept.assign(v.n_words(), 0);
  m_.set_single_head(m_.push_stack(top.elem, top.n));
  walk_.run(
      m_, TrieWalk::All{}, v.lcp, v.sorted.size(),
      [&](size_t i) {
        const int32_t tok = v.sorted[i];
        t->accept[(uint32_t)tok >> 5] |= 1u << (tok & 31);
      },
      [&](size_t first, size_t end, bool dep) {
        if (!dep) return;
        for (size_t k = first; k < end; ++k) t->dependent.push_back((int32_t)k);
      });
  t->dep_lcp.resize(t->dependent.size());
  for (size_t k = 0; k < t->dependent.size(); ++k) {
    t->dep_lcp[k] =
        k ? common_prefix(v.bytes[v.sorted[t->dependent[k - 1]]], v.bytes[v.sorted[t->dependent[k]]]) : 0;
  }
  ++built_;
  return *tables_.emplace(top, std::move(t)).first->second;
}

}  // namespace ultra::grammar
