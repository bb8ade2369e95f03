#include "engine/ddp/distributed_data_parallel.h"

#include "engine/autograd/grad_mode.h"
#include "engine/autograd/variable.h"
#include "engine/core/error.h"
#include "engine/distributed/reduce_op.h"
#include "engine/ops/elementwise.h"

namespace fsdp::ddp {

DistributedDataParallel::DistributedDataParallel(nn::ModulePtr module,
                                                 DistributedDataParallelOptions options)
    : nn::Module("DistributedDataParallel"), options_(std::move(options)) {
  FSDP_CHECK(module != nullptr, "DistributedDataParallel: null module");
  FSDP_CHECK(options_.process_group != nullptr, "DistributedDataParallel wrapping ",
             module->type_name(), ": process_group is required");
  register_module("module", module);
  std::shared_ptr<distributed::ProcessGroup> pg = options_.process_group;
  {
    // `_sync_module_states`: rank 0's parameters and buffers everywhere.
    autograd::NoGradGuard no_grad;
    for (const Tensor& p : module->parameters()) pg->broadcast(p, 0);
    for (const Tensor& b : module->buffers()) pg->broadcast(b, 0);
  }
  const double world = static_cast<double>(pg->size());
  for (const Tensor& p : module->parameters()) {
    if (!p.requires_grad()) continue;
    grad_hooks_.push_back(autograd::register_post_accumulate_grad_hook(
        p, [pg, world](const Tensor& param) {
          autograd::NoGradGuard no_grad;
          Tensor grad = param.grad();
          pg->all_reduce(grad, distributed::Sum());
          grad.copy_(ops::kernels::DivScalar(grad, world));
        }));
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  for (autograd::RemovableHandle& handle : grad_hooks_) handle.remove();
}

void DistributedDataParallel::broadcast_buffers() {
  autograd::NoGradGuard no_grad;
  for (const Tensor& b : module()->buffers()) options_.process_group->broadcast(b, 0);
}

nn::Value DistributedDataParallel::forward(const nn::Value& args) {
  if (options_.broadcast_buffers) broadcast_buffers();
  return call_child("module", args);
}

}  // namespace fsdp::ddp
