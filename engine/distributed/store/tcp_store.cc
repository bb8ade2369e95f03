#include "engine/distributed/store/tcp_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine/core/error.h"

namespace fsdp::distributed {

namespace {

enum Command : uint8_t { kSet = 1, kGet = 2, kWait = 3 };
enum Status : uint8_t { kOk = 0, kTimeout = 1 };

// Full-buffer socket I/O; false when the peer closed or the socket failed.
bool SendAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool RecvAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// Message buffer with the store's framing.
class Message {
 public:
  void U8(uint8_t v) { bytes_.push_back(static_cast<char>(v)); }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void Bytes(const char* p, size_t n) {
    U64(n);
    bytes_.insert(bytes_.end(), p, p + n);
  }
  void Str(const std::string& s) { Bytes(s.data(), s.size()); }
  bool SendTo(int fd) const { return SendAll(fd, bytes_.data(), bytes_.size()); }

 private:
  std::vector<char> bytes_;
};

bool ReadU8(int fd, uint8_t* v) { return RecvAll(fd, v, 1); }

bool ReadU64(int fd, uint64_t* v) {
  unsigned char b[8];
  if (!RecvAll(fd, b, 8)) return false;
  *v = 0;
  for (int i = 0; i < 8; ++i) *v |= static_cast<uint64_t>(b[i]) << (8 * i);
  return true;
}

constexpr uint64_t kMaxFieldBytes = uint64_t{1} << 30;

bool ReadBytes(int fd, std::vector<char>* out) {
  uint64_t n = 0;
  if (!ReadU64(fd, &n) || n > kMaxFieldBytes) return false;
  out->resize(n);
  return n == 0 || RecvAll(fd, out->data(), n);
}

bool ReadStr(int fd, std::string* out) {
  std::vector<char> b;
  if (!ReadBytes(fd, &b)) return false;
  out->assign(b.begin(), b.end());
  return true;
}

}  // namespace

// ---- Server -------------------------------------------------------------------------------

bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost") return true;
  in_addr addr{};
  return ::inet_pton(AF_INET, host.c_str(), &addr) == 1 && (ntohl(addr.s_addr) >> 24) == 127;
}

TcpStoreServer::TcpStoreServer(int port, bool loopback_only) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  FSDP_CHECK_CODE(ErrorCode::kUnavailable, listen_fd_ >= 0,
                  "TcpStoreServer: socket() failed: ", std::strerror(errno));
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(loopback_only ? INADDR_LOOPBACK : INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listen_fd_, 1024) != 0) {
    const std::string why = std::strerror(errno);
    ::close(listen_fd_);
    FSDP_THROW(ErrorCode::kUnavailable, "TcpStoreServer: cannot listen on port ", port, ": ", why,
               " (is MASTER_PORT in use?)");
  }
  socklen_t len = sizeof(addr);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

std::string TcpStoreServer::listen_address() const {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  char text[INET_ADDRSTRLEN] = {0};
  if (::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      ::inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text)) == nullptr) {
    return "";
  }
  return text;
}

TcpStoreServer::~TcpStoreServer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (int fd : client_fds_) ::shutdown(fd, SHUT_RDWR);
  }
  cv_.notify_all();
  ::shutdown(listen_fd_, SHUT_RDWR);
  accept_thread_.join();
  ::close(listen_fd_);
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    threads.swap(client_threads_);
  }
  for (auto& t : threads) t.join();
  for (int fd : client_fds_) ::close(fd);
}

void TcpStoreServer::AcceptLoop() {
  while (true) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    client_fds_.push_back(fd);
    client_threads_.emplace_back([this, fd] { Serve(fd); });
  }
}

