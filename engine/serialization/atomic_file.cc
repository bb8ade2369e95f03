#include "engine/serialization/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "engine/core/error.h"
#include "engine/core/fd_io.h"

namespace fsdp::serialization {

namespace {

std::string SystemReason() { return std::strerror(errno); }

}  // namespace

void WriteFileAtomically(const std::string& path, const std::string& bytes) {
  static std::atomic<uint64_t> counter{0};
  const std::filesystem::path target(path);
  const std::filesystem::path dir =
      target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  const std::string tmp = (dir / ("." + target.filename().string() + ".tmp." +
                                  std::to_string(::getpid()) + "." +
                                  std::to_string(counter.fetch_add(1))))
                              .string();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  FSDP_CHECK_CODE(ErrorCode::kUnavailable, fd >= 0, "cannot write ", path, ": cannot create ",
                  tmp, ": ", SystemReason());
  const bool written = WriteAllToFd(fd, bytes) && ::fsync(fd) == 0;
  const std::string reason = written ? "" : SystemReason();
  const bool closed = ::close(fd) == 0;
  if (!written || !closed) {
    ::unlink(tmp.c_str());
    FSDP_THROW(ErrorCode::kUnavailable, "cannot write ", path, ": ",
               written ? SystemReason() : reason);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = SystemReason();
    ::unlink(tmp.c_str());
    FSDP_THROW(ErrorCode::kUnavailable, "cannot write ", path, ": rename from ", tmp, ": ", why);
  }
  // The rename is durable once the directory is synced.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::string ReadRegularFile(const std::string& path, size_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    FSDP_CHECK_CODE(ErrorCode::kNotFound, err != ENOENT, "no such file: ", path);
    FSDP_THROW(ErrorCode::kUnavailable, "cannot open ", path, ": ", std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    FSDP_THROW(ErrorCode::kInvalidArgument, path, " is not a regular file");
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    FSDP_THROW(ErrorCode::kDataLoss, path, " is ", st.st_size, " bytes, more than the limit of ",
               max_bytes);
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? SystemReason() : "file shrank while reading";
      ::close(fd);
      FSDP_THROW(ErrorCode::kUnavailable, "cannot read ", path, ": ", why);
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return bytes;
}

}  // namespace fsdp::serialization
