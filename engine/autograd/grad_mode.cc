#include "engine/autograd/grad_mode.h"

namespace fsdp::autograd {
namespace {
thread_local bool grad_mode_enabled = true;
}  // namespace

bool GradMode::is_enabled() { return grad_mode_enabled; }
void GradMode::set_enabled(bool enabled) { grad_mode_enabled = enabled; }

AutoGradMode::AutoGradMode(bool enabled) : previous_(GradMode::is_enabled()) {
  GradMode::set_enabled(enabled);
}
AutoGradMode::~AutoGradMode() { GradMode::set_enabled(previous_); }

}  // namespace fsdp::autograd
