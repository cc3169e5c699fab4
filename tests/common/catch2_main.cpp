// Catch2 2.x needs one translation unit that defines main; 3.x links catch2-with-main.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
