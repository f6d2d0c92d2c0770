#include "core/huge_pages.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace ultra {

namespace {
constexpr size_t kHuge = (size_t)2 << 20;
}

size_t HugePageMemory::mapped_bytes(size_t bytes) {
  return (bytes + kHuge - 1) / kHuge * kHuge;
}

HugePageMemory::HugePageMemory(size_t bytes, const char* what, bool prefault) : size_(bytes) {
  if (bytes == 0) return;
  if (bytes > ((size_t)1 << 56)) fail("cannot allocate {} bytes for {}: too large", bytes, what);
  const size_t len = mapped_bytes(bytes);
  // Over-map by 2 MiB, then trim to an aligned range of len bytes: huge pages need aligned addresses.
  void* raw = ::mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) fail("cannot allocate {} bytes for {}: {}", len, what, std::strerror(errno));
  const uintptr_t a = ((uintptr_t)raw + kHuge - 1) / kHuge * kHuge;
  if (a > (uintptr_t)raw) ::munmap(raw, a - (uintptr_t)raw);
  const uintptr_t end = (uintptr_t)raw + len + kHuge;
  if (end > a + len) ::munmap((void*)(a + len), end - (a + len));
  p_ = reinterpret_cast<uint8_t*>(a);
  mapped_ = len;
#ifdef MADV_HUGEPAGE
  ::madvise(p_, len, MADV_HUGEPAGE);  // a hint: refused or ignored where the kernel has no THP
#endif
  if (prefault) {
    // Anonymous memory reads as zero: fault it in writable without writing it again (Linux >= 5.14), or,
    // where the kernel does not know the advice, by writing the zeros.
#ifdef MADV_POPULATE_WRITE
    if (::madvise(p_, len, MADV_POPULATE_WRITE) == 0) return;
#endif
    std::memset(p_, 0, bytes);
  }
}

HugePageMemory::~HugePageMemory() {
  if (p_) ::munmap(p_, mapped_);
}

HugePageMemory::HugePageMemory(HugePageMemory&& o) noexcept
    : p_(std::exchange(o.p_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      mapped_(std::exchange(o.mapped_, 0)) {}

HugePageMemory& HugePageMemory::operator=(HugePageMemory&& o) noexcept {
  if (this != &o) {
    if (p_) ::munmap(p_, mapped_);
    p_ = std::exchange(o.p_, nullptr);
    size_ = std::exchange(o.size_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
  }
  return *this;
}

void HugePageMemory::make_read_only() {
  if (p_) ::mprotect(p_, mapped_, PROT_READ);
}

}  // namespace ultra
