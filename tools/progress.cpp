#include "progress.h"

#include <unistd.h>
#include <algorithm>
#include <iostream>

namespace crucible::tools {

ProgressBar::ProgressBar(std::string label, int64_t total, std::ostream& out, bool tty)
    : label_(std::move(label)), total_(std::max<int64_t>(total, 1)), out_(out), tty_(tty) {}

ProgressBar::ProgressBar(std::string label, int64_t total)
    : ProgressBar(std::move(label), total, std::cerr, ::isatty(STDERR_FILENO) != 0) {}

void ProgressBar::update(int64_t done, std::string_view status) {
  done_ = done;
  if (tty_) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    draw(done, status, false);
    return;
  }
  const int tenth = static_cast<int>(10 * std::min(done, total_) / total_);
  if (tenth > last_tenth_) {
    last_tenth_ = tenth;
    draw(done, status, false);
  }
}

void ProgressBar::finish(std::string_view status) {
  // A plain log already has the line of the last tenth when the work is all done.
  if (!tty_ && last_tenth_ == 10) return;
  last_tenth_ = 10;
  draw(done_, status, true);
}

void ProgressBar::draw(int64_t done, std::string_view status, bool final) {
  const int64_t shown = std::min(done, total_);
  const std::string count = std::to_string(shown) + "/" + std::to_string(total_);
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * shown / total_);
    // \r returns to the line's start; \x1b[K clears what a longer line left.
    out_ << '\r' << label_ << " [" << std::string(static_cast<size_t>(filled), '#')
         << std::string(static_cast<size_t>(kWidth - filled), '.') << "] " << count << "  " << status << "\x1b[K";
    if (final) out_ << '\n';
  } else {
    out_ << label_ << ' ' << count << " (" << 100 * shown / total_ << "%)  " << status << '\n';
  }
  out_.flush();
}

}  // namespace crucible::tools
