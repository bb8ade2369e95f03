#include "engine/autograd/hooks.h"

namespace fsdp::autograd {

RemovableHandle::RemovableHandle(std::function<void()> remover)
    : state_(std::make_shared<State>()) {
  state_->remover = std::move(remover);
}

RemovableHandle::RemovableHandle(std::vector<RemovableHandle> handles)
    : state_(std::make_shared<State>()) {
  state_->remover = [handles = std::move(handles)]() mutable {
    for (RemovableHandle& handle : handles) handle.remove();
  };
}

void RemovableHandle::remove() {
  if (!state_ || state_->removed) return;
  state_->removed = true;
  std::function<void()> remover = std::move(state_->remover);
  state_->remover = nullptr;
  if (remover) remover();
}

bool RemovableHandle::active() const { return state_ && !state_->removed; }

}  // namespace fsdp::autograd
