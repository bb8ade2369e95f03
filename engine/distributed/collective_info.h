// CollectiveInfo: the description of one issued collective (op, group, sequence number,
// dtype, shapes, reduce op, root), built by the ProcessGroup front for every call. It is what
// CommDebugMode and the flight recorder store, what decorators record, what error messages
// print, and what the collective checker compares across ranks (its "fingerprint").
//
// [Note: collective fingerprint] Two ranks' infos for the same collective must agree on op,
// sequence number, dtype, element counts (input and output numel; for allgather_ the list of
// per-rank output numels; for new_group the member list), root and reduce op. Shapes are
// shown in messages but only numels are compared (c10d needs only matching numels).
// PREMUL_SUM factors may differ by rank (each rank scales its own input) and are not compared.
//
// Thread-safety: value types and stateless functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/distributed/reduce_op.h"

namespace fsdp::distributed {

// Process-group collectives, named like the c10d ops that CommDebugMode counts.
enum class CollectiveOp : uint8_t {
  kAllgatherBase,      // "_allgather_base_"       (all_gather_into_tensor)
  kReduceScatterBase,  // "_reduce_scatter_base_"  (reduce_scatter_tensor)
  kAllreduce,          // "allreduce_"             (all_reduce)
  kBroadcast,          // "broadcast_"             (broadcast)
  kAllgather,          // "allgather_"             (all_gather into a list)
  kBarrier,            // "barrier"
  kNewGroup,           // "new_group"              (subgroup creation; checked, never counted)
};

// The c10d op name: "_allgather_base_", "_reduce_scatter_base_", "allreduce_", "broadcast_",
// "allgather_", "barrier", "new_group".
const char* CollectiveOpName(CollectiveOp op);
// Every CollectiveOp, in declaration order.
std::vector<CollectiveOp> AllCollectiveOps();
// The CommDebugMode key of a process-group op: "c10d." + CollectiveOpName(op).
std::string C10dCommKey(CollectiveOp op);
// True for the ops CommDebugMode counts (PyTorch's c10d_collective_ops: every op above except
// barrier and new_group).
bool IsCountedByCommDebugMode(CollectiveOp op);

// Functional collectives (torch.distributed._functional_collectives), used by tensor-parallel
// redistributions. CommDebugMode reports them under the legacy key
// "c10d_functional.<name>".
enum class FunctionalCollective : uint8_t {
  kAllGatherIntoTensor,  // "all_gather_into_tensor"
  kReduceScatterTensor,  // "reduce_scatter_tensor"
  kAllReduce,            // "all_reduce"
  kBroadcast,            // "broadcast"
};
const char* FunctionalCollectiveName(FunctionalCollective op);
// "c10d_functional." + FunctionalCollectiveName(op).
std::string FunctionalCommKey(FunctionalCollective op);

struct CollectiveInfo {
  CollectiveOp op = CollectiveOp::kBarrier;
  std::string group_name;  // the group's name ("0" is the world)
  int group_rank = 0;      // this rank within the group
  int group_size = 1;
  int global_rank = 0;           // this rank within the world
  uint64_t sequence_number = 0;  // 1 for the group's first collective
  bool has_payload = false;      // false for barrier and new_group
  DType dtype = DType::kFloat32;
  Shape input_shape;
  Shape output_shape;                  // allgather_: this rank's outputs[rank]
  std::vector<int64_t> output_numels;  // allgather_: numel of outputs[r] for every r
  bool has_reduce_op = false;
  ReduceOp reduce_op = ReduceOp::kSum;
  double premul_factor = 1.0;
  int root = -1;                     // broadcast_: group rank of the source
  std::vector<int> new_group_ranks;  // new_group: the global ranks requested
  bool in_place = false;
  bool async_op = false;
  // Bytes of the collective's full buffer on this rank: all-gather output, reduce-scatter
  // input, all-reduce/broadcast tensor, sum of allgather_ outputs; 0 for barrier/new_group.
  int64_t payload_bytes = 0;

  int64_t input_numel() const { return Numel(input_shape); }
  int64_t output_numel() const { return Numel(output_shape); }
  // One line: "allreduce_ #3 on group 0 (rank 1/4, global rank 1): float32 in [4, 2] out
  // [4, 2], SUM".
  std::string str() const;
  // The fingerprint only: op, sequence number, dtype, numels, root, reduce op.
  std::string fingerprint_str() const;
};

// Empty when `a` and `b` describe the same collective (see [Note: collective fingerprint]);
// otherwise the first difference, e.g. "op allreduce_ vs _allgather_base_".
std::string CollectiveMismatch(const CollectiveInfo& a, const CollectiveInfo& b);

// Fixed-size wire encoding of the fingerprint for backends that exchange fingerprints over
// the network (GlooOptions::check_collectives). Decode fills the fingerprint fields only;
// lists (output_numels, new_group_ranks) are compared through a hash, so a decoded info
// carries `list_hash` in place of the lists.
constexpr size_t kFingerprintWords = 16;
std::vector<int64_t> EncodeFingerprint(const CollectiveInfo& info);
// Empty when equal; otherwise the first difference, naming fields of both sides.
std::string EncodedFingerprintMismatch(const int64_t* a, const int64_t* b);
// "allreduce_ #3 float32 in [4, 2] out [4, 2] SUM" from an encoded fingerprint.
std::string EncodedFingerprintStr(const int64_t* words);

}  // namespace fsdp::distributed
