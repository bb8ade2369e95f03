#include "engine/ops/compare.h"

#include <cmath>
#include <vector>

namespace fsdp::ops::kernels {

double MaxAbsDiff(const Tensor& a, const Tensor& b) {
  FSDP_CHECK(a.defined() && b.defined(), "max_abs_diff: undefined tensor");
  FSDP_CHECK(a.sizes() == b.sizes(), "max_abs_diff: shapes differ: ", ShapeStr(a.sizes()), " vs ",
             ShapeStr(b.sizes()));
  const std::vector<double> va = a.to_doubles(), vb = b.to_doubles();
  double m = 0.0;
  for (size_t i = 0; i < va.size(); ++i) {
    const double d = std::fabs(va[i] - vb[i]);
    if (std::isnan(d)) return d;
    if (d > m) m = d;
  }
  return m;
}

bool AllClose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  FSDP_CHECK(a.defined() && b.defined(), "allclose: undefined tensor");
  if (a.sizes() != b.sizes()) return false;
  const std::vector<double> va = a.to_doubles(), vb = b.to_doubles();
  for (size_t i = 0; i < va.size(); ++i) {
    const double x = va[i], y = vb[i];
    if (std::isnan(x) || std::isnan(y)) {
      if (!(equal_nan && std::isnan(x) && std::isnan(y))) return false;
      continue;
    }
    if (x == y) continue;  // covers equal infinities
    if (std::isinf(x) || std::isinf(y)) return false;
    if (std::fabs(x - y) > atol + rtol * std::fabs(y)) return false;
  }
  return true;
}

}  // namespace fsdp::ops::kernels
