#include "engine/autograd/saved_tensor_hooks.h"

#include <algorithm>
#include <vector>

#include "engine/core/error.h"

namespace fsdp::autograd {
namespace {
std::vector<std::shared_ptr<SavedTensorHooks>>& Stack() {
  thread_local std::vector<std::shared_ptr<SavedTensorHooks>> stack;
  return stack;
}
}  // namespace

std::shared_ptr<SavedTensorHooks> push_saved_tensor_hooks(PackHook pack, UnpackHook unpack) {
  FSDP_CHECK(pack && unpack, "saved_tensors_hooks: pack and unpack hooks must both be set");
  auto hooks = std::make_shared<SavedTensorHooks>(SavedTensorHooks{std::move(pack), std::move(unpack)});
  Stack().push_back(hooks);
  return hooks;
}

void pop_saved_tensor_hooks(const std::shared_ptr<SavedTensorHooks>& hooks) {
  auto& stack = Stack();
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, !stack.empty() && stack.back() == hooks,
                  "saved_tensors_hooks: exiting a pair of hooks that is not the innermost one "
                  "(hooks must be entered and exited in stack order on one thread)");
  stack.pop_back();
}

std::shared_ptr<SavedTensorHooks> current_saved_tensor_hooks() {
  auto& stack = Stack();
  return stack.empty() ? nullptr : stack.back();
}

size_t saved_tensor_hooks_depth() { return Stack().size(); }

SavedTensorHooksGuard::SavedTensorHooksGuard(PackHook pack, UnpackHook unpack)
    : hooks_(push_saved_tensor_hooks(std::move(pack), std::move(unpack))) {}

void erase_saved_tensor_hooks(const std::shared_ptr<SavedTensorHooks>& hooks) noexcept {
  auto& stack = Stack();
  auto it = std::find(stack.rbegin(), stack.rend(), hooks);
  if (it != stack.rend()) stack.erase(std::next(it).base());
}

SavedTensorHooksGuard::~SavedTensorHooksGuard() { erase_saved_tensor_hooks(hooks_); }

}  // namespace fsdp::autograd
