// Mixture-of-experts routing: which experts a token's FFN runs and with what weights, as llama.cpp's
// build_moe_ffn computes them (softmax over every expert's router logit, the top k of those probabilities,
// optionally renormalised to sum 1). Plain scalar code on host memory: the CPU backend runs it and the
// tests take it as the reference for the grouping that follows.
#pragma once

#include <cstdint>

namespace ultra {

// For each of n rows: logits [n, n_expert] (overwritten with the softmax probabilities) -> ids [n, k] the
// selected experts in descending probability, ties to the lower expert index (ggml's argsort on the CPU for
// up to 16 experts, where std::sort is an insertion sort), and w [n, k] their probabilities, divided by
// their sum (clamped below at 2^-14, as llama.cpp) when norm. 1 <= k <= n_expert. Allocates nothing.
void moe_route(float* logits, int n, int n_expert, int k, bool norm, int32_t* ids, float* w);

// gpt-oss's routing (transformers' GptOssTopKRouter, llama.cpp's
// LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT): for each of n rows, ids [n, k] the experts of the k largest
// logits [n, n_expert] in descending order (ties to the lower index, NaN last), w [n, k] the softmax of those
// k logits. logits are left as they are.
void moe_route_topk_softmax(const float* logits, int n, int n_expert, int k, int32_t* ids, float* w);

}  // namespace ultra
