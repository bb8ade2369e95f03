// Parameter initialisation (torch.nn.init), drawing from the calling rank's generator
// (RankContext::Current().generator()) unless a generator is given. Each function fills the
// tensor in place (a member write, no autograd) and returns it.
// Thread-safety: uses the calling rank's generator; a tensor belongs to one rank.
#pragma once

#include <cstdint>
#include <utility>

#include "engine/core/rng.h"
#include "engine/core/tensor.h"

namespace fsdp::nn {

// torch.manual_seed(seed) for the calling rank: replaces its generator by a fresh one seeded
// with `seed` (counter and any buffered words reset), so later draws do not depend on what
// was drawn before.
void ManualSeed(uint64_t seed);

}  // namespace fsdp::nn

namespace fsdp::nn::init {

// U(low, high): low + (high - low) * u with u uniform in [0, 1), drawn in element order.
Tensor& uniform_(Tensor& tensor, double low, double high, Generator* generator = nullptr);
// N(mean, std^2), drawn in element order.
Tensor& normal_(Tensor& tensor, double mean = 0.0, double std = 1.0,
                Generator* generator = nullptr);
Tensor& ones_(Tensor& tensor);
Tensor& zeros_(Tensor& tensor);
// (fan_in, fan_out) of a weight of at least 2 dims: (size(1) * receptive, size(0) * receptive).
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& tensor);
// kaiming_uniform_(mode="fan_in", nonlinearity="leaky_relu") with negative slope `a`:
// bound = sqrt(3) * sqrt(2 / (1 + a^2)) / sqrt(fan_in). a = sqrt(5) gives 1 / sqrt(fan_in).
Tensor& kaiming_uniform_(Tensor& tensor, double a = 0.0, Generator* generator = nullptr);

// xavier_uniform_: bound = gain * sqrt(6 / (fan_in + fan_out)).
Tensor& xavier_uniform_(Tensor& tensor, double gain = 1.0, Generator* generator = nullptr);

}  // namespace fsdp::nn::init
