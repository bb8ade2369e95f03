#include "engine/distributed/launch/launcher_death_watch.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace fsdp::distributed {

namespace {

constexpr int32_t kReleased = 0;  // the message that ends the watch quietly
constexpr int kMaxGroups = 65536;

// The watch process: reads process groups from fd 0 until Release's message (exit quietly) or
// end of file (the launcher died: stop every group). Async-signal-safe calls only.
[[noreturn]] void WatchLoop(int read_fd, int64_t kill_grace_ms) {
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
  for (int i = 0; i < count; ++i) ::kill(-groups[i], SIGTERM);
  timespec grace{static_cast<time_t>(kill_grace_ms / 1000),
                 static_cast<long>((kill_grace_ms % 1000) * 1000000)};
  while (::nanosleep(&grace, &grace) != 0 && errno == EINTR) {
  }
  for (int i = 0; i < count; ++i) ::kill(-groups[i], SIGKILL);
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
    WatchLoop(0, kill_grace.count());
  }
  ::close(fds[0]);
  pid_ = pid;
  write_fd_ = fds[1];
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
