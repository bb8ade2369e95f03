#include "engine/core/bitwise_equal.h"

#include <cstring>

namespace fsdp {

bool BitwiseEqual(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) return false;
  if (a.nbytes() == 0) return true;  // memcmp must not see an empty tensor's null pointer
  const Tensor ha = a.to(Device::CPU()), hb = b.to(Device::CPU());
  return std::memcmp(ha.data_ptr(), hb.data_ptr(), ha.nbytes()) == 0;
}

}  // namespace fsdp
