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

// The file read into anonymous memory aligned to 2 MiB (*mapped bytes, a multiple of 2 MiB), advised for
// transparent huge pages, then made read-only. Closes nothing; throws naming the path.
uint8_t* read_into_huge_pages(int fd, size_t size, const std::string& path, const char* what,
                              size_t* mapped) {
  constexpr size_t kHuge = (size_t)2 << 20;
  const size_t len = (size + kHuge - 1) / kHuge * kHuge;
  void* raw = ::mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED)
    fail("{}: cannot allocate {} bytes for {}: {}", path, len, what, std::strerror(errno));
  // Trim to a 2 MiB-aligned range of len bytes (huge pages need aligned virtual addresses).
  const uintptr_t a = ((uintptr_t)raw + kHuge - 1) / kHuge * kHuge;
  if (a > (uintptr_t)raw) ::munmap(raw, a - (uintptr_t)raw);
  const uintptr_t end = (uintptr_t)raw + len + kHuge;
  if (end > a + len) ::munmap((void*)(a + len), end - (a + len));
  uint8_t* p = reinterpret_cast<uint8_t*>(a);
#ifdef MADV_HUGEPAGE
  ::madvise(p, len, MADV_HUGEPAGE);
#endif
  size_t got = 0;
  while (got < size) {
    const ssize_t n = ::pread(fd, p + got, size - got, (off_t)got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::munmap(p, len);
      fail("{}: read error in {}: {}", path, what, n == 0 ? "the file shrank" : std::strerror(e));
    }
    got += (size_t)n;
  }
  ::mprotect(p, len, PROT_READ);
  *mapped = len;
  return p;
}

}  // namespace

void set_read_into_memory(bool on) {
  g_read_into_memory = on;
}

bool read_into_memory() {
  if (g_read_into_memory) return true;
  const char* e = std::getenv("ULTRA_NO_MMAP");
  return e && *e && std::strcmp(e, "0") != 0;
}

MappedFile::MappedFile(const std::string& path, const char* what) : path_(path) {
  // Checks the type before opening: open() on a FIFO would block until a writer appears.
  const int fd = open_regular_file(path, what, &size_);
  if (size_ > 0 && read_into_memory()) {
    try {
      data_ = read_into_huge_pages(fd, size_, path, what, &mapped_);
      copied_ = true;
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
    mapped_ = size_;
#ifdef MADV_HUGEPAGE
    ::madvise(p, size_, MADV_HUGEPAGE);  // a hint only: few kernels back file mappings with huge pages
#endif
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), mapped_);
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)),
      data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      mapped_(std::exchange(o.mapped_, 0)),
      copied_(std::exchange(o.copied_, false)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), mapped_);
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
    copied_ = std::exchange(o.copied_, false);
  }
  return *this;
}

}  // namespace ultra
