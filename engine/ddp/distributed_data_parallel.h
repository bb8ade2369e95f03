// DistributedDataParallel: PyTorch's torch.nn.parallel.DistributedDataParallel reduced to
// what the FSDP seeds compare against (seed 001's DDP baselines): a replicated model whose
// gradients are averaged over the process group.
//
//   auto ddp = std::make_shared<ddp::DistributedDataParallel>(model, {.process_group = pg});
//   loss(ddp, batch).backward();   // every parameter's .grad is the group's mean gradient
//   optim.step();
//
//  * Construction (`_sync_module_states`): every parameter and buffer of the module (each
//    tensor once) is broadcast from group rank 0, so every replica starts equal.
//  * Forward: with broadcast_buffers (default), the buffers are broadcast from rank 0 first,
//    then the wrapped module runs. The module is the child `module` (keys gain "module.").
//  * Backward: a post-accumulate-grad hook on every parameter that requires grad all-reduces
//    its gradient (SUM) and divides it by the group size (PyTorch's reducer averages the same
//    way; it buckets and overlaps, which changes nothing in the values). Every rank must run
//    the same backward (the same parameters get gradients, in the same order), as PyTorch's
//    DDP without find_unused_parameters requires.
//
// Ownership: shared (a module); owns the wrapped module and the hook handles (removed on
// destruction); shares the process group. Thread-safety: a rank's module tree is used by its
// thread only.
#pragma once

#include <memory>
#include <vector>

#include "engine/autograd/hooks.h"
#include "engine/distributed/process_group.h"
#include "engine/nn/module.h"

namespace fsdp::ddp {

struct DistributedDataParallelOptions {
  // The group gradients are averaged over. Required (no default group here).
  std::shared_ptr<distributed::ProcessGroup> process_group;
  // Broadcast the buffers from rank 0 at every forward. Default: true, as PyTorch.
  bool broadcast_buffers = true;
};

class DistributedDataParallel : public nn::Module {
 public:
  // Throws InvalidArgument for a null module or group.
  DistributedDataParallel(nn::ModulePtr module, DistributedDataParallelOptions options);
  ~DistributedDataParallel() override;

  // `.module`.
  nn::ModulePtr module() const { return child("module"); }
  nn::Value forward(const nn::Value& args) override;

 private:
  void broadcast_buffers();

  DistributedDataParallelOptions options_;
  std::vector<autograd::RemovableHandle> grad_hooks_;
};

}  // namespace fsdp::ddp
