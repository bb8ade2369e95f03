// Dropout CPU kernels (namespace fsdp::ops::kernels).
//
// The mask is drawn from a Generator (the rank's Philox generator by default in the functional
// API) in a counter-based way, so it is a pure function of the generator state: element i is
// kept iff u_i < 1 - p, where u_i = (w >> 8) * 2^-24 and w is word (i mod 4) of
// Philox(seed, counter = offset + i / 4); afterwards the generator's offset has advanced by
// ceil(numel / 4) (Generator::reserve_philox, shared with the CUDA kernel, which reproduces
// the same mask from the same (seed, offset)).
// Thread-safety: stateless, except that the generator passed in is advanced.
#pragma once

#include "engine/core/rng.h"
#include "engine/core/tensor.h"

namespace fsdp::ops::kernels {

// A Bernoulli(1 - p) mask of `shape` in `dtype` whose kept elements hold 1 / (1 - p) rounded
// to `dtype` (PyTorch's CPU dropout scales its noise tensor in the input's dtype). p must be in
// [0, 1]; p == 1 gives all zeros, p == 0 all ones (the generator still advances).
Tensor DropoutMask(const Shape& shape, double p, DType dtype, Generator& generator);

// Output and mask of Dropout (value type).
struct DropoutResult {
  Tensor output;  // x * mask
  Tensor mask;    // as DropoutMask, in x's dtype
};
// Training-mode dropout (the caller handles eval mode, where dropout is the identity).
DropoutResult Dropout(const Tensor& x, double p, Generator& generator);
// grad * mask.
Tensor DropoutBackward(const Tensor& grad, const Tensor& mask);

}  // namespace fsdp::ops::kernels
