// Linked contexts (context.h, "Linked contexts"): Context::follow, the checks of rows that take their tokens
// from the followed context (Batch::follow), and how those tokens are staged: the token itself when the
// host knows it, else a TokenFeed reference the backend resolves from the source's device state.
#include "core/error.h"
#include "engine/context_impl.h"

namespace ultra {

void Context::Impl::link(Impl& s) {
  linked_device = be->link({s.be.get(), s.seqs.token_log(), s.p.n_ctx, s.p.n_slots});
  source = &s;
  s.follower = this;
}

void Context::Impl::unlink_source() {
  if (!source) return;
  source->follower = nullptr;
  source = nullptr;
  linked_device = false;
  be->link({});
}

void Context::Impl::unlink() {
  unlink_source();
  if (follower) follower->unlink_source();
}

void Context::Impl::check_follow(int i, int src, int pos) const {
  if (!source)
    fail("step: row {}: token Batch::follow({}), but the context follows no other (Context::follow)", i, src);
  if (src < 0 || src >= source->p.n_slots)
    fail("step: row {}: Batch::follow({}): the followed context has {} sequences", i, src, source->p.n_slots);
  if (pos > source->seqs.len(src))
    fail(
        "step: row {}: Batch::follow({}) at position {}: the followed sequence holds {} tokens (a row "
        "may follow it up to one position past its end)",
        i, src, pos, source->seqs.len(src));
  if (pos == source->seqs.len(src) && !source->sampled.any(src))
    fail(
        "step: row {}: Batch::follow({}) at position {}: the followed sequence's last step sampled no "
        "token for it",
        i, src, pos);
}

void Context::Impl::check_followed_proposal(int i, int src, int pos) const {
  if (!linked_device)
    fail("step: row {}: Output::verify of a followed token needs both contexts on the same GPU", i);
  if (src < 0 || src >= source->p.n_slots)
    fail("step: row {}: Batch::follow({}): the followed context has {} sequences", i + 1, src,
         source->p.n_slots);
  if (!source->proposals.kept(src, pos))
    fail(
        "step: row {}: Output::verify: the followed token at position {} of sequence {} was not drawn by "
        "an Output::propose row",
        i, pos, src);
}

void Context::Impl::check_no_reader() const {
  if (follower && follower->queued_reads > 0)
    fail("submit: a queued step of the following context reads this context's tokens (wait() for it first)");
}

int32_t Context::Impl::followed(int src, int pos) const {
  const Impl& S = *source;
  if (pos < S.seqs.len(src)) return S.seqs.tokens(src)[pos];
  return pos == S.seqs.len(src) && S.sampled.known(src) ? S.sampled.token(src) : -1;
}

TokenFeed Context::Impl::follow_token(int i, int src, int pos, int32_t& value) const {
  value = followed(src, pos);
  if (value >= 0) return TokenFeed::id;
  if (!linked_device)
    fail(
        "step: row {}: Batch::follow({}): the followed token is still on the device in a queued step of the "
        "followed context, and the backends cannot share it (wait() for the followed context first)",
        i, src);
  const Impl& S = *source;
  if (pos < S.seqs.len(src)) {
    value = src;
    return TokenFeed::linked_seq;
  }
  if (S.sampled.record(src) != S.queue.last_index())
    fail(
        "step: row {}: Batch::follow({}): the followed token comes from a queued step that is not the "
        "followed context's last",
        i, src);
  value = S.sampled.output(src);
  return TokenFeed::linked_output;
}

void Context::Impl::check_followed_known(const StepRecord& r) const {
  if (!r.reads_source) return;
  for (int i = 0; i < r.n; ++i)
    if (r.feed[i] != TokenFeed::id && r.link_seq[i] >= 0 && followed(r.link_seq[i], r.pos[i]) < 0)
      fail(
          "wait: row {} follows a token of a step of the followed context that has not been waited for "
          "(wait() for the followed context first)",
          i);
}

void Context::follow(Context* source) {
  Impl& me = *impl_;
  me.queue.check_idle("follow");
  if (source) {
    Impl& s = *source->impl_;
    if (&s == &me) fail("follow: a context cannot follow itself");
    s.queue.check_idle("follow");
    if (s.follower && s.follower != &me) fail("follow: the context to follow is followed by another already");
  }
  me.unlink_source();  // its own follower stays
  if (source) me.link(*source->impl_);
}

}  // namespace ultra
