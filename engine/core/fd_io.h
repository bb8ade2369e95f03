// Writing a whole buffer to a file descriptor: the one loop over write(2) that retries on EINTR
// and continues after partial writes, shared by the launchers (forwarding rank output) and the
// atomic file writer. Thread-safety: stateless.
#pragma once

#include <cstddef>
#include <string>

namespace fsdp {

// Writes all `n` bytes of `data` to `fd`. Returns false (errno set) when write(2) fails for a
// reason other than EINTR, e.g. a closed pipe or a full disk; what was written stays written.
bool WriteAllToFd(int fd, const void* data, size_t n);
inline bool WriteAllToFd(int fd, const std::string& s) { return WriteAllToFd(fd, s.data(), s.size()); }

}  // namespace fsdp
