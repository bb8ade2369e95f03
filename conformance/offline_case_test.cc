// fsdp-conform expect / check: a prepared directory holds the inputs, the requests and the
// oracle's expectations; results in the expected form pass `check`, tampered or missing ones
// fail naming the rank and what is wrong.
#include "conformance/offline_case.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "conformance/cli.h"
#include "engine/core/error.h"
#include "engine/serialization/safetensors.h"

namespace fsdp::conformance {
namespace {

using ::testing::HasSubstr;

class OfflineCase : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() /
            ("offline_case_test." + std::to_string(::getpid()) + "." +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  int Cli(std::vector<std::string> args) {
    out_.str("");
    err_.str("");
    return RunCli(args, DefaultCatalog(), out_, err_);
  }
  // Puts the expected observations where a driver writes its results.
  void UseExpectedAsResults(int world) {
    for (int r = 0; r < world; ++r) {
      const std::string from = dir_ + "/expected/rank" + std::to_string(r);
      const std::string to = dir_ + "/rank" + std::to_string(r);
      std::filesystem::copy_file(from + ".json", to + ".result.json");
      std::filesystem::copy_file(from + ".tensors.safetensors", to + ".tensors.safetensors");
    }
  }

  std::string dir_;
  std::ostringstream out_, err_;
};

TEST_F(OfflineCase, ExpectedObservationsPassCheck) {
  ASSERT_EQ(Cli({"expect", "parity/fsdp/mlp", "--dir", dir_, "--world", "3", "--param",
                 "optim=sgd", "--param", "steps=2"}),
            0)
      << err_.str();
  for (const char* f : {"weights.safetensors", "rank2.inputs.safetensors", "rank2.request.json",
                        "expected/rank2.json", "expected/rank2.tensors.safetensors"}) {
    EXPECT_TRUE(std::filesystem::exists(dir_ + "/" + f)) << f;
  }
  const auto inputs = serialization::LoadSafetensors(dir_ + "/rank1.inputs.safetensors");
  EXPECT_NE(inputs.Find("step1/input"), nullptr);
  UseExpectedAsResults(3);
  EXPECT_EQ(Cli({"check", dir_}), 0) << out_.str() << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("1 passed, 0 failed, 0 skipped"));
}

TEST_F(OfflineCase, CheckNamesTamperedAndMissingResults) {
  ASSERT_EQ(Cli({"expect", "parity/fsdp/mlp", "--dir", dir_, "--world", "2", "--param",
                 "optim=sgd", "--param", "steps=1"}),
            0)
      << err_.str();
  UseExpectedAsResults(2);
  // Rank 1 claims a different loss: the judge fails naming the rank.
  {
    std::ifstream in(dir_ + "/rank1.result.json");
    nlohmann::json result = nlohmann::json::parse(in);
    result["observations"]["losses"][0] = result["observations"]["losses"][0].get<double>() + 1;
    std::ofstream(dir_ + "/rank1.result.json") << result.dump();
  }
  EXPECT_EQ(Cli({"check", dir_}), 1);
  EXPECT_THAT(out_.str(), HasSubstr("rank 1 losses vs oracle"));
  // An undeclared key is refused before judging.
  {
    std::ifstream in(dir_ + "/rank0.result.json");
    nlohmann::json result = nlohmann::json::parse(in);
    result["observations"]["mismatched_params"] = 0;
    std::ofstream(dir_ + "/rank0.result.json") << result.dump();
  }
  EXPECT_EQ(Cli({"check", dir_}), 1);
  EXPECT_THAT(out_.str(), HasSubstr("rank 0: undeclared key 'mismatched_params'"));
  std::filesystem::remove(dir_ + "/rank0.result.json");
  EXPECT_EQ(Cli({"check", dir_}), 1);
  EXPECT_THAT(out_.str(), HasSubstr("rank 0 wrote no"));
}

TEST_F(OfflineCase, ExpectNeedsEveryAxisFixed) {
  EXPECT_EQ(Cli({"expect", "parity/fsdp/mlp", "--dir", dir_}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("fix every axis with --param: optim"));
  EXPECT_FALSE(std::filesystem::exists(dir_));
  EXPECT_EQ(Cli({"expect", "parity/fsdp/mlp", "--dir", dir_, "--param", "optim=sgd", "--world",
                 "99"}),
            2);
  EXPECT_THAT(err_.str(), HasSubstr("runs at worlds 1..8, not 99"));
}

TEST_F(OfflineCase, SchemaPrintsJsonSchemaAndMarkdown) {
  ASSERT_EQ(Cli({"schema", "parity/fsdp/mlp"}), 0);
  const nlohmann::json doc = nlohmann::json::parse(out_.str());
  ASSERT_EQ(doc.size(), 1u);
  EXPECT_EQ(doc[0]["observations"]["additionalProperties"], false);
  EXPECT_TRUE(doc[0]["inputs"].contains("weights"));
  ASSERT_EQ(Cli({"schema", "parity/fsdp/mlp", "--markdown"}), 0);
  EXPECT_THAT(out_.str(), HasSubstr("### `parity/fsdp/mlp`"));
  EXPECT_THAT(out_.str(), HasSubstr("| `grad{k}/{fqn}` |"));
}

}  // namespace
}  // namespace fsdp::conformance
