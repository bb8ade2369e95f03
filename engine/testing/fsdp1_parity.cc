#include "engine/testing/fsdp1_parity.h"

#include <cmath>
#include <map>
#include <sstream>
#include <vector>

#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/fsdp1/runtime_utils.h"

namespace fsdp::fsdp1 {
namespace {

std::string Join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// Compares `actual` (this rank's padded shard) with `expected` (the unsharded flat tensor,
// NaN where padding) over [begin, begin + numel); the rest of `actual` must be zero.
std::string CompareShard(const std::vector<double>& actual, const std::vector<double>& expected,
                         int64_t begin, int64_t numel, const fsdp2::ParityOptions& options) {
  size_t bad = 0;
  double max_diff = 0.0;
  for (size_t k = 0; k < actual.size(); ++k) {
    const bool owned = static_cast<int64_t>(k) < numel;
    const double e = owned ? expected[static_cast<size_t>(begin) + k] : 0.0;
    if (std::isnan(e)) continue;  // alignment padding
    const double diff = std::fabs(actual[k] - e);
    if (!(diff <= options.atol + options.rtol * std::fabs(e))) ++bad;
    if (diff > max_diff || std::isnan(diff)) max_diff = diff;
  }
  if (bad == 0) return "";
  std::ostringstream os;
  os << bad << " of " << actual.size() << " elements differ (max abs diff " << max_diff << ")";
  return os.str();
}

}  // namespace

std::string CheckFlatParamParity(const nn::Module& fsdp_root, const nn::Module& reference,
                                 const fsdp2::ParityOptions& options) {
  std::map<std::string, Tensor> ref_params;
  for (const auto& [name, p] : reference.named_parameters("", true, /*remove_duplicate=*/false)) {
    ref_params.emplace(CleanTensorName(name), p);
  }
  std::ostringstream report;
  for (const FullyShardedDataParallel* state : GetFsdpStates(fsdp_root)) {
    const FlatParamHandle* handle = state->handle.get();
    if (handle == nullptr) continue;
    const std::string where = "instance '" + state->fqn + "'";
    const FlatParamLayout& layout = handle->layout();
    std::vector<double> expected_param(static_cast<size_t>(layout.total_numel), NAN);
    std::vector<double> expected_grad(static_cast<size_t>(layout.total_numel), NAN);
    const auto offsets = layout.entry_offsets();
    size_t param_index = 0;
    bool complete = true;
    for (size_t entry = 0; entry < offsets.size(); ++entry) {
      if (layout.is_padding_mask[entry]) continue;
      const std::string name = Join(state->fqn, CleanTensorName(handle->fqns()[param_index++]));
      auto it = ref_params.find(name);
      if (it == ref_params.end()) {
        report << where << ": no reference parameter " << name << "\n";
        complete = false;
        continue;
      }
      const std::vector<double> values = it->second.to_doubles();
      const Tensor ref_grad = it->second.grad();
      const std::vector<double> grads =
          ref_grad.defined() ? ref_grad.to_doubles() : std::vector<double>(values.size(), 0.0);
      for (size_t k = 0; k < values.size(); ++k) {
        expected_param[static_cast<size_t>(offsets[entry].first) + k] = values[k];
        expected_grad[static_cast<size_t>(offsets[entry].first) + k] = grads[k];
      }
    }
    if (!complete) continue;
    int64_t begin = 0;
    int64_t numel = layout.total_numel;
    if (handle->uses_sharded_strategy()) {
      const FlatParamShard shard =
          ComputeFlatParamShard(layout.total_numel, handle->rank(), handle->world_size());
      begin = shard.begin;
      numel = shard.numel;
    }
    const Tensor& flat_param = handle->flat_param();
    if (std::string diff = CompareShard(flat_param.to_doubles(), expected_param, begin, numel, options);
        !diff.empty()) {
      report << where << ": flat parameter " << diff << "\n";
    }
    // A frozen flat parameter has no gradient to compare.
    if (!options.check_grads || !flat_param.requires_grad()) continue;
    const Tensor grad = flat_param.grad();
    if (!grad.defined()) {
      report << where << ": flat parameter has no gradient\n";
      continue;
    }
    if (std::string diff = CompareShard(grad.to_doubles(), expected_grad, begin, numel, options);
        !diff.empty()) {
      report << where << ": flat gradient " << diff << "\n";
    }
  }
  return report.str();
}

}  // namespace fsdp::fsdp1
