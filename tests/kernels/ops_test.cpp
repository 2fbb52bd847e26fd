// The operator table (src/ops/aten_ops.def), its schema parser, and the kernel
// registry's agreement check: kernels' C++ parameter types against the schema.
#include "kiln/ops/op_id.h"
#include "kiln/ops/schema.h"
#include "util/register.h"

#include "kiln/passes/op_table.h"
#include "kiln/runtime/kernel.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

using namespace kiln;
using namespace kiln::rt;
using namespace kiln::rt::kernels;
using ops::OpId;
using ops::Type;

namespace {

ops::Schema parse(std::string_view text) {
  ops::Schema s;
  ops::ParseError e;
  EXPECT_TRUE(ops::parse_schema(text, &s, &e)) << text << ": " << e.what << " at " << e.offset;
  return s;
}

// ---------------------------------------------------------------------------
// schema parser

TEST(SchemaParser, GeluOut) {
  ops::Schema s = parse("aten::gelu.out(Tensor self, *, str approximate='none', Tensor(a!) out) -> Tensor(a!)");
  EXPECT_EQ(s.ns, "aten");
  EXPECT_EQ(s.name, "gelu");
  EXPECT_EQ(s.overload, "out");
  ASSERT_EQ(s.num_args, 3);
  EXPECT_EQ(s.num_outs, 1);
  EXPECT_EQ(s.num_inputs(), 2);
  EXPECT_EQ(s.args[0].name, "self");
  EXPECT_EQ(s.args[0].type, Type::Tensor);
  EXPECT_FALSE(s.args[0].kwarg_only);
  EXPECT_EQ(s.args[1].name, "approximate");
  EXPECT_EQ(s.args[1].type, Type::String);
  EXPECT_TRUE(s.args[1].kwarg_only);
  ASSERT_TRUE(s.args[1].has_default);
  EXPECT_EQ(s.args[1].default_value.kind, ops::Default::Kind::String);
  EXPECT_EQ(s.args[1].default_value.s, "none");
  EXPECT_TRUE(s.args[2].is_out);
  EXPECT_FALSE(s.out_is_list);
}

TEST(SchemaParser, TypesAndDefaults) {
  ops::Schema s = parse(
      "aten::f.o(Tensor? a, Tensor[] b, Tensor?[] c, SymInt d=-1, int? e=None, int[1] f=[], SymInt[]? g, "
      "float h=1e-05, bool i=True, Scalar j=1, Scalar? k=None, ScalarType? l=None, str? m, MemoryFormat? n=None, "
      "*, Tensor(a!) out) -> Tensor(a!)");
  ASSERT_EQ(s.num_args, 15);
  const Type want[] = {Type::OptionalTensor, Type::TensorList, Type::OptionalTensorList, Type::Int, Type::OptionalInt,
                       Type::IntList, Type::OptionalIntList, Type::Float, Type::Bool, Type::Scalar,
                       Type::OptionalScalar, Type::OptionalScalarType, Type::OptionalString,
                       Type::OptionalMemoryFormat, Type::Tensor};
  for (int i = 0; i < 15; ++i) EXPECT_EQ(s.args[i].type, want[i]) << i;
  EXPECT_EQ(s.args[3].default_value.kind, ops::Default::Kind::Int);
  EXPECT_EQ(s.args[3].default_value.i, -1);
  EXPECT_EQ(s.args[4].default_value.kind, ops::Default::Kind::None);
  EXPECT_EQ(s.args[5].default_value.kind, ops::Default::Kind::IntList);
  EXPECT_EQ(s.args[5].default_value.list_size, 0);
  EXPECT_FALSE(s.args[6].has_default);
  EXPECT_TRUE(ops::is_optional(s.args[6].type));
  EXPECT_EQ(s.args[7].default_value.kind, ops::Default::Kind::Float);
  EXPECT_DOUBLE_EQ(s.args[7].default_value.d, 1e-05);
  EXPECT_TRUE(s.args[8].default_value.b);
  EXPECT_EQ(s.args[9].default_value.i, 1);
}

TEST(SchemaParser, SeveralOutsAndListOut) {
  ops::Schema ln = parse(
      "aten::native_layer_norm.out(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps, "
      "*, Tensor(a!) out0, Tensor(b!) out1, Tensor(c!) out2) -> (Tensor(a!), Tensor(b!), Tensor(c!))");
  EXPECT_EQ(ln.num_args, 8);
  EXPECT_EQ(ln.num_outs, 3);
  ops::Schema sp = parse(
      "aten::split_with_sizes_copy.out(Tensor self, SymInt[] split_sizes, int dim=0, *, Tensor(a!)[] out) -> ()");
  EXPECT_EQ(sp.num_outs, 1);
  EXPECT_TRUE(sp.out_is_list);
  ops::Schema lst = parse("aten::x.out(Tensor self, int[2] k=[3, -4], *, Tensor(a!) out) -> Tensor(a!)");
  ASSERT_EQ(lst.args[1].default_value.list_size, 2);
  EXPECT_EQ(lst.args[1].default_value.list[0], 3);
  EXPECT_EQ(lst.args[1].default_value.list[1], -4);
}

TEST(SchemaParser, Rejects) {
  const char* bad[] = {
      "gelu.out(Tensor self) -> Tensor",                                  // no namespace
      "aten::gelu.out(Tensr self, *, Tensor(a!) out) -> Tensor(a!)",      // unknown type
      "aten::gelu.out(Tensor self, *, str a='none, Tensor(a!) out) -> Tensor(a!)",  // unterminated string
      "aten::f.out(Tensor(a!) out, Tensor self) -> Tensor(a!)",           // input after out
      "aten::f.out(Tensor self, *, Tensor(a!) out)",                      // no returns
      "aten::f.out(Tensor self Tensor(a!) out) -> Tensor(a!)",            // missing comma
      "aten::f.out(Tensor self, int x=foo, *, Tensor(a!) out) -> Tensor(a!)",  // bad default
      "aten::f.out(Tensor self, *, int(a!) out) -> Tensor(a!)",           // out not a tensor
      "aten::f.out(Tensor self, *, Tensor(a!)[] out, Tensor(b!) o2) -> ()",    // list out not alone
  };
  for (const char* text : bad) {
    ops::Schema s;
    ops::ParseError e;
    EXPECT_FALSE(ops::parse_schema(text, &s, &e)) << text;
    EXPECT_STRNE(e.what, "") << text;
  }
}

// ---------------------------------------------------------------------------
// the operator table

TEST(OpTable, EveryLineParsesAndNamesAreUnique) {
  OpId bad{};
  const char* why = ops::check_op_table(&bad);
  EXPECT_EQ(why, nullptr) << ops::op_info(bad).id << ": " << why;
  ASSERT_EQ(ops::kNumOps, std::size(ops::kOps));
  for (size_t i = 0; i < ops::kNumOps; ++i) {
    const auto id = static_cast<OpId>(i);
    const ops::Schema& s = ops::op_schema(id);
    // the name the lookup uses is the schema's own, and finds the same row
    std::string qualified = std::string(s.ns) + "::" + std::string(s.name);
    EXPECT_EQ(ops::op_name(id), s.overload.empty() ? qualified : qualified + "." + std::string(s.overload));
    EXPECT_TRUE(!s.overload.empty() || s.inplace) << qualified << ": only in-place forms have no overload name";
    auto found = ops::find_op(qualified, s.overload);
    ASSERT_TRUE(found.has_value()) << qualified;
    EXPECT_EQ(*found, id);
    // the schema text starts with the name: the row is an out variant
    EXPECT_TRUE(ops::op_info(id).schema.starts_with(ops::op_name(id))) << ops::op_info(id).schema;
  }
  EXPECT_FALSE(ops::find_op("aten::gelu", "default").has_value());
  EXPECT_FALSE(ops::find_op("aten::no_such_op", "out").has_value());
}

TEST(OpTable, InPlaceFormsWriteTheirSelf) {
  // aten::index_put_: self is Tensor(a!) and read; no out arguments; the compiler appends only the return slot
  ops::Schema s;
  ASSERT_TRUE(ops::parse_schema(
      "aten::index_put_(Tensor(a!) self, Tensor?[] indices, Tensor values, bool accumulate=False) -> Tensor(a!)", &s,
      nullptr));
  EXPECT_TRUE(s.inplace);
  EXPECT_EQ(s.num_outs, 0);
  EXPECT_EQ(s.num_inputs(), 4);
  EXPECT_TRUE(s.args[0].is_out);
  // a mutable first argument of an op whose name does not end in '_' is still an out-first schema error
  EXPECT_FALSE(ops::parse_schema("aten::foo.out(Tensor(a!) out, Tensor self) -> Tensor(a!)", &s, nullptr));
  const passes::OpSchema* ip = passes::find_op_schema("aten.index_put_.default");
  ASSERT_NE(ip, nullptr);
  EXPECT_TRUE(ip->inplace);
  EXPECT_EQ(ip->kernel, "aten::index_put_");
  EXPECT_EQ(ip->overload, "");
  EXPECT_EQ(ip->args.size(), 4u);
}

TEST(OpTable, PassesTableIsDerivedFromIt) {
  // the compiler's view of a few ops, against their ATen schemas
  const passes::OpSchema* gelu = passes::find_op_schema("aten.gelu.default");
  ASSERT_NE(gelu, nullptr);
  EXPECT_EQ(gelu->kernel, "aten::gelu");
  EXPECT_EQ(gelu->overload, "out");
  ASSERT_EQ(gelu->args.size(), 2u);
  EXPECT_EQ(gelu->args[1].name, "approximate");
  EXPECT_EQ(gelu->args[1].type, passes::ArgType::String);
  ASSERT_TRUE(gelu->args[1].has_default);
  EXPECT_EQ(std::get<std::string_view>(gelu->args[1].default_value), "none");
  EXPECT_EQ(static_cast<OpId>(gelu->op), OpId::gelu_out);

  const passes::OpSchema* add = passes::find_op_schema("aten.add.Tensor");
  ASSERT_NE(add, nullptr);
  ASSERT_EQ(add->args.size(), 3u);
  EXPECT_EQ(add->args[2].name, "alpha");
  EXPECT_EQ(add->args[2].type, passes::ArgType::Scalar);
  EXPECT_EQ(std::get<int64_t>(add->args[2].default_value), 1);

  const passes::OpSchema* ln = passes::find_op_schema("aten.native_layer_norm.default");
  ASSERT_NE(ln, nullptr);
  EXPECT_EQ(ln->num_outs, 3);
  EXPECT_EQ(ln->args[2].type, passes::ArgType::OptionalTensor);
  EXPECT_TRUE(ln->args[2].has_default);  // an optional without a default defaults to None

  const passes::OpSchema* split = passes::find_op_schema("aten.split_with_sizes_copy.default");
  ASSERT_NE(split, nullptr);
  EXPECT_TRUE(split->out_is_list);

  EXPECT_TRUE(passes::is_view_like("aten.view_copy.default"));
  EXPECT_FALSE(passes::is_view_like("aten.gelu.default"));
  // every emitted target is a table row with a kernel
  for (const auto& s : passes::op_schemas()) {
    EXPECT_EQ(ops::op_info(static_cast<OpId>(s.op)).target, s.target);
    EXPECT_NE(find_kernel(s.kernel, s.overload), nullptr) << s.target;
  }
}

// ---------------------------------------------------------------------------
// registry / schema agreement

void good_gelu(KernelContext&, const Tensor&, std::string_view, Tensor&) {}
void gelu_int_approximate(KernelContext&, const Tensor&, int64_t, Tensor&) {}
void gelu_too_few(KernelContext&, const Tensor&, Tensor&) {}
void gelu_const_out(KernelContext&, const Tensor&, std::string_view, const Tensor&) {}
void gelu_mutable_input(KernelContext&, Tensor&, std::string_view, Tensor&) {}
void clamp_plain_scalars(KernelContext&, const Tensor&, Scalar, Scalar, Tensor&) {}
void clamp_ok(KernelContext&, const Tensor&, std::optional<Scalar>, std::optional<Scalar>, Tensor&) {}

std::string check(const KernelEntry& e) {
  char msg[256];
  return check_kernel_entry(e, msg, sizeof(msg));
}

TEST(KernelRegistry, RealRegistryAgreesWithTheTable) {
  auto entries = registered_kernels();
  ASSERT_EQ(entries.size(), ops::kNumOps);
  for (size_t i = 0; i < entries.size(); ++i) {
    ASSERT_NE(entries[i], nullptr);
    EXPECT_EQ(entries[i]->op, i);
    EXPECT_EQ(check(*entries[i]), "") << kernel_name(*entries[i]);
    const ops::Schema& s = ops::op_schema(static_cast<OpId>(i));
    std::string base = std::string(s.ns) + "::" + std::string(s.name);
    EXPECT_NE(find_kernel(base, s.overload), nullptr) << base;
  }
  char msg[256];
  EXPECT_STREQ(check_kernel_coverage(entries, msg, sizeof(msg)), "");
}

TEST(KernelRegistry, RejectsMismatchedRegistrations) {
  EXPECT_EQ(check(boxing::typed_entry<OpId::gelu_out, &good_gelu>()), "");
  EXPECT_EQ(check(boxing::typed_entry<OpId::clamp_out, &clamp_ok>()), "");

  std::string why = check(boxing::typed_entry<OpId::gelu_out, &gelu_int_approximate>());
  EXPECT_NE(why.find("aten::gelu.out"), std::string::npos) << why;
  EXPECT_NE(why.find("approximate"), std::string::npos) << why;
  EXPECT_NE(why.find("str"), std::string::npos) << why;

  why = check(boxing::typed_entry<OpId::gelu_out, &gelu_too_few>());
  EXPECT_NE(why.find("takes 2 arguments"), std::string::npos) << why;

  why = check(boxing::typed_entry<OpId::gelu_out, &gelu_const_out>());
  EXPECT_NE(why.find("out tensor"), std::string::npos) << why;

  why = check(boxing::typed_entry<OpId::gelu_out, &gelu_mutable_input>());
  EXPECT_NE(why.find("mutable"), std::string::npos) << why;

  why = check(boxing::typed_entry<OpId::clamp_out, &clamp_plain_scalars>());
  EXPECT_NE(why.find("Scalar?"), std::string::npos) << why;

  // registered under the wrong operator: the schema of that one decides
  why = check(boxing::typed_entry<OpId::relu_out, &good_gelu>());
  EXPECT_NE(why.find("aten::relu.out"), std::string::npos) << why;
}

TEST(KernelRegistry, CoverageNamesTheMissingOp) {
  std::vector<const KernelEntry*> entries(registered_kernels().begin(), registered_kernels().end());
  entries.erase(entries.begin() + static_cast<long>(OpId::gelu_out));
  char msg[256];
  std::string why = check_kernel_coverage(entries, msg, sizeof(msg));
  EXPECT_NE(why.find("aten::gelu.out"), std::string::npos) << why;
  EXPECT_NE(why.find("aten.gelu.default"), std::string::npos) << why;
}

// ---------------------------------------------------------------------------
// boxing: tags are checked before the kernel runs; good arguments reach it typed

struct Seen {
  int calls = 0;
  std::string approximate;
  float first = 0;
} seen;

void recording_gelu(KernelContext&, const Tensor& self, std::string_view approximate, Tensor& out) {
  ++seen.calls;
  seen.approximate = std::string(approximate);
  seen.first = self.data_as<const float>()[0];
  out.data_as<float>()[0] = 42.0f;
}

TEST(KernelBoxing, ChecksTagsThenCallsTyped) {
  const KernelEntry e = boxing::typed_entry<OpId::gelu_out, &recording_gelu>();
  float in_data[2] = {3.5f, 1.0f}, out_data[2] = {0, 0};
  Tensor in, out;
  const int64_t shape[] = {2};
  ASSERT_EQ(make_contiguous_tensor(in, ScalarType::Float, shape, in_data, sizeof(in_data)), Status::Ok);
  ASSERT_EQ(make_contiguous_tensor(out, ScalarType::Float, shape, out_data, sizeof(out_data)), Status::Ok);
  EValue t_in = EValue::from_tensor(&in), t_out = EValue::from_tensor(&out);
  EValue s;
  s.tag = EValue::Tag::String;
  s.str = "tanh";
  EValue i = EValue::from_int(3);

  KernelContext ctx;
  EValue* good[] = {&t_in, &s, &t_out};
  e.fn(ctx, std::span<EValue*>(good));
  ASSERT_TRUE(ctx.ok()) << ctx.message();
  EXPECT_EQ(seen.calls, 1);
  EXPECT_EQ(seen.approximate, "tanh");
  EXPECT_EQ(seen.first, 3.5f);
  EXPECT_EQ(out_data[0], 42.0f);

  struct Case {
    std::vector<EValue*> args;
    const char* want;
  } cases[] = {
      {{&t_in, &i, &t_out}, "argument 1 (approximate) must be a string"},
      {{&i, &s, &t_out}, "argument 0 (self) must be a tensor"},
      {{&t_in, &s}, "expected 3 arguments, got 2"},
      {{&t_in, &s, nullptr}, "argument 2 is missing"},
  };
  for (auto& c : cases) {
    KernelContext bad;
    e.fn(bad, c.args);
    EXPECT_EQ(bad.status(), Status::InvalidArgument);
    EXPECT_NE(std::string(bad.message()).find(c.want), std::string::npos) << bad.message();
  }
  EXPECT_EQ(seen.calls, 1);  // never reached with bad arguments

  // a tensor of a dtype the kernels do not know is refused before the call
  Tensor odd = in;
  odd.dtype = static_cast<ScalarType>(100);
  EValue t_odd = EValue::from_tensor(&odd);
  EValue* odd_args[] = {&t_odd, &s, &t_out};
  KernelContext c2;
  e.fn(c2, std::span<EValue*>(odd_args));
  EXPECT_FALSE(c2.ok());
  EXPECT_EQ(seen.calls, 1);
}

}  // namespace
