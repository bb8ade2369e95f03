#include "fakes/threaded_process_group.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>
#include <utility>

#include "engine/distributed/flight_recorder.h"
#include "engine/distributed/host_staging.h"

namespace fsdp::fakes {

namespace internal {

// One rank's side of a collective: host views of its buffers, valid while it waits.
struct Participant {
  distributed::CollectiveInfo info;
  const char* input = nullptr;
  char* output = nullptr;
  std::vector<char*> outputs;  // allgather_
  size_t input_bytes = 0;
  double premul_factor = 1.0;
  std::shared_ptr<GroupState> new_group;  // new_group: set on members
};

// The k-th collective of a group: who arrived, and its outcome.
struct Rendezvous {
  enum class State { kGathering, kExecuting, kDone, kFailed };
  explicit Rendezvous(size_t n) : slots(n, nullptr) {}
  std::vector<Participant*> slots;
  int arrived = 0;
  int departed = 0;
  std::vector<int> phase_finished;  // kExecuting: ranks done with each phase of their share
  std::string share_error;          // the first error a rank met while doing its share
  State state = State::kGathering;
  ErrorCode code = ErrorCode::kInternal;
  std::string error;
  std::condition_variable cv;
  std::shared_ptr<GroupState> new_group;
};

struct GroupState {
  std::string name;
  std::vector<int> ranks;     // global ranks, ascending
  int subgroups_created = 0;  // names children: "1", "2", ... of the world; "1.1" below
  std::map<uint64_t, std::shared_ptr<Rendezvous>> pending;
};

}  // namespace internal

using internal::GroupState;
using internal::Participant;
using internal::Rendezvous;

namespace {

constexpr size_t kReportEntries = 4;     // flight-recorder entries per rank in reports
constexpr size_t kMaxMismatchLines = 8;  // differing ranks shown in a mismatch error

std::string RanksStr(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  os << "]";
  return os.str();
}

std::string RankName(const GroupState& group, int group_rank) {
  std::ostringstream os;
  os << "rank " << group_rank;
  if (group.ranks[group_rank] != group_rank) os << " (global " << group.ranks[group_rank] << ")";
  return os.str();
}

}  // namespace

// ---- ThreadedWorld ------------------------------------------------------------------------

std::shared_ptr<ThreadedWorld> ThreadedWorld::Create(int world_size,
                                                     std::chrono::milliseconds timeout) {
  FSDP_CHECK(world_size >= 1, "ThreadedWorld: world size must be >= 1, got ", world_size);
  FSDP_CHECK(timeout.count() > 0, "ThreadedWorld: timeout must be positive, got ", timeout.count(),
             " ms");
  return std::shared_ptr<ThreadedWorld>(new ThreadedWorld(world_size, timeout));
}

ThreadedWorld::ThreadedWorld(int world_size, std::chrono::milliseconds timeout)
    : world_size_(world_size),
      timeout_(timeout),
      ranks_(static_cast<size_t>(world_size)),
      last_progress_(std::chrono::steady_clock::now()) {
  std::vector<int> all(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) all[r] = r;
  std::lock_guard<std::mutex> lock(mu_);
  world_group_ = NewGroupState("0", all);
}

ThreadedWorld::~ThreadedWorld() = default;

std::shared_ptr<GroupState> ThreadedWorld::NewGroupState(const std::string& name,
                                                         const std::vector<int>& ranks) {
  auto group = std::make_shared<GroupState>();
  group->name = name;
  group->ranks = ranks;
  groups_.erase(
      std::remove_if(groups_.begin(), groups_.end(), [](const auto& g) { return g.expired(); }),
      groups_.end());
  groups_.push_back(group);
  return group;
}

std::string ThreadedWorld::Describe(const GroupState& group) const {
  std::ostringstream os;
  os << "group " << group.name << " (size " << group.ranks.size();
  if (group.ranks.size() != static_cast<size_t>(world_size_)) {
    os << ", global ranks " << RanksStr(group.ranks);
  }
  os << ", world size " << world_size_ << ")";
  return os.str();
}

std::shared_ptr<distributed::ProcessGroup> ThreadedWorld::CreateWorldGroup(int rank) {
  FSDP_CHECK(rank >= 0 && rank < world_size_, "ThreadedWorld::CreateWorldGroup: rank ", rank,
             " out of range for world size ", world_size_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, !ranks_[rank].world_group_created,
                    "ThreadedWorld::CreateWorldGroup: rank ", rank,
                    " already has its world group handle (one handle per rank and group)");
    ranks_[rank].world_group_created = true;
  }
  return std::make_shared<ThreadedProcessGroup>(shared_from_this(), world_group_, rank);
}

