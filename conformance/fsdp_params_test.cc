// The shared FSDP parameters (conformance/fsdp_params.h): the `semantics` parameter, the
// `reshard_after_forward` axis's domain and parsing per profile, the int skip rule, and the
// judges' reshard-after-forward rule against the profiles' definitions.
#include "conformance/fsdp_params.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/core/error.h"

namespace fsdp::conformance {
namespace {

using ::testing::HasSubstr;

const std::string kTorch24 = fsdp2::SemanticsName(fsdp2::Semantics::kTorch2_4);
const std::string kTorch28 = fsdp2::SemanticsName(fsdp2::Semantics::kTorch2_8);

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

CaseParams Case(const std::string& semantics, const std::string& raf) {
  return CaseParams({{kSemanticsParam, semantics}, {"reshard_after_forward", raf}});
}

TEST(SemanticsParam, IsAFixedValueOverTheKnownProfiles) {
  const ParamSpec spec = SemanticsParam();
  EXPECT_EQ(spec.kind, ParamKind::kSize);
  EXPECT_EQ(spec.default_value(), kTorch24);
  for (const std::string& name : fsdp2::SemanticsNames()) EXPECT_EQ(spec.Canonicalize(name), name);
  EXPECT_THAT(ErrorOf([&] { spec.Canonicalize("torch-2.6"); }),
              HasSubstr("parameter 'semantics' takes torch-2.4, torch-2.8 or torch-2.15; got "
                        "'torch-2.6'"));
  EXPECT_NO_THROW(ValidateParamSpecs("f/c", {spec}));
  EXPECT_EQ(SemanticsOf(CaseParams()), fsdp2::kDefaultSemantics);  // not declared
  EXPECT_EQ(SemanticsOf(CaseParams({{kSemanticsParam, kTorch28}})), fsdp2::Semantics::kTorch2_8);
}

TEST(ReshardAfterForwardAxis, RunsTheSeedsValuesAndAcceptsEveryValidValue) {
  const ParamSpec axis = ReshardAfterForwardAxis();
  EXPECT_NO_THROW(ValidateParamSpecs("f/c", {axis}));
  EXPECT_EQ(axis.values, (std::vector<std::string>{"True", "False", "2"}));
  EXPECT_EQ(axis.Canonicalize("true"), "True");
  EXPECT_EQ(axis.Canonicalize("none"), "None");
  EXPECT_EQ(axis.Canonicalize("1"), "1");  // the int 1, not True
  EXPECT_EQ(axis.Canonicalize("08"), "8");
  for (const char* bad : {"0", "-2", "maybe", "2.5"}) {
    EXPECT_THAT(ErrorOf([&] { axis.Canonicalize(bad); }), HasSubstr("it accepts True, False, None"))
        << bad;
  }
}

TEST(ParseReshardAfterForward, NoneOnlyUnderTheLaterProfile) {
  for (fsdp2::Semantics s : {fsdp2::Semantics::kTorch2_4, fsdp2::Semantics::kTorch2_8}) {
    EXPECT_EQ(ParseReshardAfterForward("True", s), fsdp2::ReshardAfterForward(true));
    EXPECT_EQ(ParseReshardAfterForward("False", s), fsdp2::ReshardAfterForward(false));
    EXPECT_EQ(ParseReshardAfterForward("4", s), fsdp2::ReshardAfterForward(4));
  }
  EXPECT_EQ(ParseReshardAfterForward("None", fsdp2::Semantics::kTorch2_8), std::nullopt);
  const std::string err =
      ErrorOf([] { ParseReshardAfterForward("None", fsdp2::Semantics::kTorch2_4); });
  EXPECT_THAT(err, HasSubstr("reshard_after_forward=None is not valid under semantics torch-2.4"));
  EXPECT_THAT(err, HasSubstr("--semantics torch-2.8"));
  EXPECT_THAT(ErrorOf([] { ParseReshardAfterForward("x", fsdp2::Semantics::kTorch2_8); }),
              HasSubstr("got 'x'"));
}

TEST(SkipIntNotAFactor, SkipsNonFactorsAndRejectsNoneUnderTorch24) {
  EXPECT_EQ(SkipIntNotAFactor(Case(kTorch24, "3"), 4),
            "reshard_after_forward=3 is not a factor of world size 4");
  EXPECT_EQ(SkipIntNotAFactor(Case(kTorch24, "8"), 4),
            "reshard_after_forward=8 is not a factor of world size 4");
  for (const char* ok : {"1", "2", "4", "True", "False"}) {
    EXPECT_EQ(SkipIntNotAFactor(Case(kTorch24, ok), 4), std::nullopt) << ok;
  }
  EXPECT_EQ(SkipIntNotAFactor(Case(kTorch28, "None"), 4), std::nullopt);
  EXPECT_THAT(ErrorOf([] { SkipIntNotAFactor(Case(kTorch24, "None"), 4); }),
              HasSubstr("not valid under semantics torch-2.4"));
}

TEST(ReshardsAfterForward, FollowsTheProfiles) {
  // Non-root modules: the value's meaning, the same under both profiles (None only in 2.8).
  for (const std::string& s : {kTorch24, kTorch28}) {
    EXPECT_TRUE(ReshardsAfterForward(Case(s, "True"), false)) << s;
    EXPECT_TRUE(ReshardsAfterForward(Case(s, "2"), false)) << s;
    EXPECT_FALSE(ReshardsAfterForward(Case(s, "False"), false)) << s;
    EXPECT_FALSE(ReshardsAfterForward(Case(s, "1"), false)) << s;  // int 1 means False
  }
  EXPECT_TRUE(ReshardsAfterForward(Case(kTorch28, "None"), false));
  // The root: never under torch-2.4; under torch-2.8 as given, except None.
  for (const char* raf : {"True", "2", "False", "1"}) {
    EXPECT_FALSE(ReshardsAfterForward(Case(kTorch24, raf), true)) << raf;
    EXPECT_EQ(ReshardsAfterForward(Case(kTorch28, raf), true),
              ReshardsAfterForward(Case(kTorch28, raf), false))
        << raf;
  }
  EXPECT_FALSE(ReshardsAfterForward(Case(kTorch28, "None"), true));
  // torch-2.15 has torch-2.8's rule.
  const std::string torch215 = fsdp2::SemanticsName(fsdp2::Semantics::kTorch2_15);
  for (const char* raf : {"True", "2", "False", "1", "None"}) {
    for (const bool is_root : {false, true}) {
      EXPECT_EQ(ReshardsAfterForward(Case(torch215, raf), is_root),
                ReshardsAfterForward(Case(kTorch28, raf), is_root))
          << raf << " root " << is_root;
    }
  }
}

}  // namespace
}  // namespace fsdp::conformance
