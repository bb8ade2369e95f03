// Tensor comparison utilities for tests and diagnostics (namespace fsdp::ops::kernels).
// Values are compared as doubles on the host; shapes must match.
// Thread-safety: stateless functions.
#pragma once

#include "engine/core/tensor.h"

namespace fsdp::ops::kernels {

// max |a - b| over all elements (0 for empty tensors; NaN when any difference is NaN).
// Throws InvalidArgument when the shapes differ.
double MaxAbsDiff(const Tensor& a, const Tensor& b);

// torch.allclose: |a - b| <= atol + rtol * |b| elementwise (NaNs compare equal only with
// equal_nan; infinities must match exactly). False when the shapes differ.
bool AllClose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8,
              bool equal_nan = false);

}  // namespace fsdp::ops::kernels
