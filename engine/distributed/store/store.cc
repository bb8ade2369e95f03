#include "engine/distributed/store/store.h"

#include "engine/core/error.h"

namespace fsdp::distributed {

void Store::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  if (wait_for(keys, timeout)) return;
  std::string missing;
  for (const auto& k : keys) {
    if (!check({k})) missing += (missing.empty() ? "'" : ", '") + k + "'";
  }
  FSDP_THROW(ErrorCode::kDeadlineExceeded, describe(), ": key(s) ", missing,
             " did not appear within ", timeout.count(),
             " ms (a rank that should have set them is missing, slow or failed)");
}

std::string Store::get(const std::string& key, std::chrono::milliseconds timeout) {
  wait({key}, timeout);
  auto value = try_get(key);
  FSDP_CHECK_CODE(ErrorCode::kInternal, value.has_value(), describe(), ": key '", key,
                  "' disappeared after it was seen");
  return *std::move(value);
}

}  // namespace fsdp::distributed
