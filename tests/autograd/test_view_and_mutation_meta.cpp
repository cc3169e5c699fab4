// collect_metadata: what the analysis says about inputs and outputs, for
// functions whose eager behaviour shows the answer.
#include <crucible/autograd/collect_metadata.h>
#include <crucible/autograd/error.h>

#include <ATen/ATen.h>

#include "catch.h"
#include "testing.h"

using namespace crucible;
using autograd::OutputType;
using Tensors = std::vector<at::Tensor>;

namespace {

autograd::ViewAndMutationMeta analyze(tracer::TensorFn fn, const Tensors& args, bool is_train) {
  autograd::AotRequest request;
  request.flat_fn = std::move(fn);
  request.trace = [](const tracer::TensorFn& body, const Tensors& a, const tracer::TraceOptions& o) {
    return tracer::make_fx(body, a, o);
  };
  request.flat_args = args;
  request.compile_id = "test";
  return autograd::collect_metadata(request, is_train);
}

}  // namespace

TEST_CASE("collect_metadata: input data and metadata writes, and writes under no_grad", "[autograd][meta]") {
  const auto leaf = at::randn({2, 3}).requires_grad_();
  const auto nonleaf = leaf * 2;  // requires grad, has history: eager may write it
  const auto param = at::randn({3}).requires_grad_();
  const Tensors args{at::randn({2, 3}), at::randn({2, 3}), nonleaf, param, at::randn({4})};
  const Tensors before{args[0].clone(), args[1].clone(), args[2].detach().clone(), param.detach().clone(),
                       args[4].clone()};
  auto meta = analyze(
      [](const Tensors& in) {
        in[0].add_(1);
        in[1].transpose_(0, 1);
        in[2].mul_(3);
        {
          at::NoGradGuard no_grad;
          in[3].sub_(0.5);  // an optimizer-style update of a leaf
        }
        return Tensors{in[4] * 2};
      },
      args, /*is_train=*/true);
  REQUIRE(meta.input_info.size() == 5);
  REQUIRE(meta.input_info[0].mutates_data);
  REQUIRE_FALSE(meta.input_info[0].mutates_metadata);
  REQUIRE(meta.input_info[1].mutates_metadata);
  REQUIRE_FALSE(meta.input_info[1].mutates_data);
  const at::Tensor transposed = args[1].detach().clone().transpose_(0, 1);  // what eager leaves
  REQUIRE(meta.input_info[1].final_sizes == transposed.sizes().vec());
  REQUIRE(meta.input_info[1].final_strides == transposed.strides().vec());
  REQUIRE(meta.input_info[2].mutates_data);
  REQUIRE_FALSE(meta.input_info[2].is_leaf);
  REQUIRE_FALSE(meta.input_info[2].mutations_under_no_grad);  // autograd recorded the mul_
  REQUIRE(meta.input_info[3].mutates_data);
  REQUIRE(meta.input_info[3].mutations_under_no_grad);
  REQUIRE_FALSE(meta.input_info[4].mutates_data);
  REQUIRE(meta.mutated_inp_runtime_indices() == std::vector<size_t>{0, 1, 2, 3});
  REQUIRE(meta.mutated_data_inputs() == std::vector<size_t>{0, 2, 3});
  // The analysis ran on copies.
  for (size_t i = 0; i < args.size(); ++i) REQUIRE_EQUAL_TENSORS(args[i].detach(), before[i]);
  REQUIRE(args[1].sizes() == at::IntArrayRef({2, 3}));
}