void TcpStoreServer::Serve(int fd) {
  while (true) {
    uint8_t cmd = 0;
    if (!ReadU8(fd, &cmd)) return;
    Message reply;
    if (cmd == kSet) {
      std::string key;
      std::vector<char> value;
      if (!ReadStr(fd, &key) || !ReadBytes(fd, &value)) return;
      {
        std::lock_guard<std::mutex> lock(mu_);
        data_[key] = std::move(value);
      }
      cv_.notify_all();
      reply.U8(kOk);
    } else if (cmd == kGet || cmd == kWait) {
      std::vector<std::string> keys;
      if (cmd == kGet) {
        keys.emplace_back();
        if (!ReadStr(fd, &keys[0])) return;
      } else {
        uint64_t n = 0;
        if (!ReadU64(fd, &n) || n > kMaxFieldBytes) return;
        keys.resize(n);
        for (auto& k : keys) {
          if (!ReadStr(fd, &k)) return;
        }
      }
      uint64_t timeout_ms = 0;
      if (!ReadU64(fd, &timeout_ms)) return;
      std::unique_lock<std::mutex> lock(mu_);
      const bool present = cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
        if (stopping_) return true;
        for (const auto& k : keys) {
          if (!data_.count(k)) return false;
        }
        return true;
      });
      if (stopping_) return;
      reply.U8(present ? kOk : kTimeout);
      if (cmd == kGet) {
        const auto& v = present ? data_[keys[0]] : std::vector<char>();
        reply.Bytes(v.data(), v.size());
      }
    } else {
      return;  // unknown command: drop the connection
    }
    if (!reply.SendTo(fd)) return;
  }
}

// ---- Client -------------------------------------------------------------------------------

TcpStore::TcpStore(const std::string& host, int port, bool is_server,
                   std::chrono::milliseconds timeout)
    : Store(timeout), host_(host), port_(port) {
  FSDP_CHECK(port >= 0 && port < 65536, "TcpStore: bad port ", port);
  FSDP_CHECK(is_server || port > 0, "TcpStore: a client needs the server's port");
  if (is_server) {
    server_ = std::make_unique<TcpStoreServer>(port, IsLoopbackHost(host));
    port_ = server_->port();
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last_error = "no attempt";
  while (true) {
    addrinfo* result = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), std::to_string(port_).c_str(), &hints, &result);
    if (rc != 0) {
      last_error = std::string("getaddrinfo: ") + ::gai_strerror(rc);
    } else {
      for (addrinfo* ai = result; ai != nullptr && fd_ < 0; ai = ai->ai_next) {
        const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
          fd_ = fd;
        } else {
          last_error = std::string("connect: ") + std::strerror(errno);
          ::close(fd);
        }
      }
      ::freeaddrinfo(result);
    }
    if (fd_ >= 0) break;
    FSDP_CHECK_CODE(ErrorCode::kDeadlineExceeded, std::chrono::steady_clock::now() < deadline,
                    "TcpStore: could not connect to the store at ", host, ":", port_, " within ",
                    timeout.count(), " ms (", last_error,
                    "); is rank 0 running and MASTER_ADDR/MASTER_PORT right?");
    // The server may not be up yet: retry shortly (connection setup only).
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::string TcpStore::describe() const {
  return "tcp store " + host_ + ":" + std::to_string(port_);
}

void TcpStore::set(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(mu_);
  Message m;
  m.U8(kSet);
  m.Str(key);
  m.Str(value);
  uint8_t status = 0;
  FSDP_CHECK_CODE(ErrorCode::kUnavailable, m.SendTo(fd_) && ReadU8(fd_, &status),
                  describe(), ": lost the connection during set('", key, "')");
}

bool TcpStore::Request(uint8_t command, const std::vector<std::string>& keys,
                       std::chrono::milliseconds timeout, std::string* value) {
  std::lock_guard<std::mutex> lock(mu_);
  Message m;
  m.U8(command);
  if (command == kGet) {
    m.Str(keys.at(0));
  } else {
    m.U64(keys.size());
    for (const auto& k : keys) m.Str(k);
  }
  m.U64(static_cast<uint64_t>(std::max<int64_t>(timeout.count(), 0)));
  uint8_t status = 0;
  bool ok = m.SendTo(fd_) && ReadU8(fd_, &status);
  if (ok && command == kGet) ok = ReadStr(fd_, value);
  FSDP_CHECK_CODE(ErrorCode::kUnavailable, ok, describe(), ": lost the connection during ",
                  command == kGet ? "get('" + keys[0] + "')" : std::string("wait"));
  return status == kOk;
}

bool TcpStore::wait_for(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  return Request(kWait, keys, timeout, nullptr);
}

std::optional<std::string> TcpStore::try_get(const std::string& key) {
  std::string value;
  if (!Request(kGet, {key}, std::chrono::milliseconds(0), &value)) return std::nullopt;
  return value;
}

}  // namespace fsdp::distributed
