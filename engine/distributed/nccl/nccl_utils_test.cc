// Host-side tests of the NCCL backend: they need the NCCL and CUDA runtime libraries but no
// GPU, and run everywhere the build found NCCL. dtype / reduce-op mapping, the PREMUL_SUM
// scalar encoding, CUDA / NCCL error formatting, the unique-id store key and value encoding,
// and the errors NcclProcessGroup::Create and the launcher give without a usable device.
#include "engine/distributed/nccl/nccl_utils.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <string>

#include "engine/core/allocator.h"
#include "engine/distributed/launch.h"
#include "engine/distributed/nccl/nccl_process_group.h"
#include "engine/distributed/store/hash_store.h"

namespace fsdp::distributed {
namespace {

using namespace nccl_internal;  // NOLINT(google-build-using-namespace): the unit under test
using ::testing::HasSubstr;

constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                DType::kBFloat16, DType::kInt64};

TEST(NcclMapping, EveryDTypeMapsToTheNcclTypeOfTheSameKind) {
  const std::map<DType, ncclDataType_t> expected = {{DType::kFloat32, ncclFloat32},
                                                    {DType::kFloat64, ncclFloat64},
                                                    {DType::kFloat16, ncclFloat16},
                                                    {DType::kBFloat16, ncclBfloat16},
                                                    {DType::kInt64, ncclInt64}};
  for (DType dtype : kAllDTypes) {
    EXPECT_EQ(ToNcclDataType(dtype), expected.at(dtype)) << DTypeName(dtype);
  }
}

TEST(NcclMapping, ReduceOpsMapToBuiltInsAndPremulSumNeedsACreatedOp) {
  EXPECT_EQ(ToNcclRedOp(ReduceOp::kSum), ncclSum);
  EXPECT_EQ(ToNcclRedOp(ReduceOp::kAvg), ncclAvg);
  EXPECT_EQ(ToNcclRedOp(ReduceOp::kMin), ncclMin);
  EXPECT_EQ(ToNcclRedOp(ReduceOp::kMax), ncclMax);
  try {
    ToNcclRedOp(ReduceOp::kPremulSum);
    FAIL() << "expected InvalidArgument";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.message(), HasSubstr("ncclRedOpCreatePreMulSum"));
  }
}

TEST(NcclMapping, PremulScalarIsTheFactorInThePayloadDType) {
  // The engine's own double -> dtype conversion is the oracle (ProcessGroupNCCL converts with
  // static_cast<T>(double), i.e. through float for half and bfloat16).
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (double factor : {0.5, -2.0, 0.1, 1.0 / 3.0, 1e-3, 65504.0}) {
      PremulScalar s = EncodePremulScalar(factor, dtype);
      unsigned char expected[8] = {};
      ConvertElements(&factor, DType::kFloat64, expected, dtype, 1);
      EXPECT_EQ(std::memcmp(s.bytes, expected, ElementSize(dtype)), 0)
          << DTypeName(dtype) << " factor " << factor;
      for (size_t i = ElementSize(dtype); i < sizeof(s.bytes); ++i) EXPECT_EQ(s.bytes[i], 0);
    }
  }
  try {
    EncodePremulScalar(2.0, DType::kInt64);
    FAIL() << "expected InvalidArgument";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.message(), HasSubstr("int64"));
  }
}

