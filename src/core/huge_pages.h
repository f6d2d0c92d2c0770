// Anonymous memory for the large, long-lived arrays that a decode step streams through (weights read with
// --no-mmap, the KV cache): one mapping aligned to 2 MiB and advised for transparent huge pages
// (MADV_HUGEPAGE), so that where the kernel offers them (THP "always" or "madvise") each 2 MiB is one TLB
// entry instead of 512. Where it does not, this is plain zeroed page memory. Allocated once, never resized.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ultra {

class HugePageMemory {
 public:
  HugePageMemory() = default;
  // `bytes` zeroed bytes at a 2 MiB-aligned address (the mapping rounds up to 2 MiB). With prefault, every
  // page is touched now, so that no page fault is left for the hot path; without, the caller fills it.
  // Throws ultra::Error naming `what` when the memory cannot be had. bytes == 0 gives data() == nullptr.
  HugePageMemory(size_t bytes, const char* what, bool prefault);
  ~HugePageMemory();
  HugePageMemory(HugePageMemory&& o) noexcept;
  HugePageMemory& operator=(HugePageMemory&& o) noexcept;
  HugePageMemory(const HugePageMemory&) = delete;
  HugePageMemory& operator=(const HugePageMemory&) = delete;

  uint8_t* data() { return p_; }
  const uint8_t* data() const { return p_; }
  size_t size() const { return size_; }

  void make_read_only();  // after it is filled (a copy of weights)

  // The bytes a HugePageMemory of `bytes` maps (its footprint): rounded up to 2 MiB.
  static size_t mapped_bytes(size_t bytes);

 private:
  uint8_t* p_ = nullptr;
  size_t size_ = 0;    // bytes asked
  size_t mapped_ = 0;  // bytes mapped at p_: size_ rounded up to 2 MiB
};

}  // namespace ultra
