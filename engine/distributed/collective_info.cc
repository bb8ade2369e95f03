#include "engine/distributed/collective_info.h"

#include <sstream>

namespace fsdp::distributed {

const char* CollectiveOpName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllgatherBase:
      return "_allgather_base_";
    case CollectiveOp::kReduceScatterBase:
      return "_reduce_scatter_base_";
    case CollectiveOp::kAllreduce:
      return "allreduce_";
    case CollectiveOp::kBroadcast:
      return "broadcast_";
    case CollectiveOp::kAllgather:
      return "allgather_";
    case CollectiveOp::kBarrier:
      return "barrier";
    case CollectiveOp::kNewGroup:
      return "new_group";
  }
  return "unknown_collective";
}

std::vector<CollectiveOp> AllCollectiveOps() {
  return {CollectiveOp::kAllgatherBase, CollectiveOp::kReduceScatterBase, CollectiveOp::kAllreduce,
          CollectiveOp::kBroadcast,     CollectiveOp::kAllgather,         CollectiveOp::kBarrier,
          CollectiveOp::kNewGroup};
}

std::string C10dCommKey(CollectiveOp op) { return std::string("c10d.") + CollectiveOpName(op); }

bool IsCountedByCommDebugMode(CollectiveOp op) {
  return op != CollectiveOp::kBarrier && op != CollectiveOp::kNewGroup;
}

const char* FunctionalCollectiveName(FunctionalCollective op) {
  switch (op) {
    case FunctionalCollective::kAllGatherIntoTensor:
      return "all_gather_into_tensor";
    case FunctionalCollective::kReduceScatterTensor:
      return "reduce_scatter_tensor";
    case FunctionalCollective::kAllReduce:
      return "all_reduce";
    case FunctionalCollective::kBroadcast:
      return "broadcast";
  }
  return "unknown_functional_collective";
}

std::string FunctionalCommKey(FunctionalCollective op) {
  return std::string("c10d_functional.") + FunctionalCollectiveName(op);
}

namespace {

std::string ListStr(const std::vector<int64_t>& v) { return ShapeStr(v); }

std::string IntListStr(const std::vector<int>& v) {
  return ListStr(std::vector<int64_t>(v.begin(), v.end()));
}

// Appended with std::string rather than a stream: every collective of every backend formats
// its description (the Work's, the flight recorder's), and a stream's locale set-up cost more
// than a small collective of the threaded fake.
void AppendFingerprint(std::string& out, const CollectiveInfo& info) {
  if (info.op == CollectiveOp::kNewGroup) {
    out += " ranks " + IntListStr(info.new_group_ranks);
    return;
  }
  if (!info.has_payload) return;
  out += std::string(" ") + DTypeName(info.dtype) + " in " + ShapeStr(info.input_shape);
  if (info.op == CollectiveOp::kAllgather) {
    out += " outs " + ListStr(info.output_numels) + " (numels)";
  } else if (info.op != CollectiveOp::kAllreduce && info.op != CollectiveOp::kBroadcast) {
    out += " out " + ShapeStr(info.output_shape);
  }
  if (info.has_reduce_op) out += std::string(" ") + ReduceOpName(info.reduce_op);
  if (info.op == CollectiveOp::kBroadcast) out += " root " + std::to_string(info.root);
}

uint64_t HashWords(const std::vector<int64_t>& words) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the words' bytes
  for (int64_t w : words) {
    for (int b = 0; b < 8; ++b) {
      h ^= static_cast<uint64_t>((w >> (8 * b)) & 0xff);
      h *= 1099511628211ull;
    }
  }
  return h;
}

}  // namespace

std::string CollectiveInfo::fingerprint_str() const {
  std::string out = std::string(CollectiveOpName(op)) + " #" + std::to_string(sequence_number);
  AppendFingerprint(out, *this);
  return out;
}

std::string CollectiveInfo::str() const {
  std::string out = std::string(CollectiveOpName(op)) + " #" + std::to_string(sequence_number) +
                    " on group " + group_name + " (rank " + std::to_string(group_rank) + "/" +
                    std::to_string(group_size) + ", global rank " + std::to_string(global_rank) +
                    "):";
  AppendFingerprint(out, *this);
  if (in_place) out += " in place";
  return out;
}

