// The CUDA backend's captured steps, exllamav2-style: one graph per static step shape, kept in a cache keyed
// by (row bucket, parity). A step of up to 32 rows runs in the graph of the smallest row bucket (1, 2, 4, 8,
// 16, 32) that holds it, padded with padding rows; a full prefill chunk of n_batch rows has a slot of its
// own; other steps run directly. The parity is the step's set of pinned IO blocks (step_io.h): the graph's IO
// kernels name them, so each slot is captured once per set.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <functional>

namespace ultra::cuda {

class StepGraphs {
 public:
  static constexpr std::array<int, 6> kBuckets = {1, 2, 4, 8, 16, 32};
  static constexpr int kPrefillSlot = (int)kBuckets.size();  // graph of a full n_batch-row prefill chunk
  static constexpr int kSlots = kPrefillSlot + 1;
  static constexpr int kParities = 2;  // sets of step IO blocks (steps in flight)

  struct Key {
    int slot;    // a bucket index, or kPrefillSlot
    int parity;  // < kParities
  };

  // The shape a step of n rows with n_out outputs runs as: its graph slot (-1: none, run directly) and the
  // rows and outputs it is padded to. n_rows_cap: rows of the step buffers (n_batch); n_out_cap: their
  // output rows.
  struct Shape {
    int slot = -1;
    int n = 0;
    int n_out = 0;
  };
  static Shape shape(int n, int n_out, int n_rows_cap, int n_out_cap);
  // The largest bucket of at most n_rows_cap rows (0: none).
  static int largest_bucket(int n_rows_cap);

  StepGraphs() = default;
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // The captured graph of key, or null.
  cudaGraphExec_t find(Key key) const { return graphs_[key.parity][key.slot]; }
  // Records enqueue()'s launches on stream (nothing runs) into the graph of key, instantiates and uploads
  // it. Throws ultra::Error on a CUDA failure (the capture is then abandoned).
  void capture(Key key, cudaStream_t stream, const std::function<void()>& enqueue);
  int count() const;                                  // captured graphs
  int nodes(int slot) const { return nodes_[slot]; }  // of the last capture of slot

 private:
  std::array<std::array<cudaGraphExec_t, kSlots>, kParities> graphs_{};  // [parity][slot]
  std::array<int, kSlots> nodes_{};
};

}  // namespace ultra::cuda
