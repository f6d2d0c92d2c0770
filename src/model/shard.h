// Megatron-style tensor parallelism's split of a loaded model: rank r of n keeps the views of its shard of
// every matrix (still pointing into the mapped file: only its slices are ever read) and the hyper-parameters
// of its shard, so that the one forward (model/forward.h) and the CPU backend's buffers and KV cache are
// those of the shard; forward() adds the collectives where WeightTable::tp_size > 1.
//
//   Wq, Wk, Wv (+ biases)  rows: query heads [r * H / n, (r+1) * H / n) (ranks differ by one head at most)
//                          and the KV heads they read (GQA with fewer KV heads than ranks: replicated on the
//                          ranks that share one); refused where a rank's query heads do not map onto its KV
//                          heads as one GQA group size
//   Wo                     columns: the same heads; the output is summed over ranks (all-reduce), its bias
//                          added on rank 0 only
//   Wgate, Wup             rows: FFN columns, whole quantization blocks of Wdown per rank (ranks differ by
//                          one block at most)
//   Wdown                  columns: the same; summed over ranks
//   embedding, LM head     rows: vocabulary [r * ceil(V/n), ...) (the last shard shorter); the embedding's
//                          rows summed over ranks (the rank that holds a token writes it, the others zeros),
//                          the logits all-gathered
//   norms                  every rank (small)
// A column split keeps whole quantization blocks (refused otherwise); F8_E4M3 and TERNARY matrices (scales
// per column group) and mixtures of experts are refused for now.
#pragma once

#include "model/model.h"

namespace ultra {

// Splits m (a whole model as loaded) into rank's shard of size ranks, in place. Throws ultra::Error naming
// what does not split (heads, KV heads, the FFN width, a block that a column split would cut, a type or an
// architecture not split yet) before anything is changed.
void shard_model(ModelData& m, int rank, int size);

}  // namespace ultra
