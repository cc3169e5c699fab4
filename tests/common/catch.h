// Catch2 2.13 (Debian 12) and 3.x (the GPU machine) behind one include.
#pragma once

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#define CRUCIBLE_HAS_SUBSTR(s) Catch::Matchers::ContainsSubstring(s)
#else
#include <catch2/catch.hpp>
#define CRUCIBLE_HAS_SUBSTR(s) Catch::Matchers::Contains(s)
#endif
