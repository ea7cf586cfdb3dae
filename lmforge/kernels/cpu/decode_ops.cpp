// torch operators over the decode kernels (decode_kernels.h): lmforge_cpu::dense_mm, int8_mm
// and int4_mm, paged_attention and sample_rows (decode_softmax.h), each taking the instruction set to run ("avx512" or "avx2") as an argument, so the
// choice stays in Python (lmforge/kernels/cpu_decode.py) and either can be forced in a test.
// Rows of W are split across torch's intra-op threads; x is processed 8 rows at a time. A weight
// is row-major (N, K) or tiled (N / 8, K / 16, 8, 16): decode_kernels.h's Layout, which
// lmforge/kernels/cpu_decode.py's `tile` writes.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "decode_entry_points.h"

namespace lmforge_decode {
#if defined(__x86_64__) || defined(_M_X64)
LMFORGE_DECODE_ENTRY_POINTS(avx512)
LMFORGE_DECODE_ENTRY_POINTS(avx2)
#endif
}  // namespace lmforge_decode

namespace {

constexpr int64_t MAX_ROWS = 8;    // rows of x per pass over W (the kernels' register blocks)
// Bytes of W a thread reads at least: below this, waking a second thread costs more than it
// saves (a 2048 x 768 int4 matrix, 0.8 MB, decodes faster on one thread than on two).
constexpr int64_t MIN_BYTES_PER_THREAD = 1 << 20;
constexpr int64_t K_MULTIPLE = 16; // both vector widths divide it
constexpr int64_t TILE_ROWS = 8, UNIT = 16;  // a tiled weight's (decode_kernels.h)

bool wide(const std::string& isa) {
  TORCH_CHECK(isa == "avx512" || isa == "avx2", "lmforge_cpu: unknown instruction set ", isa);
#if !(defined(__x86_64__) || defined(_M_X64))
  TORCH_CHECK(false, "lmforge_cpu: the decode kernels are built for x86-64 only");
#endif
  return isa == "avx512";
}

bool tiled(const at::Tensor& w) { return w.dim() == 4; }

// W's rows and the elements of each, in either layout.
int64_t rows(const at::Tensor& w) { return tiled(w) ? w.size(0) * TILE_ROWS : w.size(0); }
int64_t row_elements(const at::Tensor& w) { return tiled(w) ? w.size(1) * UNIT : w.size(1); }

// inputs_per_element: 2 for packed int4, else 1.
void check_operands(const at::Tensor& x, const at::Tensor& w, int64_t inputs_per_element) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "lmforge_cpu: x must be a contiguous 2-D float32 tensor");
  TORCH_CHECK(w.is_contiguous() && (w.dim() == 2 || (w.dim() == 4 && w.size(2) == TILE_ROWS &&
                                                     w.size(3) == UNIT)),
              "lmforge_cpu: the weight must be contiguous, 2-D or tiled (rows / 8, elements / "
              "16, 8, 16)");
  const int64_t inputs = row_elements(w) * inputs_per_element;
  TORCH_CHECK(x.size(1) == inputs, "lmforge_cpu: x has ", x.size(1), " inputs, the weight ",
              inputs);
  TORCH_CHECK(x.size(1) % K_MULTIPLE == 0, "lmforge_cpu: inputs must be a multiple of ",
              K_MULTIPLE);
}

// Runs kernel(rows of x, m, n0, n1) over chunks of at most MAX_ROWS rows and W's row ranges
// (whole tiles of a tiled W), for a W of N rows of row_bytes bytes each.
template <class Kernel>
at::Tensor run(const at::Tensor& x, int64_t N, int64_t row_bytes, bool tiled, Kernel kernel) {
  const int64_t step = tiled ? TILE_ROWS : 1;
  const int64_t grain = std::max<int64_t>(1, MIN_BYTES_PER_THREAD / (row_bytes * step));
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  const int64_t M = x.size(0), K = x.size(1);
  for (int64_t m0 = 0; m0 < M; m0 += MAX_ROWS) {
    const int64_t m = std::min(MAX_ROWS, M - m0);
    const float* xs = x.data_ptr<float>() + m0 * K;
    float* ys = y.data_ptr<float>() + m0 * N;
    at::parallel_for(0, N / step, grain, [&](int64_t t0, int64_t t1) {
      kernel(xs, ys, m0, m, t0 * step, t1 * step);
    });
  }
  return y;
}

