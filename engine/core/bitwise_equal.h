// BitwiseEqual: whether two tensors hold exactly the same values, bit for bit: what "bit-exact"
// means in the tests and judges (checkpoint round trips, loads that must change nothing).
//
// Thread-safety: a pure function of its arguments.
#pragma once

#include "engine/core/tensor.h"

namespace fsdp {

// Same dtype, same sizes and the same bytes (compared on CPU copies), so NaNs with equal bits
// are equal and -0.0 differs from 0.0. Empty tensors of equal shape are equal.
bool BitwiseEqual(const Tensor& a, const Tensor& b);

}  // namespace fsdp
