#include "core/mmap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/file.h"

namespace ultra {

namespace {

std::atomic<bool> g_read_into_memory{false};
thread_local int t_read_into_memory = 0;  // ReadIntoMemoryScope(true)s alive on this thread

}  // namespace

void set_read_into_memory(bool on) {
  g_read_into_memory = on;
}

ReadIntoMemoryScope::ReadIntoMemoryScope(bool on) : on_(on) {
  t_read_into_memory += on_;
}

ReadIntoMemoryScope::~ReadIntoMemoryScope() {
  t_read_into_memory -= on_;
}

bool read_into_memory() {
  return g_read_into_memory || t_read_into_memory > 0;
}

MappedFile::MappedFile(const std::string& path, const char* what) : path_(path) {
  // Checks the type before opening: open() on a FIFO would block until a writer appears.
  const int fd = open_regular_file(path, what, &size_);
  if (size_ > 0 && read_into_memory()) {
    try {
      copy_ = HugePageMemory(size_, (path + " (" + what + ")").c_str(), /*prefault=*/false);
      if (read_up_to(fd, copy_.data(), size_, path, what) != size_)
        fail("{}: read error in {}: the file shrank", path, what);
      copy_.make_read_only();
      data_ = copy_.data();
    } catch (...) {
      ::close(fd);
      throw;
    }
  } else if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      fail("{}: cannot mmap {} bytes: {}", path, size_, std::strerror(e));
    }
    data_ = static_cast<const uint8_t*>(p);
#ifdef MADV_HUGEPAGE
    ::madvise(p, size_, MADV_HUGEPAGE);  // a hint only: few kernels back file mappings with huge pages
#endif
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_ && !copied()) ::munmap(const_cast<uint8_t*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)),
      data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      copy_(std::move(o.copy_)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_ && !copied()) ::munmap(const_cast<uint8_t*>(data_), size_);
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    copy_ = std::move(o.copy_);
  }
  return *this;
}

}  // namespace ultra
