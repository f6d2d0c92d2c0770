// The engine's side of Output::propose rows (context.h, "Speculative outputs"): for each sequence, the
// position whose kept distribution each entry of the backend's proposal ring holds (entry pos %
// kProposalRing, engine/backend.h), and whether that distribution is a point mass (a greedy proposer). A
// verify row of a follower may read an entry only while it holds the proposal's position.
// Sized once at construction; nothing here allocates after it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/backend.h"

namespace ultra {

class ProposalRing {
 public:
  ProposalRing() = default;
  explicit ProposalRing(int n_slots);

  // A propose row of sequence s drew the token for pos; point: the distribution is a point mass (greedy).
  void keep(int s, int32_t pos, bool point) {
    pos_[entry(s, pos)] = pos;
    point_[entry(s, pos)] = point;
  }
  // The token at pos of sequence s was given by a row (not fed as drawn): a proposal kept for it is void.
  void given(int s, int32_t pos) {
    if (int32_t& at = pos_[entry(s, pos)]; at == pos) at = -1;
  }
  // Sequence s keeps positions [0, n): the proposals for the positions forgotten are void.
  void crop(int s, int32_t n);
  bool kept(int s, int32_t pos) const { return pos_[entry(s, pos)] == pos; }   // holds a proposal for pos
  bool point(int s, int32_t pos) const { return point_[entry(s, pos)] != 0; }  // ... that is a point mass

  static size_t bytes(int n_slots);

 private:
  static size_t entry(int s, int32_t pos) { return (size_t)s * kProposalRing + pos % kProposalRing; }
  std::vector<int32_t> pos_;    // [n_slots, kProposalRing] the position an entry holds (-1: none)
  std::vector<uint8_t> point_;  // [n_slots, kProposalRing]
};

}  // namespace ultra