void ThreadedWorld::AttachRankContext(int rank, RankContext* context) {
  FSDP_CHECK(context != nullptr, "ThreadedWorld::AttachRankContext: null context for rank ", rank);
  auto recorder = distributed::FlightRecorderOf(*context);
  std::lock_guard<std::mutex> lock(mu_);
  ranks_.at(static_cast<size_t>(rank)).recorder = std::move(recorder);
}

void ThreadedWorld::NotifyAllPending() {
  for (const auto& weak : groups_) {
    if (auto group = weak.lock()) {
      for (auto& [index, rv] : group->pending) rv->cv.notify_all();
    }
  }
}

void ThreadedWorld::MarkRankReturned(int rank) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ranks_.at(static_cast<size_t>(rank)).status = RankStatus::kReturned;
    ++finished_ranks_;
    last_progress_ = std::chrono::steady_clock::now();
    NotifyAllPending();
  }
  finished_cv_.notify_all();
}

void ThreadedWorld::MarkRankFailed(int rank, const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& state = ranks_.at(static_cast<size_t>(rank));
    state.status = RankStatus::kFailed;
    state.error = what;
    ++finished_ranks_;
    last_progress_ = std::chrono::steady_clock::now();
  }
  Abort("rank " + std::to_string(rank) + " failed: " + what);
  finished_cv_.notify_all();
}

void ThreadedWorld::Abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_) {
    aborted_ = true;
    abort_reason_ = reason;
  }
  NotifyAllPending();
}

bool ThreadedWorld::aborted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_;
}

std::chrono::steady_clock::time_point ThreadedWorld::last_progress() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_progress_;
}

bool ThreadedWorld::WaitAllFinished(std::chrono::steady_clock::time_point deadline) const {
  std::unique_lock<std::mutex> lock(mu_);
  return finished_cv_.wait_until(lock, deadline, [&] { return finished_ranks_ == world_size_; });
}

std::string ThreadedWorld::RankLine(int rank, size_t entries) const {
  const RankState& state = ranks_[static_cast<size_t>(rank)];
  std::ostringstream os;
  switch (state.status) {
    case RankStatus::kRunning:
      os << "running";
      break;
    case RankStatus::kReturned:
      os << "returned from its function";
      break;
    case RankStatus::kFailed:
      os << "failed: " << state.error.substr(0, state.error.find('\n'));
      break;
  }
  os << "; last collectives:\n";
  if (state.recorder != nullptr) {
    os << state.recorder->Dump(entries, "      ");
  } else {
    os << "      (no flight recorder attached)\n";
  }
  return os.str();
}

std::string ThreadedWorld::Report() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream os;
  os << "threaded world of " << world_size_ << " ranks";
  if (aborted_) os << " (aborted: " << abort_reason_.substr(0, abort_reason_.find('\n')) << ")";
  os << "\n";
  for (int r = 0; r < world_size_; ++r) os << "  rank " << r << ": " << RankLine(r, 8);
  return os.str();
}

