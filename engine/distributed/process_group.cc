#include "engine/distributed/process_group.h"

#include <algorithm>
#include <sstream>

#include "engine/core/rank_context.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/distributed/flight_recorder.h"
#include "engine/distributed/rank_comm_state.h"

namespace fsdp::distributed {

namespace {

// Marks a front call for its lifetime; only the outermost call on a rank records.
class FrontDepthGuard {
 public:
  FrontDepthGuard() : state_(internal::CurrentRankCommState()) { ++state_.front_depth; }
  ~FrontDepthGuard() { --state_.front_depth; }
  bool outermost() const { return state_.front_depth == 1; }

 private:
  internal::RankCommState& state_;
};

// [begin, end) byte ranges of a tensor's data.
struct ByteRange {
  const char* begin;
  const char* end;
};

ByteRange RangeOf(const Tensor& t) {
  const char* p = static_cast<const char*>(t.data_ptr());
  return {p, p + t.nbytes()};
}

bool Overlaps(const ByteRange& a, const ByteRange& b) { return a.begin < b.end && b.begin < a.end; }

std::string TensorStr(const Tensor& t) { return t.defined() ? t.str() : "<undefined tensor>"; }

}  // namespace

int ProcessGroup::global_rank() const { return global_ranks().at(static_cast<size_t>(rank())); }

int ProcessGroup::group_rank(int global) const {
  const auto ranks = global_ranks();
  auto it = std::find(ranks.begin(), ranks.end(), global);
  return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
}

std::string ProcessGroup::describe() const {
  std::ostringstream os;
  os << "group " << group_name() << " (" << backend_name() << ", rank " << rank() << "/" << size()
     << ")";
  return os.str();
}

CollectiveInfo ProcessGroup::MakeInfo(CollectiveOp op, bool async_op) {
  CollectiveInfo info;
  info.op = op;
  info.group_name = group_name();
  info.group_rank = rank();
  info.group_size = size();
  info.global_rank = global_rank();
  info.sequence_number = sequence_number_ + 1;  // committed by Issue once validated
  info.async_op = async_op;
  return info;
}

template <typename Fn>
auto ProcessGroup::Issue(const CollectiveInfo& info, Fn&& fn) {
  sequence_number_ = info.sequence_number;
  FrontDepthGuard depth;
  uint64_t id = 0;
  FlightRecorder* recorder = nullptr;
  if (depth.outermost()) {
    recorder = &CurrentFlightRecorder();
    id = recorder->RecordIssued(info);
    RecordCollectiveToCommModes(info);
  }
  try {
    if constexpr (std::is_void_v<decltype(fn())>) {
      fn();
      if (recorder) recorder->RecordCompleted(id);
    } else {
      auto result = fn();
      if (recorder) {
        if constexpr (std::is_same_v<decltype(result), std::shared_ptr<Work>>) {
          if (result == nullptr || result->is_completed()) recorder->RecordCompleted(id);
        } else {
          recorder->RecordCompleted(id);
        }
      }
      return result;
    }
  } catch (const std::exception& e) {
    if (recorder) recorder->RecordFailed(id, e.what());
    throw;
  }
}

namespace {

void CheckTensor(const Tensor& t, const char* what, const CollectiveInfo& info) {
  FSDP_CHECK(t.defined(), info.str(), ": ", what, " is an undefined tensor");
  FSDP_CHECK(t.numel() == 0 || t.has_storage(), info.str(), ": ", what, " ", t.str(),
             " has no storage (freed or resized to 0)");
}

void CheckSameKind(const Tensor& a, const char* a_name, const Tensor& b, const char* b_name,
                   const CollectiveInfo& info) {
  FSDP_CHECK(a.dtype() == b.dtype(), info.str(), ": ", a_name, " ", a.str(), " and ", b_name, " ",
             b.str(), " have different dtypes");
  FSDP_CHECK(a.device() == b.device(), info.str(), ": ", a_name, " ", a.str(), " and ", b_name, " ",
             b.str(), " are on different devices");
}

void CheckReduce(const ReduceOptions& options, DType dtype, const CollectiveInfo& info) {
  FSDP_CHECK(ReduceOpSupports(options.op, dtype), info.str(), ": ReduceOp ",
             ReduceOpName(options.op), " needs a floating-point dtype, got ", DTypeName(dtype));
}

// `chunk` is expected to be either disjoint from `whole` or exactly its chunk `index` of
// `chunk.nbytes()` bytes. Returns true when it is that chunk (in place).
bool CheckChunkAliasing(const Tensor& whole, const char* whole_name, const Tensor& chunk,
                        const char* chunk_name, int index, const CollectiveInfo& info) {
  if (chunk.nbytes() == 0 || whole.nbytes() == 0) return false;
  const ByteRange w = RangeOf(whole);
  const ByteRange c = RangeOf(chunk);
  if (!Overlaps(w, c)) return false;
  const char* expected = w.begin + static_cast<size_t>(index) * chunk.nbytes();
  FSDP_CHECK(c.begin == expected, info.str(), ": ", chunk_name, " ", chunk.str(), " overlaps ",
             whole_name, " ", whole.str(), " but is not its chunk ", index, " (byte offset ",
             c.begin - w.begin, ", expected ", expected - w.begin,
             "); in-place use must pass exactly that chunk");
  return true;
}

}  // namespace

std::shared_ptr<Work> ProcessGroup::all_gather_into_tensor(const Tensor& output,
                                                           const Tensor& input, bool async_op) {
  CollectiveInfo info = MakeInfo(CollectiveOp::kAllgatherBase, async_op);
  info.has_payload = true;
  if (input.defined()) {
    info.dtype = input.dtype();
    info.input_shape = input.sizes();
  }
  if (output.defined()) info.output_shape = output.sizes();
  CheckTensor(output, "output", info);
  CheckTensor(input, "input", info);
  CheckSameKind(output, "output", input, "input", info);
  FSDP_CHECK(output.numel() == static_cast<int64_t>(size()) * input.numel(), info.str(),
             ": output numel must be world size ", size(), " * input numel ", input.numel(), " = ",
             size() * input.numel(), ", got output ", output.str());
  info.in_place = CheckChunkAliasing(output, "output", input, "input", rank(), info);
  info.payload_bytes = static_cast<int64_t>(output.nbytes());
  auto work = Issue(info, [&] { return all_gather_into_tensor_impl(output, input, info); });
  output.bump_version();
  return work;
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter_tensor(const Tensor& output, const Tensor& input,
                                                          ReduceOptions options, bool async_op) {
  CollectiveInfo info = MakeInfo(CollectiveOp::kReduceScatterBase, async_op);
  info.has_payload = true;
  info.has_reduce_op = true;
  info.reduce_op = options.op;
  info.premul_factor = options.premul_factor;
  if (input.defined()) {
    info.dtype = input.dtype();
    info.input_shape = input.sizes();
  }
  if (output.defined()) info.output_shape = output.sizes();
  CheckTensor(output, "output", info);
  CheckTensor(input, "input", info);
  CheckSameKind(output, "output", input, "input", info);
  CheckReduce(options, input.dtype(), info);
  FSDP_CHECK(input.numel() == static_cast<int64_t>(size()) * output.numel(), info.str(),
             ": input numel must be world size ", size(), " * output numel ", output.numel(), " = ",
             size() * output.numel(), ", got input ", input.str());
  info.in_place = CheckChunkAliasing(input, "input", output, "output", rank(), info);
  info.payload_bytes = static_cast<int64_t>(input.nbytes());
  auto work = Issue(info, [&] { return reduce_scatter_tensor_impl(output, input, options, info); });
  output.bump_version();
  return work;
}

std::shared_ptr<Work> ProcessGroup::all_reduce(const Tensor& tensor, ReduceOptions options,
                                               bool async_op) {
  CollectiveInfo info = MakeInfo(CollectiveOp::kAllreduce, async_op);
  info.has_payload = true;
  info.has_reduce_op = true;
  info.reduce_op = options.op;
  info.premul_factor = options.premul_factor;
  info.in_place = true;
  if (tensor.defined()) {
    info.dtype = tensor.dtype();
    info.input_shape = info.output_shape = tensor.sizes();
  }
  CheckTensor(tensor, "tensor", info);
  CheckReduce(options, tensor.dtype(), info);
  info.payload_bytes = static_cast<int64_t>(tensor.nbytes());
  auto work = Issue(info, [&] { return all_reduce_impl(tensor, options, info); });
  tensor.bump_version();
  return work;
}

std::shared_ptr<Work> ProcessGroup::broadcast(const Tensor& tensor, int root, bool async_op) {
  CollectiveInfo info = MakeInfo(CollectiveOp::kBroadcast, async_op);
  info.has_payload = true;
  info.root = root;
  info.in_place = true;
  if (tensor.defined()) {
    info.dtype = tensor.dtype();
    info.input_shape = info.output_shape = tensor.sizes();
  }
  CheckTensor(tensor, "tensor", info);
  FSDP_CHECK(root >= 0 && root < size(), info.str(), ": root ", root,
             " is not a group rank of a group of size ", size(),
             " (root is a group rank; group_rank(global) converts)");
  info.payload_bytes = static_cast<int64_t>(tensor.nbytes());
  auto work = Issue(info, [&] { return broadcast_impl(tensor, root, info); });
  if (rank() != root) tensor.bump_version();
  return work;
}

std::shared_ptr<Work> ProcessGroup::all_gather(const std::vector<Tensor>& outputs,
                                               const Tensor& input, bool async_op) {
  CollectiveInfo info = MakeInfo(CollectiveOp::kAllgather, async_op);
  info.has_payload = true;
  if (input.defined()) {
    info.dtype = input.dtype();
    info.input_shape = input.sizes();
  }
  for (const auto& out : outputs) info.output_numels.push_back(out.defined() ? out.numel() : -1);
  if (static_cast<int>(outputs.size()) > rank() && outputs[rank()].defined()) {
    info.output_shape = outputs[rank()].sizes();
  }
  CheckTensor(input, "input", info);
  FSDP_CHECK(static_cast<int>(outputs.size()) == size(), info.str(), ": outputs has ",
             outputs.size(), " tensors, expected one per rank (", size(), ")");
  int64_t bytes = 0;
  const ByteRange in_range = RangeOf(input);
  for (int r = 0; r < size(); ++r) {
    const Tensor& out = outputs[r];
    const std::string name = "outputs[" + std::to_string(r) + "]";
    CheckTensor(out, name.c_str(), info);
    CheckSameKind(out, name.c_str(), input, "input", info);
    bytes += static_cast<int64_t>(out.nbytes());
    if (input.nbytes() > 0 && out.nbytes() > 0 && Overlaps(RangeOf(out), in_range)) {
      FSDP_CHECK(
          r == rank() && out.data_ptr() == input.data_ptr() && out.nbytes() == input.nbytes(),
          info.str(), ": input ", input.str(), " overlaps ", name, " ", out.str(),
          "; only outputs[rank] may alias the input, exactly");
      info.in_place = true;
    }
  }
  FSDP_CHECK(outputs[rank()].numel() == input.numel(), info.str(), ": outputs[", rank(), "] ",
             TensorStr(outputs[rank()]), " must have the input's numel ", input.numel());
  info.payload_bytes = bytes;
  auto work = Issue(info, [&] { return all_gather_impl(outputs, input, info); });
  for (int r = 0; r < size(); ++r) {
    if (r != rank()) outputs[r].bump_version();
  }
  return work;
}

void ProcessGroup::barrier() {
  CollectiveInfo info = MakeInfo(CollectiveOp::kBarrier, false);
  Issue(info, [&] { barrier_impl(info); });
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(const std::vector<int>& ranks) {
  CollectiveInfo info = MakeInfo(CollectiveOp::kNewGroup, false);
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  info.new_group_ranks = sorted;
  FSDP_CHECK(!sorted.empty(), info.str(), ": new_group needs at least one rank");
  FSDP_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(), info.str(),
             ": new_group ranks contain duplicates");
  const auto members = global_ranks();
  for (int r : sorted) {
    FSDP_CHECK(std::find(members.begin(), members.end(), r) != members.end(), info.str(),
               ": new_group rank ", r, " is not a member of group ", group_name(), " (world size ",
               size(), ")");
  }
  return Issue(info, [&] { return new_group_impl(sorted, info); });
}

// ---- Default group ------------------------------------------------------------------------

namespace {
struct DefaultGroupSlot {
  std::shared_ptr<ProcessGroup> group;
};
}  // namespace

void SetDefaultProcessGroup(std::shared_ptr<ProcessGroup> group) {
  RankContext::Current().slot<DefaultGroupSlot>().group = std::move(group);
}

std::shared_ptr<ProcessGroup> GetDefaultProcessGroup() {
  auto group = RankContext::Current().slot<DefaultGroupSlot>().group;
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, group != nullptr,
                  "no default process group on rank ", RankContext::Current().rank(),
                  " (world size ", RankContext::Current().world_size(),
                  "): run under fakes::RunRanks or call distributed::InitProcessGroup first");
  return group;
}

bool HasDefaultProcessGroup() {
  return RankContext::Current().slot<DefaultGroupSlot>().group != nullptr;
}

}  // namespace fsdp::distributed
