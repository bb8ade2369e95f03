// Central finite differences in double precision, used to verify the oracle's hand-derived
// backward passes (and available to anyone who wants to check a gradient numerically).
//
// Thread-safety: pure functions (the callback must be safe to call repeatedly). Ownership: values.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "reference/model.h"
#include "reference/tensor.h"

namespace fsdp::reference {

struct FiniteDifferenceOptions {
  double step = 1e-6;                   // Default: 1e-6, the central-difference step h.
  int64_t max_entries_per_tensor = -1;  // Default: -1 (every entry); else evenly spaced entries,
                                        // always including the first and the last.
};

// (f(x + h e_i) - f(x - h e_i)) / 2h for the entries of the tensors named in `names` (all when
// empty). Entries not checked (max_entries_per_tensor) are NaN.
RefTensorMap NumericalGradients(const std::function<double(const RefTensorMap&)>& f,
                                const RefTensorMap& at, const FiniteDifferenceOptions& options = {},
                                const std::vector<std::string>& names = {});

struct GradientCheckResult {
  bool ok = true;
  std::string message;       // the first failure, or empty
  double max_abs_error = 0;  // over the checked entries
  int64_t checked_entries = 0;
};

// For every non-NaN entry of `numerical`: |a - n| <= atol + rtol * |n|. A key of `numerical`
// missing from `analytic` fails unless all its numerical entries are within atol of 0 and
// `absent_means_zero` is set.
GradientCheckResult CompareToNumerical(const RefTensorMap& analytic, const RefTensorMap& numerical,
                                       double rtol, double atol, bool absent_means_zero = false);

// Checks model.Backward against finite differences of L = Σ_k <output_k, G_k>, where the G_k are
// fixed pseudo-random tensors drawn from `seed` (outputs with use_output[k] == false get no G and
// no gradient slot). Every parameter is checked, and input.features when set (under the key
// "<input>"). Parameters the model reports as absent must have a zero numerical gradient.
GradientCheckResult CheckModelGradients(const Model<double>& model, const RefTensorMap& params,
                                        const RefTensorMap& buffers,
                                        const ModelInput<double>& input, uint64_t seed, double rtol,
                                        double atol, const FiniteDifferenceOptions& options = {},
                                        const std::vector<bool>& use_output = {});

}  // namespace fsdp::reference
