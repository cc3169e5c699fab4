#include <crucible/ir/signature.h>

#include <array>
#include <utility>

namespace crucible::ir {

namespace {
constexpr std::array<std::pair<InputKind, std::string_view>, 7> kInputKinds{{
    {InputKind::UserInput, "user_input"},
    {InputKind::Parameter, "parameter"},
    {InputKind::Buffer, "buffer"},
    {InputKind::Tangent, "tangent"},
    {InputKind::State, "state"},
    {InputKind::Lifted, "lifted"},
    {InputKind::SavedValue, "saved_value"},
}};
constexpr std::array<std::pair<OutputKind, std::string_view>, 6> kOutputKinds{{
    {OutputKind::UserOutput, "user_output"},
    {OutputKind::Loss, "loss"},
    {OutputKind::Gradient, "gradient"},
    {OutputKind::MutatedInput, "mutated_input"},
    {OutputKind::MutatedInputMetadata, "mutated_input_metadata"},
    {OutputKind::SavedValue, "saved_value"},
}};

template <typename Table, typename Kind>
std::string_view name_of(const Table& table, Kind k) {
  for (const auto& [kind, name] : table)
    if (kind == k) return name;
  return "?";
}
template <typename Table, typename Kind = typename Table::value_type::first_type>
std::optional<Kind> kind_of(const Table& table, std::string_view s) {
  for (const auto& [kind, name] : table)
    if (name == s) return kind;
  return std::nullopt;
}
}  // namespace

std::vector<size_t> GraphSignature::inputs_of(InputKind kind) const {
  std::vector<size_t> r;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].kind == kind) r.push_back(i);
  return r;
}

std::vector<size_t> GraphSignature::outputs_of(OutputKind kind) const {
  std::vector<size_t> r;
  for (size_t i = 0; i < outputs.size(); ++i)
    if (outputs[i].kind == kind) r.push_back(i);
  return r;
}

std::string_view to_string(InputKind kind) { return name_of(kInputKinds, kind); }
std::string_view to_string(OutputKind kind) { return name_of(kOutputKinds, kind); }
std::optional<InputKind> input_kind_from_string(std::string_view s) { return kind_of(kInputKinds, s); }
std::optional<OutputKind> output_kind_from_string(std::string_view s) { return kind_of(kOutputKinds, s); }

}  // namespace crucible::ir