namespace {

// Empty when every participant issued the same collective; otherwise the error message.
template <typename DescribeGroup>
std::string CheckFingerprints(const GroupState& group, const Rendezvous& rv,
                              const DescribeGroup& group_desc) {
  const Participant& first = *rv.slots[0];
  std::ostringstream os;
  size_t shown = 0;
  size_t differing = 0;
  for (size_t r = 1; r < rv.slots.size(); ++r) {
    const std::string diff = distributed::CollectiveMismatch(first.info, rv.slots[r]->info);
    if (diff.empty()) continue;
    ++differing;
    if (shown++ < kMaxMismatchLines) {
      os << "\n  " << RankName(group, static_cast<int>(r))
         << " issued: " << rv.slots[r]->info.fingerprint_str() << "   <- differs: " << diff;
    }
  }
  if (differing == 0) return "";
  std::ostringstream msg;
  msg << "collective mismatch on " << group_desc() << ": " << differing
      << " rank(s) issued a different collective than rank 0\n  " << RankName(group, 0)
      << " issued: " << first.info.fingerprint_str() << os.str();
  if (shown > kMaxMismatchLines) msg << "\n  ... and " << (shown - kMaxMismatchLines) << " more";
  return msg.str();
}

void CopyBytes(char* dst, const char* src, size_t n) {
  if (n == 0 || dst == src) return;
  std::memcpy(dst, src, n);
}

// [Note: every rank does its own share] Once all participants arrived and match, each rank's
// thread performs its own share of the collective, so that a collective runs on as many cores
// as there are ranks: all-gathers and broadcast copy into the rank's own outputs, reduce-scatter
// reduces the rank's own chunk over all inputs, all-reduce runs in two phases (each rank reduces
// its 1/size slice into its own buffer, then copies every peer's reduced slice). A rank only
// writes its own buffers and only reads peers' regions that no rank writes in the same phase,
// so in-place calls stay correct. Reductions are elementwise in rank order
// (ReduceInRankOrder), so any slicing gives results bit-identical to reducing whole buffers.
int PhaseCount(distributed::CollectiveOp op) {
  return op == distributed::CollectiveOp::kAllreduce ? 2 : 1;
}

// [begin, end) of the elements rank `me` of `n` reduces in an all-reduce of `numel` elements.
std::pair<size_t, size_t> SliceOf(size_t numel, size_t me, size_t n) {
  const size_t base = numel / n;
  const size_t extra = numel % n;
  const size_t begin = me * base + std::min(me, extra);
  return {begin, begin + base + (me < extra ? 1 : 0)};
}

// Rank `me`'s share of phase `phase` of the collective (see the Note above).
void ExecuteShare(Rendezvous& rv, size_t me, int phase) {
  const Participant& p0 = *rv.slots[0];
  const auto& info = p0.info;
  const size_t n = rv.slots.size();
  Participant& mine = *rv.slots[me];
  std::vector<double> factors(n);
  for (size_t r = 0; r < n; ++r) factors[r] = rv.slots[r]->premul_factor;
  std::vector<const void*> inputs(n);
  switch (info.op) {
    case distributed::CollectiveOp::kAllgatherBase: {
      const size_t chunk = p0.input_bytes;
      for (size_t r = 0; r < n; ++r) CopyBytes(mine.output + r * chunk, rv.slots[r]->input, chunk);
      break;
    }
    case distributed::CollectiveOp::kReduceScatterBase: {
      const size_t numel = static_cast<size_t>(info.output_numel());
      const size_t chunk = numel * ElementSize(info.dtype);
      for (size_t r = 0; r < n; ++r) inputs[r] = rv.slots[r]->input + me * chunk;
      distributed::ReduceInRankOrder(info.dtype, info.reduce_op, inputs, factors, mine.output,
                                     numel);
      break;
    }
    case distributed::CollectiveOp::kAllreduce: {
      const size_t numel = static_cast<size_t>(info.input_numel());
      const size_t element = ElementSize(info.dtype);
      if (phase == 0) {
        const auto [begin, end] = SliceOf(numel, me, n);
        for (size_t r = 0; r < n; ++r) inputs[r] = rv.slots[r]->input + begin * element;
        distributed::ReduceInRankOrder(info.dtype, info.reduce_op, inputs, factors,
                                       mine.output + begin * element, end - begin);
      } else {
        for (size_t r = 0; r < n; ++r) {
          if (r == me) continue;
          const auto [begin, end] = SliceOf(numel, r, n);
          CopyBytes(mine.output + begin * element, rv.slots[r]->output + begin * element,
                    (end - begin) * element);
        }
      }
      break;
    }
    case distributed::CollectiveOp::kBroadcast: {
      const Participant& root = *rv.slots[static_cast<size_t>(info.root)];
      CopyBytes(mine.output, root.input, root.input_bytes);
      break;
    }
    case distributed::CollectiveOp::kAllgather: {
      for (size_t r = 0; r < n; ++r) {
        CopyBytes(mine.outputs[r], rv.slots[r]->input, rv.slots[r]->input_bytes);
      }
      break;
    }
    case distributed::CollectiveOp::kBarrier:
    case distributed::CollectiveOp::kNewGroup:
      break;
  }
}

}  // namespace