at::Tensor dense_mm(const at::Tensor& x, const at::Tensor& w, const std::string& isa) {
  check_operands(x, w, 1);
  TORCH_CHECK(w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16,
              "lmforge_cpu::dense_mm: the weight must be float32 or bfloat16");
  const bool avx512 = wide(isa), t = tiled(w);
  const int64_t K = x.size(1), N = rows(w);
  const bool bf16 = w.scalar_type() == at::kBFloat16;
  const void* wp = w.data_ptr();
  return run(x, N, K * w.element_size(), t, [&](const float* xs, float* ys, int64_t, int64_t m,
                                                 int64_t n0, int64_t n1) {
#if defined(__x86_64__) || defined(_M_X64)
    using namespace lmforge_decode;
    if (bf16) {
      auto* wb = static_cast<const uint16_t*>(wp);
      (avx512 ? dense_bf16_avx512 : dense_bf16_avx2)(xs, m, K, wb, t, ys, n0, n1, N);
    } else {
      auto* wf = static_cast<const float*>(wp);
      (avx512 ? dense_f32_avx512 : dense_f32_avx2)(xs, m, K, wf, t, ys, n0, n1, N);
    }
#endif
  });
}

// x rounded to int16 with one scale per row (and, with group > 0, its sums per group), which the
// integer kernels multiply the codes by, in the kernels' layout for each pass of MAX_ROWS rows.
// The buffers are the calling thread's, reused by its next call (the kernels read them only
// within this one): a decode step makes a hundred such calls, and allocating three tensors
// took 1.1 us of a small product's 6.6 (one Zen 3 thread).
struct QuantizedRows {
  const int16_t* xq;
  const float* dx;
  const float* xsum;
};

QuantizedRows quantize(const at::Tensor& x, int64_t group, bool avx512) {
  const int64_t M = x.size(0), K = x.size(1), groups = group > 0 ? K / group : 0;
  thread_local std::vector<int16_t> xq;
  thread_local std::vector<float> dx, xsum;
  xq.resize(M * K);
  dx.resize(M);
  xsum.resize(std::max<int64_t>(1, M * groups));
#if defined(__x86_64__) || defined(_M_X64)
  using namespace lmforge_decode;
  for (int64_t m0 = 0; m0 < M; m0 += MAX_ROWS) {  // each pass's rows laid out together
    const int64_t m = std::min(MAX_ROWS, M - m0);
    (avx512 ? quantize_avx512 : quantize_avx2)(x.data_ptr<float>() + m0 * K, m, K, group,
                                               xq.data() + m0 * K, dx.data() + m0,
                                               xsum.data() + m0 * groups);
  }
#endif
  return {xq.data(), dx.data(), xsum.data()};
}

at::Tensor int8_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales,
                   const std::string& isa) {
  check_operands(x, w, 1);
  TORCH_CHECK(w.scalar_type() == at::kChar, "lmforge_cpu::int8_mm: the weight must be int8");
  const bool avx512 = wide(isa), t = tiled(w);
  const int64_t K = x.size(1), N = rows(w);
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.numel() == N,
              "lmforge_cpu::int8_mm: scales must be float32, one per row of the weight");
  const QuantizedRows q = quantize(x, 0, avx512);
  const int16_t* xq = q.xq;
  const float* dx = q.dx;
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  return run(x, N, K, t, [&](const float*, float* ys, int64_t m0, int64_t m, int64_t n0,
                             int64_t n1) {
#if defined(__x86_64__) || defined(_M_X64)
    using namespace lmforge_decode;
    (avx512 ? int8_avx512 : int8_avx2)(xq + m0 * K, dx + m0, m, K, wp, t, sp, ys, n0, n1,
                                       N);
#endif
  });
}

