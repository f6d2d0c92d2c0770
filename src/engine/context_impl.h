// ultra::Context's insides, shared by the files that implement them:
//   context.cpp          creation, submit / wait, and the public calls
//   batch_check.cpp      validation of a batch before anything is written
//   linked_contexts.cpp  Context::follow: rows that take their tokens from another context
//   step_queue.h         the records of queued steps and what Batch::kSampled stands for
//   proposal_ring.h      which positions the backend's kept proposals are for
//   testing.cpp          the test-only hooks of engine/testing.h
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "engine/backend.h"
#include "engine/model_impl.h"
#include "engine/proposal_ring.h"
#include "engine/seq_constraint.h"
#include "engine/step_queue.h"
#include "kv/sequences.h"
#include "ultra/context.h"

namespace ultra {

struct Context::Impl {
  Model model;
  const ModelData& m;
  std::vector<std::string> warnings;  // before p: resolve() fills it
  ContextParams p;
  int n_sample;
  std::unique_ptr<Backend> be;

  Sequences seqs;          // lengths, tokens, sampler settings (kv/sequences.h)
  LastSampled sampled;     // what Batch::kSampled stands for, per sequence
  ProposalRing proposals;  // Output::propose rows' kept distributions
  StepQueue queue;         // the steps handed to the backend
  // Linked contexts (Context::follow).
  Impl* source = nullptr;      // the context this one follows
  Impl* follower = nullptr;    // the context that follows this one
  bool linked_device = false;  // the backend reads the source's device state (Backend::link)
  int queued_reads = 0;        // queued steps that read the source's device state
  Buffer<int32_t> next_pos;    // [n_slots] validation: the position the next row of a sequence must have
  Buffer<int32_t> last_row;    // [n_slots] scratch of submit(): the last row of each sequence in the step
  // Grammar constraints (Context::set_grammar): per sequence (null: none), the vocabulary as their masks
  // see it and the masks of a step's sample rows, [n_outputs, n_words] (allocated with the first grammar).
  std::vector<std::unique_ptr<SeqConstraint>> constraints;
  std::shared_ptr<const grammar::MaskVocab> mask_vocab;
  GrammarTablesCache grammar_tables;  // by grammar text: the sequences using one share its tables
  // Output::logits rows of sequences with a grammar or a logit bias, in a step: their logits get the rules
  // in the step (Backend::rules_in_step) or after it (sample rows get them in the backend, before
  // sampling). [n_outputs]
  std::vector<LogitsRule> rule_rows;
  std::vector<uint32_t> masks;
  StepStats stats;

  Impl(const Model& model_, const ContextParams& params);
  ~Impl() { unlink(); }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // The engine's own per-context memory: each sequence's tokens, the step records and the per-sequence
  // arrays.
  static size_t engine_bytes(const ContextParams& p);

  // --- batch_check.cpp ---
  // Checks every row before anything is written; throws naming the row and the field.
  void validate(const Batch& b);
  // Output::propose / verify row i (see "Speculative outputs" in context.h).
  void check_speculative(const Batch& b, int i) const;

  // --- context.cpp ---
  void submit(const Batch& b);
  // Before submit() stages b on an asynchronous backend: a grammar's mask needs its sequence's tokens on the
  // host, so when a row of a constrained sequence (with an output row at or after it in b) takes a token
  // the queued step samples (kSampled), that step is completed now (wait() then only shows it); a token
  // followed from another context's queued step throws.
  void complete_for_masks(const Batch& b);
  // The host's side of the step in record ri that has run: the tokens the device fed into the sequences'
  // copies, then what kSampled stands for.
  void finish(int ri);
  void wait();

  // --- linked_contexts.cpp ---
  void link(Impl& s);    // follow s (both checked idle and linkable)
  void unlink_source();  // ends this context's link to the context it follows
  void unlink();         // ends both links of this context (as follower and as source)
  // Row i's Batch::follow(src) at position pos, and row i's Output::verify of it (validation).
  void check_follow(int i, int src, int pos) const;
  void check_followed_proposal(int i, int src, int pos) const;
  // Throws while a queued step of the follower reads this context's state (before this one submits).
  void check_no_reader() const;
  // A Batch::follow token, now: the source's token at pos of its sequence src, or the one its last step
  // sampled for pos (one past the end); -1 while only the device knows it.
  int32_t followed(int src, int pos) const;
  // What submit() stages for row i's Batch::follow(src) at pos: the token id when the host knows it, else
  // the backend's reference to the source's device state; value gets the id, slot or output index.
  TokenFeed follow_token(int i, int src, int pos, int32_t& value) const;
  // Before the step in r ends: throws unless the host can learn every token it read from the source.
  void check_followed_known(const StepRecord& r) const;
};

}  // namespace ultra