TEST(NcclErrors, NcclFailuresNameTheCallTheResultAndNcclsText) {
  for (ncclResult_t r : {ncclUnhandledCudaError, ncclSystemError, ncclInternalError,
                         ncclInvalidArgument, ncclInvalidUsage, ncclRemoteError}) {
    const std::string msg = FormatNcclError("ncclAllReduce", r, "");
    EXPECT_THAT(msg, HasSubstr("ncclAllReduce failed: "));
    EXPECT_THAT(msg, HasSubstr(NcclResultName(r)));
    EXPECT_THAT(msg, HasSubstr(ncclGetErrorString(r)));
    EXPECT_THAT(msg, ::testing::Not(HasSubstr("NCCL:")));
  }
  EXPECT_STREQ(NcclResultName(ncclRemoteError), "ncclRemoteError");
  EXPECT_STREQ(NcclResultName(ncclInProgress), "ncclInProgress");
  EXPECT_STREQ(NcclResultName(static_cast<ncclResult_t>(99)), "ncclUnknownResult");
  EXPECT_THAT(FormatNcclError("ncclCommSplit", ncclSystemError, "socket closed"),
              HasSubstr("; NCCL: socket closed"));

  EXPECT_EQ(NcclErrorCode(ncclInvalidArgument), ErrorCode::kInvalidArgument);
  EXPECT_EQ(NcclErrorCode(ncclInvalidUsage), ErrorCode::kInvalidArgument);
  EXPECT_EQ(NcclErrorCode(ncclRemoteError), ErrorCode::kUnavailable);
  EXPECT_EQ(NcclErrorCode(ncclSystemError), ErrorCode::kUnavailable);
  EXPECT_EQ(NcclErrorCode(ncclUnhandledCudaError), ErrorCode::kUnavailable);
  EXPECT_EQ(NcclErrorCode(ncclInternalError), ErrorCode::kInternal);

  try {
    ThrowNcclError(ncclRemoteError, "ncclAllGather", "[_allgather_base_ #3 on group 0]", nullptr);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_THAT(e.message(), HasSubstr("[_allgather_base_ #3 on group 0]: ncclAllGather failed: "
                                       "ncclRemoteError ("));
  }
}

TEST(NcclErrors, CudaFailuresNameTheCallAndCudasText) {
  const std::string msg = FormatCudaError("cudaEventRecord", cudaErrorInvalidResourceHandle);
  EXPECT_THAT(msg, HasSubstr("cudaEventRecord failed: cudaErrorInvalidResourceHandle ("));
  EXPECT_THAT(msg, HasSubstr(cudaGetErrorString(cudaErrorInvalidResourceHandle)));
  EXPECT_EQ(CudaErrorCode(cudaErrorInsufficientDriver), ErrorCode::kUnavailable);
  EXPECT_EQ(CudaErrorCode(cudaErrorNoDevice), ErrorCode::kUnavailable);
  EXPECT_EQ(CudaErrorCode(cudaErrorIllegalAddress), ErrorCode::kInternal);
  // Fails everywhere: an invalid device with a GPU, an insufficient driver without one.
  try {
    FSDP_CUDA_CHECK(cudaSetDevice(-1), "NcclProcessGroup::Create");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_THAT(e.message(), HasSubstr("NcclProcessGroup::Create: cudaSetDevice(-1) failed: cuda"));
  }
}

TEST(NcclUniqueId, StoreKeyNamesPrefixAndGroup) {
  EXPECT_EQ(UniqueIdStoreKey("", "0"), "nccl/pg0/unique_id");
  EXPECT_EQ(UniqueIdStoreKey("job7", "0"), "job7/nccl/pg0/unique_id");
  EXPECT_EQ(UniqueIdStoreKey("job7/", "1.2"), "job7/nccl/pg1.2/unique_id");
}

