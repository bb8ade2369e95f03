#include "engine/core/fd_io.h"

#include <unistd.h>

#include <cerrno>

namespace fsdp {

bool WriteAllToFd(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace fsdp
