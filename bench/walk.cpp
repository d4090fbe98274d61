// kestrel-bench-walk: how fast decode's weight products of a GGUF file read
// their bytes, against plain reads of the same bytes walked in given ways,
// alternated pass by pass in one process (the machine is noisy: quote the
// paired ratios). A pass is one token's products, region by region as
// decode runs them on the pool: q, k and v together (cpu::matvec_fused),
// the attention output, gate and up with SwiGLU (cpu::matvec_swiglu), down,
// and the output matrix. A read variant "S:L2:L1" reads each matrix's rows
// on the same pool, split as a decode product of its size is split
// (cpu::parallel_for), S rows side by side (rows j, q + j, .., (S - 1) q +
// j of a chunk of S q rows), line by line with each stream's line asked
// for L2 bytes ahead into L2 and L1 bytes ahead into L1 (0: not asked), the
// loads OR'd: the walk's cost without the arithmetic.
//
//   kestrel-bench-walk -m FILE [-t 2] [-r 15] [--read S:L2:L1]...
//
// One JSON line per variant: GB/s of weights per pass (median, quartiles)
// and the median and quartiles over passes of its time over the first
// variant's (decode) in the same pass. Weights are read in place from the
// file mapping, as kestrel-bench -mmp 1 reads them; rows walk as decode's
// plans for rows in 2 MiB pages when the mapping has them, and for a model
// larger than the last-level cache when it is (cpu/streaming.hpp). Types
// decode reads in the file's layout only: f32, f16, bf16 and the legacy
// blocks (q4_0 .. q8_0) on AVX-512 hosts; the k-quants (repacked at load)
// are refused.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common.hpp"
#include "kestrel/core/mmap.hpp"
#include "kestrel/cpu/matvec.hpp"
#include "kestrel/cpu/thread_pool.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/model/backend.hpp"
#include "kestrel/model/gguf_types.hpp"

namespace {

using namespace kestrel;

struct region {
  std::vector<weight_view> w;  // 1 matrix, or q/k/v, or gate/up
  enum kind { single, fused, swiglu } how;
};

struct read_walk {
  std::size_t streams = 2, l2 = 3072, l1 = 1536;
  std::string name;
};

/// Rows [r0, r1) of w read as `walk`: S streams side by side, the rest one by one.
std::uint64_t read_rows(const weight_view& w, std::size_t r0, std::size_t r1, const read_walk& walk) {
  const std::size_t rb = w.row_bytes(), S = walk.streams, q = (r1 - r0) / S;
  std::uint64_t acc[8] = {};
  auto line = [&](const std::byte* p, std::size_t left) {
    if (walk.l2) __builtin_prefetch(reinterpret_cast<const char*>(p) + walk.l2, 0, 2);  // into L2
    if (walk.l1) __builtin_prefetch(reinterpret_cast<const char*>(p) + walk.l1, 0, 3);  // into L1
    std::uint64_t v[8] = {};
    if (left >= 64)
      std::memcpy(v, p, 64);  // one 64-byte load where the target has one
    else
      std::memcpy(v, p, left);
    for (int i = 0; i < 8; ++i) acc[i] |= v[i];
  };
  std::vector<const std::byte*> p(S);
  for (std::size_t j = 0; j < q; ++j) {
    for (std::size_t s = 0; s < S; ++s) p[s] = w.row(r0 + s * q + j);
    for (std::size_t o = 0; o < rb; o += 64)
      for (std::size_t s = 0; s < S; ++s) line(p[s] + o, rb - o);
  }
  for (std::size_t r = r0 + S * q; r < r1; ++r)
    for (std::size_t o = 0; o < rb; o += 64) line(w.row(r) + o, rb - o);
  std::uint64_t all = 0;
  for (auto a : acc) all |= a;
  return all;
}

int usage(const char* msg) {
  if (msg) std::fprintf(stderr, "error: %s\n", msg);
  std::fprintf(stderr, "usage: kestrel-bench-walk -m FILE [-t THREADS] [-r PASSES] [--read S:L2:L1]...\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string path;
  std::size_t threads = 2, passes = 15;
  std::vector<read_walk> reads;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "-m") path = value();
    else if (a == "-t") threads = std::stoul(value());
    else if (a == "-r") passes = std::stoul(value());
    else if (a == "--read") {
      read_walk w;
      w.name = value();
      if (std::sscanf(w.name.c_str(), "%zu:%zu:%zu", &w.streams, &w.l2, &w.l1) != 3 || w.streams == 0 ||
          w.streams > 64)
        return usage(("--read takes S:L2:L1 (1 <= S <= 64), not '" + w.name + "'").c_str());
      reads.push_back(w);
    } else if (a == "-h" || a == "--help") return usage(nullptr);
    else return usage(("unknown option " + a).c_str());
  }
  if (path.empty()) return usage("give a model file with -m");
  if (threads == 0 || passes == 0) return usage("-t and -r take positive numbers");
  if (reads.empty()) reads.push_back({2, 3072, 1536, "2:3072:1536"});

