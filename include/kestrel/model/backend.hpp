// kestrel/model/backend.hpp: the CPU backends (the Backend concept is in
// model/concepts.hpp).
//
// Models: cpu_backend (xsimd kernels on a persistent thread pool) and
// cpu_ref_backend (the scalar twins, one thread). The CUDA backend will
// model the same concept.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "kestrel/core/buffer.hpp"
#include "kestrel/core/mmap.hpp"
#include "kestrel/core/separate.hpp"
#include "kestrel/core/tensor.hpp"
#include "kestrel/cpu/kernels.hpp"
#include "kestrel/cpu/ref/kernels.hpp"
#include "kestrel/cpu/thread_pool.hpp"
#include "kestrel/model/concepts.hpp"
#include "kestrel/model/weights.hpp"
#include "kestrel/quant/kquant_x16.hpp"
#include "kestrel/quant/legacy_x16.hpp"

namespace kestrel {

/// Where cpu_backend reads a file's weight matrices from.
enum class weight_placement {
  /// In place in the file mapping: no copy, 4 KiB pages, every matrix in
  /// the file's layout.
  file,
  /// Copied once, when the model is built, into transparent huge pages
  /// (where the kernel offers them and the memory can be mapped; else as
  /// `file`), the file's pages given back as they are copied, so the process
  /// holds about the file's size, not twice it. Decode streams every matrix
  /// once per token, and with 4 KiB pages every 4 KiB of it is a TLB miss
  /// and a page walk.
  /// Measured on Zen 4 (kestrel-bench tg64 --mmap 1 / 0 alternated, 2
  /// threads, 2 rounds; bench/README.md): TinyLlama shape q4_0 +12-13%,
  /// q8_0 +10-30%, Q4_K_M +4-26%, f16 +7%, f32 0-10%; the 110M shape within
  /// noise; prefill unchanged (compute-bound). The copy's cost is in the
  /// model's construction: 0.2-5.5 s for TinyLlama's 0.6-4.4 GB there
  /// (kestrel-bench's load_ns).
  huge_pages,
  /// Where the file mappings of copy_rate_limit::page_cache_min_bytes or
  /// more lie in 2 MiB pages of the page cache (detail::file_in_huge_pages),
  /// the matrices that keep the file's layout stay in place and only those
  /// interleaved at load are copied. Otherwise, as huge_pages while the
  /// copy runs at copy_rate_limit::min_bytes_per_s or faster; from the
  /// first stretch of copy_rate_limit::probe_bytes that
  /// ran slower on, the matrices that keep the file's layout stay in place,
  /// as with `file` (those interleaved at load are still copied: their
  /// kernels are the faster ones). The default.
  /// Why: where fresh memory is slow to fault in, as in a virtual machine
  /// whose host backs guest memory only when it is first touched, the copy
  /// costs seconds and gains nothing. Measured on a Zen 3 KVM guest: 2 GiB
  /// of fresh anonymous memory first touched in 14.3-14.6 s (huge pages) and
  /// 37 s for 6000 MiB (4 KiB pages), 0.33 s when touched again at once;
  /// TinyLlama f16 built in 8.4-9.9 s copied against 1 ms in place, and its
  /// decode the same both ways (tg64, 2 alternated rounds: 12.83 / 12.75
  /// and 13.48 / 13.53 t/s copied / in place).
  automatic,
};

/// When weight_placement::automatic stops copying: the copy is timed in
/// stretches of at least probe_bytes (whole matrices), and the first stretch
/// slower than min_bytes_per_s leaves the rest in place. Every stretch, not
/// the first alone: memory another process has just freed faults in fast,
/// and fresh memory after it may not (the Zen 3 guest above copied
/// TinyLlama f16's first 32 MiB fast, then the other 1.9 GiB in 10 s).
/// 0.25 GB/s lies between the slowest stretches measured where huge pages
/// paid and the fastest where they did not (the Zen 3 guest: 0.03-0.16
/// GB/s). Where they paid: Zen 4 copied TinyLlama f32's 4.4 GB in 5.5 s
/// (0.8 GB/s); the AMX Xeon guest, its page cache just dropped, copied
/// TinyLlama f16 in 89 stretches at 0.43-6.4 GB/s (median 3.8; 0.62 at the
/// 10th percentile) and decoded 13.6 t/s copied whole against 12.1 with the
/// copy stopped at its first stretch under the 0.5 GB/s this limit was
/// before; in bench/compare_llama.sh's first round of a file such stops
/// left 81-95% of TinyLlama f16 and f32 in the file mapping, 0.85-0.92x the
/// later rounds' decode. 16 MiB is 8 huge pages,
/// and one stretch of TinyLlama's first layer's matrices (wq, wk, wv, wo in
/// f16; wq alone in f32): with 32 MiB the guest's f32 build took 1.2 s to
/// stop copying, its first 36 MiB.
///
/// Before any copy, weight_placement::automatic looks whether file mappings
/// of page_cache_min_bytes or more lie in 2 MiB pages of the page cache
/// itself (detail::file_in_huge_pages): where they do, the matrices that
/// keep their layout stay in place, with no copy and no second memory.
/// 64 MiB keeps the check (a sample mapped, /proc/self/smaps read) off the
/// small models, which stream from the L3 cache.
struct copy_rate_limit {
  double min_bytes_per_s = 0.25e9;
  std::size_t probe_bytes = std::size_t{16} << 20;
  std::size_t page_cache_min_bytes = std::size_t{64} << 20;
};

namespace detail {

/// Whether every one of w's file mappings of min_bytes or more lies in 2
/// MiB pages of the page cache: a sample of eight 2 MiB pages, one from
/// each eighth of the file, is mapped (populate_pages; mapped_file marked
/// the mapping MADV_HUGEPAGE, so what the cache lacks is read in 2 MiB
/// folios) and half of it or more must come as 2 MiB pages (FilePmdMapped
/// in /proc/self/smaps). One 16 MiB sample from the middle (the first
/// version) would judge a file whose page cache mixes 2 MiB and small
/// folios by the stretch it hit; the TinyLlama files here are so mixed
/// (f32 90% or more in 2 MiB folios in most 64 MiB stretches, 50-90% in a
/// quarter of them; q8_0 50-90% almost everywhere). Where the check says
/// no, f32 rows walk as wide instead of far (cpu/streaming.hpp): TinyLlama
/// f32 decoded 6.86 against 7.1-7.4 t/s read in place. False where
/// there is no such mapping or one is not so (a file the page cache holds
/// in small folios, as written; no huge pages for files: tmpfs without
/// huge=, older kernels). Only the sample is mapped here, not the whole
/// file, which would hold the pages of the matrices about to be copied
/// (the interleaved types) and of the token embeddings at once.
/// Where the page cache holds a file in 2 MiB folios (on the AMX Xeon
/// guest's 6.18 kernel, the TinyLlama files dropped from the page cache and
/// read again came back so, through a mapping marked or not), reading it
/// in place takes no copy, no second memory and no fresh pages. A file
/// cached in small folios is not dropped and read again to get them: on
/// the AMX Xeon guest that moved TinyLlama f16 and f32 into memory the host
/// served at 24-28 GB/s against 30-31 before (the same pages mapped 4 KiB
/// at a time read as slowly: it was where they lay, not the page size),
/// and their decode ran 0.81-0.86x as fast, while TinyLlama q8_0's pages
/// landed where they read at 33 GB/s and its decode ran 1.07-1.10x as fast
/// (bench/README.md).
inline bool file_in_huge_pages(const llama_weights& w, std::size_t min_bytes) {
  constexpr std::size_t huge = huge_page_bytes, spots = 8, sample = spots * huge;
  bool any = false;
  for (const auto& m : w.mapped) {
    if (m.size() < min_bytes || m.size() < 2 * sample) continue;
    any = true;
    // One 2 MiB page at the middle of each eighth of the file, given back
    // first (a page an earlier look mapped would not count again), then
    // FilePmdMapped counted before and after mapping them.
    const auto spot = [&](std::size_t i) { return m.data() + m.size() / (2 * spots) * (2 * i + 1) / huge * huge; };
    for (std::size_t i = 0; i < spots; ++i) release_pages(spot(i), huge);
    const std::size_t before = file_pmd_mapped_bytes(m.data(), m.size());
    for (std::size_t i = 0; i < spots; ++i) populate_pages(spot(i), huge);
    const std::size_t after = file_pmd_mapped_bytes(m.data(), m.size());
    if (after < before || after - before < sample / 2) return false;
  }
  return any;
}

/// The matrices decode reads, each view once (a tied classifier's
/// embedding view too): prepare_weights' list.
inline std::vector<weight_view*> decode_views(llama_weights& w) {
  std::vector<weight_view*> views;
  for (auto& L : w.layers)
    for (weight_view* v : L.matrices()) views.push_back(v);
  views.push_back(&w.output);
  if (w.output.data == w.token_embd.data) views.push_back(&w.token_embd);
  return views;
}

/// Marks every one of the views decode reads from memory
/// (weight_view::from_memory) where their distinct bytes together exceed
/// the last-level cache, so that each token streams them from memory
/// rather than from the cache. (kestrel-bench-walk marks the matrices it
/// reads by this rule too.)
inline void mark_from_memory(std::span<weight_view* const> views) {
  std::vector<const void*> seen;
  std::size_t bytes = 0;
  for (const weight_view* v : views)
    if (v->data && std::find(seen.begin(), seen.end(), v->data) == seen.end()) {
      seen.push_back(v->data);
      bytes += v->bytes();
    }
  const bool from_memory = bytes > cpu::last_level_cache_bytes();
  for (weight_view* v : views) v->from_memory = from_memory;
}

/// The same for the matrices of a model (decode_views).
inline void mark_from_memory(llama_weights& w) {
  const std::vector<weight_view*> views = decode_views(w);
  mark_from_memory(views);
}

}  // namespace detail

/// The xsimd kernels of cpu/ on a persistent pool of `n_threads` threads
/// (the caller's thread is one of them).
class cpu_backend {
 public:
  explicit cpu_backend(std::size_t n_threads = 1, weight_placement placement = weight_placement::automatic,
                       copy_rate_limit limit = {})
      : pool_(std::make_unique<cpu::thread_pool>(n_threads)), placement_(placement), limit_(limit) {}

