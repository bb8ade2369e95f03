// Saved-tensor hooks (torch.autograd.graph.saved_tensors_hooks): a thread-local stack of
// (pack, unpack) pairs. While the stack is non-empty, every SavedTensor created on this
// thread is packed by the innermost pair (pack(detached alias of the tensor) -> opaque
// value; the alias shares the tensor's storage) and unpacked by the
// same pair when backward needs it (unpack(value) -> tensor). Non-reentrant activation
// checkpointing is built on this.
//
// Ownership: the stack holds shared_ptrs; each SavedTensor keeps the pair it was packed with.
// Thread-safety: the stack is per thread (each rank thread has its own).
#pragma once

#include <any>
#include <cstddef>
#include <functional>
#include <memory>

#include "engine/core/tensor.h"

namespace fsdp::autograd {

using PackHook = std::function<std::any(const Tensor& tensor)>;
using UnpackHook = std::function<Tensor(const std::any& packed)>;

// One (pack, unpack) pair of the stack.
struct SavedTensorHooks {
  PackHook pack;
  UnpackHook unpack;
};

// Pushes a pair; returns it (the identity pop_saved_tensor_hooks checks).
std::shared_ptr<SavedTensorHooks> push_saved_tensor_hooks(PackHook pack, UnpackHook unpack);
// Pops `hooks`, which must be the innermost pair.
void pop_saved_tensor_hooks(const std::shared_ptr<SavedTensorHooks>& hooks);
// Removes `hooks` wherever it is in the stack (for unwinding); never throws.
void erase_saved_tensor_hooks(const std::shared_ptr<SavedTensorHooks>& hooks) noexcept;
// The innermost pair, or null.
std::shared_ptr<SavedTensorHooks> current_saved_tensor_hooks();
size_t saved_tensor_hooks_depth();

// `with saved_tensors_hooks(pack, unpack):` as an RAII guard.
class SavedTensorHooksGuard {
 public:
  SavedTensorHooksGuard(PackHook pack, UnpackHook unpack);
  ~SavedTensorHooksGuard();
  SavedTensorHooksGuard(const SavedTensorHooksGuard&) = delete;
  SavedTensorHooksGuard& operator=(const SavedTensorHooksGuard&) = delete;

 private:
  std::shared_ptr<SavedTensorHooks> hooks_;
};

}  // namespace fsdp::autograd
