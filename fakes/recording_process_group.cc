#include "fakes/recording_process_group.h"

#include <sstream>

namespace fsdp::fakes {

void CollectiveTrace::Add(const distributed::CollectiveInfo& info) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.push_back(info);
}

std::vector<distributed::CollectiveInfo> CollectiveTrace::All() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_;
}

std::vector<distributed::CollectiveInfo> CollectiveTrace::ForRank(int global_rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<distributed::CollectiveInfo> out;
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

std::string TraceLine(const distributed::CollectiveInfo& info) {
  std::ostringstream os;
  os << distributed::CollectiveOpName(info.op) << " group=" << info.group_name;
  if (info.has_payload) {
    os << " " << DTypeName(info.dtype);
    if (info.op == distributed::CollectiveOp::kAllgather) {
      os << " numels=[";
      for (size_t i = 0; i < info.output_numels.size(); ++i) {
        os << (i ? "," : "") << info.output_numels[i];
      }
      os << "]";
    } else {
      os << " numel=" << info.input_numel();
    }
  }
  if (info.has_reduce_op) os << " " << distributed::ReduceOpName(info.reduce_op);
  if (info.op == distributed::CollectiveOp::kBroadcast) os << " root=" << info.root;
  if (info.op == distributed::CollectiveOp::kNewGroup) {
    os << " ranks=[";
    for (size_t i = 0; i < info.new_group_ranks.size(); ++i) {
      os << (i ? "," : "") << info.new_group_ranks[i];
    }
    os << "]";
  }
  return os.str();
}

RecordingProcessGroup::RecordingProcessGroup(std::shared_ptr<distributed::ProcessGroup> inner,
                                             std::shared_ptr<CollectiveTrace> trace)
    : ProcessGroupWrapper(std::move(inner)), trace_(std::move(trace)) {
  FSDP_CHECK(trace_ != nullptr, "RecordingProcessGroup: null trace");
}

std::shared_ptr<distributed::ProcessGroup> RecordingProcessGroup::Wrap(
    std::shared_ptr<distributed::ProcessGroup> inner) {
  return std::make_shared<RecordingProcessGroup>(std::move(inner), trace_);
}

std::shared_ptr<distributed::Work> RecordingProcessGroup::Intercept(const distributed::CollectiveInfo& info,
                                                             const std::vector<Tensor>& /*outputs*/,
                                                             const Forward& forward) {
  trace_->Add(info);
  return forward();
}

}  // namespace fsdp::fakes
