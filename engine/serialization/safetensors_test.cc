// Safetensors reading and writing: round trips of every engine dtype, the byte layout of the
// specification, and every malformed-file class refused with DataLoss naming the file.
#include "engine/serialization/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/core/bitwise_equal.h"
#include "engine/core/error.h"
#include "engine/serialization/atomic_file.h"
#include "engine/testing/safetensors_python.h"

namespace fsdp::serialization {
namespace {

std::string Header(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  return bytes.substr(8, n);
}

// A file made by hand: `header` JSON text and `buffer` bytes.
std::string Handmade(const std::string& header, const std::string& buffer) {
  std::string out;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + header + buffer;
}

void ExpectDataLoss(const std::string& bytes, const std::string& needle) {
  try {
    DecodeSafetensors(bytes, "x.safetensors");
    FAIL() << "accepted a malformed file (expected '" << needle << "')";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDataLoss) << e.what();
    EXPECT_NE(e.message().find("x.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(e.message().find(needle), std::string::npos) << e.what();
  }
}

TEST(Safetensors, EveryEngineDTypeRoundTripsBitExact) {
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"a.weight", Tensor::from_doubles({1.5, -2.25, 3.0, 1e-3, 7, 8}, {2, 3}, DType::kFloat32)},
      {"b", Tensor::from_doubles({0.1, -1e300}, {2}, DType::kFloat64)},
      {"c", Tensor::from_doubles({0.5, 65504, -0.0}, {3}, DType::kFloat16)},
      {"d", Tensor::from_doubles({1.0, -3.0e38}, {1, 2}, DType::kBFloat16)},
      {"ids", Tensor::from_int64s({-1, 1LL << 60, 3}, {3})},
      {"scalar", Tensor::from_doubles({42}, {}, DType::kFloat32)},
      {"empty", Tensor::empty({0, 4}, DType::kFloat32)},
  };
  const std::string bytes = EncodeSafetensors(tensors, {{"format", "pt"}});
  EXPECT_EQ((8 + Header(bytes).size()) % 8, 0u) << "buffer must start 8-aligned";
  const SafetensorsFile file = DecodeSafetensors(bytes, "mem");
  EXPECT_EQ(file.metadata.at("format"), "pt");
  ASSERT_EQ(file.entries.size(), tensors.size());
  const auto back = file.Tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(back[i].first, tensors[i].first);
    EXPECT_EQ(back[i].second.dtype(), tensors[i].second.dtype());
    EXPECT_EQ(back[i].second.sizes(), tensors[i].second.sizes());
    ASSERT_EQ(back[i].second.nbytes(), tensors[i].second.nbytes());
    EXPECT_TRUE(BitwiseEqual(back[i].second, tensors[i].second)) << tensors[i].first;
  }
}

TEST(Safetensors, HeaderFollowsTheSpecification) {
  const std::string bytes =
      EncodeSafetensors({{"w", Tensor::from_doubles({1, 2}, {2}, DType::kFloat32)},
                         {"v", Tensor::from_doubles({3}, {1}, DType::kFloat64)}});
  const auto header = nlohmann::json::parse(Header(bytes));
  EXPECT_EQ(header["w"]["dtype"], "F32");
  EXPECT_EQ(header["w"]["shape"], nlohmann::json::array({2}));
  EXPECT_EQ(header["w"]["data_offsets"], nlohmann::json::array({0, 8}));
  EXPECT_EQ(header["v"]["dtype"], "F64");
  EXPECT_EQ(header["v"]["data_offsets"], nlohmann::json::array({8, 16}));
  EXPECT_FALSE(header.contains("__metadata__"));
  // Little-endian elements: 1.0f is 00 00 80 3f.
  const std::string buffer = bytes.substr(8 + Header(bytes).size());
  EXPECT_EQ(static_cast<unsigned char>(buffer[3]), 0x3f);
  EXPECT_EQ(static_cast<unsigned char>(buffer[2]), 0x80);
}

TEST(Safetensors, ReadsAFileWrittenInAnotherOrderWithOtherDTypes) {
  // Tensors stored out of header order, and a dtype the engine has no tensors of (I32).
  const std::string buffer(4 + 8, '\0');
  const std::string bytes = Handmade(
      R"({"late":{"dtype":"I32","shape":[1],"data_offsets":[8,12]},)"
      R"("early":{"dtype":"F64","shape":[],"data_offsets":[0,8]}})",
      buffer);
  const SafetensorsFile file = DecodeSafetensors(bytes, "mem");
  ASSERT_EQ(file.entries.size(), 2u);
  EXPECT_EQ(file.entries[0].name, "early");
  EXPECT_EQ(file.entries[1].name, "late");
  EXPECT_NE(file.Find("late"), nullptr);
  try {
    file.Find("late")->ToTensor();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(e.message().find("'late'"), std::string::npos);
    EXPECT_NE(e.message().find("I32"), std::string::npos);
  }
}