std::string CollectiveMismatch(const CollectiveInfo& a, const CollectiveInfo& b) {
  std::ostringstream os;
  if (a.op != b.op) {
    os << "op " << CollectiveOpName(a.op) << " vs " << CollectiveOpName(b.op);
  } else if (a.sequence_number != b.sequence_number) {
    os << "sequence number " << a.sequence_number << " vs " << b.sequence_number;
  } else if (a.op == CollectiveOp::kNewGroup) {
    if (a.new_group_ranks != b.new_group_ranks) {
      os << "new_group ranks " << IntListStr(a.new_group_ranks) << " vs "
         << IntListStr(b.new_group_ranks);
    }
  } else if (a.has_payload && a.dtype != b.dtype) {
    os << "dtype " << DTypeName(a.dtype) << " vs " << DTypeName(b.dtype);
  } else if (a.op == CollectiveOp::kAllgather) {
    if (a.output_numels != b.output_numels) {
      os << "output numels " << ListStr(a.output_numels) << " vs " << ListStr(b.output_numels);
    }
  } else if (a.has_payload && a.input_numel() != b.input_numel()) {
    os << "input numel " << a.input_numel() << " " << ShapeStr(a.input_shape) << " vs "
       << b.input_numel() << " " << ShapeStr(b.input_shape);
  } else if (a.has_payload && a.output_numel() != b.output_numel()) {
    os << "output numel " << a.output_numel() << " " << ShapeStr(a.output_shape) << " vs "
       << b.output_numel() << " " << ShapeStr(b.output_shape);
  }
  if (os.tellp() == 0) {
    if (a.has_reduce_op && a.reduce_op != b.reduce_op) {
      os << "reduce op " << ReduceOpName(a.reduce_op) << " vs " << ReduceOpName(b.reduce_op);
    } else if (a.root != b.root) {
      os << "root " << a.root << " vs " << b.root;
    }
  }
  return os.str();
}

namespace {

enum Word : size_t {
  kOp = 0,
  kSeq,
  kDType,
  kInNumel,
  kOutNumel,
  kRoot,
  kReduce,
  kListHash,
  kInNdim,
  kInDims,  // 3 words
  kOutNdim = kInDims + 3,
  kOutDims,  // 3 words
};
static_assert(kOutDims + 3 == kFingerprintWords);
constexpr int64_t kMagic = 0x46500000;  // "FP": guards against decoding garbage

Shape DecodeShape(const int64_t* w, size_t ndim_word, size_t dims_word) {
  Shape s;
  const int64_t ndim = w[ndim_word];
  for (int64_t d = 0; d < ndim && d < 3; ++d) s.push_back(w[dims_word + d]);
  return s;
}

std::string DecodedShapeStr(const int64_t* w, size_t ndim_word, size_t dims_word) {
  std::string s = ShapeStr(DecodeShape(w, ndim_word, dims_word));
  if (w[ndim_word] > 3) s.insert(s.size() - 1, ", ...");
  return s;
}

}  // namespace

std::vector<int64_t> EncodeFingerprint(const CollectiveInfo& info) {
  std::vector<int64_t> w(kFingerprintWords, 0);
  w[kOp] = kMagic | static_cast<int64_t>(info.op);
  w[kSeq] = static_cast<int64_t>(info.sequence_number);
  w[kDType] = info.has_payload ? (256 | static_cast<int64_t>(info.dtype)) : 0;
  const bool list_op = info.op == CollectiveOp::kAllgather;
  w[kInNumel] = info.has_payload && !list_op ? info.input_numel() : 0;
  w[kOutNumel] = info.has_payload && !list_op ? info.output_numel() : 0;
  w[kRoot] = info.root;
  w[kReduce] = info.has_reduce_op ? (256 | static_cast<int64_t>(info.reduce_op)) : 0;
  if (list_op) {
    w[kListHash] = static_cast<int64_t>(HashWords(info.output_numels));
  } else if (info.op == CollectiveOp::kNewGroup) {
    w[kListHash] = static_cast<int64_t>(
        HashWords(std::vector<int64_t>(info.new_group_ranks.begin(), info.new_group_ranks.end())));
  }
  w[kInNdim] = static_cast<int64_t>(info.input_shape.size());
  for (size_t d = 0; d < 3 && d < info.input_shape.size(); ++d)
    w[kInDims + d] = info.input_shape[d];
  w[kOutNdim] = static_cast<int64_t>(info.output_shape.size());
  for (size_t d = 0; d < 3 && d < info.output_shape.size(); ++d) {
    w[kOutDims + d] = info.output_shape[d];
  }
  return w;
}

std::string EncodedFingerprintStr(const int64_t* w) {
  if ((w[kOp] & ~int64_t{0xff}) != kMagic) return "<not a collective fingerprint>";
  std::ostringstream os;
  os << CollectiveOpName(static_cast<CollectiveOp>(w[kOp] & 0xff)) << " #" << w[kSeq];
  if (w[kDType] != 0) {
    os << " " << DTypeName(static_cast<DType>(w[kDType] & 0xff)) << " in "
       << DecodedShapeStr(w, kInNdim, kInDims) << " out " << DecodedShapeStr(w, kOutNdim, kOutDims);
  }
  if (w[kReduce] != 0) os << " " << ReduceOpName(static_cast<ReduceOp>(w[kReduce] & 0xff));
  if (w[kRoot] >= 0) os << " root " << w[kRoot];
  if (w[kListHash] != 0) os << " list hash " << std::hex << w[kListHash];
  return os.str();
}

std::string EncodedFingerprintMismatch(const int64_t* a, const int64_t* b) {
  static const char* const kFieldNames[] = {"op",          "sequence number",        "dtype",
                                            "input numel", "output numel",           "root",
                                            "reduce op",   "per-rank sizes or ranks"};
  for (size_t i = 0; i <= kListHash; ++i) {
    if (a[i] != b[i]) {
      return std::string(kFieldNames[i]) + " differs: " + EncodedFingerprintStr(a) + " vs " +
             EncodedFingerprintStr(b);
    }
  }
  return "";
}

}  // namespace fsdp::distributed
