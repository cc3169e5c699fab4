// GraphSignature: what each placeholder and each output of a graph stands
// for, as torch.export's ExportGraphSignature and aot_export_module's
// GraphSignature (torch/_functorch/_aot_autograd/schemas.py) record it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace crucible::ir {

enum class InputKind : uint8_t {
  UserInput,   ///< an argument of the user's function
  Parameter,   ///< a module parameter lifted to a placeholder
  Buffer,      ///< a module buffer lifted to a placeholder
  Tangent,     ///< an incoming gradient of a forward output (joint / backward graphs)
  State,       ///< other lifted state (optimizer state, RNG seed/offset, step counters)
  Lifted,      ///< a tensor the function reads from outside its arguments (a captured or global
               ///< tensor, another module's parameter or buffer), read afresh at every call
  SavedValue,  ///< a value the forward saved for the backward (backward graphs of a partition)
};

enum class OutputKind : uint8_t {
  UserOutput,            ///< a result of the user's function
  Loss,                  ///< the loss of a training graph (a scalar)
  Gradient,              ///< the gradient of input `input_index`
  MutatedInput,          ///< the new value of input `input_index` (data written in place)
  MutatedInputMetadata,  ///< input `input_index` after a shape/stride mutation
  SavedValue,            ///< a value the forward saves for the backward (partitioned graphs)
};

struct InputSpec {
  InputKind kind = InputKind::UserInput;
  /// Fully qualified name for parameters, buffers and state ("fc1.weight"),
  /// where a lifted tensor came from when known ("discriminator.fc.weight");
  /// empty for user inputs and tangents.
  std::string target;
  /// Index of another placeholder this one duplicates (a parameter tied to
  /// another name, as named_parameters(remove_duplicate=False) lists them).
  std::optional<size_t> duplicate_of;

  bool operator==(const InputSpec&) const = default;
};

struct OutputSpec {
  OutputKind kind = OutputKind::UserOutput;
  /// The placeholder index this output refers to (Gradient, MutatedInput*):
  /// of this graph's placeholders, except for a backward graph's Gradient
  /// outputs, where it is the primal's index in the forward (joint) graph.
  std::optional<size_t> input_index;

  bool operator==(const OutputSpec&) const = default;
};

/// One InputSpec per placeholder and one OutputSpec per output, in order.
struct GraphSignature {
  std::vector<InputSpec> inputs;
  std::vector<OutputSpec> outputs;

  /// Placeholder indices of the given kind, in order.
  std::vector<size_t> inputs_of(InputKind kind) const;
  /// Output indices of the given kind, in order.
  std::vector<size_t> outputs_of(OutputKind kind) const;

  bool operator==(const GraphSignature&) const = default;
};

/// Text-form names: "user_input", "parameter", "buffer", "tangent", "state", "lifted", "saved_value";
/// "user_output", "loss", "gradient", "mutated_input", "mutated_input_metadata",
/// "saved_value". The from_string functions return nullopt for unknown names.
std::string_view to_string(InputKind kind);
std::string_view to_string(OutputKind kind);
std::optional<InputKind> input_kind_from_string(std::string_view s);
std::optional<OutputKind> output_kind_from_string(std::string_view s);

}  // namespace crucible::ir