  void matvec(const weight_view& w, const float* x, float* y);
  void matmul(const weight_view& w, const float* x, std::size_t n, float* y);
  /// Optional (model/concepts.hpp): several products of the same n rows of x, x quantized once.
  void matmul_shared(std::span<const cpu::matvec_job> jobs, const float* x, std::size_t n);
  /// Optional (model/concepts.hpp): h = silu(X gate^T) * (X up^T), X (n, cols); up_scratch: (n, gate.rows).
  void matmul_swiglu(const weight_view& gate, const weight_view& up, const float* x, std::size_t n, float* h,
                     float* up_scratch);
  /// Optional (model/concepts.hpp): several products of one x in one parallel region.
  void matvec_fused(std::span<const cpu::matvec_job> jobs, const float* x);
  /// Optional: h = silu(gate x) * (up x) in one parallel region; up_scratch: (gate.rows).
  void matvec_swiglu(const weight_view& gate, const weight_view& up, const float* x, float* h, float* up_scratch);
  void row_to_f32(const weight_view& w, std::size_t row, float* y);
  void rmsnorm(float* y, const float* x, const float* weight, std::size_t n, float eps);
  void layernorm(float* y, const float* x, const float* weight, const float* bias, std::size_t n, float eps);
  void rope(float* x, std::size_t n_heads, std::size_t head_dim, std::size_t pos, const cpu::rope_spec& r);
  /// Optional: rope with the position's angles precomputed (cpu::rope_angles).
  void rope_rotate(float* x, std::size_t n_heads, std::size_t head_dim, const float* cs, const float* sn,
                   const cpu::rope_spec& r);
  void swiglu(float* y, const float* gate, const float* up, std::size_t n);
  void gelu(float* y, const float* x, std::size_t n);
  void add(float* y, const float* x, std::size_t n);
  /// k, v: f32, or f16 from an f16 cache (kv/contiguous.hpp).
  template <class T>
  void attend(const float* q, const T* k, const T* v, std::size_t n_kv, std::size_t head_dim, std::size_t kv_stride,
              float scale, float* out, float* scratch);
  /// Optional: attention of a block of queries x the query heads of one KV
  /// head (cpu/attend_block.hpp), called from inside parallel_for. Its
  /// scratch is the caller's (a.scratch) or per thread and grow-only:
  /// allocated by the first calls of a prompt, then reused.
  template <class T>
  void attend_block(const cpu::basic_attend_block_args<T>& a);
  /// Optional: rows (queries x heads) per prefill attend_block task. A
  /// prompt's tasks on AMX tiles (cpu/attend_amx.hpp) share one layout of
  /// their keys and values among attend_amx_rows (512); the AVX-512 kernel
  /// takes 32.
  std::size_t attend_block_rows(std::size_t head_dim) const noexcept {
    return cpu::attend_amx_available(head_dim) ? cpu::attend_amx_rows : 32;
  }
  template <class F>
  void parallel_for(std::size_t n, F&& f, std::size_t work) { cpu::parallel_for(pool_.get(), n, std::forward<F>(f), work); }
  std::size_t n_threads() const noexcept { return pool_->size(); }

