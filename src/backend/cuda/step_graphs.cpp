#include "backend/cuda/step_graphs.h"

#include <algorithm>

#include "backend/cuda/device_memory.h"

namespace ultra::cuda {

StepGraphs::Shape StepGraphs::shape(int n, int n_out, int n_rows_cap, int n_out_cap) {
  // The smallest row bucket that holds the step (its outputs padded to the bucket), or, for a full prefill
  // chunk of n_batch rows, the prefill slot (outputs padded to n_out_cap); else none.
  Shape s{-1, n, n_out};
  for (size_t i = 0; i < kBuckets.size() && s.slot < 0; ++i)
    if (kBuckets[i] >= n && kBuckets[i] <= n_rows_cap) {
      s.slot = (int)i;
      s.n = s.n_out = kBuckets[i];
    }
  if (s.slot < 0 && n == n_rows_cap) {
    s.slot = kPrefillSlot;
    s.n_out = std::min(n_out_cap, n);
  }
  return s;
}

int StepGraphs::largest_bucket(int n_rows_cap) {
  int largest = 0;
  for (int b : kBuckets)
    if (b <= n_rows_cap) largest = b;
  return largest;
}

StepGraphs::~StepGraphs() {
  for (auto& set : graphs_)
    for (cudaGraphExec_t g : set)
      if (g) cudaGraphExecDestroy(g);
}

void StepGraphs::capture(Key key, cudaStream_t stream, const std::function<void()>& enqueue) {
  cudaGraph_t graph = nullptr;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "graph capture");
  try {
    enqueue();
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  check(cudaStreamEndCapture(stream, &graph), "graph capture");
  size_t n_nodes = 0;
  cudaGraphGetNodes(graph, nullptr, &n_nodes);
  nodes_[key.slot] = (int)n_nodes;
  cudaGraphExec_t& exec = graphs_[key.parity][key.slot];
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  check(e, "graph instantiation");
  check(cudaGraphUpload(exec, stream), "graph upload");  // its first launch is not slower
}

int StepGraphs::count() const {
  int n = 0;
  for (const auto& set : graphs_)
    for (cudaGraphExec_t g : set) n += g != nullptr;
  return n;
}

}  // namespace ultra::cuda
