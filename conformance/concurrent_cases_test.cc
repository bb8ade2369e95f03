// The engine's cases run at once (fsdp-conform run --jobs) share no state: a selection of the
// real families, each case with its own threaded ranks, reports exactly what it reports one
// case at a time. Under ThreadSanitizer (make tsan) this is also the race check between cases.
#include <gtest/gtest.h>

#include <sstream>

#include "conformance/catalog.h"
#include "conformance/cli.h"

namespace fsdp::conformance {
namespace {

nlohmann::json Report(const std::string& jobs) {
  std::ostringstream out, err;
  // FSDP2 and FSDP1 training, state dicts, unshard_params, stream order and collectives (not
  // the barrier, whose checks report timings): the engine's whole surface, several worlds.
  const int code =
      RunCli({"run", "fully_shard_training/train_parity_multi_group", "fully_shard_state_dict/*",
              "fsdp_unshard_params/with_grads_core", "fully_shard_overlap/stream_order",
              "parity/fsdp/double_linear", "collectives/all_*", "collectives/reduce_scatter_tensor",
              "--json", "-", "--jobs", jobs},
             DefaultCatalog(), out, err);
  EXPECT_EQ(code, kExitOk) << err.str();
  nlohmann::json j = nlohmann::json::parse(out.str());
  for (auto& c : j["cases"]) c.erase("seconds");
  return j;
}

TEST(ConcurrentCases, ReportWhatOneCaseAtATimeReports) {
  const nlohmann::json one = Report("1");
  const nlohmann::json three = Report("3");
  EXPECT_GT(one["cases"].size(), 20u);
  EXPECT_EQ(one["summary"], three["summary"]);
  ASSERT_EQ(one["cases"].size(), three["cases"].size());
  for (size_t i = 0; i < one["cases"].size(); ++i) {
    EXPECT_EQ(one["cases"][i], three["cases"][i]) << one["cases"][i]["name"];
  }
}

}  // namespace
}  // namespace fsdp::conformance
