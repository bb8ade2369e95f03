// Learning-rate schedulers (torch.optim.lr_scheduler), chainable form.
//
// LRScheduler sets every group's initial_lr on construction and performs the initial step
// (last_epoch -1 → 0), like PyTorch's `_initial_step`. StepLR multiplies each group's lr by
// gamma every step_size epochs.
// Ownership: holds a reference to the optimizer, which must outlive the scheduler.
// Thread-safety: none; belongs to the optimizer's rank thread.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/optim/optimizer.h"

namespace fsdp::optim {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // last_epoch += 1, then every group's lr = get_lr().
  void step();
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  int64_t last_epoch() const { return last_epoch_; }

 protected:
  explicit LRScheduler(Optimizer& optimizer);
  // Call at the end of the subclass constructor (after its fields are set).
  void initial_step() { step(); }
  // The new lr of every group for last_epoch (chainable: may read the current group lrs).
  virtual std::vector<double> get_lr() const = 0;
  Optimizer& optimizer() const { return optimizer_; }

 private:
  Optimizer& optimizer_;
  int64_t last_epoch_ = -1;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
};

class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);

 protected:
  std::vector<double> get_lr() const override;

 private:
  int64_t step_size_;
  double gamma_;
};

}  // namespace fsdp::optim
