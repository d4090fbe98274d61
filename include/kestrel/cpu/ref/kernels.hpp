// kestrel/cpu/ref/kernels.hpp: the scalar twin of every kernel in
// kestrel/cpu/kernels.hpp, namespace kestrel::cpu::ref, same signatures.
// Plain loops in index order, std::exp, no SIMD: the reference the tests
// compare the fast kernels against.
#pragma once

#include "kestrel/cpu/ref/attend.hpp"
#include "kestrel/cpu/ref/elementwise.hpp"
#include "kestrel/cpu/ref/linear.hpp"
#include "kestrel/cpu/ref/weights.hpp"
