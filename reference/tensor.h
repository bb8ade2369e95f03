// The oracle's tensor value types: BasicRefTensor<T> (a shape plus row-major values), IndexTensor
// (integer inputs such as token ids and class targets), TensorSpec (an FQN and a shape) and the
// FQN-keyed maps every oracle function takes and returns.
//
// Conventions (see docs/oracle.md):
//   * Weights, gradients, buffers and optimizer states travel as TensorMap<T>, keyed by PyTorch
//     fully qualified names exactly as `named_parameters()` / `named_buffers()` spell them.
//   * An absent key in a gradient map means "grad is None" (the parameter received no gradient).
//   * `double` is the oracle's working precision; `float` instantiations exist so that fp32
//     subjects can also be compared against fp32 arithmetic.
//
// Ownership: plain values; copies are deep. Thread-safety: none needed (no shared state); distinct
// objects may be used from distinct threads.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fsdp::reference {

using Shape = std::vector<int64_t>;

// Product of the sizes (1 for the 0-d shape {}). Throws std::invalid_argument on a negative size.
int64_t NumelOf(const Shape& shape);

// "[2, 3]" (torch.Size style without the prefix); "[]" for a 0-d shape.
std::string ShapeToString(const Shape& shape);

// A dense row-major tensor of T. Invariant: data.size() == NumelOf(shape). The default value is
// the empty 1-d tensor (shape [0]).
template <typename T>
struct BasicRefTensor {
  Shape shape = {0};
  std::vector<T> data;

  BasicRefTensor() = default;
  // Zero-filled tensor of `shape`.
  explicit BasicRefTensor(Shape s);
  // Tensor of `shape` holding `values` (row-major); throws if the element counts differ.
  BasicRefTensor(Shape s, std::vector<T> values);

  int64_t numel() const { return static_cast<int64_t>(data.size()); }
  int64_t ndim() const { return static_cast<int64_t>(shape.size()); }
  // Size of dimension `d`; negative `d` counts from the end. Throws when out of range.
  int64_t size(int64_t d) const;

  T& operator[](int64_t i) { return data[static_cast<size_t>(i)]; }
  const T& operator[](int64_t i) const { return data[static_cast<size_t>(i)]; }

  bool operator==(const BasicRefTensor& other) const = default;
};

using RefTensor = BasicRefTensor<double>;
using RefTensorF = BasicRefTensor<float>;

template <typename T>
using TensorMap = std::map<std::string, BasicRefTensor<T>>;
using RefTensorMap = TensorMap<double>;

// Integer tensor (token ids, class targets). Invariant: data.size() == NumelOf(shape).
struct IndexTensor {
  Shape shape = {0};
  std::vector<int64_t> data;

  IndexTensor() = default;
  // Throws if the element counts differ.
  IndexTensor(Shape s, std::vector<int64_t> values);

  int64_t numel() const { return static_cast<int64_t>(data.size()); }
  bool empty() const { return data.empty(); }
  bool operator==(const IndexTensor& other) const = default;
};

// A named tensor slot: a parameter or buffer FQN with its shape. `persistent` only matters for
// buffers (false: registered with persistent=False, so absent from state_dict()).
struct TensorSpec {
  std::string name;
  Shape shape;
  bool persistent = true;

  bool operator==(const TensorSpec& other) const = default;
};

// ---- Construction helpers ----------------------------------------------------------------------

template <typename T>
BasicRefTensor<T> Full(const Shape& shape, T value);

// Deterministic pseudo-random values uniform in [low, high) from a SplitMix64 stream seeded with
// `seed`; identical on every platform and for every T (values are drawn in double, then cast).
template <typename T>
BasicRefTensor<T> UniformTensor(const Shape& shape, uint64_t seed, double low, double high);

// One uniform tensor per spec; spec i uses seed `seed + i`.
template <typename T>
TensorMap<T> UniformTensors(const std::vector<TensorSpec>& specs, uint64_t seed, double low,
                            double high);

// Deterministic integers uniform in [0, bound) (SplitMix64, as UniformTensor).
IndexTensor UniformIndices(const Shape& shape, uint64_t seed, int64_t bound);

// Zero tensors for every spec.
template <typename T>
TensorMap<T> ZerosLike(const std::vector<TensorSpec>& specs);

// ---- Conversions and comparisons ---------------------------------------------------------------

template <typename To, typename From>
BasicRefTensor<To> CastTensor(const BasicRefTensor<From>& t) {
  BasicRefTensor<To> out;
  out.shape = t.shape;
  out.data.assign(t.data.begin(), t.data.end());
  return out;
}

template <typename To, typename From>
TensorMap<To> CastMap(const TensorMap<From>& m) {
  TensorMap<To> out;
  for (const auto& [name, t] : m) out.emplace(name, CastTensor<To>(t));
  return out;
}

// max |a - b| over elements; throws std::invalid_argument when the shapes differ.
template <typename T>
double MaxAbsDiff(const BasicRefTensor<T>& a, const BasicRefTensor<T>& b);

// Same shape and |a - b| <= atol + rtol * |b| elementwise (torch.allclose's rule).
template <typename T>
bool AllClose(const BasicRefTensor<T>& a, const BasicRefTensor<T>& b, double rtol, double atol);

// Same key set and AllClose for every key. When `why` is non-null it receives a description of
// the first mismatch (missing key, shape or worst element).
template <typename T>
bool AllCloseMaps(const TensorMap<T>& a, const TensorMap<T>& b, double rtol, double atol,
                  std::string* why = nullptr);

// ---- Dim-0 slicing -----------------------------------------------------------------------------

// Rows [begin, end) of dim 0 (0 <= begin <= end <= size(0)); keeps the other dims.
template <typename T>
BasicRefTensor<T> SliceRows(const BasicRefTensor<T>& t, int64_t begin, int64_t end);
IndexTensor SliceRows(const IndexTensor& t, int64_t begin, int64_t end);

// Concatenation along dim 0; all parts must agree on the other dims. Throws on an empty list.
template <typename T>
BasicRefTensor<T> ConcatRows(const std::vector<BasicRefTensor<T>>& parts);

}  // namespace fsdp::reference
