#include "engine/distributed/comm_debug_mode.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "engine/core/error.h"
#include "engine/core/rank_context.h"
#include "engine/distributed/rank_comm_state.h"

namespace fsdp::distributed {

namespace internal {
RankCommState& CurrentRankCommState() { return RankContext::Current().slot<RankCommState>(); }
}  // namespace internal

using internal::CurrentRankCommState;
using internal::RankCommState;

const char* CommPhaseName(CommPhase phase) {
  return phase == CommPhase::kForward ? "forward" : "backward";
}

// ---- CommDebugMode ------------------------------------------------------------------------

CommDebugMode::CommDebugMode() { enter(); }

CommDebugMode::~CommDebugMode() {
  if (active()) exit();
}

void CommDebugMode::enter() {
  std::lock_guard<std::mutex> lock(mu_);
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, context_ == nullptr,
                  "CommDebugMode::enter: already active on rank ", context_->rank());
  counts_.clear();
  bytes_.clear();
  module_counts_.clear();
  module_counts_[kGlobalModule]["forward"];
  module_counts_[kGlobalModule]["backward"];
  records_.clear();
  context_ = &RankContext::Current();
  context_->slot<RankCommState>().modes.push_back(this);
}

void CommDebugMode::exit() {
  std::lock_guard<std::mutex> lock(mu_);
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, context_ != nullptr,
                  "CommDebugMode::exit: not active");
  auto& modes = context_->slot<RankCommState>().modes;
  modes.erase(std::remove(modes.begin(), modes.end(), this), modes.end());
  context_ = nullptr;
}

bool CommDebugMode::active() const {
  std::lock_guard<std::mutex> lock(mu_);
  return context_ != nullptr;
}

void CommDebugMode::Record(const CommRecord& record, const std::vector<std::string>& modules) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[record.op];
  bytes_[record.op] += record.info.payload_bytes;
  const char* phase = CommPhaseName(record.phase);
  for (const auto& m : modules) {
    auto& per_phase = module_counts_[m];
    per_phase["forward"];
    per_phase["backward"];
    ++per_phase[phase][record.op];
  }
  records_.push_back(record);
}

CommDebugMode::Counts CommDebugMode::get_comm_counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

CommDebugMode::Counts CommDebugMode::get_comm_counts(CommPhase phase) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = module_counts_.find(kGlobalModule);
  if (it == module_counts_.end()) return {};
  auto pit = it->second.find(CommPhaseName(phase));
  return pit == it->second.end() ? Counts{} : pit->second;
}

int64_t CommDebugMode::get_total_counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t total = 0;
  for (const auto& [op, n] : counts_) total += n;
  return total;
}

int64_t CommDebugMode::get_count(std::string_view op) const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t total = 0;
  for (const auto& [key, n] : counts_) {
    if (key == op) return n;
    const auto dot = key.rfind('.');
    if (dot != std::string::npos && std::string_view(key).substr(dot + 1) == op) total += n;
  }
  return total;
}

CommDebugMode::ModuleCounts CommDebugMode::get_comm_module_counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return module_counts_;
}

CommDebugMode::Counts CommDebugMode::get_comm_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

std::vector<CommRecord> CommDebugMode::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  return records_;
}

std::string CommDebugMode::str() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream os;
  for (const auto& [module, phases] : module_counts_) {
    os << module << "\n";
    for (const char* phase : {"forward", "backward"}) {
      auto it = phases.find(phase);
      if (it == phases.end() || it->second.empty()) continue;
      os << "  " << (std::string(phase) == "forward" ? "FORWARD PASS" : "BACKWARD PASS") << "\n";
      for (const auto& [op, n] : it->second) os << "    *" << op << ": " << n << "\n";
    }
  }
  return os.str();
}

// ---- Recording ----------------------------------------------------------------------------

void RecordToActiveCommModes(const CommRecord& record, const std::vector<std::string>& modules) {
  for (CommDebugMode* mode : CurrentRankCommState().modes) mode->Record(record, modules);
}

void RecordCollectiveToCommModes(const CollectiveInfo& info) {
  RankCommState& state = CurrentRankCommState();
  std::string key;
  if (state.functional_active) {
    if (state.functional_consumed) return;  // one functional collective, one count
    state.functional_consumed = true;
    key = FunctionalCommKey(state.functional_op);
  } else {
    if (!IsCountedByCommDebugMode(info.op)) return;
    key = C10dCommKey(info.op);
  }
  if (state.modes.empty()) return;

  CommRecord record;
  record.op = std::move(key);
  record.module_fqn = kGlobalModule;
  record.phase = CommPhase::kForward;
  std::vector<std::string> modules;
  auto add = [&](const std::string& m) {
    if (std::find(modules.begin(), modules.end(), m) == modules.end()) modules.push_back(m);
  };
  for (const auto& frame : state.frames) {
    if (!frame.module_fqn.empty()) {
      add(frame.module_fqn);
      record.module_fqn = frame.module_fqn;
    }
    record.phase = frame.phase;
  }
  if (auto it = state.forward_parents.find(record.module_fqn); it != state.forward_parents.end()) {
    for (const auto& m : it->second) add(m);
  }
  add(kGlobalModule);
  record.info = info;
  RecordToActiveCommModes(record, modules);
}

// ---- Guards -------------------------------------------------------------------------------

size_t EnterCommModule(std::string module_fqn, CommPhase phase) {
  RankCommState& state = CurrentRankCommState();
  if (!module_fqn.empty() && phase == CommPhase::kForward &&
      !state.forward_parents.count(module_fqn)) {
    std::vector<std::string> parents;
    for (const auto& frame : state.frames) {
      if (!frame.module_fqn.empty() && frame.module_fqn != module_fqn &&
          std::find(parents.begin(), parents.end(), frame.module_fqn) == parents.end()) {
        parents.push_back(frame.module_fqn);
      }
    }
    state.forward_parents[module_fqn] = std::move(parents);
  }
  state.frames.push_back({std::move(module_fqn), phase});
  return state.frames.size();
}

void ExitCommModule(size_t depth) {
  RankCommState& state = CurrentRankCommState();
  // Tolerate a mismatched order (a frame left open inside) by truncating.
  if (depth >= 1 && state.frames.size() >= depth) state.frames.resize(depth - 1);
}

CommPhaseGuard::CommPhaseGuard(std::string module_fqn, CommPhase phase)
    : depth_(EnterCommModule(std::move(module_fqn), phase)) {}

CommPhaseGuard::~CommPhaseGuard() { ExitCommModule(depth_); }

FunctionalCollectiveGuard::FunctionalCollectiveGuard(FunctionalCollective op) {
  RankCommState& state = CurrentRankCommState();
  previous_active_ = state.functional_active;
  previous_op_ = state.functional_op;
  previous_consumed_ = state.functional_consumed;
  state.functional_active = true;
  state.functional_op = op;
  state.functional_consumed = false;
}

FunctionalCollectiveGuard::~FunctionalCollectiveGuard() {
  RankCommState& state = CurrentRankCommState();
  state.functional_active = previous_active_;
  state.functional_op = previous_op_;
  state.functional_consumed = previous_consumed_;
}

std::string CurrentCommModule() {
  const RankCommState& state = CurrentRankCommState();
  for (auto it = state.frames.rbegin(); it != state.frames.rend(); ++it) {
    if (!it->module_fqn.empty()) return it->module_fqn;
  }
  return kGlobalModule;
}

CommPhase CurrentCommPhase() {
  const RankCommState& state = CurrentRankCommState();
  return state.frames.empty() ? CommPhase::kForward : state.frames.back().phase;
}

}  // namespace fsdp::distributed
