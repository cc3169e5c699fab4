#include <crucible/autograd/view_and_mutation_meta.h>

#include <sstream>

namespace crucible::autograd {

std::string_view to_string(OutputType type) {
  switch (type) {
    case OutputType::non_alias:
      return "non_alias";
    case OutputType::alias_of_input:
      return "alias_of_input";
    case OutputType::is_input:
      return "is_input";
    case OutputType::alias_of_intermediate:
      return "alias_of_intermediate";
    case OutputType::alias_of_intermediate_base_is_user_output:
      return "alias_of_intermediate_base_is_user_output";
  }
  return "?";
}

std::vector<size_t> ViewAndMutationMeta::mutated_inp_runtime_indices() const {
  std::vector<size_t> r;
  for (size_t i = 0; i < input_info.size(); ++i) {
    const InputAliasInfo& in = input_info[i];
    if (in.mutates_metadata || (in.mutates_data && !in.mutation_in_graph)) r.push_back(i);
  }
  return r;
}

std::vector<size_t> ViewAndMutationMeta::mutated_data_inputs() const {
  std::vector<size_t> r;
  for (size_t i = 0; i < input_info.size(); ++i)
    if (input_info[i].mutates_data && !input_info[i].mutation_in_graph) r.push_back(i);
  return r;
}

std::vector<size_t> ViewAndMutationMeta::grad_accumulating_inputs() const {
  std::vector<size_t> r;
  for (size_t i = 0; i < input_info.size(); ++i)
    if (input_info[i].accumulates_grad) r.push_back(i);
  return r;
}

std::vector<size_t> ViewAndMutationMeta::graph_computed_outputs() const {
  std::vector<size_t> r;
  for (size_t k = 0; k < output_info.size(); ++k) {
    const OutputType t = output_info[k].output_type;
    if (t != OutputType::alias_of_input && t != OutputType::is_input) r.push_back(k);
  }
  return r;
}

bool ViewAndMutationMeta::has_aliased_outputs() const {
  for (const OutputAliasInfo& o : output_info)
    if (o.output_type != OutputType::non_alias) return true;
  return false;
}

std::string ViewAndMutationMeta::to_string() const {
  std::ostringstream os;
  auto ints = [&os](const std::vector<int64_t>& v) {
    os << "[";
    for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
    os << "]";
  };
  os << "ViewAndMutationMeta(" << (is_train ? "train" : "inference") << ")\n";
  for (size_t i = 0; i < input_info.size(); ++i) {
    const InputAliasInfo& in = input_info[i];
    os << "  input " << i << ": mutates_data=" << in.mutates_data << " mutates_metadata=" << in.mutates_metadata
       << " requires_grad=" << in.requires_grad << " is_leaf=" << in.is_leaf
       << " mutations_under_no_grad=" << in.mutations_under_no_grad << " mutation_in_graph=" << in.mutation_in_graph
       << " accumulates_grad=" << in.accumulates_grad;
    if (in.mutates_metadata) {
      os << " final_sizes=";
      ints(in.final_sizes);
      os << " final_strides=";
      ints(in.final_strides);
      os << " final_offset_delta=" << in.final_offset_delta;
    }
    os << "\n";
  }
  for (size_t k = 0; k < output_info.size(); ++k) {
    const OutputAliasInfo& o = output_info[k];
    os << "  output " << k << ": " << autograd::to_string(o.output_type);
    if (o.base_idx) os << " base=" << *o.base_idx;
    if (o.offset_delta != 0) os << " offset_delta=" << o.offset_delta;
    os << " " << ir::to_string(o.meta) << "\n";
  }
  os << "  intermediate bases: " << intermediate_bases.size();
  for (const ir::TensorMeta& b : intermediate_bases) os << "; " << ir::to_string(b);
  if (is_rng_op_functionalized) os << "; rng functionalized";
  return os.str();
}

}  // namespace crucible::autograd