void ThreadedWorld::Join(GroupState& group, int group_rank, uint64_t index, Participant& p) {
  using State = Rendezvous::State;
  const size_t size = group.ranks.size();
  std::unique_lock<std::mutex> lock(mu_);
  last_progress_ = std::chrono::steady_clock::now();
  auto& slot = group.pending[index];
  if (!slot) slot = std::make_shared<Rendezvous>(size);
  const std::shared_ptr<Rendezvous> rv = slot;
  // Only error messages describe the group: built on demand, not on every collective.
  auto group_desc = [&] { return Describe(group); };
  // [Note: waking after unlocking] A rank that changes the rendezvous under mu_ signals its
  // condition variable only once it has released mu_, so that the woken ranks do not at once
  // block on mu_ again (a second futex sleep and wake-up per waiter). The rendezvous outlives
  // the signal: `rv` holds it.
  bool wake_pending = false;
  auto wake_later = [&] { wake_pending = true; };
  auto unlock_and_wake = [&] {
    lock.unlock();
    if (wake_pending) rv->cv.notify_all();
    wake_pending = false;
  };

  auto fail = [&](ErrorCode code, std::string message) {
    rv->state = State::kFailed;
    rv->code = code;
    rv->error = std::move(message);
    wake_later();
  };
  auto missing_ranks = [&] {
    std::vector<int> missing;
    for (size_t r = 0; r < size; ++r) {
      if (rv->slots[r] == nullptr) missing.push_back(static_cast<int>(r));
    }
    return missing;
  };
  auto missing_report = [&](const std::vector<int>& missing) {
    std::ostringstream os;
    std::vector<int> arrived;
    for (size_t r = 0; r < size; ++r) {
      if (rv->slots[r] != nullptr) arrived.push_back(static_cast<int>(r));
    }
    os << "\n  arrived (" << arrived.size() << " of " << size << "): ranks " << RanksStr(arrived);
    for (int r : missing) {
      os << "\n  missing " << RankName(group, r) << ": "
         << RankLine(group.ranks[r], kReportEntries);
    }
    return os.str();
  };

  if (rv->state == State::kGathering && aborted_) {
    fail(ErrorCode::kAborted, "aborted on " + group_desc() + ": " + abort_reason_);
  }
  if (rv->state == State::kGathering) {
    rv->slots[group_rank] = &p;
    ++rv->arrived;
  }
  if (rv->state == State::kGathering && rv->arrived == static_cast<int>(size)) {
    // Last to arrive: check the fingerprints, then perform the collective.
    std::string mismatch = CheckFingerprints(group, *rv, group_desc);
    if (!mismatch.empty()) {
      fail(ErrorCode::kDataLoss, std::move(mismatch));
    } else if (p.info.op == distributed::CollectiveOp::kNewGroup) {
      const std::string index = std::to_string(++group.subgroups_created);
      rv->new_group = NewGroupState(group.name == "0" ? index : group.name + "." + index,
                                    p.info.new_group_ranks);
      rv->state = State::kDone;
      wake_later();
    } else {
      rv->state = State::kExecuting;
      rv->phase_finished.assign(static_cast<size_t>(PhaseCount(p.info.op)), 0);
      wake_later();
    }
  } else {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (rv->state == State::kGathering) {
      if (aborted_) {
        fail(ErrorCode::kAborted, "aborted on " + group_desc() + ": " + abort_reason_);
        break;
      }
      std::vector<int> gone;
      for (int r : missing_ranks()) {
        if (ranks_[group.ranks[r]].status == RankStatus::kReturned) gone.push_back(r);
      }
      if (!gone.empty()) {
        std::ostringstream os;
        os << "can never complete on " << group_desc() << ": ";
        for (size_t i = 0; i < gone.size(); ++i) {
          os << (i ? ", " : "") << RankName(group, gone[i]);
        }
        os << (gone.size() == 1 ? " has" : " have")
           << " returned from the rank function without joining it"
           << missing_report(missing_ranks());
        fail(ErrorCode::kUnavailable, os.str());
        break;
      }
      if (rv->cv.wait_until(lock, deadline) == std::cv_status::timeout &&
          rv->state == State::kGathering) {
        std::ostringstream os;
        os << "timed out after " << timeout_.count() << " ms waiting for " << group_desc()
           << missing_report(missing_ranks());
        fail(ErrorCode::kDeadlineExceeded, os.str());
        break;
      }
    }
  }
  if (rv->state == State::kExecuting) {
    // Every participant does its own share, phase by phase ([Note: every rank does its own
    // share]); the last to finish the last phase completes the collective.
    const int phases = static_cast<int>(rv->phase_finished.size());
    for (int phase = 0; phase < phases; ++phase) {
      unlock_and_wake();
      std::string error;
      try {
        ExecuteShare(*rv, static_cast<size_t>(group_rank), phase);
      } catch (const std::exception& e) {
        error = e.what();
      }
      lock.lock();
      if (!error.empty() && rv->share_error.empty()) rv->share_error = std::move(error);
      if (++rv->phase_finished[phase] == static_cast<int>(size)) {
        if (phase + 1 == phases) {
          if (rv->share_error.empty()) {
            rv->state = State::kDone;
          } else {
            rv->state = State::kFailed;
            rv->code = ErrorCode::kInternal;
            rv->error = "failed on " + group_desc() + " while copying between ranks: " +
                        rv->share_error;
          }
        }
        wake_later();
      } else {
        while (rv->phase_finished[phase] < static_cast<int>(size)) rv->cv.wait(lock);
      }
    }
  }

  last_progress_ = std::chrono::steady_clock::now();
  if (++rv->departed == static_cast<int>(size)) group.pending.erase(index);
  const State state = rv->state;
  if (p.info.op == distributed::CollectiveOp::kNewGroup && state != State::kFailed) {
    const auto& members = p.info.new_group_ranks;
    if (std::find(members.begin(), members.end(), p.info.global_rank) != members.end()) {
      p.new_group = rv->new_group;
    }
  }
  const ErrorCode code = rv->code;
  const std::string error = state == State::kFailed ? rv->error : std::string();
  unlock_and_wake();
  if (state == State::kFailed) throw Error(code, "[" + p.info.str() + "] " + error);
}

