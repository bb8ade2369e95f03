#include "engine/testing/parity.h"

#include <cmath>
#include <sstream>

#include "engine/fsdp/fsdp_param.h"
#include "engine/ops/shape_ops.h"

namespace fsdp::fsdp2 {
namespace {

std::string StripPrefixes(std::string name, const std::vector<std::string>& prefixes) {
  for (const std::string& prefix : prefixes) {
    size_t pos;
    while ((pos = name.find(prefix)) != std::string::npos) name.erase(pos, prefix.size());
  }
  return name;
}

// "" when `actual` matches `expected` in shape and values within tolerance.
std::string Compare(const Tensor& actual, const Tensor& expected, const ParityOptions& options) {
  if (actual.sizes() != expected.sizes()) {
    return "shape " + ShapeStr(actual.sizes()) + " vs expected " + ShapeStr(expected.sizes());
  }
  const std::vector<double> a = actual.to_doubles();
  const std::vector<double> e = expected.to_doubles();
  double max_diff = 0.0;
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = std::fabs(a[i] - e[i]);
    if (!(diff <= options.atol + options.rtol * std::fabs(e[i]))) ++bad;
    if (diff > max_diff || std::isnan(diff)) max_diff = diff;
  }
  if (bad == 0) return "";
  std::ostringstream os;
  os << bad << " of " << a.size() << " elements differ (max abs diff " << max_diff << ")";
  return os.str();
}

// The chunk of `full` the sharded tensor of `fsdp_param` must hold on this rank.
Tensor ExpectedShard(const Tensor& full, const FsdpParam* fsdp_param) {
  if (fsdp_param == nullptr) return full;
  const ShardInfo& info = fsdp_param->shard_info();
  return ops::kernels::Narrow(full, info.shard_dim, info.row_begin, info.rows);
}

}  // namespace

std::string CheckShardedParity(const std::map<std::string, Tensor>& reference_params,
                               const std::map<std::string, Tensor>& reference_grads,
                               const nn::Module& sharded_module, const ParityOptions& options) {
  std::ostringstream report;
  for (const auto& [raw_name, param] : sharded_module.named_parameters()) {
    const std::string name = StripPrefixes(raw_name, options.prefixes_to_ignore);
    auto ref = reference_params.find(name);
    if (ref == reference_params.end()) {
      report << name << ": no reference parameter\n";
      continue;
    }
    const FsdpParam* fsdp_param = LookupFsdpParam(param);
    if (std::string diff = Compare(param, ExpectedShard(ref->second, fsdp_param), options);
        !diff.empty()) {
      report << name << ": parameter " << diff << "\n";
    }
    if (!options.check_grads) continue;
    auto ref_grad = reference_grads.find(name);
    const bool has_ref_grad = ref_grad != reference_grads.end() && ref_grad->second.defined();
    const Tensor grad = param.grad();
    if (has_ref_grad != grad.defined()) {
      report << name << ": gradient is " << (grad.defined() ? "set" : "None")
             << " but the reference's is " << (has_ref_grad ? "set" : "None") << "\n";
      continue;
    }
    if (!has_ref_grad) continue;
    if (std::string diff = Compare(grad, ExpectedShard(ref_grad->second, fsdp_param), options);
        !diff.empty()) {
      report << name << ": gradient " << diff << "\n";
    }
  }
  return report.str();
}

std::string CheckShardedParity(const nn::Module& replicated_module,
                               const nn::Module& sharded_module, const ParityOptions& options) {
  const auto replicated = replicated_module.named_parameters();
  const auto sharded = sharded_module.named_parameters();
  if (replicated.size() != sharded.size()) {
    return "the replicated module has " + std::to_string(replicated.size()) +
           " parameters but the sharded one has " + std::to_string(sharded.size()) + "\n";
  }
  std::map<std::string, Tensor> params;
  std::map<std::string, Tensor> grads;
  for (const auto& [name, p] : replicated) {
    const std::string key = StripPrefixes(name, options.prefixes_to_ignore);
    params[key] = p;
    grads[key] = p.grad();
  }
  return CheckShardedParity(params, grads, sharded_module, options);
}

double AllReduceSum(distributed::ProcessGroup& pg, double value) {
  Tensor t = Tensor::full({1}, value, DType::kFloat64);
  pg.all_reduce(t);
  return t.item();
}

void DivideGrads(nn::Module& module, double factor) {
  for (const Tensor& p : module.parameters()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    std::vector<double> v = g.to_doubles();
    for (double& x : v) x /= factor;
    g.copy_(Tensor::from_doubles(v, g.sizes(), g.dtype()));
  }
}

}  // namespace fsdp::fsdp2