at::Tensor int4_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales,
                   const at::Tensor& zeros, int64_t group_size, const std::string& isa) {
  TORCH_CHECK(w.scalar_type() == at::kByte, "lmforge_cpu::int4_mm: the weight must be uint8");
  check_operands(x, w, 2);
  TORCH_CHECK(group_size % (2 * K_MULTIPLE) == 0 && x.size(1) % group_size == 0,
              "lmforge_cpu::int4_mm: the group size must be a multiple of 32 dividing the inputs");
  const bool t = tiled(w);
  const int64_t K = x.size(1), N = rows(w), groups = K / group_size;
  for (const at::Tensor* t : {&scales, &zeros}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() &&
                    t->numel() == N * groups,
                "lmforge_cpu::int4_mm: scales and zeros must be float32 (rows, groups)");
  }
  const bool avx512 = wide(isa);
  const QuantizedRows q = quantize(x, group_size, avx512);
  const int16_t* xq = q.xq;
  const float *dx = q.dx, *xsum = q.xsum;
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const float *sp = scales.data_ptr<float>(), *zp = zeros.data_ptr<float>();
  return run(x, N, K / 2, t, [&](const float*, float* ys, int64_t m0, int64_t m, int64_t n0,
                                 int64_t n1) {
#if defined(__x86_64__) || defined(_M_X64)
    using namespace lmforge_decode;
    (avx512 ? int4_avx512 : int4_avx2)(xq + m0 * K, dx + m0, xsum + m0 * groups, m, K,
                                       group_size, wp, t, sp, zp, ys, n0, n1, N);
#endif
  });
}

// A decode step's attention over the paged KV cache: q (B, H, D), one query per row; k_pool and
// v_pool one layer's (H_kv, blocks, block_size, D); k_new, v_new (B, H_kv, D), each row's new
// key and value, not yet in the pool; tables (B, W) each row's blocks; lengths (B) each row's
// cached positions (at most W * block_size). Gives (B, H, D). Rows and key heads are split
// across torch's intra-op threads.
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
                           const at::Tensor& k_new, const at::Tensor& v_new,
                           const at::Tensor& tables, const at::Tensor& lengths,
                           const std::string& isa) {
  const bool avx512 = wide(isa);
  TORCH_CHECK(q.dim() == 3 && k_pool.dim() == 4 && k_new.dim() == 3 && tables.dim() == 2,
              "lmforge_cpu::paged_attention: q (B, H, D), pools (H_kv, blocks, block_size, D), "
              "new keys (B, H_kv, D), tables (B, W)");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), H_kv = k_pool.size(0);
  const int64_t n_blocks = k_pool.size(1), block_size = k_pool.size(2), W = tables.size(1);
  for (const at::Tensor* t : {&q, &k_pool, &v_pool, &k_new, &v_new}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous(),
                "lmforge_cpu::paged_attention: q, the pools and the new keys and values must be "
                "contiguous float32");
  }
  TORCH_CHECK(v_pool.sizes() == k_pool.sizes() && k_pool.size(3) == D &&
                  k_new.sizes() == at::IntArrayRef({B, H_kv, D}) && v_new.sizes() == k_new.sizes(),
              "lmforge_cpu::paged_attention: the pools' and new keys' shapes do not match q's");
  TORCH_CHECK(D % 8 == 0 && H % H_kv == 0 && H / H_kv <= 64,
              "lmforge_cpu::paged_attention: the head dim must be a multiple of 8 and the key "
              "heads divide the query heads (at most 64 to one)");
  TORCH_CHECK(tables.scalar_type() == at::kLong && tables.is_contiguous() && tables.size(0) == B &&
                  lengths.scalar_type() == at::kLong && lengths.numel() == B,
              "lmforge_cpu::paged_attention: tables (B, W) and lengths (B) must be int64");
  const at::Tensor lengths_c = lengths.contiguous();
  const int64_t* table = tables.data_ptr<int64_t>();
  const int64_t* length = lengths_c.data_ptr<int64_t>();
  int64_t longest = 0;
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(0 <= length[b] && length[b] <= W * block_size,
                "lmforge_cpu::paged_attention: row ", b, " has ", length[b],
                " cached positions, its table holds ", W * block_size);
    for (int64_t i = 0; i < (length[b] + block_size - 1) / block_size; ++i) {
      TORCH_CHECK(0 <= table[b * W + i] && table[b * W + i] < n_blocks,
                  "lmforge_cpu::paged_attention: row ", b, " names block ", table[b * W + i],
                  " of ", n_blocks);
    }
    longest = std::max(longest, length[b]);
  }
  const int64_t G = H / H_kv, stride = (longest + 8) / 8 * 8;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  at::Tensor out = at::empty_like(q);
  const float *qp = q.data_ptr<float>(), *kp = k_pool.data_ptr<float>();
  const float *vp = v_pool.data_ptr<float>(), *kn = k_new.data_ptr<float>();
  const float* vn = v_new.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t head_elements = n_blocks * block_size * D;
  at::parallel_for(0, B * H_kv, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores(G * stride);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / H_kv, h = i % H_kv;
#if defined(__x86_64__) || defined(_M_X64)
      using namespace lmforge_decode;
      (avx512 ? attend_head_avx512 : attend_head_avx2)(
          qp + (b * H + h * G) * D, kp + h * head_elements, vp + h * head_elements,
          kn + (b * H_kv + h) * D, vn + (b * H_kv + h) * D, table + b * W, length[b], G, D,
          block_size, scale, scores.data(), op + (b * H + h * G) * D);
#endif
    }
  });
  return out;
}