std::vector<std::shared_ptr<distributed::ProcessGroup>> MakeThreadedWorldGroups(
    int world_size, std::chrono::milliseconds timeout) {
  auto world = ThreadedWorld::Create(world_size, timeout);
  std::vector<std::shared_ptr<distributed::ProcessGroup>> groups;
  for (int r = 0; r < world_size; ++r) groups.push_back(world->CreateWorldGroup(r));
  return groups;
}

// ---- ThreadedProcessGroup -----------------------------------------------------------------

ThreadedProcessGroup::ThreadedProcessGroup(std::shared_ptr<ThreadedWorld> world,
                                           std::shared_ptr<GroupState> group, int group_rank)
    : world_(std::move(world)), group_(std::move(group)), group_rank_(group_rank) {}

ThreadedProcessGroup::~ThreadedProcessGroup() = default;

int ThreadedProcessGroup::size() const { return static_cast<int>(group_->ranks.size()); }

std::vector<int> ThreadedProcessGroup::global_ranks() const { return group_->ranks; }

std::string ThreadedProcessGroup::group_name() const { return group_->name; }

void ThreadedProcessGroup::Run(Participant& participant) {
  world_->Join(*group_, group_rank_, next_index_++, participant);
}

std::shared_ptr<distributed::Work> ThreadedProcessGroup::Done(const distributed::CollectiveInfo& info) const {
  return std::make_shared<distributed::CompletedWork>(info.str(), timeout());
}