  /// Optional (model/concepts.hpp): with weight_placement::huge_pages or
  /// automatic and where the kernel offers transparent huge pages, copies every weight
  /// matrix that lies in one of the weights' file mappings (w.mapped; a
  /// matrix shared by two views, as tied embeddings, once) into one
  /// huge_page_buffer and points the views at the copy, the threads
  /// splitting the copy. Matrices made at load (transposed, converted) stay
  /// where they are. The norms and biases are copied to a plain buffer. The
  /// token embeddings stay in the mapping unless the output matrix is tied to
  /// them (decode reads one row); the mappings' pages are then all given
  /// back and read again by 4 KiB pages (map_small_pages). With
  /// weight_placement::automatic, a slow copy stops there (copy_rate_limit):
  /// the matrices that keep their layout then stay in the mappings, which
  /// are left as they are; w.copied_bytes says how much moved.
  /// With AVX-512 VNNI or AVX2, q4_K and q6_K matrices are not copied as they are
  /// but interleaved by 16 rows (dtype::q4_k_x16 / q6_k_x16,
  /// quant/kquant_x16.hpp; q4_K the same size, q6_K 1% larger), which
  /// decode's kernel reads a row per lane; the views take the new type. With
  /// AVX2 and without VNNI, q2_K, q3_K, q5_K, q4_0, q4_1, q5_0, q5_1 and
  /// q8_0 matrices too (dtype::q2_k_x16, ...; quant/kquant_x16.hpp,
  /// quant/legacy_x16.hpp; the same size, q3_K 2% larger).
  void prepare_weights(llama_weights& w);

