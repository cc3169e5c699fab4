// Catch2 2.13 (Debian 12) and 3.x (the GPU machine) behind one include.
#pragma once

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#define CRUCIBLE_HAS_SUBSTR(s) Catch::Matchers::ContainsSubstring(s)
#else
#include <catch2/catch.hpp>
#define CRUCIBLE_HAS_SUBSTR(s) Catch::Matchers::Contains(s)
#endif

/// Ends the test case as skipped (Catch2 3's SKIP; on Catch2 2, which has no
/// skipped state, a warning starting with "skipped: ", which ./x counts, and a
/// return). `msg` is a string literal. Use only for a missing machine
/// capability, such as a CUDA device.
#ifdef SKIP
#define CRUCIBLE_SKIP(msg) SKIP(msg)
#else
#define CRUCIBLE_SKIP(msg) \
  do {                     \
    WARN("skipped: " msg); \
    return;                \
  } while (0)
#endif
