#include "reference/tensor.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace fsdp::reference {
namespace {

// SplitMix64 (Steele, Lea, Flood 2014): a tiny, fully specified generator, so oracle test data is
// the same everywhere (std distributions are implementation-defined).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double NextUnit() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }

 private:
  uint64_t state_;
};

}  // namespace

int64_t NumelOf(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0) throw std::invalid_argument("negative size in shape " + ShapeToString(shape));
    n *= s;
  }
  return n;
}

std::string ShapeToString(const Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

template <typename T>
BasicRefTensor<T>::BasicRefTensor(Shape s)
    : shape(std::move(s)), data(static_cast<size_t>(NumelOf(shape)), T(0)) {}

template <typename T>
BasicRefTensor<T>::BasicRefTensor(Shape s, std::vector<T> values)
    : shape(std::move(s)), data(std::move(values)) {
  if (NumelOf(shape) != static_cast<int64_t>(data.size())) {
    throw std::invalid_argument("BasicRefTensor: shape " + ShapeToString(shape) + " needs " +
                                std::to_string(NumelOf(shape)) + " values, got " +
                                std::to_string(data.size()));
  }
}

template <typename T>
int64_t BasicRefTensor<T>::size(int64_t d) const {
  const int64_t n = ndim();
  const int64_t dd = d < 0 ? d + n : d;
  if (dd < 0 || dd >= n) {
    throw std::out_of_range("BasicRefTensor::size(" + std::to_string(d) + ") on shape " +
                            ShapeToString(shape));
  }
  return shape[static_cast<size_t>(dd)];
}

IndexTensor::IndexTensor(Shape s, std::vector<int64_t> values)
    : shape(std::move(s)), data(std::move(values)) {
  if (NumelOf(shape) != static_cast<int64_t>(data.size())) {
    throw std::invalid_argument("IndexTensor: shape " + ShapeToString(shape) + " needs " +
                                std::to_string(NumelOf(shape)) + " values, got " +
                                std::to_string(data.size()));
  }
}

template <typename T>
BasicRefTensor<T> Full(const Shape& shape, T value) {
  BasicRefTensor<T> t(shape);
  std::fill(t.data.begin(), t.data.end(), value);
  return t;
}

template <typename T>
BasicRefTensor<T> UniformTensor(const Shape& shape, uint64_t seed, double low, double high) {
  BasicRefTensor<T> t(shape);
  SplitMix64 rng(seed);
  for (T& v : t.data) v = static_cast<T>(low + (high - low) * rng.NextUnit());
  return t;
}

template <typename T>
TensorMap<T> UniformTensors(const std::vector<TensorSpec>& specs, uint64_t seed, double low,
                            double high) {
  TensorMap<T> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    out.emplace(specs[i].name, UniformTensor<T>(specs[i].shape, seed + i, low, high));
  }
  return out;
}

IndexTensor UniformIndices(const Shape& shape, uint64_t seed, int64_t bound) {
  if (bound <= 0) throw std::invalid_argument("UniformIndices: bound must be positive");
  IndexTensor t(shape, std::vector<int64_t>(static_cast<size_t>(NumelOf(shape))));
  SplitMix64 rng(seed);
  for (int64_t& v : t.data) v = static_cast<int64_t>(rng.Next() % static_cast<uint64_t>(bound));
  return t;
}

template <typename T>
TensorMap<T> ZerosLike(const std::vector<TensorSpec>& specs) {
  TensorMap<T> out;
  for (const TensorSpec& s : specs) out.emplace(s.name, BasicRefTensor<T>(s.shape));
  return out;
}

template <typename T>
double MaxAbsDiff(const BasicRefTensor<T>& a, const BasicRefTensor<T>& b) {
  if (a.shape != b.shape) {
    throw std::invalid_argument("MaxAbsDiff: shapes " + ShapeToString(a.shape) + " and " +
                                ShapeToString(b.shape) + " differ");
  }
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    m = std::max(m, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  }
  return m;
}

namespace {

// Index of the worst violation of |a-b| <= atol + rtol|b|, or -1 when none.
template <typename T>
int64_t WorstViolation(const BasicRefTensor<T>& a, const BasicRefTensor<T>& b, double rtol,
                       double atol) {
  int64_t worst = -1;
  double worst_excess = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = static_cast<double>(a[i]);
    const double y = static_cast<double>(b[i]);
    const double err = std::abs(x - y);
    const double allowed = atol + rtol * std::abs(y);
    const bool bad = !(err <= allowed);  // NaN counts as a violation
    if (bad && (worst < 0 || err - allowed > worst_excess || std::isnan(err))) {
      worst = i;
      worst_excess = err - allowed;
    }
  }
  return worst;
}

}  // namespace

template <typename T>
bool AllClose(const BasicRefTensor<T>& a, const BasicRefTensor<T>& b, double rtol, double atol) {
  return a.shape == b.shape && WorstViolation(a, b, rtol, atol) < 0;
}