 private:
  /// The type a matrix gets in prepare_weights' copy.
  static dtype copy_type(const weight_view& v) noexcept {
#if defined(KESTREL_X16_KERNEL)
    if (v.type == dtype::q4_k) return dtype::q4_k_x16;
    if (v.type == dtype::q6_k) return dtype::q6_k_x16;
    if (v.type == dtype::q5_k && quant::x16_kernel<quant::block_q5_K_x16>) return dtype::q5_k_x16;
    if (v.type == dtype::q3_k && quant::x16_kernel<quant::block_q3_K_x16>) return dtype::q3_k_x16;
    if (v.type == dtype::q2_k && quant::x16_kernel<quant::block_q2_K_x16>) return dtype::q2_k_x16;
#endif
#if defined(KESTREL_LEGACY_X16_AVX2)
    if (v.type == dtype::q4_0) return dtype::q4_0_x16;
    if (v.type == dtype::q4_1) return dtype::q4_1_x16;
    if (v.type == dtype::q5_0) return dtype::q5_0_x16;
    if (v.type == dtype::q5_1) return dtype::q5_1_x16;
    if (v.type == dtype::q8_0) return dtype::q8_0_x16;
#endif
    return v.type;
  }

  /// n bytes from the file mapping at src to dst, by 2 MiB chunks, each
  /// chunk's file pages given back once copied, so the process never holds a
  /// large matrix twice (tied embeddings are a quarter of a small model).
  /// The chunks follow the 2 MiB grid of the file's addresses, so every
  /// whole page of the matrix lies in one chunk and is given back with it.
  void copy_matrix(const std::byte* src, std::size_t n, std::byte* dst) {
    const std::size_t chunk = huge_page_buffer::huge_page;
    const std::size_t skew = reinterpret_cast<std::uintptr_t>(src) % chunk;
    cpu::parallel_for(pool_.get(), (skew + n + chunk - 1) / chunk, [&](std::size_t c0, std::size_t c1) {
      for (std::size_t c = c0; c < c1; ++c) {
        const std::size_t lo = c == 0 ? 0 : c * chunk - skew, hi = std::min(n, (c + 1) * chunk - skew);
        std::memcpy(dst + lo, src + lo, hi - lo);
        release_pages(src + lo, hi - lo);
      }
    }, n);
  }

