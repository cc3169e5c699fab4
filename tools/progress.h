// A progress bar for long commands (`crucible train`): one line redrawn in
// place on a terminal, plain lines at every tenth of the way otherwise, so
// that logs (CI, pipes) stay readable.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>

namespace crucible::tools {

class ProgressBar {
 public:
  /// Draws to `out` (stderr by default), `total` units of work. `tty`: redraw
  /// one line with '\r' (the default when `out` is stderr and stderr is a
  /// terminal); otherwise print a line each time another tenth is done.
  ProgressBar(std::string label, int64_t total, std::ostream& out, bool tty);
  /// The same on stderr, as a terminal when it is one.
  ProgressBar(std::string label, int64_t total);

  /// `done` units finished; `status` follows the count ("loss 0.41  5120
  /// samples/s"). Redraws at most every 100 ms on a terminal.
  void update(int64_t done, std::string_view status);
  /// The last state, drawn once more and ended with a newline.
  void finish(std::string_view status);

 private:
  void draw(int64_t done, std::string_view status, bool final);
  std::string label_;
  int64_t total_;
  std::ostream& out_;
  bool tty_;
  int64_t done_ = 0;
  int last_tenth_ = 0;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace crucible::tools
