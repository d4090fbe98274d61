// kestrel/sampler/samplers.hpp: every sampler of the folder, for callers
// that want them all (the umbrella header includes this one).
#pragma once

#include "kestrel/sampler/concepts.hpp"
#include "kestrel/sampler/rng.hpp"
#include "kestrel/sampler/greedy.hpp"
#include "kestrel/sampler/candidates.hpp"
#include "kestrel/sampler/chain.hpp"
#include "kestrel/sampler/llama2c.hpp"