using distributed::HostStaging;

std::shared_ptr<distributed::Work> ThreadedProcessGroup::all_gather_into_tensor_impl(
    const Tensor& output, const Tensor& input, const distributed::CollectiveInfo& info) {
  HostStaging stage;
  Participant p;
  p.info = info;
  p.output = stage.Output(output, info.in_place);
  p.input = info.in_place && output.device().is_cuda() && input.numel() > 0
                ? p.output + static_cast<size_t>(rank()) * input.nbytes()
                : stage.Input(input);
  p.input_bytes = input.nbytes();
  Run(p);
  stage.WriteBack();
  return Done(info);
}

std::shared_ptr<distributed::Work> ThreadedProcessGroup::reduce_scatter_tensor_impl(
    const Tensor& output, const Tensor& input, const distributed::ReduceOptions& options,
    const distributed::CollectiveInfo& info) {
  HostStaging stage;
  Participant p;
  p.info = info;
  p.input = stage.Input(input);
  p.output = info.in_place && input.device().is_cuda() && output.numel() > 0
                 ? const_cast<char*>(p.input) + static_cast<size_t>(rank()) * output.nbytes()
                 : stage.Output(output, false);
  p.input_bytes = input.nbytes();
  p.premul_factor = options.premul_factor;
  Run(p);
  if (info.in_place && input.device().is_cuda() && output.numel() > 0) {
    Tensor host_chunk = Tensor::empty(output.sizes(), output.dtype());
    std::memcpy(host_chunk.data_ptr(), p.output, output.nbytes());
    Tensor dst = output;
    dst.copy_(host_chunk);
  }
  stage.WriteBack();
  return Done(info);
}

std::shared_ptr<distributed::Work> ThreadedProcessGroup::all_reduce_impl(
    const Tensor& tensor, const distributed::ReduceOptions& options, const distributed::CollectiveInfo& info) {
  HostStaging stage;
  Participant p;
  p.info = info;
  p.output = stage.Output(tensor, true);
  p.input = p.output;
  p.input_bytes = tensor.nbytes();
  p.premul_factor = options.premul_factor;
  Run(p);
  stage.WriteBack();
  return Done(info);
}

std::shared_ptr<distributed::Work> ThreadedProcessGroup::broadcast_impl(const Tensor& tensor, int root,
                                                                 const distributed::CollectiveInfo& info) {
  HostStaging stage;
  Participant p;
  p.info = info;
  p.output = stage.Output(tensor, rank() == root);
  p.input = p.output;
  p.input_bytes = tensor.nbytes();
  Run(p);
  if (rank() != root) stage.WriteBack();
  return Done(info);
}

std::shared_ptr<distributed::Work> ThreadedProcessGroup::all_gather_impl(
    const std::vector<Tensor>& outputs, const Tensor& input, const distributed::CollectiveInfo& info) {
  HostStaging stage;
  Participant p;
  p.info = info;
  for (int r = 0; r < size(); ++r) {
    p.outputs.push_back(stage.Output(outputs[r], r == rank() && info.in_place));
  }
  p.input = info.in_place ? p.outputs[rank()] : stage.Input(input);
  p.input_bytes = input.nbytes();
  Run(p);
  stage.WriteBack();
  return Done(info);
}

void ThreadedProcessGroup::barrier_impl(const distributed::CollectiveInfo& info) {
  Participant p;
  p.info = info;
  Run(p);
}

std::shared_ptr<distributed::ProcessGroup> ThreadedProcessGroup::new_group_impl(
    const std::vector<int>& ranks, const distributed::CollectiveInfo& info) {
  Participant p;
  p.info = info;
  Run(p);
  if (p.new_group == nullptr) return nullptr;
  const int my_global = group_->ranks[static_cast<size_t>(group_rank_)];
  const auto it = std::find(ranks.begin(), ranks.end(), my_global);
  return std::make_shared<ThreadedProcessGroup>(world_, p.new_group,
                                                static_cast<int>(it - ranks.begin()));
}

}  // namespace fsdp::fakes
