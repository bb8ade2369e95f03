// PrefixStore: a namespace inside another Store (c10d's PrefixStore): key k is stored as
// "<prefix>/k", so several groups or worlds can rendezvous in one store without clashing.
//
// Ownership: shares the inner store. Thread-safety: as the inner store.
#pragma once

#include <memory>

#include "engine/distributed/store/store.h"

namespace fsdp::distributed {

class PrefixStore final : public Store {
 public:
  // Takes the inner store's timeout.
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner);

  void set(const std::string& key, const std::string& value) override;
  bool wait_for(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::optional<std::string> try_get(const std::string& key) override;
  std::string describe() const override;

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& inner() const { return inner_; }

 private:
  std::string Key(const std::string& key) const { return prefix_ + "/" + key; }

  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

}  // namespace fsdp::distributed
