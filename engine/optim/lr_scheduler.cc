#include "engine/optim/lr_scheduler.h"

namespace fsdp::optim {

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer) {
  for (ParamGroup& group : optimizer_.param_groups()) {
    if (!group.initial_lr) group.initial_lr = group.lr;
    base_lrs_.push_back(*group.initial_lr);
  }
}

void LRScheduler::step() {
  ++last_epoch_;
  std::vector<double> lrs = get_lr();
  auto& groups = optimizer_.param_groups();
  FSDP_INTERNAL_ASSERT(lrs.size() == groups.size(), "scheduler returned ", lrs.size(), " lrs for ",
                       groups.size(), " groups");
  for (size_t i = 0; i < groups.size(); ++i) groups[i].lr = lrs[i];
  last_lr_ = std::move(lrs);
}

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  FSDP_CHECK(step_size > 0, "StepLR: step_size must be positive, got ", step_size);
  initial_step();
}

std::vector<double> StepLR::get_lr() const {
  std::vector<double> out;
  const bool decay = last_epoch() != 0 && last_epoch() % step_size_ == 0;
  for (const ParamGroup& group : optimizer().param_groups()) {
    out.push_back(decay ? group.lr * gamma_ : group.lr);
  }
  return out;
}

}  // namespace fsdp::optim
