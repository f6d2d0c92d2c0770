// Read-only memory map of a whole file. Model weights are used in place from the map (zero copy).
// Or, when asked (LoadParams::mmap = false, i.e. `--no-mmap`, through ReadIntoMemoryScope;
// or set_read_into_memory(true)), the file is read into anonymous memory
// aligned to 2 MiB and advised for transparent huge pages (MADV_HUGEPAGE): the kernel rarely backs a file
// mapping with huge pages, and with 4 KiB pages every 4 KiB of weights streamed in a decode step costs a TLB
// miss (F16 decode 6-9% faster on a Skylake-class Xeon, docs/BENCHMARKS.md). The price: a slower load, and
// memory that the page cache cannot share or drop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/huge_pages.h"

namespace ultra {

// Process-wide, for the MappedFiles constructed after the call (set it before loading a model).
void set_read_into_memory(bool on);
// The setting, or a ReadIntoMemoryScope(true) alive on this thread.
bool read_into_memory();

// For its lifetime, the MappedFiles this thread constructs are read into memory when `on` (Model::load
// with LoadParams::mmap = false).
class ReadIntoMemoryScope {
 public:
  explicit ReadIntoMemoryScope(bool on);
  ~ReadIntoMemoryScope();
  ReadIntoMemoryScope(const ReadIntoMemoryScope&) = delete;
  ReadIntoMemoryScope& operator=(const ReadIntoMemoryScope&) = delete;

 private:
  bool on_;
};

class MappedFile {
 public:
  MappedFile() = default;
  // Throws ultra::Error naming the path when it is not a regular file (checked before opening, so a FIFO
  // does not block) or cannot be opened or mapped; `what` names its role in messages.
  // An empty file maps to size 0 and data() == nullptr.
  explicit MappedFile(const std::string& path, const char* what = "file");
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  bool copied() const { return copy_.data() != nullptr; }  // read into huge-page memory (not mapped)

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;  // into the file mapping, or copy_
  size_t size_ = 0;
  HugePageMemory copy_;  // the file's bytes when copied
};

}  // namespace ultra
