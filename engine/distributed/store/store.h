// Store: the rendezvous key-value store that process groups and launchers meet through, with
// the contract of PyTorch's c10d::Store (torch/csrc/distributed/c10d/Store.hpp) that they use:
// set a key, wait for keys, get a key once it exists. Values are bytes (std::string).
//
//   auto store = std::make_shared<FileStore>("/mnt/nfs/run1");   // or TcpStore, HashStore
//   auto pg = GlooProcessGroup::Create(store, rank, world);
//   auto nccl = NcclProcessGroup::Create(std::make_shared<PrefixStore>("nccl", store), ...);
//
// Implementations (one per file): HashStore (in memory, ranks as threads), FileStore (one file
// per key in a shared directory), TcpStore (a server hosted by one rank, like torch's
// TCPStore), PrefixStore (a namespace inside another store). Backends see only this interface,
// so no backend depends on another backend's rendezvous.
//
// Errors: a wait that passes its deadline throws Error(kDeadlineExceeded) naming the store and
// the keys still missing; a store that cannot be reached throws kUnavailable.
//
// Ownership: stores are shared (shared_ptr) by every group and launcher that uses them.
// Thread-safety: every implementation is safe to call from several threads at once.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::distributed {

class Store {
 public:
  // c10d's default store timeout is 300 s; ours follows the process groups' 30 s default.
  static constexpr std::chrono::milliseconds kDefaultTimeout{30000};

  explicit Store(std::chrono::milliseconds timeout = kDefaultTimeout) : timeout_(timeout) {}
  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Sets `key` to `value`, replacing an earlier value; waiters on `key` wake up.
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits until every key of `keys` exists or `timeout` passes; true when they all exist.
  virtual bool wait_for(const std::vector<std::string>& keys,
                        std::chrono::milliseconds timeout) = 0;
  // The value of `key` when it exists now; nullopt otherwise (never waits).
  virtual std::optional<std::string> try_get(const std::string& key) = 0;
  // "file store /tmp/run1", "tcp store 10.0.0.1:29500", ...: for error messages.
  virtual std::string describe() const = 0;

  // Waits for `key` (up to timeout(), or `timeout`), then returns its value.
  std::string get(const std::string& key) { return get(key, timeout_); }
  std::string get(const std::string& key, std::chrono::milliseconds timeout);
  // Waits until every key exists; kDeadlineExceeded naming the missing keys otherwise.
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // True when every key exists now.
  bool check(const std::vector<std::string>& keys) {
    return wait_for(keys, std::chrono::milliseconds(0));
  }

  // The deadline of get() and wait() without an explicit timeout.
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 private:
  std::chrono::milliseconds timeout_;
};

}  // namespace fsdp::distributed
