#include "engine/nn/init.h"

#include <cmath>
#include <vector>

#include "engine/core/rank_context.h"

namespace fsdp::nn {

void ManualSeed(uint64_t seed) { RankContext::Current().generator() = Generator(seed); }

}  // namespace fsdp::nn

namespace fsdp::nn::init {

namespace {

Generator& Gen(Generator* generator) {
  return generator != nullptr ? *generator : RankContext::Current().generator();
}

void Write(Tensor& tensor, const std::vector<double>& values) {
  Tensor host = Tensor::from_doubles(values, tensor.sizes(), tensor.dtype());
  tensor.copy_(host);
}

}  // namespace

Tensor& uniform_(Tensor& tensor, double low, double high, Generator* generator) {
  Generator& g = Gen(generator);
  std::vector<double> v(static_cast<size_t>(tensor.numel()));
  for (double& x : v) x = low + (high - low) * g.uniform_double();
  Write(tensor, v);
  return tensor;
}

Tensor& normal_(Tensor& tensor, double mean, double std, Generator* generator) {
  Generator& g = Gen(generator);
  std::vector<double> v(static_cast<size_t>(tensor.numel()));
  for (double& x : v) x = mean + std * g.normal();
  Write(tensor, v);
  return tensor;
}

Tensor& ones_(Tensor& tensor) {
  tensor.fill_(1.0);
  return tensor;
}

Tensor& zeros_(Tensor& tensor) {
  tensor.zero_();
  return tensor;
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& tensor) {
  FSDP_CHECK(tensor.dim() >= 2,
             "Fan in and fan out can not be computed for tensor with fewer than 2 dimensions "
             "(got shape ",
             ShapeStr(tensor.sizes()), ")");
  int64_t receptive = 1;
  for (int64_t d = 2; d < tensor.dim(); ++d) receptive *= tensor.size(d);
  return {tensor.size(1) * receptive, tensor.size(0) * receptive};
}

Tensor& kaiming_uniform_(Tensor& tensor, double a, Generator* generator) {
  const int64_t fan_in = calculate_fan_in_and_fan_out(tensor).first;
  const double gain = std::sqrt(2.0 / (1.0 + a * a));
  const double std = fan_in > 0 ? gain / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  const double bound = std::sqrt(3.0) * std;
  return uniform_(tensor, -bound, bound, generator);
}

Tensor& xavier_uniform_(Tensor& tensor, double gain, Generator* generator) {
  const auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor);
  const double std = gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
  const double bound = std::sqrt(3.0) * std;
  return uniform_(tensor, -bound, bound, generator);
}

}  // namespace fsdp::nn::init
