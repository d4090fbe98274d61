// tests/tools: filled in with the quantize / make-model / perplexity tools.
#include <doctest/doctest.h>

TEST_CASE("tools: placeholder until the tools land") { CHECK(true); }