  /// A matrix (in the file mapping) whose copy_type is an x16 layout,
  /// interleaved into dst, the threads splitting the panels; as copy_matrix, the
  /// file's pages are given back as their rows are packed (the whole pages
  /// inside each run; the pages a run boundary cuts go back with the whole
  /// mappings at the end of prepare_weights).
  void interleave(const weight_view& v, std::byte* dst) {
    weight_view target = v;  // copy_type's layout, whose block type visit_x16 names
    target.type = copy_type(v);
    target.data = dst;
    cpu::detail::visit_x16(target, [&](const auto* panels) {
      using X = std::remove_cv_t<std::remove_pointer_t<decltype(panels)>>;
      X* const out = reinterpret_cast<X*>(dst);
      const auto* src = static_cast<const std::byte*>(v.data);
      const std::size_t row_bytes = v.row_bytes(), n_panels = (v.rows + 15) / 16;
      // Panels in runs of about 2 MiB of source, so pages go back as the copy proceeds.
      const std::size_t per_run = std::max<std::size_t>(1, huge_page_buffer::huge_page / (16 * row_bytes));
      cpu::parallel_for(pool_.get(), (n_panels + per_run - 1) / per_run, [&](std::size_t r0, std::size_t r1) {
        for (std::size_t r = r0; r < r1; ++r) {
          const std::size_t p0 = r * per_run, p1 = std::min(n_panels, p0 + per_run);
          quant::pack_x16_panels(src, row_bytes, v.rows, v.cols, p0, p1, out);
          const std::size_t lo = 16 * p0 * row_bytes, hi = std::min(v.rows, 16 * p1) * row_bytes;
          release_pages(src + lo, hi - lo);
        }
      }, v.rows * row_bytes);
    });
  }

