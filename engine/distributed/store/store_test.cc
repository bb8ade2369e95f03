// The Store contract, run against every implementation: set/get, waits that block until a key
// appears (set from another thread), deadlines that name the missing keys, binary values,
// prefixes, and clients of one TCP server or one directory seeing each other's keys.
#include "engine/distributed/store/store.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/error.h"
#include "engine/distributed/store/file_store.h"
#include "engine/distributed/store/hash_store.h"
#include "engine/distributed/store/prefix_store.h"
#include "engine/distributed/store/tcp_store.h"

namespace fsdp::distributed {
namespace {

using std::chrono::milliseconds;

std::string FreshDirectory() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "fsdp-store-XXXXXX").string();
  FSDP_CHECK(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp failed");
  return tmpl;
}

// One world's view of a store kind: the first store made, and a second client of the same
// backing (another connection, the same directory, the same map).
struct StoreKind {
  std::string name;
  std::function<std::pair<std::shared_ptr<Store>, std::shared_ptr<Store>>()> make;
};

std::vector<StoreKind> Kinds() {
  return {
      {"hash",
       [] {
         auto s = std::make_shared<HashStore>(milliseconds(2000));
         return std::make_pair<std::shared_ptr<Store>, std::shared_ptr<Store>>(s, s);
       }},
      {"file",
       [] {
         const std::string dir = FreshDirectory();
         return std::make_pair<std::shared_ptr<Store>, std::shared_ptr<Store>>(
             std::make_shared<FileStore>(dir, milliseconds(2000)),
             std::make_shared<FileStore>(dir, milliseconds(2000)));
       }},
      {"tcp",
       [] {
         auto server = std::make_shared<TcpStore>("127.0.0.1", 0, true, milliseconds(2000));
         auto client = std::make_shared<TcpStore>("127.0.0.1", server->port(), false,
                                                  milliseconds(2000));
         return std::make_pair<std::shared_ptr<Store>, std::shared_ptr<Store>>(server, client);
       }},
      {"prefix",
       [] {
         auto inner = std::make_shared<HashStore>(milliseconds(2000));
         return std::make_pair<std::shared_ptr<Store>, std::shared_ptr<Store>>(
             std::make_shared<PrefixStore>("world", inner),
             std::make_shared<PrefixStore>("world", inner));
       }},
  };
}

class StoreContractTest : public ::testing::TestWithParam<StoreKind> {};

TEST_P(StoreContractTest, SetThenGetFromAnotherClient) {
  auto [a, b] = GetParam().make();
  a->set("key", "value");
  EXPECT_EQ(b->get("key"), "value");
  a->set("key", "replaced");
  EXPECT_EQ(b->get("key"), "replaced");
  EXPECT_TRUE(b->check({"key"}));
  EXPECT_FALSE(b->check({"key", "other"}));
  EXPECT_EQ(b->try_get("other"), std::nullopt);
}

TEST_P(StoreContractTest, ValuesAreBytesAndKeysMayHoldAnyCharacter) {
  auto [a, b] = GetParam().make();
  const std::string value("a\0b\xff/\n", 6);
  const std::string key = "pg0/rank 1/../%x";
  a->set(key, value);
  a->set("", "empty key");
  a->set("empty value", "");
  EXPECT_EQ(b->get(key), value);
  EXPECT_EQ(b->get(""), "empty key");
  EXPECT_EQ(b->get("empty value"), "");
  const std::string long_key(600, 'k');
  a->set(long_key, "long");
  a->set(long_key + "2", "long2");
  EXPECT_EQ(b->get(long_key), "long");
  EXPECT_EQ(b->get(long_key + "2"), "long2");
}

TEST_P(StoreContractTest, WaitBlocksUntilAnotherThreadSets) {
  auto [a, b] = GetParam().make();
  std::thread setter([a = a] {
    std::this_thread::sleep_for(milliseconds(50));
    a->set("late/1", "x");
    a->set("late/2", "y");
  });
  b->wait({"late/1", "late/2"}, milliseconds(5000));
  EXPECT_EQ(b->get("late/2"), "y");
  setter.join();
}

TEST_P(StoreContractTest, DeadlineNamesTheStoreAndTheMissingKeys) {
  auto [a, b] = GetParam().make();
  a->set("present", "1");
  const auto start = std::chrono::steady_clock::now();
  try {
    b->wait({"present", "absent"}, milliseconds(100));
    FAIL() << "expected a deadline";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDeadlineExceeded) << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find("'absent'"), std::string::npos) << what;
    EXPECT_EQ(what.find("'present'"), std::string::npos) << what;
    EXPECT_NE(what.find(b->describe()), std::string::npos) << what;
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(100));
  try {
    b->get("absent", milliseconds(20));
    FAIL() << "expected a deadline";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDeadlineExceeded) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreContractTest, ::testing::ValuesIn(Kinds()),
                         [](const auto& info) { return info.param.name; });

