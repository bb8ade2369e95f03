#include "engine/nn/value.h"

#include <gtest/gtest.h>

namespace fsdp::nn {
namespace {

Tensor T(double v) { return Tensor::from_doubles({v}, {1}); }

TEST(ModuleValue, LeavesAndKinds) {
  EXPECT_TRUE(Value().is_none());
  EXPECT_TRUE(Value(Tensor()).is_none());
  Tensor t = T(1);
  Value v(t);
  EXPECT_TRUE(v.is_tensor());
  EXPECT_TRUE(v.tensor().is_same(t));
  EXPECT_EQ(Value::Int(3).to_int(), 3);
  EXPECT_EQ(Value::Int(3).to_double(), 3.0);
  EXPECT_EQ(Value::Double(2.5).to_double(), 2.5);
  EXPECT_TRUE(Value::Bool(true).to_bool());
  EXPECT_EQ(Value::String("x").to_string(), "x");
  EXPECT_THROW(Value::Int(1).tensor(), Error);
  EXPECT_THROW(Value().size(), Error);
  EXPECT_EQ(Value::Tuple({Value::Int(1)}).str(), "(1,)");
  EXPECT_EQ(Value::Double(2).str(), "2.0");
  EXPECT_EQ(Value::NamedTuple("NT", {"a", "b"}, {Value::Int(1), Value()}).str(), "NT(a=1, b=None)");
  EXPECT_EQ(Value::Dict({{"k", Value::Bool(true)}}).str(), "{'k': True}");
  EXPECT_THROW(Value::Dict({{"k", Value()}, {"k", Value()}}), Error);
  EXPECT_THROW(Value::NamedTuple("NT", {"a"}, {}), Error);
}

TEST(ModuleValue, FlattenAndRebuildRoundTrip) {
  Tensor a = T(1), b = T(2), c = T(3), d = T(4);
  Value tree = Value::Dict({
      {"z", Value::List({a, Value::Int(7), Value::Tuple({b})})},
      {"a", Value::NamedTuple("Out", {"x", "y", "s"}, {c, Value(), Value::String("s")})},
      {"m", d},
  });
  std::vector<Tensor> leaves = tree.tensors();
  ASSERT_EQ(leaves.size(), 4u);
  EXPECT_EQ(tree.num_tensors(), 4u);
  // Insertion order of dict keys, depth first (torch.utils._pytree order).
  EXPECT_TRUE(leaves[0].is_same(a));
  EXPECT_TRUE(leaves[1].is_same(b));
  EXPECT_TRUE(leaves[2].is_same(c));
  EXPECT_TRUE(leaves[3].is_same(d));

  std::vector<Tensor> replaced = {T(10), T(20), T(30), T(40)};
  Value rebuilt = tree.with_tensors(replaced);
  EXPECT_TRUE(rebuilt.same_structure(tree));
  EXPECT_EQ(rebuilt.keys(), (std::vector<std::string>{"z", "a", "m"}));
  EXPECT_TRUE(rebuilt.at("z")[2][0].tensor().is_same(replaced[1]));
  EXPECT_EQ(rebuilt.at("z")[1].to_int(), 7);
  EXPECT_EQ(rebuilt.at("a").named_tuple_type(), "Out");
  EXPECT_TRUE(rebuilt.at("a").at("x").tensor().is_same(replaced[2]));
  EXPECT_TRUE(rebuilt.at("a").at("y").is_none());
  EXPECT_TRUE(rebuilt.at("m").tensor().is_same(replaced[3]));
  // The original is untouched.
  EXPECT_TRUE(tree.at("m").tensor().is_same(d));
  EXPECT_THROW(tree.with_tensors({a}), Error);

  Value doubled =
      tree.map_tensors([](const Tensor& t) { return Tensor::full(t.sizes(), t.item() * 2); });
  EXPECT_EQ(doubled.tensors()[3].item(), 8.0);
  EXPECT_FALSE(tree.same_structure(Value::List({a})));
  EXPECT_FALSE(Value::Int(1).same_structure(Value::Int(2)));
}

}  // namespace
}  // namespace fsdp::nn
