// `crucible graph`: the text form in, a verified graph out in every format,
// and --run's checksums equal to the same ops run directly by ATen.
#include "catch.h"
#include "cli.h"

#include <crucible/ir/parser.h>
#include <crucible/ir/printer.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdio>

using crucible::testing::run_cli;
using crucible::testing::write_temp;

namespace {

const char* kGraph = R"(%x : f32[8, 16] = placeholder()
%w : f32[16, 4] = placeholder(kind=parameter, target="fc.weight")
%idx : i64[3] = placeholder()
%mm : f32[8, 4] = aten::mm(%x, %w)
%relu : f32[8, 4] = aten::relu(%mm)
%rows : f32[3, 4] = aten::index_select(%relu, 0, %idx)
return (%relu, %rows)
)";

// The line `crucible graph --run` prints for an output (see graph_command.cpp).
std::string checksum_line(const std::string& name, const at::Tensor& t) {
  char buf[160];
  const at::Tensor d = t.to(at::kDouble);
  std::snprintf(buf, sizeof buf, "sum=%.9g abs_sum=%.9g", d.sum().item<double>(), d.abs().sum().item<double>());
  return "%" + name + " : f32[" + std::to_string(t.size(0)) + ", " + std::to_string(t.size(1)) + "]  " + buf;
}

}  // namespace

TEST_CASE("crucible graph prints the text form it read, verified", "[tools][graph]") {
  const std::string path = write_temp(kGraph);
  const auto r = run_cli("graph " + path);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.out == crucible::ir::to_text(crucible::ir::parse(kGraph)));
}

TEST_CASE("crucible graph --run prints the checksums of the ATen calls it spells", "[tools][graph]") {
  const auto r = run_cli("graph " + write_temp(kGraph) + " --run --seed 7");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  // The inputs the command draws: one generator seeded with --seed, each
  // placeholder in order, floats N(0, 1), integers uniform in [0, 4).
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor x = at::randn({8 * 16}, gen).view({8, 16});
  const at::Tensor w = at::randn({16 * 4}, gen).view({16, 4});
  const at::Tensor idx = at::randint(0, 4, {3}, gen, at::kLong);
  const at::Tensor relu = at::relu(at::mm(x, w));
  const at::Tensor rows = at::index_select(relu, 0, idx);
  CHECK_THAT(r.out, CRUCIBLE_HAS_SUBSTR(checksum_line("relu", relu)));
  CHECK_THAT(r.out, CRUCIBLE_HAS_SUBSTR(checksum_line("rows", rows)));
}

TEST_CASE("crucible graph converts between the text, JSON and DOT forms", "[tools][graph]") {
  const auto json = run_cli("graph " + write_temp(kGraph) + " --format json");
  REQUIRE(json.exit_code == 0);
  REQUIRE(json.out.rfind("{", 0) == 0);
  // The JSON form reads back to the same graph.
  const auto text = run_cli("graph " + write_temp(json.out, ".json"));
  INFO(text.err);
  REQUIRE(text.exit_code == 0);
  REQUIRE(text.out == crucible::ir::to_text(crucible::ir::parse(kGraph)));
  const auto dot = run_cli("graph " + write_temp(kGraph) + " --format dot");
  REQUIRE(dot.exit_code == 0);
  CHECK_THAT(dot.out, CRUCIBLE_HAS_SUBSTR("digraph"));
  CHECK_THAT(dot.out, CRUCIBLE_HAS_SUBSTR("aten::index_select"));
}

TEST_CASE("crucible graph reports bad input on stderr with a non-zero exit", "[tools][graph][errors]") {
  SECTION("an unknown operator, with the line and column") {
    const auto r = run_cli("graph " + write_temp("%x : f32[2] = placeholder()\n%y : f32[2] = aten::nope(%x)\n"));
    CHECK(r.exit_code == 1);
    CHECK(r.out.empty());
    CHECK_THAT(r.err, CRUCIBLE_HAS_SUBSTR("line 2, column 15"));
    CHECK_THAT(r.err, CRUCIBLE_HAS_SUBSTR("aten::nope"));
  }
  SECTION("a graph that fails verification says what is wrong") {
    // Parses (the printer never writes this) but returns nothing: no output node.
    const auto r = run_cli("graph " + write_temp("%x : f32[2] = placeholder()\n%y : f32[2] = aten::neg(%x)\n"));
    CHECK(r.exit_code == 1);
    CHECK(r.out.empty());
    CHECK_THAT(r.err, CRUCIBLE_HAS_SUBSTR("no output node"));
  }
  SECTION("--run refuses a graph whose declared types its kernels contradict") {
    const auto r = run_cli(
        "graph " + write_temp("%x : f32[2] = placeholder()\n%y : f32[3] = aten::neg(%x)\nreturn (%y)\n") + " --run");
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, CRUCIBLE_HAS_SUBSTR("%y is declared f32[3] but its kernel computed f32[2]"));
  }
  SECTION("a missing file") {
    const auto r = run_cli("graph /nonexistent/graph.txt");
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, CRUCIBLE_HAS_SUBSTR("/nonexistent/graph.txt"));
  }
  SECTION("an unknown format is a usage error") {
    const auto r = run_cli("graph " + write_temp(kGraph) + " --format svg");
    CHECK(r.exit_code != 0);
    CHECK(r.out.empty());
  }
}