  std::unique_ptr<cpu::thread_pool> pool_;  // behind a pointer so the backend can move into a model
  weight_placement placement_;
  copy_rate_limit limit_;
};

#if KESTREL_SEPARATE_DEFINE
// cpu_backend's kernels: defined here in the header-only build, and in the
// one translation unit of a separate compilation (core/separate.hpp).
#define KESTREL_CPU_BACKEND_FN KESTREL_SEPARATE_INLINE void cpu_backend::
KESTREL_CPU_BACKEND_FN matvec(const weight_view& w, const float* x, float* y) { cpu::matvec(w, x, y, pool_.get()); }
KESTREL_CPU_BACKEND_FN matmul(const weight_view& w, const float* x, std::size_t n, float* y) {
  cpu::matmul(w, x, n, y, pool_.get());
}
KESTREL_CPU_BACKEND_FN matmul_shared(std::span<const cpu::matvec_job> jobs, const float* x, std::size_t n) {
  cpu::matmul_shared(jobs, x, n, pool_.get());
}
KESTREL_CPU_BACKEND_FN matmul_swiglu(const weight_view& gate, const weight_view& up, const float* x, std::size_t n,
                                     float* h, float* up_scratch) {
  cpu::matmul_swiglu(gate, up, x, n, h, up_scratch, pool_.get());
}
KESTREL_CPU_BACKEND_FN matvec_fused(std::span<const cpu::matvec_job> jobs, const float* x) {
  cpu::matvec_fused(jobs, x, pool_.get());
}
KESTREL_CPU_BACKEND_FN matvec_swiglu(const weight_view& gate, const weight_view& up, const float* x, float* h,
                                     float* up_scratch) {
  cpu::matvec_swiglu(gate, up, x, h, up_scratch, pool_.get());
}
KESTREL_CPU_BACKEND_FN row_to_f32(const weight_view& w, std::size_t row, float* y) { cpu::row_to_f32(w, row, y); }
KESTREL_CPU_BACKEND_FN rmsnorm(float* y, const float* x, const float* weight, std::size_t n, float eps) {
  cpu::rmsnorm(y, x, weight, n, eps);
}
KESTREL_CPU_BACKEND_FN layernorm(float* y, const float* x, const float* weight, const float* bias, std::size_t n,
                                 float eps) {
  cpu::layernorm(y, x, weight, bias, n, eps);
}
KESTREL_CPU_BACKEND_FN rope(float* x, std::size_t n_heads, std::size_t head_dim, std::size_t pos,
                            const cpu::rope_spec& r) {
  cpu::rope(x, n_heads, head_dim, pos, r);
}
KESTREL_CPU_BACKEND_FN rope_rotate(float* x, std::size_t n_heads, std::size_t head_dim, const float* cs,
                                   const float* sn, const cpu::rope_spec& r) {
  cpu::rope_rotate(x, n_heads, head_dim, cs, sn, r);
}
KESTREL_CPU_BACKEND_FN swiglu(float* y, const float* gate, const float* up, std::size_t n) { cpu::swiglu(y, gate, up, n); }
KESTREL_CPU_BACKEND_FN gelu(float* y, const float* x, std::size_t n) { cpu::gelu(y, x, n); }
KESTREL_CPU_BACKEND_FN add(float* y, const float* x, std::size_t n) { cpu::add(y, x, n); }
template <class T>
KESTREL_CPU_BACKEND_FN attend(const float* q, const T* k, const T* v, std::size_t n_kv, std::size_t head_dim,
                              std::size_t kv_stride, float scale, float* out, float* scratch) {
  cpu::attend(q, k, v, n_kv, head_dim, kv_stride, scale, out, scratch);
}
template <class T>
KESTREL_CPU_BACKEND_FN attend_block(const cpu::basic_attend_block_args<T>& a) {
  if (a.scratch) return cpu::attend_block(a, a.scratch);
  // A prompt's block (the caller gives no scratch): on AMX tiles where the
  // CPU has them and the head is whole 32-element chunks.
  thread_local aligned_buffer<float> scratch;
  const bool tiles = cpu::attend_amx_available(a.head_dim);
  const std::size_t need = tiles ? cpu::attend_block_amx_scratch_size(a) : cpu::attend_block_scratch_size(a);
  if (scratch.size() < need) scratch = aligned_buffer<float>(need);
  if (tiles) return cpu::attend_block_amx(a, scratch.data());
  cpu::attend_block(a, scratch.data());
}
KESTREL_CPU_BACKEND_FN prepare_weights(llama_weights& w) {
  detail::mark_from_memory(w);
  if (placement_ == weight_placement::file || w.mapped.empty() || !transparent_huge_pages()) return;
  // automatic: the file mappings in 2 MiB pages of the page cache, where
  // they can be, keep the plain matrices in place.
  const bool file_huge =
      placement_ == weight_placement::automatic && detail::file_in_huge_pages(w, limit_.page_cache_min_bytes);
  const std::vector<weight_view*> views = detail::decode_views(w);
  // Each distinct matrix once, 64-byte aligned in the copy.
  struct place {
    const std::byte* src = nullptr;  // null: nothing to place
    std::size_t offset = 0;          // in the copy
    std::size_t first = 0;           // index of the view that copies it (itself for the first)
    dtype type = dtype::f32;         // its type in the copy
  };
  std::vector<place> where;
  std::size_t total = 0;
  for (std::size_t i = 0; i < views.size(); ++i) {
    const weight_view* v = views[i];
    const auto* src = static_cast<const std::byte*>(v->data);
    const auto seen = std::find_if(where.begin(), where.end(), [&](const place& p) { return p.src == src; });
    if (src == nullptr || v->bytes() == 0 || !w.in_mapping(src, v->bytes())) where.push_back({});
    else if (seen != where.end()) where.push_back(*seen);
    else {
      const dtype type = copy_type(*v);
      where.push_back({src, total, i, type});
      if (!file_huge || type != v->type)  // file_huge keeps the plain ones in place
        total += (weight_view{type, nullptr, v->rows, v->cols}.bytes() + 63) / 64 * 64;
    }
  }
  if (total == 0 && !file_huge) return;
  std::shared_ptr<huge_page_buffer> copy;
  try {
    if (total > 0) copy = std::make_shared<huge_page_buffer>(total);
  } catch (const error&) {
    return;  // no memory to map: the weights stay where they are, as with weight_placement::file
  }
  // weight_placement::automatic: the copy's rate over each stretch of
  // probe_bytes decides whether the matrices that keep their layout go on
  // following. Not its first stretch alone: memory another process has
  // just freed faults in fast, fresh memory after it may not.
  using clock = std::chrono::steady_clock;
  const bool adaptive = placement_ == weight_placement::automatic;
  bool copy_plain = true, left = false;  // left: a matrix stayed in a mapping
  std::size_t copied = 0, stretch = 0;
  auto stretch_start = clock::now();
  for (std::size_t i = 0; i < views.size(); ++i) {
    const place& p = where[i];
    if (p.src == nullptr) continue;
    if (p.first != i) {  // a matrix an earlier view placed: this view follows it, copied or not
      views[i]->data = views[p.first]->data;
      views[i]->type = views[p.first]->type;
      views[i]->huge_pages = views[p.first]->huge_pages;
      continue;
    }
    const bool relayout = p.type != views[i]->type;
    if (!relayout && file_huge) {
      views[i]->huge_pages = true;  // in place, in the page cache's 2 MiB pages
      left = true;
      continue;
    }
    if (!relayout && !copy_plain) {
      left = true;  // stays in the file mapping
      continue;
    }
    if (adaptive && copy_plain) {
      // The file's pages come in before the copy is timed: reading them
      // (from disk, where the page cache has let them go) is the load's
      // cost in either placement, since decode would fault them in from
      // the mapping, not the copy's. Timed with them, a file that had left
      // the page cache stopped the copy early: TinyLlama f16 after the
      // caches were dropped copied 0.9 of 2.07 GB and decoded 12.1 t/s
      // against 13.6 copied whole; the first of three rounds of
      // bench/compare_llama.sh copied 5-19% of TinyLlama f16 and f32 and
      // decoded 0.85-0.92x as fast as the later rounds.
      const auto t0 = clock::now();
      touch_pages(p.src, views[i]->bytes());
      stretch_start += clock::now() - t0;
    }
    std::byte* const dst = copy->data() + p.offset;
    if (relayout) interleave(*views[i], dst);
    else copy_matrix(p.src, views[i]->bytes(), dst);
    copied += views[i]->bytes();
    stretch += views[i]->bytes();
    if (adaptive && copy_plain && stretch >= limit_.probe_bytes) {
      const auto now = clock::now();
      const double s = std::chrono::duration<double>(now - stretch_start).count();
      copy_plain = static_cast<double>(stretch) >= limit_.min_bytes_per_s * s;
      stretch = 0;
      stretch_start = now;
    }
    views[i]->data = dst;
    views[i]->type = p.type;
    views[i]->huge_pages = true;
  }
  w.copied_bytes = copied;
  // The norms and biases too, into a plain buffer: then nothing but the
  // token embeddings is read from the file after this, and the whole
  // mappings can be given back. Where the page cache holds the file in
  // large folios, a fault maps the whole folio around the byte read: a
  // norm read beside a matrix brought up to 2 MiB of that matrix back.
  struct placed {
    std::shared_ptr<huge_page_buffer> matrices;
    std::vector<float> vectors;
  };
  auto moved = std::make_shared<placed>();
  moved->matrices = std::move(copy);
  std::vector<std::pair<const float**, std::size_t>> vecs;  // those in a mapping
  std::size_t n_floats = 0;
  auto take = [&](const std::pair<const float**, std::size_t>& v) {
    if (*v.first && w.in_mapping(*v.first, v.second * sizeof(float))) {
      vecs.push_back(v);
      n_floats += v.second;
    }
  };
  for (auto& L : w.layers)
    for (const auto& v : L.vectors(w.hparams)) take(v);
  take({&w.output_norm, w.hparams.n_embd});
  take({&w.output_norm_b, w.hparams.n_embd});
  moved->vectors.resize(n_floats);
  float* at = moved->vectors.data();
  // Each vector's 2 MiB around it given back once copied: where the page
  // cache holds the file in 2 MiB folios, reading a norm mapped the whole
  // folio (a small-page mapping, map_small_pages, did not change that on
  // the 6.18 guest), and TinyLlama Q4_K_M's 45 norms held 74 MB at once,
  // its peak RSS over file + KV cache + 64 MiB.
  for (const auto& [p, n] : vecs) {
    const auto* src = reinterpret_cast<const std::byte*>(*p);
    std::memcpy(at, src, n * sizeof(float));
    const std::size_t grid = huge_page_bytes;
    for (const auto& m : w.mapped)
      if (src >= m.data() && src < m.data() + m.size()) {
        const std::size_t off = static_cast<std::size_t>(src - m.data());
        const std::size_t lo = off / grid * grid, hi = std::min(m.size(), (off + n * sizeof(float) + grid - 1) / grid * grid);
        release_pages(m.data() + lo, hi - lo);
      }
    *p = at;
    at += n;
  }
  w.copy = std::move(moved);
  if (left) {  // matrices left in the mappings are read from there
    // but the token embeddings (not tied) a row per token: by small pages,
    // or each row read maps the 2 MiB folio around it (mapped_file asks
    // for them), as the tail below does for whole mappings.
    const auto* emb = static_cast<const std::byte*>(w.token_embd.data);
    if (emb && emb != w.output.data && w.in_mapping(emb, w.token_embd.bytes())) {
      release_pages(emb, w.token_embd.bytes());
      map_small_pages(emb, w.token_embd.bytes());
    }
    return;
  }
  // What stays in the mappings (the token embeddings, rope frequencies)
  // is read a row at a time: give every page back, and map what is read
  // again by small pages (core/mmap.hpp).
  for (const auto& m : w.mapped) {
    release_pages(m.data(), m.size());
    map_small_pages(m.data(), m.size());
  }
}
#undef KESTREL_CPU_BACKEND_FN
#if defined(KESTREL_SEPARATE)
// The attention templates for the KV cache's element types
// (kv/contiguous.hpp), instantiated in the one translation unit that
// defines the separate parts (KESTREL_SEPARATE_IMPL): the others see only
// their declarations.
template void cpu_backend::attend<float>(const float*, const float*, const float*, std::size_t, std::size_t,
                                         std::size_t, float, float*, float*);
template void cpu_backend::attend<f16>(const float*, const f16*, const f16*, std::size_t, std::size_t, std::size_t,
                                       float, float*, float*);
template void cpu_backend::attend_block<float>(const cpu::basic_attend_block_args<float>&);
template void cpu_backend::attend_block<f16>(const cpu::basic_attend_block_args<f16>&);
#endif
#endif  // KESTREL_SEPARATE_DEFINE

/// The scalar twins of cpu/ref/, single-threaded: the reference the fast
/// backend is tested against, end to end.
class cpu_ref_backend {
 public:
  explicit cpu_ref_backend(std::size_t = 1) {}

