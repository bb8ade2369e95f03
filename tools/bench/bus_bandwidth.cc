#include "tools/bench/bus_bandwidth.h"

#include <algorithm>
#include <cctype>

#include "engine/core/error.h"

namespace fsdp::bench {

std::string NormalizedName(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (c == '-' || c == '_') continue;
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

const char* NcclTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float";
    case DType::kFloat64:
      return "double";
    case DType::kFloat16:
      return "half";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt64:
      return "int64";
  }
  return "?";
}

DType ParseBenchDType(const std::string& name) {
  const std::string n = NormalizedName(name);
  if (n == "float") return DType::kFloat32;
  if (n == "double") return DType::kFloat64;
  if (n == "half") return DType::kFloat16;
  if (n == "int64" || n == "int64t" || n == "long") return DType::kInt64;
  try {
    return ParseDType(name);
  } catch (const Error&) {
    FSDP_THROW(ErrorCode::kInvalidArgument, "unknown datatype '", name,
               "' (choose float, double, half, bfloat16 or int64; PyTorch spellings such as "
               "float32, fp16, bf16 also work)");
  }
}

const char* RedOpName(distributed::ReduceOp op) {
  switch (op) {
    case distributed::ReduceOp::kSum:
      return "sum";
    case distributed::ReduceOp::kAvg:
      return "avg";
    case distributed::ReduceOp::kMin:
      return "min";
    case distributed::ReduceOp::kMax:
      return "max";
    case distributed::ReduceOp::kPremulSum:
      return "premul_sum";
  }
  return "?";
}

distributed::ReduceOp ParseRedOp(const std::string& name) {
  const std::string n = NormalizedName(name);
  for (distributed::ReduceOp op :
       {distributed::ReduceOp::kSum, distributed::ReduceOp::kAvg, distributed::ReduceOp::kMin, distributed::ReduceOp::kMax}) {
    if (n == RedOpName(op)) return op;
  }
  FSDP_THROW(ErrorCode::kInvalidArgument, "unknown reduce op '", name,
             "' (choose sum, avg, min or max)");
}

double RingFactor(int world_size) {
  FSDP_CHECK(world_size >= 1, "bus bandwidth: world size must be >= 1, got ", world_size);
  const double n = world_size;
  return (n - 1) / n;
}

double AlgBandwidthGBps(int64_t bytes, double seconds) {
  if (seconds <= 0) return 0;
  return static_cast<double>(bytes) / seconds / 1e9;
}

CollectiveCounts WholeArrayCounts(int64_t requested_bytes, DType dtype, int world_size) {
  FSDP_CHECK(world_size >= 1, "collective counts: world size must be >= 1, got ", world_size);
  FSDP_CHECK(requested_bytes >= 0, "collective counts: negative size ", requested_bytes);
  const auto elem = static_cast<int64_t>(ElementSize(dtype));
  CollectiveCounts c;
  c.count = requested_bytes / elem;
  c.bytes = c.count * elem;
  c.per_rank_numel = c.count;
  c.input_numel = c.count;
  c.output_numel = c.count;
  return c;
}

CollectiveCounts EvenSplitCounts(int64_t requested_bytes, DType dtype, int world_size) {
  FSDP_CHECK(world_size >= 1, "collective counts: world size must be >= 1, got ", world_size);
  FSDP_CHECK(requested_bytes >= 0, "collective counts: negative size ", requested_bytes);
  const auto elem = static_cast<int64_t>(ElementSize(dtype));
  CollectiveCounts c;
  c.count = requested_bytes / elem / world_size * world_size;
  c.bytes = c.count * elem;
  c.per_rank_numel = c.count / world_size;
  return c;
}

std::vector<int64_t> SizeSweep(int64_t min_bytes, int64_t max_bytes, int64_t factor,
                               int64_t step_bytes) {
  FSDP_CHECK(min_bytes >= 0 && max_bytes >= 0, "size sweep: sizes must be >= 0 (min ", min_bytes,
             ", max ", max_bytes, ")");
  FSDP_CHECK(min_bytes <= max_bytes, "size sweep: min bytes (-b ", min_bytes,
             ") is larger than max bytes (-e ", max_bytes, ")");
  FSDP_CHECK(factor > 1 || step_bytes > 0 || min_bytes == max_bytes,
             "size sweep: needs a factor > 1 (-f) or a step > 0 (-i), got factor ", factor,
             " and step ", step_bytes);
  FSDP_CHECK(factor <= 1 || min_bytes > 0 || min_bytes == max_bytes,
             "size sweep: min bytes 0 never grows by factor ", factor, "; use -b > 0");
  std::vector<int64_t> sizes;
  for (int64_t s = min_bytes; s <= max_bytes;) {
    sizes.push_back(s);
    if (s == max_bytes) break;
    const int64_t next = factor > 1 ? (s > max_bytes / factor ? max_bytes + 1 : s * factor)
                                    : (s > max_bytes - step_bytes ? max_bytes + 1 : s + step_bytes);
    s = next;
  }
  return sizes;
}

}  // namespace fsdp::bench
