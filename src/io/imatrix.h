// llama.cpp's importance matrices (llama-imatrix's output) as the quantizers' weights: per weight tensor,
// one value per input column, the mean of x^2 over the calibration activations that column saw.
//   GGUF (current):  tensors "<weight name>.in_sum2" [n_cols, n_mat] and "<weight name>.counts" [1, n_mat]
//                    (F32); the weight of column i of matrix j is in_sum2[j][i] / round(counts[j]), or 1 when
//                    the count is 0 (llama-quantize's load_imatrix)
//   legacy .dat:     i32 n_entries, then per entry i32 name length, the name, i32 ncall, i32 n_values,
//                    f32 values[n_values]; the weights are values / ncall (values as they are when ncall is
//                    0)
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

namespace ultra {

struct Imatrix {
  std::unordered_map<std::string, std::vector<float>> weights;  // tensor name -> [n_cols * n_mat]
  std::vector<std::string> datasets;                            // calibration files, when recorded
  int chunk_count = 0;                                          // chunks of calibration text, when recorded
};

// Reads either format (a file starting with "GGUF" is the GGUF one). Throws ultra::Error naming the file
// and the problem: unreadable or truncated, a .in_sum2 without its .counts (or the reverse), a shape or type
// mismatch, a non-finite or negative weight, no entries at all.
Imatrix load_imatrix(const std::string& path);

}  // namespace ultra
