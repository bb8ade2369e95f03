#include "fakes/recording_process_group.h"

#include <sstream>

namespace fsdp::fakes {

void CollectiveTrace::Add(const dist::CollectiveInfo& info) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.push_back(info);
}

std::vector<dist::CollectiveInfo> CollectiveTrace::All() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_;
}

std::vector<dist::CollectiveInfo> CollectiveTrace::ForRank(int global_rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<dist::CollectiveInfo> out;
  for (const auto& e : entries_) {
    if (e.global_rank == global_rank) out.push_back(e);
  }
  return out;
}

std::vector<std::string> CollectiveTrace::OpLines(int global_rank) const {
  std::vector<std::string> lines;
  for (const auto& e : ForRank(global_rank)) lines.push_back(TraceLine(e));
  return lines;
}

void CollectiveTrace::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
}

std::string TraceLine(const dist::CollectiveInfo& info) {
  std::ostringstream os;
  os << dist::CollectiveOpName(info.op) << " group=" << info.group_name;
  if (info.has_payload) {
    os << " " << DTypeName(info.dtype);
    if (info.op == dist::CollectiveOp::kAllgather) {
      os << " numels=[";
      for (size_t i = 0; i < info.output_numels.size(); ++i) {
        os << (i ? "," : "") << info.output_numels[i];
      }
      os << "]";
    } else {
      os << " numel=" << info.input_numel();
    }
  }
  if (info.has_reduce_op) os << " " << dist::ReduceOpName(info.reduce_op);
  if (info.op == dist::CollectiveOp::kBroadcast) os << " root=" << info.root;
  if (info.op == dist::CollectiveOp::kNewGroup) {
    os << " ranks=[";
    for (size_t i = 0; i < info.new_group_ranks.size(); ++i) {
      os << (i ? "," : "") << info.new_group_ranks[i];
    }
    os << "]";
  }
  return os.str();
}

RecordingProcessGroup::RecordingProcessGroup(std::shared_ptr<dist::ProcessGroup> inner,
                                             std::shared_ptr<CollectiveTrace> trace)
    : ProcessGroupWrapper(std::move(inner)), trace_(std::move(trace)) {
  FSDP_CHECK(trace_ != nullptr, "RecordingProcessGroup: null trace");
}

std::shared_ptr<dist::ProcessGroup> RecordingProcessGroup::Wrap(
    std::shared_ptr<dist::ProcessGroup> inner) {
  return std::make_shared<RecordingProcessGroup>(std::move(inner), trace_);
}

std::shared_ptr<dist::Work> RecordingProcessGroup::Intercept(const dist::CollectiveInfo& info,
                                                             const std::vector<Tensor>& /*outputs*/,
                                                             const Forward& forward) {
  trace_->Add(info);
  return forward();
}

}  // namespace fsdp::fakes
