#include "conformance/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace fsdp::conformance {
namespace {

std::atomic<int> g_received{0};
std::atomic<bool> g_active{false};  // a RunInterrupt is alive

void WriteStderr(const char* text) {
  const ssize_t ignored = ::write(2, text, std::strlen(text));
  (void)ignored;
}

void OnSignal(int signal) {
  int expected = 0;
  if (!g_received.compare_exchange_strong(expected, signal)) {
    // A second signal: end now, as the default disposition would.
    ::signal(signal, SIG_DFL);
    ::raise(signal);
    return;
  }
  WriteStderr(signal == SIGINT
                  ? "fsdp-conform: interrupted (SIGINT): stopping after the running case and "
                    "writing the partial report; interrupt again to end at once\n"
                  : "fsdp-conform: interrupted (SIGTERM): stopping after the running case and "
                    "writing the partial report; signal again to end at once\n");
}

}  // namespace

struct RunInterrupt::Saved {
  struct sigaction old_int {};
  struct sigaction old_term {};
};

RunInterrupt::RunInterrupt() : saved_(std::make_unique<Saved>()) {
  g_received.store(0);
  g_active.store(true);
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, &saved_->old_int);
  ::sigaction(SIGTERM, &sa, &saved_->old_term);
}

RunInterrupt::~RunInterrupt() {
  ::sigaction(SIGINT, &saved_->old_int, nullptr);
  ::sigaction(SIGTERM, &saved_->old_term, nullptr);
  g_active.store(false);
}

int RunInterrupt::received() { return g_received.load(); }

void RunInterrupt::Note(int signal) {
  if (!g_active.load()) {
    ::signal(signal, SIG_DFL);
    ::raise(signal);
    return;
  }
  int expected = 0;
  g_received.compare_exchange_strong(expected, signal);
}

void RunInterrupt::EndAsSignalled() {
  const int signal = g_received.load();
  if (signal == 0) return;
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

}  // namespace fsdp::conformance
