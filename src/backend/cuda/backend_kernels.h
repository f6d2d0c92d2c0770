// Small kernels of the CUDA backend's step that are not forward ops (see kernels.h for those).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ultra::cuda {

// Writes the tokens of a step into the device copy of the sequences' tokens, which the sampler's penalty
// windows read: log[seq[t], pos[t]] = token[t]; rows with seq < 0 (padding) are skipped.
cudaError_t token_log_write(int32_t* log,  // [n_slots, n_ctx]
                            int n_ctx, int n_slots,
                            const int32_t* token,  // [n]
                            const int32_t* pos,    // [n]
                            const int32_t* seq,    // [n]
                            int n, cudaStream_t stream);

}  // namespace ultra::cuda