// One token per row of x (n, V) float32, -inf where masked: the first whose cumulative softmax
// weight exceeds u (n) float32 in [0, 1) of the row's total. Rows are split across threads.
at::Tensor sample_rows(const at::Tensor& x, const at::Tensor& u, const std::string& isa) {
  const bool avx512 = wide(isa);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() &&
                  x.size(1) > 0,
              "lmforge_cpu::sample_rows: x must be a contiguous (rows, vocab) float32 tensor");
  TORCH_CHECK(u.scalar_type() == at::kFloat && u.numel() == x.size(0),
              "lmforge_cpu::sample_rows: u must be float32, one per row");
  const at::Tensor uc = u.contiguous();
  const int64_t n = x.size(0), V = x.size(1);
  at::Tensor tokens = at::empty({n}, x.options().dtype(at::kLong));
  const float *xp = x.data_ptr<float>(), *up = uc.data_ptr<float>();
  int64_t* tp = tokens.data_ptr<int64_t>();
  at::parallel_for(0, n, std::max<int64_t>(1, (1 << 16) / V), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
#if defined(__x86_64__) || defined(_M_X64)
      using namespace lmforge_decode;
      tp[r] = (avx512 ? sample_row_avx512 : sample_row_avx2)(xp + r * V, V, up[r]);
#endif
    }
  });
  return tokens;
}

}  // namespace

TORCH_LIBRARY(lmforge_cpu, m) {
  m.def("dense_mm(Tensor x, Tensor weight, str isa) -> Tensor");
  m.def("int8_mm(Tensor x, Tensor weight, Tensor scales, str isa) -> Tensor");
  m.def(
      "int4_mm(Tensor x, Tensor weight, Tensor scales, Tensor zeros, int group_size, str isa) "
      "-> Tensor");
  m.def(
      "paged_attention(Tensor q, Tensor k_pool, Tensor v_pool, Tensor k_new, Tensor v_new, "
      "Tensor tables, Tensor lengths, str isa) -> Tensor");
  m.def("sample_rows(Tensor x, Tensor u, str isa) -> Tensor");
}

TORCH_LIBRARY_IMPL(lmforge_cpu, CPU, m) {
  m.impl("dense_mm", &dense_mm);
  m.impl("int8_mm", &int8_mm);
  m.impl("int4_mm", &int4_mm);
  m.impl("paged_attention", &paged_attention);
  m.impl("sample_rows", &sample_rows);
}