  // These three are compiled with cpu_backend's kernels (core/separate.hpp):
  // the quantized products share their dispatch, whose scalar twins are picked at run time.
  void matvec(const weight_view& w, const float* x, float* y);
  void matmul(const weight_view& w, const float* x, std::size_t n, float* y);
  void row_to_f32(const weight_view& w, std::size_t row, float* y);
  void rmsnorm(float* y, const float* x, const float* weight, std::size_t n, float eps) { cpu::ref::rmsnorm(y, x, weight, n, eps); }
  void layernorm(float* y, const float* x, const float* weight, const float* bias, std::size_t n, float eps) {
    cpu::ref::layernorm(y, x, weight, bias, n, eps);
  }
  void rope(float* x, std::size_t n_heads, std::size_t head_dim, std::size_t pos, const cpu::rope_spec& r) {
    cpu::ref::rope(x, n_heads, head_dim, pos, r);
  }
  void swiglu(float* y, const float* gate, const float* up, std::size_t n) { cpu::ref::swiglu(y, gate, up, n); }
  void gelu(float* y, const float* x, std::size_t n) { cpu::ref::gelu(y, x, n); }
  void add(float* y, const float* x, std::size_t n) { cpu::ref::add(y, x, n); }
  template <class T>
  void attend(const float* q, const T* k, const T* v, std::size_t n_kv, std::size_t head_dim, std::size_t kv_stride,
              float scale, float* out, float* scratch) {
    cpu::ref::attend(q, k, v, n_kv, head_dim, kv_stride, scale, out, scratch);
  }
  template <class F>
  void parallel_for(std::size_t n, F&& f, std::size_t /*work*/) { if (n) f(std::size_t{0}, n); }
  std::size_t n_threads() const noexcept { return 1; }
};

#if KESTREL_SEPARATE_DEFINE
KESTREL_SEPARATE_INLINE void cpu_ref_backend::matvec(const weight_view& w, const float* x, float* y) {
  cpu::ref::matvec(w, x, y, nullptr);
}
KESTREL_SEPARATE_INLINE void cpu_ref_backend::matmul(const weight_view& w, const float* x, std::size_t n, float* y) {
  cpu::ref::matmul(w, x, n, y, nullptr);
}
KESTREL_SEPARATE_INLINE void cpu_ref_backend::row_to_f32(const weight_view& w, std::size_t row, float* y) {
  cpu::ref::row_to_f32(w, row, y);
}
#endif

static_assert(Backend<cpu_backend>);
static_assert(Backend<cpu_ref_backend>);

}  // namespace kestrel
