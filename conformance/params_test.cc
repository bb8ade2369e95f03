#include "conformance/params.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/core/error.h"

namespace fsdp::conformance {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<ParamSpec> Specs() {
  return {ParamSpec::Axis("reshard_after_forward", "", {"True", "False", "2"}),
          ParamSpec::Axis("checkpoint_impl", "", {"none", "utils", "composable"}),
          ParamSpec::SizeInt("n_layers", "", 3)};
}

TEST(ParseBool, AcceptsPythonAndCSpellings) {
  for (const char* t : {"true", "True", "TRUE", "1"}) EXPECT_EQ(ParseBool(t), true) << t;
  for (const char* f : {"false", "False", "FALSE", "0"}) EXPECT_EQ(ParseBool(f), false) << f;
  for (const char* bad : {"", "yes", "T", "2", " true"}) EXPECT_FALSE(ParseBool(bad)) << bad;
}

TEST(ParseNumbers, AreStrict) {
  EXPECT_EQ(ParseInt("42"), 42);
  EXPECT_EQ(ParseInt("-3"), -3);
  EXPECT_FALSE(ParseInt("4x"));
  EXPECT_FALSE(ParseInt(""));
  EXPECT_FALSE(ParseInt(" 4"));
  EXPECT_FALSE(ParseInt("99999999999999999999"));
  EXPECT_EQ(ParseDouble("1e-3"), 1e-3);
  EXPECT_FALSE(ParseDouble("nan"));
  EXPECT_FALSE(ParseDouble("1.5.2"));
}

TEST(ParamSpec, AxisCanonicalisesBoolSpellingsButNotDigits) {
  const ParamSpec axis = Specs()[0];
  EXPECT_EQ(axis.Canonicalize("True"), "True");
  EXPECT_EQ(axis.Canonicalize("true"), "True");
  EXPECT_EQ(axis.Canonicalize("FALSE"), "False");
  EXPECT_EQ(axis.Canonicalize("2"), "2");
  const std::string err = ErrorOf([&] { axis.Canonicalize("1"); });
  EXPECT_THAT(err, HasSubstr("reshard_after_forward"));
  EXPECT_THAT(err, HasSubstr("valid values: True, False, 2"));
}

TEST(ParamSpec, SizeValuesAreTyped) {
  const ParamSpec n = ParamSpec::SizeInt("n_layers", "", 2);
  EXPECT_EQ(n.default_value(), "2");
  EXPECT_EQ(n.Canonicalize("5"), "5");
  EXPECT_THAT(ErrorOf([&] { n.Canonicalize("five"); }), HasSubstr("'n_layers' takes an int"));
  const ParamSpec b = ParamSpec::SizeBool("fp16", "", false);
  EXPECT_EQ(b.Canonicalize("1"), "True");
  EXPECT_THAT(ErrorOf([&] { b.Canonicalize("maybe"); }), HasSubstr("takes a bool"));
  const ParamSpec d = ParamSpec::SizeDouble("lr", "", 0.01);
  EXPECT_EQ(d.default_value(), "0.01");
  EXPECT_EQ(ParamSpec::SizeDouble("atol", "", 1e-5).default_value(), "1e-05");
  EXPECT_EQ(ParamSpec::SizeDouble("x", "", 1.0 / 3).default_value(), "0.3333333333333333");
  EXPECT_EQ(d.Canonicalize("1e-3"), "1e-3");
  EXPECT_THAT(ErrorOf([&] { d.Canonicalize("fast"); }), HasSubstr("'lr' takes a finite number"));
  EXPECT_EQ(n.ValuesText(), "an int >= 0, default 2");
  // Int sizes are bounded below (0 by default): a negative count is a usage error naming it.
  EXPECT_THAT(ErrorOf([&] { n.Canonicalize("-3"); }),
              HasSubstr("parameter 'n_layers' takes an int >= 0; got '-3'"));
  const ParamSpec layers = ParamSpec::SizeInt("n_layers", "", 2, /*minimum=*/1);
  EXPECT_THAT(ErrorOf([&] { layers.Canonicalize("0"); }), HasSubstr("takes an int >= 1"));
  const ParamSpec root = ParamSpec::SizeInt("root", "", -1, /*minimum=*/std::nullopt);
  EXPECT_EQ(root.Canonicalize("-2"), "-2");
  EXPECT_EQ(root.ValuesText(), "int, default -1");
  EXPECT_EQ(Specs()[0].ValuesText(), "True|False|2");
}

// A toy domain: the even numbers, spelled without leading zeros.
ParamDomain EvenNumbers() {
  return {"an even int", [](const std::string& v) -> std::optional<std::string> {
            const std::optional<int64_t> n = ParseInt(v);
            if (!n || *n % 2 != 0) return std::nullopt;
            return std::to_string(*n);
          }};
}

TEST(ParamSpec, AxisWithADomainRunsItsValuesAndAcceptsTheDomain) {
  ParamSpec axis = ParamSpec::Axis("k", "", {"2", "4"});
  axis.domain = EvenNumbers();
  EXPECT_EQ(axis.Canonicalize("4"), "4");
  EXPECT_EQ(axis.Canonicalize("006"), "6");  // not listed, in the domain: its spelling
  const std::string err = ErrorOf([&] { axis.Canonicalize("3"); });
  EXPECT_THAT(err, HasSubstr("parameter 'k' has no value '3'; it accepts an even int"));
  EXPECT_THAT(err, HasSubstr("by default it runs 2, 4"));
  EXPECT_EQ(axis.ValuesText(), "2|4 (accepts an even int)");
  const auto cases = ExpandCases("f/c", {axis}, {});
  ASSERT_EQ(cases.size(), 2u);  // unfixed: the listed values only
  EXPECT_EQ(ExpandCases("f/c", {axis}, {{"k", "8"}}).front().GetString("k"), "8");
}

TEST(ParamSpec, SizeWithADomainAcceptsExactlyTheDomain) {
  ParamSpec size = ParamSpec::SizeString("profile", "", "2");
  size.domain = EvenNumbers();
  EXPECT_EQ(size.Canonicalize("10"), "10");
  EXPECT_THAT(ErrorOf([&] { size.Canonicalize("x"); }),
              HasSubstr("parameter 'profile' takes an even int; got 'x' (default 2)"));
  EXPECT_EQ(size.ValuesText(), "an even int, default 2");
}

TEST(ValidateParamSpecs, ListedValuesMustBeInTheirDomain) {
  ParamSpec axis = ParamSpec::Axis("k", "", {"2", "3"});
  axis.domain = EvenNumbers();
  EXPECT_THAT(ErrorOf([&] { ValidateParamSpecs("f/c", {axis}); }),
              HasSubstr("lists '3', which its domain (an even int) does not spell that way"));
  ParamSpec size = ParamSpec::SizeString("s", "", "02");
  size.domain = EvenNumbers();
  EXPECT_THAT(ErrorOf([&] { ValidateParamSpecs("f/c", {size}); }), HasSubstr("lists '02'"));
  axis.values = {"2", "4"};
  EXPECT_NO_THROW(ValidateParamSpecs("f/c", {axis}));
}

TEST(ValidateParamSpecs, RejectsDuplicatesAndBadDefaults) {
  EXPECT_NO_THROW(ValidateParamSpecs("f/c", Specs()));
  auto dup = Specs();
  dup.push_back(ParamSpec::SizeInt("n_layers", "", 1));
  EXPECT_THAT(ErrorOf([&] { ValidateParamSpecs("f/c", dup); }), HasSubstr("declared twice"));
  ParamSpec bad = ParamSpec::SizeInt("n", "", 1);
  bad.values = {"x"};
  EXPECT_THAT(ErrorOf([&] { ValidateParamSpecs("f/c", {bad}); }), HasSubstr("takes an int"));
  EXPECT_THAT(ErrorOf([&] { ValidateParamSpecs("f/c", {ParamSpec::Axis("a", "", {})}); }),
              HasSubstr("lists no values"));
  EXPECT_THAT(ErrorOf([&] { ValidateParamSpecs("f/c", {ParamSpec::Axis("a-b", "", {"1"})}); }),
              HasSubstr("letters, digits"));
  EXPECT_THAT(ErrorOf([&] { ValidateParamSpecs("f/c", {ParamSpec::Axis("a", "", {"1,2"})}); }),
              HasSubstr("neither ','"));
}

TEST(ExpandCases, CartesianProductInDeclarationOrder) {
  const auto cases = ExpandCases("f/c", Specs(), {});
  ASSERT_EQ(cases.size(), 9u);
  EXPECT_EQ(cases[0].GetString("reshard_after_forward"), "True");
  EXPECT_EQ(cases[0].GetString("checkpoint_impl"), "none");
  EXPECT_EQ(cases[1].GetString("checkpoint_impl"), "utils");  // the last axis varies fastest
  EXPECT_EQ(cases[3].GetString("reshard_after_forward"), "False");
  for (const auto& c : cases) EXPECT_EQ(c.GetInt("n_layers"), 3);
}

TEST(ExpandCases, FixedValuesOverride) {
  const auto cases =
      ExpandCases("f/c", Specs(), {{"reshard_after_forward", "false"}, {"n_layers", "7"}});
  ASSERT_EQ(cases.size(), 3u);
  for (const auto& c : cases) {
    EXPECT_EQ(c.GetString("reshard_after_forward"), "False");
    EXPECT_EQ(c.GetInt("n_layers"), 7);
  }
  EXPECT_EQ(ExpandCases("f/c", {}, {}).size(), 1u);  // no parameters: one case
}

TEST(ExpandCases, UnknownKeyAndBadValueNameTheScenario) {
  const std::string unknown = ErrorOf([] { ExpandCases("f/c", Specs(), {{"nlayers", "2"}}); });
  EXPECT_THAT(unknown, HasSubstr("scenario f/c has no parameter 'nlayers'"));
  EXPECT_THAT(unknown, HasSubstr("n_layers (an int >= 0, default 3)"));
  const std::string bad = ErrorOf([] {
    ExpandCases("f/c", Specs(), {{"checkpoint_impl", "full"}});
  });
  EXPECT_THAT(bad, HasSubstr("scenario f/c"));
  EXPECT_THAT(bad, HasSubstr("none, utils, composable"));
}

TEST(CaseParams, TypedGettersAndErrors) {
  CaseParams p({{"a", "True"}, {"n", "4"}, {"x", "0.5"}, {"s", "separate"}});
  EXPECT_TRUE(p.GetBool("a"));
  EXPECT_TRUE(p.IsBool("a"));
  EXPECT_FALSE(p.IsBool("n"));
  EXPECT_EQ(p.GetInt("n"), 4);
  EXPECT_DOUBLE_EQ(p.GetDouble("x"), 0.5);
  EXPECT_EQ(p.GetString("s"), "separate");
  EXPECT_EQ(p.Label(), "a=True,n=4,s=separate,x=0.5");
  EXPECT_THAT(ErrorOf([&] { p.GetInt("s"); }), HasSubstr("'s' = 'separate' is not an int"));
  EXPECT_THAT(ErrorOf([&] { p.GetBool("n"); }), HasSubstr("is not a bool"));
  const std::string missing = ErrorOf([&] { p.GetString("zzz"); });
  EXPECT_THAT(missing, HasSubstr("NotFound"));
  EXPECT_THAT(missing, HasSubstr("parameters: a, n, s, x"));
}

TEST(ParseParamAssignment, SplitsAtTheFirstEquals) {
  EXPECT_EQ(ParseParamAssignment("k=v=w"), (std::pair<std::string, std::string>("k", "v=w")));
  EXPECT_THAT(ErrorOf([] { ParseParamAssignment("novalue"); }), HasSubstr("KEY=VALUE"));
  EXPECT_THAT(ErrorOf([] { ParseParamAssignment("=v"); }), HasSubstr("KEY=VALUE"));
  EXPECT_THAT(ErrorOf([] { ParseParamAssignment("k="); }), HasSubstr("empty value"));
}

}  // namespace
}  // namespace fsdp::conformance
