// TcpStore: a Store served over TCP, for ranks that are processes on several hosts
// (MASTER_ADDR / MASTER_PORT, like torch's TCPStore). One rank (is_server) also hosts the
// TcpStoreServer; every rank, the host included, talks to it through one client connection.
// Waits block on the server until the keys exist or the timeout passes.
//
// Wire format (all integers little-endian uint64): a request is a command byte then fields:
// SET key value -> status; GET key timeout_ms -> status value; WAIT n key... timeout_ms ->
// status. Strings are a length then bytes; status 0 is ok, 1 is timeout.
//
// Ownership: the server owns its listening socket, connections and threads (joined in the
// destructor); a TcpStore owns its connection and, on the hosting rank, the server.
// Thread-safety: the server is internally synchronised; a client serialises its calls.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/distributed/store/store.h"

namespace fsdp::distributed {

// Whether `host` names the loopback interface: "localhost" or an IPv4 address in 127.0.0.0/8.
bool IsLoopbackHost(const std::string& host);

class TcpStoreServer {
 public:
  // Listens at `port` (0: an ephemeral port, see port()) on the loopback interface when
  // `loopback_only`, else on every IPv4 interface (ranks on other hosts must reach it).
  explicit TcpStoreServer(int port, bool loopback_only = true);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const { return port_; }
  // The address the listening socket is bound to, as getsockname reports it ("127.0.0.1" or
  // "0.0.0.0").
  std::string listen_address() const;

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

class TcpStore final : public Store {
 public:
  // Connects to host:port, retrying until `timeout` (the server may start later). With
  // `is_server` this rank first hosts the server at `port` (0: an ephemeral port, see port())
  // and connects to it; the server listens on the loopback interface only when `host` is a
  // loopback address (127.0.0.0/8, "localhost"), so a single-host run is not reachable from
  // the network, and on every interface otherwise.
  TcpStore(const std::string& host, int port, bool is_server,
           std::chrono::milliseconds timeout = kDefaultTimeout);
  ~TcpStore() override;

  void set(const std::string& key, const std::string& value) override;
  bool wait_for(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::optional<std::string> try_get(const std::string& key) override;
  std::string describe() const override;

  // The server's port (the ephemeral one when asked for port 0).
  int port() const { return port_; }

 private:
  // Sends a wait (GET or WAIT) and reads the status; the value too for GET.
  bool Request(uint8_t command, const std::vector<std::string>& keys,
               std::chrono::milliseconds timeout, std::string* value);

  std::unique_ptr<TcpStoreServer> server_;  // on the hosting rank; outlives the connection
  std::string host_;
  int port_;
  std::mutex mu_;
  int fd_ = -1;
};

}  // namespace fsdp::distributed
