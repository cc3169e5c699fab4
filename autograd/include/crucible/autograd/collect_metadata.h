// collect_metadata: the metadata analysis of AOTAutograd, run before any
// graph is traced for compilation
// (torch/_functorch/_aot_autograd/collect_metadata_analysis.py's
// run_functionalized_fw_and_collect_metadata).
#pragma once

#include <crucible/autograd/aot_request.h>
#include <crucible/autograd/view_and_mutation_meta.h>
#include <crucible/ir/hash.h>

#include <optional>
#include <vector>

namespace crucible::autograd {

// Note [Metadata analysis]
// request.flat_fn runs once, traced with functionalization on copies of
// request.flat_args (so nothing of the caller's changes), with gradients as
// the call will have them (`is_train`) or under no_grad. Each input's
// functional wrapper then says whether its data or metadata was written;
// each output is compared with the inputs and the other outputs:
//  - the same tensor as an input: is_input;
//  - sharing an input's storage: alias_of_input;
//  - the same tensor as an earlier output, or a view whose base is another
//    output: alias_of_intermediate_base_is_user_output;
//  - a view (autograd's notion: it has a base) of anything else:
//    alias_of_intermediate, its base numbered among the intermediate bases;
//  - otherwise non_alias.
// Inputs are given to the function as eager would see them: an input that
// requires grad and has autograd history is passed as a non-leaf (a clone of
// the traced leaf), so writing it in place is allowed exactly when eager
// allows it, and an in-place write that autograd did not record (made under
// NoGradGuard) is told apart from one it did (the clone's grad_fn is
// unchanged). Module state (the first config.num_params_buffers inputs of a
// module) is read from the trace's own account of writes to it
// (see Note [Functionalizing module state] in the tracer), and so are the
// lifted tensors the request already knows (Note [Lifting in AOTAutograd]).

/// Runs the analysis of Note [Metadata analysis] and returns its result.
/// Tensors the function reads from outside its arguments that the request
/// does not lift yet (Note [Lifted tensors]) are stored in `lifted`, with
/// their names, when it is given; otherwise they raise AotError.
/// Throws AotError for what the runtime wrappers cannot reproduce (metadata
/// written in place on module state or a lifted tensor); and, with the
/// function's own message, when the
/// function fails while traced (nothing of the caller's is changed then).
/// When `graph_hash` is given it is set to ir::graph_hash of the graph the
/// analysis traced, or nullopt when that graph cannot be hashed: the key of
/// the trace cache (Note [AOT trace cache] in trace_cache.h). In real mode
/// with the trace cache on, a fake-mode run of the analysis may stand for
/// the real one (Note [Fake fingerprints] in trace_cache.h).
ViewAndMutationMeta collect_metadata(const AotRequest& request, bool is_train,
                                     std::vector<tracer::NamedTensor>* lifted = nullptr,
                                     std::optional<ir::GraphHash>* graph_hash = nullptr);

}  // namespace crucible::autograd