TEST(PrefixStoreTest, KeysLiveUnderThePrefixOfTheInnerStore) {
  auto inner = std::make_shared<HashStore>();
  PrefixStore a("pg0", inner);
  PrefixStore b("pg1", inner);
  a.set("k", "from a");
  b.set("k", "from b");
  EXPECT_EQ(inner->get("pg0/k"), "from a");
  EXPECT_EQ(inner->get("pg1/k"), "from b");
  PrefixStore nested("nccl", std::make_shared<PrefixStore>("pg0", inner));
  nested.set("id", "x");
  EXPECT_EQ(inner->get("pg0/nccl/id"), "x");
  EXPECT_NE(nested.describe().find("hash store"), std::string::npos);
}

TEST(FileStoreTest, OneFilePerKeyAndNoTemporaryFilesLeft) {
  const std::string dir = FreshDirectory();
  FileStore store(dir);
  store.set("a/b", "1");
  store.set("a/b", "2");
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    ++files;
    EXPECT_EQ(entry.path().filename().string().rfind(".tmp", 0), std::string::npos)
        << entry.path();
  }
  EXPECT_EQ(files, 1);
  EXPECT_TRUE(std::filesystem::exists(store.PathOf("a/b")));
  std::filesystem::remove_all(dir);
}

TEST(FileStoreTest, AnUnusableDirectoryIsAClearError) {
  try {
    FileStore store("/proc/version/sub");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable) << e.what();
    EXPECT_NE(std::string(e.what()).find("/proc/version/sub"), std::string::npos) << e.what();
  }
}

TEST(TcpStoreTest, ManyClientsOfOneServer) {
  auto server = std::make_shared<TcpStore>("127.0.0.1", 0, true, milliseconds(5000));
  std::vector<std::thread> threads;
  for (int r = 0; r < 8; ++r) {
    threads.emplace_back([port = server->port(), r] {
      TcpStore client("127.0.0.1", port, false, milliseconds(5000));
      client.set("rank" + std::to_string(r), std::to_string(r));
      std::vector<std::string> all;
      for (int q = 0; q < 8; ++q) all.push_back("rank" + std::to_string(q));
      client.wait(all);
      EXPECT_EQ(client.get("rank" + std::to_string((r + 1) % 8)), std::to_string((r + 1) % 8));
    });
  }
  for (auto& t : threads) t.join();
}

TEST(TcpStoreTest, ClientWithoutServerTimesOutNamingTheAddress) {
  // Port 1 on loopback: nothing listens there (and an unprivileged bind cannot take it).
  try {
    TcpStore client("127.0.0.1", 1, false, milliseconds(100));
    FAIL() << "expected a deadline";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDeadlineExceeded) << e.what();
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:1"), std::string::npos) << e.what();
  }
}

// A store hosted for a loopback MASTER_ADDR listens on the loopback interface only; any other
// address (ranks on other hosts) listens on every interface.
TEST(TcpStoreListenTest, LoopbackHostsListenOnLoopbackOnly) {
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("127.1.2.3"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_FALSE(IsLoopbackHost("10.0.0.7"));
  EXPECT_FALSE(IsLoopbackHost("node17.cluster"));
  TcpStoreServer loopback(0, /*loopback_only=*/true);
  EXPECT_EQ(loopback.listen_address(), "127.0.0.1");
  TcpStoreServer everywhere(0, /*loopback_only=*/false);
  EXPECT_EQ(everywhere.listen_address(), "0.0.0.0");
}

}  // namespace
}  // namespace fsdp::distributed
