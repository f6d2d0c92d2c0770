#include "core/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace ultra {

namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

void check_mode(const std::string& path, const char* what, mode_t m) {
  if (!S_ISREG(m)) fail("{}: {} is {}, expected a regular file", path, what, kind_of(m));
}

}  // namespace

void check_regular_file(const std::string& path, const char* what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail("{}: cannot open {}: {}", path, what, std::strerror(errno));
  check_mode(path, what, st.st_mode);
}

int open_regular_file(const std::string& path, const char* what, size_t* size) {
  check_regular_file(path, what);
  // O_NONBLOCK: if the path became a FIFO after the check, open() returns at once instead of waiting for a
  // writer; the fstat below then refuses it. (It changes nothing for a regular file.)
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) fail("{}: cannot open {}: {}", path, what, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail("{}: cannot stat {}: {}", path, what, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    check_mode(path, what, st.st_mode);
  }
  if (size) *size = (size_t)st.st_size;
  return fd;
}

size_t read_up_to(int fd, void* dst, size_t n, const std::string& path, const char* what) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, static_cast<char*>(dst) + got, n - got, (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("{}: read error in {}: {}", path, what, std::strerror(errno));
    if (r == 0) break;  // the file shrank while being read
    got += (size_t)r;
  }
  return got;
}

std::string read_file(const std::string& path, const char* what, size_t max_bytes) {
  size_t size = 0;
  const int fd = open_regular_file(path, what, &size);
  if (size > max_bytes) {
    ::close(fd);
    fail("{}: {} is {} bytes, more than the limit of {}", path, what, size, max_bytes);
  }
  std::string out(size, '\0');
  size_t got = 0;
  try {
    got = read_up_to(fd, out.data(), size, path, what);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  out.resize(got);
  return out;
}

}  // namespace ultra
