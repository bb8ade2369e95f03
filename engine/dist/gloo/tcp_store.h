// TcpStore: a small TCP key-value store for Gloo rendezvous when ranks are processes on
// several hosts (MASTER_ADDR / MASTER_PORT, like torch's TCPStore). One rank hosts a
// TcpStoreServer; every rank (the host included) talks to it through a TcpStore client, which
// implements gloo::rendezvous::Store. get() and wait() block on the server until the keys
// exist or the timeout passes (then the client throws Error(kDeadlineExceeded)).
//
// Wire format (all integers little-endian uint64): a request is a command byte then fields:
// SET key value -> status; GET key timeout_ms -> status value; WAIT n key... timeout_ms ->
// status. Strings are a length then bytes; status 0 is ok, 1 is timeout.
//
// Internal to engine/dist/gloo (it includes gloo headers).
// Ownership: the server owns its listening socket, connections and threads (joined in the
// destructor); a client owns one connection.
// Thread-safety: the server is internally synchronised; a client serialises its calls.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace fsdp::dist::gloo_internal {

class TcpStoreServer {
 public:
  // Listens on all IPv4 interfaces at `port` (0: an ephemeral port, see port()).
  explicit TcpStoreServer(int port);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const { return port_; }

 private:
  void AcceptLoop();
  void Serve(int fd);

  int listen_fd_ = -1;
  int port_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<std::string, std::vector<char>> data_;
  std::vector<int> client_fds_;
  std::vector<std::thread> client_threads_;
  std::thread accept_thread_;
};

class TcpStore final : public ::gloo::rendezvous::Store {
 public:
  // Connects to host:port, retrying until `timeout` (the server may start later).
  TcpStore(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  int fd_ = -1;
};

}  // namespace fsdp::dist::gloo_internal
