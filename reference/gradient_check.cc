#include "reference/gradient_check.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace fsdp::reference {
namespace {

constexpr char kInputKey[] = "<input>";

std::vector<int64_t> EntriesToCheck(int64_t numel, int64_t max_entries) {
  std::vector<int64_t> idx;
  if (max_entries < 0 || max_entries >= numel) {
    for (int64_t i = 0; i < numel; ++i) idx.push_back(i);
    return idx;
  }
  if (max_entries == 1) return {0};
  for (int64_t j = 0; j < max_entries; ++j) {
    const int64_t i = j * (numel - 1) / (max_entries - 1);
    if (idx.empty() || idx.back() != i) idx.push_back(i);
  }
  return idx;
}

}  // namespace

RefTensorMap NumericalGradients(const std::function<double(const RefTensorMap&)>& f,
                                const RefTensorMap& at, const FiniteDifferenceOptions& options,
                                const std::vector<std::string>& names) {
  std::vector<std::string> keys = names;
  if (keys.empty()) {
    for (const auto& [name, t] : at) keys.push_back(name);
  }
  RefTensorMap out;
  RefTensorMap x = at;
  const double h = options.step;
  for (const std::string& name : keys) {
    auto it = x.find(name);
    if (it == x.end()) throw std::invalid_argument("NumericalGradients: no tensor '" + name + "'");
    RefTensor g = Full<double>(it->second.shape, std::numeric_limits<double>::quiet_NaN());
    for (int64_t i : EntriesToCheck(it->second.numel(), options.max_entries_per_tensor)) {
      const double orig = it->second[i];
      it->second[i] = orig + h;
      const double plus = f(x);
      it->second[i] = orig - h;
      const double minus = f(x);
      it->second[i] = orig;
      g[i] = (plus - minus) / (2 * h);
    }
    out.emplace(name, std::move(g));
  }
  return out;
}

GradientCheckResult CompareToNumerical(const RefTensorMap& analytic, const RefTensorMap& numerical,
                                       double rtol, double atol, bool absent_means_zero) {
  GradientCheckResult r;
  auto fail = [&r](const std::string& msg) {
    if (r.ok) r.message = msg;
    r.ok = false;
  };
  for (const auto& [name, num] : numerical) {
    auto it = analytic.find(name);
    const bool absent = it == analytic.end();
    if (absent && !absent_means_zero) {
      fail("no analytic gradient for '" + name + "'");
      continue;
    }
    if (!absent && it->second.shape != num.shape) {
      fail("'" + name + "': analytic shape " + ShapeToString(it->second.shape) + " vs " +
           ShapeToString(num.shape));
      continue;
    }
    for (int64_t i = 0; i < num.numel(); ++i) {
      if (std::isnan(num[i])) continue;
      const double a = absent ? 0.0 : it->second[i];
      const double err = std::abs(a - num[i]);
      ++r.checked_entries;
      r.max_abs_error = std::max(r.max_abs_error, err);
      if (!(err <= atol + rtol * std::abs(num[i]))) {
        std::ostringstream os;
        os.precision(12);
        os << "'" << name << "'[" << i << "]: analytic " << (absent ? "absent (0)" : "") << a
           << " vs numerical " << num[i] << " (|diff| " << err << ")";
        fail(os.str());
      }
    }
  }
  return r;
}

GradientCheckResult CheckModelGradients(const Model<double>& model, const RefTensorMap& params,
                                        const RefTensorMap& buffers,
                                        const ModelInput<double>& input, uint64_t seed, double rtol,
                                        double atol, const FiniteDifferenceOptions& options,
                                        const std::vector<bool>& use_output) {
  const ForwardResult<double> fwd = model.Forward(params, buffers, input);
  std::vector<std::optional<RefTensor>> weights(fwd.outputs.size());
  for (size_t k = 0; k < fwd.outputs.size(); ++k) {
    if (!use_output.empty() && !use_output.at(k)) continue;
    weights[k] = UniformTensor<double>(fwd.outputs[k].shape, seed + 1000 * (k + 1), -1.0, 1.0);
  }
  // L(params, x) = Σ_k <output_k, G_k>, evaluated with the input features (if any) at "<input>".
  auto objective = [&](const RefTensorMap& point) {
    RefTensorMap p = point;
    ModelInput<double> in = input;
    if (in.features) {
      in.features = p.at(kInputKey);
      p.erase(kInputKey);
    }
    const ForwardResult<double> f = model.Forward(p, buffers, in);
    double l = 0;
    for (size_t k = 0; k < f.outputs.size(); ++k) {
      if (!weights[k]) continue;
      for (int64_t i = 0; i < f.outputs[k].numel(); ++i) l += f.outputs[k][i] * (*weights[k])[i];
    }
    return l;
  };
  RefTensorMap point = params;
  if (input.features) point.emplace(kInputKey, *input.features);
  const RefTensorMap numerical = NumericalGradients(objective, point, options);

  const BackwardResult<double> bwd = model.Backward(params, buffers, input, weights);
  RefTensorMap analytic = bwd.grads;
  if (input.features && bwd.input_grad) analytic.emplace(kInputKey, *bwd.input_grad);
  for (const auto& [name, g] : analytic) {
    if (!numerical.count(name)) {
      GradientCheckResult r;
      r.ok = false;
      r.message = "analytic gradient for unknown tensor '" + name + "'";
      return r;
    }
  }
  return CompareToNumerical(analytic, numerical, rtol, atol, /*absent_means_zero=*/true);
}

}  // namespace fsdp::reference
