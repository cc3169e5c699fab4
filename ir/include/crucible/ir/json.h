// JSON serialization of a graph, for caches and tooling: lossless like the
// text form (to_text(from_json(to_json(g))) == to_text(g)), and structured so
// tools need no parser of their own.
//
//   {"format": "crucible.graph", "version": 1, "nodes": [
//     {"kind": "placeholder", "results": [R], "input": {"kind": "parameter", "target": "fc.weight",
//                                                       "duplicate_of": null}},
//     {"kind": "call", "target": "aten::add.Tensor", "args": [{"value": "x"}, {"value": "w"}, 1],
//      "results": [R], "source": "fc", "tags": ["backward"]},
//     {"kind": "constant", "results": [R], "data": [1.0, 2.0]},    (a tensor; no data on meta)
//     {"kind": "constant", "results": [R], "value": 3},            (a scalar)
//     {"kind": "output", "outputs": [{"value": "add", "kind": "gradient", "input": "w"}]}]}
//
// with each result R = {"name": "add", "type": "Tensor", "meta": {"dtype": "f32",
// "sizes": [8, 16], "strides": [16, 1], "storage_offset": 0, "device": "cpu",
// "requires_grad": false}} ("meta" only on tensors that have it; "type" is
// the c10 type's name, "int" for a sym_size). Arguments are in schema order,
// one per schema argument: a Value is {"value": name}, a Tensor[] a list of
// them (null for None); constants are JSON null/bool/int/float/string/list,
// with dtypes, layouts, memory formats and devices as the text form's words
// ("f32", "channels_last", "cuda:0"), non-finite floats as "nan", "inf",
// "-inf", and a float always written with a '.' or an exponent so it reads
// back as a float. Tensor data is flat, row-major, exact.
#pragma once

#include <crucible/ir/graph.h>

#include <string>
#include <string_view>

namespace crucible::ir {

/// The JSON form of `graph`; `indent` < 0 gives one line, otherwise
/// nlohmann-json's pretty printing with that indent. Throws IrError for what
/// the text form cannot hold either (see printer.h).
std::string to_json(const Graph& graph, int indent = -1);

/// Reads the JSON form back. Throws IrError naming the field at fault
/// ("nodes[3].args[1]: ...") on malformed JSON, a wrong format or version,
/// missing or mistyped fields, and everything parse() rejects.
Graph from_json(std::string_view json);

}  // namespace crucible::ir