TEST(NcclUniqueId, HexEncodingRoundTripsEveryByteThroughAStore) {
  std::mt19937 gen(1234);
  std::uniform_int_distribution<int> byte(0, 255);
  ncclUniqueId id;
  std::generate(std::begin(id.internal), std::end(id.internal),
                [&] { return static_cast<char>(byte(gen)); });
  id.internal[0] = 0;  // NUL and 0xff must survive a text store
  id.internal[1] = static_cast<char>(0xff);

  const std::string text = EncodeUniqueId(id);
  EXPECT_EQ(text.size(), 2u * NCCL_UNIQUE_ID_BYTES);
  EXPECT_EQ(text.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(text.substr(0, 4), "00ff");

  auto store = std::make_shared<HashStore>();
  const std::string key = UniqueIdStoreKey("t", "0");
  store->set(key, text);
  const ncclUniqueId back = DecodeUniqueId(store->get(key, std::chrono::seconds(1)), key);
  EXPECT_EQ(std::memcmp(back.internal, id.internal, NCCL_UNIQUE_ID_BYTES), 0);
}

TEST(NcclUniqueId, ARealUniqueIdRoundTrips) {
  // ncclGetUniqueId needs no GPU (it only picks a bootstrap address).
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) GTEST_SKIP() << FormatNcclError("ncclGetUniqueId", r, "");
  const ncclUniqueId back = DecodeUniqueId(EncodeUniqueId(id), "k");
  EXPECT_EQ(std::memcmp(back.internal, id.internal, NCCL_UNIQUE_ID_BYTES), 0);
}

TEST(NcclUniqueId, CorruptValuesAreDataLossNamingTheKey) {
  const std::string good(2 * static_cast<size_t>(NCCL_UNIQUE_ID_BYTES), 'a');
  for (const std::string& bad : {good.substr(1), good + "0", good.substr(2) + "zz"}) {
    try {
      DecodeUniqueId(bad, "run/nccl/pg0/unique_id");
      FAIL() << "expected DataLoss for '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kDataLoss);
      EXPECT_THAT(e.message(), HasSubstr("'run/nccl/pg0/unique_id'"));
    }
  }
}

TEST(NcclProcessGroupCreate, RejectsNonCudaDevicesAndMissingDevices) {
  auto store = std::make_shared<HashStore>();
  try {
    NcclProcessGroup::Create(store, 0, 1, Device::CPU());
    FAIL() << "expected InvalidArgument";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.message(), HasSubstr("device cpu is not a CUDA device"));
  }
  const int visible = CudaDeviceCount();
  try {
    NcclProcessGroup::Create(store, 0, 1, Device::CUDA(visible));
    FAIL() << "expected Unavailable";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_THAT(e.message(), HasSubstr(visible == 0 ? std::string("no CUDA device visible")
                                                    : "cuda:" + std::to_string(visible) +
                                                          " is not visible"));
  }
}

EnvLookup MapEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(NcclLaunch, FsdpBackendSelectsNcclOnTheLocalRanksDevice) {
  const LaunchEnvironment launch = ReadLaunchEnvironment(MapEnv({{"RANK", "3"},
                                                                 {"WORLD_SIZE", "4"},
                                                                 {"LOCAL_RANK", "1"},
                                                                 {"LOCAL_WORLD_SIZE", "2"},
                                                                 {"MASTER_ADDR", "node0"},
                                                                 {"MASTER_PORT", "29500"},
                                                                 {"FSDP_BACKEND", "nccl"}}));
  EXPECT_EQ(launch.backend, "nccl");
  EXPECT_EQ(launch.device(), Device::CUDA(1));
  EXPECT_EQ(launch.str(),
            "rank 3/4 (local 1/2) from torchrun, store tcp://node0:29500, backend nccl");

  const LaunchEnvironment gloo = ReadLaunchEnvironment(MapEnv({}));
  EXPECT_EQ(gloo.backend, "gloo");
  EXPECT_EQ(gloo.device(), Device::CPU());

  try {
    ReadLaunchEnvironment(MapEnv({{"FSDP_BACKEND", "mpi"}}));
    FAIL() << "expected InvalidArgument";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.message(), HasSubstr("FSDP_BACKEND='mpi'"));
  }
}

TEST(NcclLaunch, SessionWithoutADeviceIsUnavailable) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is visible; this checks the error";
  try {
    DistributedSession::FromEnvironment(MapEnv({{"FSDP_BACKEND", "nccl"}}));
    FAIL() << "expected Unavailable";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_THAT(e.message(), HasSubstr("no CUDA device visible"));
  }
}

}  // namespace
}  // namespace fsdp::distributed
