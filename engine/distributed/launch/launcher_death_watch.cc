#include "engine/distributed/launch/launcher_death_watch.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>

namespace fsdp::distributed {

namespace {

constexpr int32_t kReleased = 0;  // the message that ends the watch quietly
constexpr int kMaxGroups = 65536;

// True when the environment in `/proc/<pid>/environ` (NUL-separated entries) holds `entry`
// exactly. Async-signal-safe: raw reads into a stack buffer, no allocation.
bool EnvironmentHolds(const char* pid, const char* entry, size_t entry_length) {
  char path[64] = "/proc/";
  size_t n = 6;
  for (const char* c = pid; *c != '\0' && n < sizeof(path) - 9; ++c) path[n++] = *c;
  for (const char* c = "/environ"; *c != '\0'; ++c) path[n++] = *c;
  path[n] = '\0';
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // gone, or not this user's
  // Bytes of `entry` matched so far in the current entry; -1 once it differs.
  long matched = 0;
  bool found = false;
  char buffer[4096];
  for (;;) {
    const ssize_t k = ::read(fd, buffer, sizeof(buffer));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    for (ssize_t i = 0; i < k && !found; ++i) {
      if (buffer[i] == '\0') {
        found = matched == static_cast<long>(entry_length);
        matched = 0;
      } else if (matched >= 0) {
        const bool same = matched < static_cast<long>(entry_length) && buffer[i] == entry[matched];
        matched = same ? matched + 1 : -1;
      }
    }
    if (found) break;
  }
  ::close(fd);
  return found;
}

// Sends `sig` to every other process whose environment holds `entry`, and to the process group
// it leads, if any. Async-signal-safe: getdents64 over /proc into a stack buffer.
void SignalHoldersOf(const char* entry, int sig) {
  if (entry[0] == '\0') return;
  size_t entry_length = 0;
  while (entry[entry_length] != '\0') ++entry_length;
  const int proc = ::open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (proc < 0) return;
  const pid_t self = ::getpid();
  alignas(8) char buffer[8192];
  for (;;) {
    const long k = ::syscall(SYS_getdents64, proc, buffer, sizeof(buffer));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    for (long offset = 0; offset < k;) {
      const auto* d = reinterpret_cast<const struct dirent64*>(buffer + offset);
      offset += d->d_reclen;
      long pid = 0;
      bool digits = d->d_name[0] != '\0';
      for (const char* c = d->d_name; *c != '\0' && digits; ++c) {
        digits = *c >= '0' && *c <= '9';
        pid = pid * 10 + (*c - '0');
      }
      if (!digits || pid <= 0 || pid == self) continue;
      if (!EnvironmentHolds(d->d_name, entry, entry_length)) continue;
      ::kill(static_cast<pid_t>(pid), sig);
      if (::getpgid(static_cast<pid_t>(pid)) == pid) ::kill(-static_cast<pid_t>(pid), sig);
    }
  }
  ::close(proc);
}

// The watch process: reads process groups from fd 0 until Release's message (exit quietly) or
// end of file (the launcher died: stop every group and every holder of `entry`).
// Async-signal-safe calls only.
[[noreturn]] void WatchLoop(int read_fd, int64_t kill_grace_ms, const char* entry) {
  static int32_t groups[kMaxGroups];
  int count = 0;
  for (;;) {
    int32_t value = 0;
    const ssize_t k = ::read(read_fd, &value, sizeof(value));
    if (k == static_cast<ssize_t>(sizeof(value))) {
      if (value == kReleased) ::_exit(0);
      if (count < kMaxGroups) groups[count++] = value;
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    break;  // end of file (or an error): the launcher is gone
  }
  // Every group it was given, and every holder of the entry.
  auto stop_all = [&](int sig) {
    for (int i = 0; i < count; ++i) ::kill(-groups[i], sig);
    SignalHoldersOf(entry, sig);
  };
  stop_all(SIGTERM);
  timespec grace{static_cast<time_t>(kill_grace_ms / 1000),
                 static_cast<long>((kill_grace_ms % 1000) * 1000000)};
  while (::nanosleep(&grace, &grace) != 0 && errno == EINTR) {
  }
  stop_all(SIGKILL);
  ::_exit(0);
}

// Closes every descriptor of the watch except `keep` (which it moves to 0).
void CloseInheritedDescriptors(int keep) {
  if (keep != 0) {
    ::dup2(keep, 0);
    ::close(keep);
  }
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, 1U, ~0U, 0U) == 0) return;
#endif
  rlimit limit{};
  const long max_fd = ::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                          ? static_cast<long>(limit.rlim_cur)
                          : 65536;
  for (long fd = 1; fd < max_fd; ++fd) ::close(static_cast<int>(fd));
}

}  // namespace

LauncherDeathWatch::LauncherDeathWatch(std::chrono::milliseconds kill_grace) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return;
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  const std::string value =
      std::to_string(::getpid()) + "-" +
      std::to_string(static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec);
  const std::string entry = std::string(kEnvironmentVariable) + "=" + value;
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return;
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::sigaction(sig, &ignore, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::close(fds[1]);
    CloseInheritedDescriptors(fds[0]);
    WatchLoop(0, kill_grace.count(), entry.c_str());
  }
  ::close(fds[0]);
  pid_ = pid;
  write_fd_ = fds[1];
  environment_value_ = value;
}

LauncherDeathWatch::~LauncherDeathWatch() { Release(); }

void LauncherDeathWatch::Watch(pid_t pgid) {
  if (write_fd_ < 0 || pgid <= 0) return;
  const int32_t value = static_cast<int32_t>(pgid);
  while (::write(write_fd_, &value, sizeof(value)) < 0 && errno == EINTR) {
  }
}

void LauncherDeathWatch::Release() {
  if (pid_ <= 0) return;
  const int32_t value = kReleased;
  while (::write(write_fd_, &value, sizeof(value)) < 0 && errno == EINTR) {
  }
  ::close(write_fd_);
  write_fd_ = -1;
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

}  // namespace fsdp::distributed
