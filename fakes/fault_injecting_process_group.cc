#include "fakes/fault_injecting_process_group.h"

#include <thread>

namespace fsdp::fakes {

Fault Fault::Delay(int rank, uint64_t collective, std::chrono::milliseconds delay) {
  Fault f;
  f.kind = Kind::kDelay;
  f.rank = rank;
  f.collective = collective;
  f.delay = delay;
  return f;
}

Fault Fault::Fail(int rank, uint64_t collective, ErrorCode code, std::string message) {
  Fault f;
  f.kind = Kind::kFail;
  f.rank = rank;
  f.collective = collective;
  f.code = code;
  f.message = std::move(message);
  return f;
}

Fault Fault::Drop(int rank, uint64_t collective) {
  Fault f;
  f.kind = Kind::kDrop;
  f.rank = rank;
  f.collective = collective;
  return f;
}

Fault Fault::Corrupt(int rank, uint64_t collective, double delta) {
  Fault f;
  f.kind = Kind::kCorrupt;
  f.rank = rank;
  f.collective = collective;
  f.corrupt_delta = delta;
  return f;
}

void FaultPlan::Add(Fault fault) {
  FSDP_CHECK(fault.collective >= 1, "FaultPlan::Add: collective index is 1-based, got ",
             fault.collective);
  std::lock_guard<std::mutex> lock(mu_);
  faults_.push_back(std::move(fault));
}

std::vector<Fault> FaultPlan::Match(const distributed::CollectiveInfo& info) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Fault> fired;
  for (size_t i = 0; i < faults_.size(); ++i) {
    const Fault& f = faults_[i];
    if (f.rank >= 0 && f.rank != info.global_rank) continue;
    if (f.op && *f.op != info.op) continue;
    if (!f.group.empty() && f.group != info.group_name) continue;
    if (++counts_[{i, info.global_rank}] == f.collective) {
      fired.push_back(f);
      ++fired_;
    }
  }
  return fired;
}

int FaultPlan::fired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fired_;
}

FaultInjectingProcessGroup::FaultInjectingProcessGroup(std::shared_ptr<distributed::ProcessGroup> inner,
                                                       std::shared_ptr<FaultPlan> plan)
    : ProcessGroupWrapper(std::move(inner)), plan_(std::move(plan)) {
  FSDP_CHECK(plan_ != nullptr, "FaultInjectingProcessGroup: null plan");
}

std::shared_ptr<distributed::ProcessGroup> FaultInjectingProcessGroup::Wrap(
    std::shared_ptr<distributed::ProcessGroup> inner) {
  return std::make_shared<FaultInjectingProcessGroup>(std::move(inner), plan_);
}

namespace {

void AddToEveryElement(const Tensor& t, double delta) {
  if (t.numel() == 0) return;
  std::vector<double> values = t.to_doubles();
  for (double& v : values) v += delta;
  Tensor dst = t;
  dst.copy_(Tensor::from_doubles(values, t.sizes(), t.dtype()));
}

}  // namespace

std::shared_ptr<distributed::Work> FaultInjectingProcessGroup::Intercept(
    const distributed::CollectiveInfo& info, const std::vector<Tensor>& outputs, const Forward& forward) {
  const std::vector<Fault> faults = plan_->Match(info);
  for (const Fault& f : faults) {
    if (f.kind == Fault::Kind::kDelay) std::this_thread::sleep_for(f.delay);
  }
  for (const Fault& f : faults) {
    if (f.kind == Fault::Kind::kFail) {
      throw Error(f.code, f.message + " (FaultInjectingProcessGroup, on " + info.str() + ")");
    }
  }
  for (const Fault& f : faults) {
    if (f.kind == Fault::Kind::kDrop && info.op != distributed::CollectiveOp::kNewGroup) {
      return std::make_shared<distributed::CompletedWork>(info.str() + " (dropped)", timeout());
    }
  }
  auto work = forward();
  for (const Fault& f : faults) {
    if (f.kind != Fault::Kind::kCorrupt) continue;
    if (work) work->wait();
    for (const Tensor& out : outputs) AddToEveryElement(out, f.corrupt_delta);
  }
  return work;
}

}  // namespace fsdp::fakes
