// kestrel/cpu/kernels.hpp: every CPU kernel of kestrel, namespace kestrel::cpu.
// The scalar twins live in kestrel/cpu/ref/kernels.hpp (kestrel::cpu::ref).
#pragma once

#include "kestrel/cpu/activation.hpp"
#include "kestrel/cpu/attend.hpp"
#include "kestrel/cpu/attend_amx.hpp"
#include "kestrel/cpu/attend_block.hpp"
#include "kestrel/cpu/convert.hpp"
#include "kestrel/cpu/dot.hpp"
#include "kestrel/cpu/math.hpp"
#include "kestrel/cpu/matmul.hpp"
#include "kestrel/cpu/matvec.hpp"
#include "kestrel/cpu/norm.hpp"
#include "kestrel/cpu/rope.hpp"
#include "kestrel/cpu/softmax.hpp"
#include "kestrel/cpu/thread_pool.hpp"
#include "kestrel/cpu/xsimd_compat.hpp"