template <typename T>
bool AllCloseMaps(const TensorMap<T>& a, const TensorMap<T>& b, double rtol, double atol,
                  std::string* why) {
  auto fail = [&](const std::string& msg) {
    if (why != nullptr) *why = msg;
    return false;
  };
  for (const auto& [name, t] : a) {
    if (!b.count(name)) return fail("key '" + name + "' only in the first map");
  }
  for (const auto& [name, t] : b) {
    auto it = a.find(name);
    if (it == a.end()) return fail("key '" + name + "' only in the second map");
    if (it->second.shape != t.shape) {
      return fail("'" + name + "': shape " + ShapeToString(it->second.shape) + " vs " +
                  ShapeToString(t.shape));
    }
    const int64_t i = WorstViolation(it->second, t, rtol, atol);
    if (i >= 0) {
      std::ostringstream os;
      os.precision(17);
      os << "'" << name << "' element " << i << ": " << static_cast<double>(it->second[i]) << " vs "
         << static_cast<double>(t[i]) << " (rtol " << rtol << ", atol " << atol << ")";
      return fail(os.str());
    }
  }
  return true;
}

namespace {

int64_t RowNumel(const Shape& shape, const char* what) {
  if (shape.empty()) throw std::invalid_argument(std::string(what) + ": 0-d tensor has no rows");
  return NumelOf(Shape(shape.begin() + 1, shape.end()));
}

void CheckRowRange(const Shape& shape, int64_t begin, int64_t end) {
  if (begin < 0 || begin > end || end > shape[0]) {
    throw std::invalid_argument("SliceRows: rows [" + std::to_string(begin) + ", " +
                                std::to_string(end) + ") out of range for shape " +
                                ShapeToString(shape));
  }
}

}  // namespace

template <typename T>
BasicRefTensor<T> SliceRows(const BasicRefTensor<T>& t, int64_t begin, int64_t end) {
  const int64_t row = RowNumel(t.shape, "SliceRows");
  CheckRowRange(t.shape, begin, end);
  Shape shape = t.shape;
  shape[0] = end - begin;
  return BasicRefTensor<T>(
      shape, std::vector<T>(t.data.begin() + begin * row, t.data.begin() + end * row));
}

IndexTensor SliceRows(const IndexTensor& t, int64_t begin, int64_t end) {
  const int64_t row = RowNumel(t.shape, "SliceRows");
  CheckRowRange(t.shape, begin, end);
  Shape shape = t.shape;
  shape[0] = end - begin;
  return IndexTensor(
      shape, std::vector<int64_t>(t.data.begin() + begin * row, t.data.begin() + end * row));
}

template <typename T>
BasicRefTensor<T> ConcatRows(const std::vector<BasicRefTensor<T>>& parts) {
  if (parts.empty()) throw std::invalid_argument("ConcatRows: no parts");
  Shape shape = parts[0].shape;
  RowNumel(shape, "ConcatRows");
  shape[0] = 0;
  std::vector<T> data;
  for (const auto& p : parts) {
    if (p.shape.size() != shape.size() ||
        !std::equal(p.shape.begin() + 1, p.shape.end(), shape.begin() + 1)) {
      throw std::invalid_argument("ConcatRows: shape " + ShapeToString(p.shape) +
                                  " does not match " + ShapeToString(parts[0].shape));
    }
    shape[0] += p.shape[0];
    data.insert(data.end(), p.data.begin(), p.data.end());
  }
  return BasicRefTensor<T>(shape, std::move(data));
}

#define FSDP_REFERENCE_INSTANTIATE(T)                                                            \
  template struct BasicRefTensor<T>;                                                             \
  template BasicRefTensor<T> Full<T>(const Shape&, T);                                           \
  template BasicRefTensor<T> UniformTensor<T>(const Shape&, uint64_t, double, double);           \
  template TensorMap<T> UniformTensors<T>(const std::vector<TensorSpec>&, uint64_t, double,      \
                                          double);                                               \
  template TensorMap<T> ZerosLike<T>(const std::vector<TensorSpec>&);                            \
  template double MaxAbsDiff<T>(const BasicRefTensor<T>&, const BasicRefTensor<T>&);             \
  template bool AllClose<T>(const BasicRefTensor<T>&, const BasicRefTensor<T>&, double, double); \
  template bool AllCloseMaps<T>(const TensorMap<T>&, const TensorMap<T>&, double, double,        \
                                std::string*);                                                   \
  template BasicRefTensor<T> SliceRows<T>(const BasicRefTensor<T>&, int64_t, int64_t);           \
  template BasicRefTensor<T> ConcatRows<T>(const std::vector<BasicRefTensor<T>>&);

FSDP_REFERENCE_INSTANTIATE(float)
FSDP_REFERENCE_INSTANTIATE(double)
#undef FSDP_REFERENCE_INSTANTIATE

}  // namespace fsdp::reference
