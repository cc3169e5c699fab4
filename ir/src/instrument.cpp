#include <crucible/ir/instrument.h>

namespace crucible::ir {

bool should_run(const Instruments& instruments, const StageEvent& event) {
  for (const auto& i : instruments)
    if (!i->should_run(event)) return false;
  return true;
}

void notify_before(const Instruments& instruments, const StageEvent& event) {
  for (const auto& i : instruments) i->before_stage(event);
}

void notify_after(const Instruments& instruments, const StageEvent& event) {
  for (auto it = instruments.rbegin(); it != instruments.rend(); ++it) (*it)->after_stage(event);
}

StageScope::StageScope(const Instruments& instruments, StageEvent before)
    : instruments_(&instruments), stage_(before.stage), id_(before.id), open_(true) {
  notify_before(instruments, before);
}

StageScope::~StageScope() {
  if (!open_) return;
  try {
    failed({});
  } catch (...) {  // NOLINT(bugprone-empty-catch): an instrument's exception cannot leave a destructor
  }
}

void StageScope::done(StageEvent after) {
  if (!open_) return;
  open_ = false;
  after.stage = stage_;
  after.id = id_;
  notify_after(*instruments_, after);
}

void StageScope::failed(std::string_view message) {
  StageEvent after;
  after.failed = true;
  after.changed = false;
  after.detail = message;
  done(std::move(after));
}

}  // namespace crucible::ir