TEST(Safetensors, MalformedFilesAreDataLossNamingFileAndTensor) {
  const std::string good =
      EncodeSafetensors({{"w", Tensor::from_doubles({1, 2, 3}, {3}, DType::kFloat32)}});
  ExpectDataLoss(good.substr(0, 5), "shorter than the 8-byte header length");
  ExpectDataLoss(good.substr(0, good.size() - 1), "truncated");
  ExpectDataLoss(good + "x", "trailing bytes");
  ExpectDataLoss(Handmade("[1]", ""), "does not start with '{'");
  ExpectDataLoss(Handmade("{\"w\":", ""), "not valid JSON");
  ExpectDataLoss(Handmade(R"({"w":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", "abcd"),
                 "unknown dtype 'F33'");
  ExpectDataLoss(Handmade(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "abcd"),
                 "tensor 'w'");
  ExpectDataLoss(Handmade(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "abcd"),
                 "non-negative");
  ExpectDataLoss(Handmade(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],)"
                          R"("data_offsets":[0,4]}})",
                          "abcd"),
                 "tensor 'w'");
  ExpectDataLoss(Handmade(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                          "abcd"),
                 "overlaps");
  ExpectDataLoss(Handmade(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", "abcdefgh"),
                 "gap");
  ExpectDataLoss(Handmade(R"({"a":{"dtype":"F32","shape":[1]}})", "abcd"), "data_offsets");
  ExpectDataLoss(Handmade(R"({"__metadata__":{"k":1}})", ""), "not a string");
  std::string huge(8, '\0');
  huge[7] = 0x7f;  // a header length near 2^63
  ExpectDataLoss(huge, "exceeds the limit");
}

TEST(Safetensors, EncodingRefusesBadNames) {
  const Tensor t = Tensor::zeros({1});
  EXPECT_THROW(EncodeSafetensors({{"", t}}), Error);
  EXPECT_THROW(EncodeSafetensors({{"__metadata__", t}}), Error);
  EXPECT_THROW(EncodeSafetensors({{"a", t}, {"a", t}}), Error);
}

class SafetensorsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("safetensors_test." + std::to_string(::getpid()) + "." +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(SafetensorsFileTest, SaveReplacesAtomicallyAndLoadReadsBack) {
  const std::string path = (dir_ / "m.safetensors").string();
  SaveSafetensors(path, {{"w", Tensor::from_doubles({1, 2}, {2})}});
  SaveSafetensors(path, {{"w", Tensor::from_doubles({3, 4, 5}, {3})}});
  const SafetensorsFile file = LoadSafetensors(path);
  ASSERT_EQ(file.entries.size(), 1u);
  EXPECT_EQ(file.entries[0].shape, std::vector<int64_t>({3}));
  // Only the file itself is left: no temporary files.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST_F(SafetensorsFileTest, LoadNamesMissingAndNonRegularFiles) {
  try {
    LoadSafetensors((dir_ / "absent.safetensors").string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(e.message().find("absent.safetensors"), std::string::npos);
  }
  try {
    LoadSafetensors(dir_.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(e.message().find("not a regular file"), std::string::npos);
  }
}

TEST_F(SafetensorsFileTest, AFailedWriteLeavesThePreviousFile) {
  const std::string path = (dir_ / "keep.safetensors").string();
  SaveSafetensors(path, {{"w", Tensor::from_doubles({1}, {1})}});
  // A directory where the temporary file would go cannot be written: the target is intact.
  EXPECT_THROW(WriteFileAtomically((dir_ / "no-such-dir" / "x").string(), "data"), Error);
  EXPECT_EQ(LoadSafetensors(path).entries.size(), 1u);
}

// The reference implementation (the `safetensors` Python package, numpy API) reads what this
// code writes and writes what it reads. Python comes from $FSDP_PYTHON, else python3 on PATH.
TEST_F(SafetensorsFileTest, TheReferencePythonPackageReadsAndWritesTheSameFiles) {
  std::string why_not;
  const std::optional<std::string> found = testing::PythonWithSafetensors(&why_not);
  if (!found) GTEST_SKIP() << why_not;
  const std::string& python = *found;
  const std::string ours = (dir_ / "ours.safetensors").string();
  const std::string theirs = (dir_ / "theirs.safetensors").string();
  SaveSafetensors(ours,
                  {{"w", Tensor::from_doubles({1.5, -2.25, 3, 4, 5, 6}, {2, 3}, DType::kFloat32)},
                   {"d", Tensor::from_doubles({0.1, -1e300}, {2}, DType::kFloat64)},
                   {"h", Tensor::from_doubles({0.5, 65504}, {2}, DType::kFloat16)},
                   {"i", Tensor::from_int64s({-1, 1LL << 60}, {2})}},
                  {{"format", "pt"}});
  const std::string script = dir_.string() + "/check.py";
  std::ofstream(script) << R"(import sys, numpy as np
from safetensors.numpy import load_file, save_file
t = load_file(sys.argv[1])
assert t["w"].dtype == np.float32 and t["w"].shape == (2, 3) and t["w"][0, 1] == -2.25, t["w"]
assert t["d"].dtype == np.float64 and t["d"][1] == -1e300
assert t["h"].dtype == np.float16 and t["h"][1] == 65504
assert t["i"].dtype == np.int64 and t["i"][1] == 1 << 60
save_file({"z": np.arange(6, dtype=np.float64).reshape(3, 2), "a": np.array([7], dtype=np.int64)},
          sys.argv[2], metadata={"format": "np"})
)";
  ASSERT_EQ(std::system((python + " " + script + " " + ours + " " + theirs).c_str()), 0)
      << "the Python package rejected or misread " << ours;
  const SafetensorsFile file = LoadSafetensors(theirs);
  EXPECT_EQ(file.metadata.at("format"), "np");
  const Tensor z = file.Find("z")->ToTensor();
  EXPECT_EQ(z.sizes(), std::vector<int64_t>({3, 2}));
  EXPECT_EQ(z.to_doubles(), std::vector<double>({0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(file.Find("a")->ToTensor().to_int64s(), std::vector<int64_t>({7}));
}

}  // namespace
}  // namespace fsdp::serialization