  io::gguf_file f(path);
  const auto& file = f.file();
  populate_pages(file.data(), file.size());
  const bool huge = file_pmd_mapped_bytes(file.data(), file.size()) >= file.size() / 2;
  auto view = [&](const std::string& name) {
    const auto& t = f.tensor(name);
    const auto d = weight_dtype_of(t.type);
    if (!d || t.dims.size() != 2) throw invalid_argument(name + ": not a weight matrix of a type the kernels take");
    if (panel_rows(*d) > 1 || *d >= dtype::q2_k)
      throw invalid_argument(name + ": " + std::string(name_of(*d)) +
                             " is repacked at load for decode; this tool reads the file's layout (f32, f16, bf16, q4_0 .. q8_0)");
    return weight_view{*d, t.data, static_cast<std::size_t>(t.dims[1]), static_cast<std::size_t>(t.dims[0]), huge};
  };
  std::vector<region> regions;
  for (int l = 0;; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    if (!f.find_tensor(p + "attn_q.weight")) break;
    regions.push_back({{view(p + "attn_q.weight"), view(p + "attn_k.weight"), view(p + "attn_v.weight")}, region::fused});
    regions.push_back({{view(p + "attn_output.weight")}, region::single});
    regions.push_back({{view(p + "ffn_gate.weight"), view(p + "ffn_up.weight")}, region::swiglu});
    regions.push_back({{view(p + "ffn_down.weight")}, region::single});
  }
  if (regions.empty()) throw invalid_argument(path + ": no blk.0.attn_q.weight (not a llama-style GGUF)");
  // No output.weight: the classifier is the token embedding (model/load.hpp).
  // Left out, and named in the output, where its type is one this tool does
  // not read (a q6_K classifier beside q4_0 layers).
  std::string skipped;
  {
    const std::string out = f.find_tensor("output.weight") ? "output.weight" : "token_embd.weight";
    try {
      regions.push_back({{view(out)}, region::single});
    } catch (const invalid_argument&) {
      skipped = out;
    }
  }
  std::size_t bytes = 0, max_cols = 0, max_rows = 0;
  for (const auto& r : regions)
    for (const auto& w : r.w) {
      bytes += w.bytes();
      max_cols = std::max(max_cols, w.cols);
      max_rows = std::max(max_rows, w.rows);
    }
  // Marked as cpu_backend::prepare_weights marks the model's matrices.
  std::vector<weight_view*> marked;
  for (auto& r : regions)
    for (auto& w : r.w) marked.push_back(&w);
  kestrel::detail::mark_from_memory(marked);
  const bool from_memory = marked.front()->from_memory;

  std::vector<float> x(max_cols);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : x) v = nd(rng);
  std::vector<std::vector<float>> y(3, std::vector<float>(max_rows));
  cpu::thread_pool pool(threads);
  std::uint64_t sink = 0;

  auto decode_pass = [&] {
    for (const auto& r : regions) {
      if (r.how == region::fused) {
        const cpu::matvec_job jobs[3] = {{&r.w[0], y[0].data()}, {&r.w[1], y[1].data()}, {&r.w[2], y[2].data()}};
        cpu::matvec_fused(jobs, x.data(), &pool);
      } else if (r.how == region::swiglu) {
        cpu::matvec_swiglu(r.w[0], r.w[1], x.data(), y[0].data(), y[1].data(), &pool);
      } else {
        cpu::matvec(r.w[0], x.data(), y[0].data(), &pool);
      }
    }
  };
  auto read_pass = [&](const read_walk& walk) {
    for (const auto& r : regions)
      for (const auto& w : r.w) {
        std::atomic<std::uint64_t> got{0};
        cpu::parallel_for(&pool, w.rows, [&](std::size_t r0, std::size_t r1) {
          got.fetch_xor(read_rows(w, r0, r1, walk), std::memory_order_relaxed);
        }, w.rows * w.cols);
        sink ^= got.load();
      }
  };
  auto pass = [&](std::size_t v) {
    const double t0 = bench::now_ms();
    if (v == 0) decode_pass();
    else read_pass(reads[v - 1]);
    return bench::now_ms() - t0;
  };

  const std::size_t n_var = 1 + reads.size();
  for (std::size_t v = 0; v < n_var; ++v) pass(v);  // warm-up
  std::vector<std::vector<double>> ms(n_var);
  for (std::size_t p = 0; p < passes; ++p)
    for (std::size_t v = 0; v < n_var; ++v) ms[v].push_back(pass(v));

  auto quartiles = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return std::array<double, 3>{v[n / 4], bench::median(v), v[(3 * n) / 4]};
  };
  for (std::size_t v = 0; v < n_var; ++v) {
    std::vector<double> gbps, ratio;
    for (std::size_t p = 0; p < passes; ++p) {
      gbps.push_back(static_cast<double>(bytes) / (ms[v][p] * 1e6));
      ratio.push_back(ms[v][p] / ms[0][p]);
    }
    const auto g = quartiles(gbps), q = quartiles(ratio);
    std::printf(
        "{\"variant\": %s, \"model_filename\": %s, \"n_threads\": %zu, \"passes\": %zu, \"bytes\": %zu, "
        "\"huge_pages\": %s, \"from_memory\": %s, \"skipped\": %s, \"gbps\": %.2f, \"gbps_q1\": %.2f, "
        "\"gbps_q3\": %.2f, \"time_ratio_to_decode\": %.3f, \"ratio_q1\": %.3f, \"ratio_q3\": %.3f}\n",
        bench::json_string(v == 0 ? "decode" : "read " + reads[v - 1].name).c_str(), bench::json_string(path).c_str(),
        threads, passes, bytes, huge ? "true" : "false", from_memory ? "true" : "false",
        bench::json_string(skipped).c_str(), g[1], g[0], g[2], q[1], q[0], q[2]);
  }
  if (sink == 0x5eed) std::fprintf(stderr, " ");  // keeps the reads
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
