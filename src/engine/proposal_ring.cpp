#include "engine/proposal_ring.h"

namespace ultra {

ProposalRing::ProposalRing(int n_slots)
    : pos_((size_t)n_slots * kProposalRing, -1), point_((size_t)n_slots * kProposalRing, 0) {}

void ProposalRing::crop(int s, int32_t n) {
  for (int e = 0; e < kProposalRing; ++e)
    if (int32_t& at = pos_[(size_t)s * kProposalRing + e]; at >= n) at = -1;
}

size_t ProposalRing::bytes(int n_slots) {
  return (size_t)n_slots * kProposalRing * (sizeof(int32_t) + sizeof(uint8_t));
}

}  // namespace ultra
