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
//   mixtures of experts    every expert by columns, as the dense FFN: each rank holds rows [f0, f0 + fl) of
//                          every expert's Wgate and Wup (and of gpt-oss's gate/up biases) and those columns
//                          of its Wdown (whole quantization blocks, ranks differ by one block at most); the
//                          experts' down biases added on rank 0 only. Qwen2-MoE's shared expert the same way
//                          over its own width. The router (and the shared expert's sigmoid gate) on every
//                          rank: each rank routes every token alike and runs the same experts on its
//                          columns, and the MoE block's output is summed over the ranks with the one
//                          all-reduce the dense FFN has. Not by expert (whole experts per rank): that needs
//                          an all-to-all of the routed tokens per layer, and a rank's load would depend on
//                          the routing (at decode, k of n_expert experts: some ranks idle); by columns every
//                          rank reads 1/n of each selected expert, whatever the routing.
// A column split keeps whole quantization blocks (refused otherwise, naming the matrix and the block).
// F8_E4M3 and TERNARY matrices keep a scale per row or per tensor as it is; scales per group of columns are
// sliced with their columns, whole groups only (the FFN splits fall on group boundaries; a head split inside
// a group is refused).
#pragma once

#include "model/model.h"

namespace ultra {

// Splits m (a whole model as loaded) into rank's shard of size ranks, in place. Throws ultra::Error naming
// what does not split (heads, KV heads, the FFN or an expert's width, a block that a column split would cut,
// a type not split yet) before anything is changed.
void shard_model(ModelData& m, int rank, int size);

}  // namespace ultra