TEST_CASE("collect_metadata: outputs that are inputs, views of inputs, of intermediates, of outputs",
          "[autograd][meta]") {
  const Tensors args{at::randn({4, 3}).requires_grad_(), at::randn({4, 3}).requires_grad_()};
  auto meta = analyze(
      [](const Tensors& in) {
        const auto h = in[0] * in[1];
        const auto g = in[0] + 1;
        return Tensors{in[0],                  // 0 is_input
                       in[1].slice(0, 1, 3),   // 1 alias_of_input 1
                       h.view({-1}),           // 2 alias_of_intermediate 0
                       h.t(),                  // 3 alias_of_intermediate 0 (same base)
                       g,                      // 4 non_alias
                       g.select(1, 2),         // 5 alias_of_intermediate_base_is_user_output 4
                       g,                      // 6 the same tensor as output 4
                       in[1].detach().sum()};  // 7 non_alias, no grad
      },
      args, /*is_train=*/true);
  const auto& o = meta.output_info;
  REQUIRE(o.size() == 8);
  REQUIRE(o[0].output_type == OutputType::is_input);
  REQUIRE(o[0].base_idx == std::optional<size_t>(0));
  REQUIRE(o[1].output_type == OutputType::alias_of_input);
  REQUIRE(o[1].base_idx == std::optional<size_t>(1));
  REQUIRE(o[1].offset_delta == args[1].slice(0, 1, 3).storage_offset());  // row 1: 3 elements in
  REQUIRE(o[1].meta.sizes == std::vector<int64_t>{2, 3});
  REQUIRE(o[2].output_type == OutputType::alias_of_intermediate);
  REQUIRE(o[3].output_type == OutputType::alias_of_intermediate);
  REQUIRE(o[2].base_idx == std::optional<size_t>(0));
  REQUIRE(o[3].base_idx == std::optional<size_t>(0));
  REQUIRE(meta.intermediate_bases.size() == 1);
  REQUIRE(meta.intermediate_bases[0].requires_grad);
  REQUIRE(o[4].output_type == OutputType::non_alias);
  REQUIRE(o[4].meta.requires_grad);
  REQUIRE(o[5].output_type == OutputType::alias_of_intermediate_base_is_user_output);
  REQUIRE(o[5].base_idx == std::optional<size_t>(4));
  REQUIRE(o[5].offset_delta == (args[0] + 1).select(1, 2).storage_offset());  // eager's g.select(1, 2)
  REQUIRE(o[6].output_type == OutputType::alias_of_intermediate_base_is_user_output);
  REQUIRE(o[6].base_idx == std::optional<size_t>(4));
  REQUIRE(o[7].output_type == OutputType::non_alias);
  REQUIRE_FALSE(o[7].meta.requires_grad);
  REQUIRE(meta.graph_computed_outputs() == std::vector<size_t>{2, 3, 4, 5, 6, 7});
  REQUIRE(meta.to_string().find("alias_of_intermediate_base_is_user_output base=4") != std::string::npos);
}

TEST_CASE("collect_metadata: an output viewing an input with another dtype is an alias, offset in its elements",
          "[autograd][meta]") {
  const at::Tensor x = at::randn({8});
  const auto meta = analyze([](const Tensors& in) { return Tensors{in[0].slice(0, 2).view(at::kHalf)}; }, {x}, false);
  const autograd::OutputAliasInfo& o = meta.output_info.at(0);
  REQUIRE(o.output_type == OutputType::alias_of_input);
  REQUIRE(o.meta.dtype == at::kHalf);
  REQUIRE(o.offset_delta == x.slice(0, 2).view(at::kHalf).storage_offset());  // 2 floats = 4 halves
}

TEST_CASE("collect_metadata: a failure inside the function is an AotError naming the compilation", "[autograd][meta]") {
  const auto x = at::randn({2, 3});
  REQUIRE_THROWS_AS(analyze([](const Tensors& in) { return Tensors{at::mm(in[0], in[0])}; }, {x}, false),
                    autograd::AotError);
  // Writing a leaf that requires grad fails as it does in eager.
  const auto leaf = at::randn({3}).requires_grad_();
  REQUIRE_THROWS_WITH(analyze(
                          [](const Tensors& in) {
                            in[0].mul_(2);
                            return Tensors{in[0] * 1};
                          },
                          {leaf}, true),
                      CRUCIBLE_HAS_SUBSTR("leaf Variable that requires grad"));
}
