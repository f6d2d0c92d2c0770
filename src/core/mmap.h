// Read-only memory map of a whole file. Model weights are used in place from the map (zero copy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ultra {

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

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ultra
