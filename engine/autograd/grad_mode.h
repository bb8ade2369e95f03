// GradMode: whether differentiable operations record autograd history on the calling thread
// (torch.is_grad_enabled / torch.no_grad / torch.enable_grad).
//
// The flag is thread-local, so ranks running as threads of one process are independent; a
// new thread starts with grad mode enabled, as in PyTorch. During backward the engine sets it
// to create_graph for the duration of each node and hook.
// Ownership: no objects; the guards restore the previous value on destruction.
// Thread-safety: each thread sees only its own flag.
#pragma once

namespace fsdp::autograd {

class GradMode {
 public:
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// Sets grad mode for its lifetime and restores the previous value (torch.set_grad_enabled).
class AutoGradMode {
 public:
  explicit AutoGradMode(bool enabled);
  ~AutoGradMode();
  AutoGradMode(const AutoGradMode&) = delete;
  AutoGradMode& operator=(const AutoGradMode&) = delete;

 private:
  bool previous_;
};

// torch.no_grad().
class NoGradGuard : public AutoGradMode {
 public:
  NoGradGuard() : AutoGradMode(false) {}
};

// torch.enable_grad().
class EnableGradGuard : public AutoGradMode {
 public:
  EnableGradGuard() : AutoGradMode(true) {}
};

}  // namespace fsdp::autograd
