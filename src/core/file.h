// Opening input files safely: every path the engine reads (models, shards, JSON files, text inputs) must
// be a regular file. A FIFO would block open() until a writer appears, a directory reads as empty, and a
// device may never end; they are refused with a clear error before anything is read.
#pragma once

#include <cstddef>
#include <string>

namespace ultra {

// Throws ultra::Error "<path>: <what> is a directory / FIFO / ..., expected a regular file" (or "cannot
// stat") unless path names a regular file (symlinks are followed). `what` names the role ("model file").
void check_regular_file(const std::string& path, const char* what = "input");

// Opens path read-only after check_regular_file, without blocking even if it was swapped for a FIFO in
// between (O_NONBLOCK, then fstat again). Returns the descriptor (O_CLOEXEC) and its size; the caller
// closes it. Throws ultra::Error naming the path.
int open_regular_file(const std::string& path, const char* what, size_t* size);

// Reads from fd at offset 0 until n bytes are in dst or the file ends (it shrank); retries EINTR. Returns
// the bytes read. Throws ultra::Error "<path>: read error in <what>: ..." on a failed read.
size_t read_up_to(int fd, void* dst, size_t n, const std::string& path, const char* what);

// The whole content of a regular file. Files larger than max_bytes are refused before they are read.
std::string read_file(const std::string& path, const char* what = "input",
                      size_t max_bytes = (size_t)1 << 30);

}  // namespace ultra
