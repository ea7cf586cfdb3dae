// Weight-only matrix products for decoding, written once and compiled once per instruction set
// (decode_avx2.cpp, decode_avx512.cpp): y[m, n] = sum_k x[m, k] * W[n, k] for a few rows m of
// fp32 activations and a weight W stored as int8 with one scale per row, packed int4 with a
// scale and a zero point per group of inputs (lmforge's half-group nibble layout,
// quant/schemes.py), bf16, or fp32.
//
// Decode is bound by the bytes of W it reads, so each kernel reads W exactly once per call, in
// order, and reuses every loaded piece of W for all rows of x and every loaded piece of x for R
// rows of W (R * rows accumulators in registers).
// - Float weights are widened to fp32 in registers and multiplied over the set's vector type V.
// - Integer weights are multiplied as integers: each row of x is first rounded to int16 with one
//   scale (x ~ dx * xq: an error of at most 2^-16 of the row's largest value, 128 times finer
//   than bf16's rounding), and the codes, widened to 16 bits, meet it in pairwise multiply-adds
//   into 32-bit sums (vpmaddwd; one vpdpwssd with AVX-512 VNNI). That is a third of the
//   instructions of converting every code to fp32, which made int4 slower than int8 although it
//   reads half the bytes. These use 256-bit vectors in both builds (16-bit lanes fill them),
//   except int8 over a tiled W with AVX-512, which pairs rows in 512-bit ones (int8_pairs).
//
// No torch header is included here: this code is compiled with instruction-set flags, and any
// inline function it shared with the rest of the library could be linked into code that runs
// on a CPU without those instructions.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "decode_entry_points.h"

namespace lmforge_decode {
namespace {

template <int N>
using Int = std::integral_constant<int, N>;

// Calls f(Int<M>) for a run-time number of rows M in 1..8, so each count gets its own registers.
template <class F>
inline void with_rows(int64_t M, F f) {
  switch (M) {
    case 1: return f(Int<1>{});
    case 2: return f(Int<2>{});
    case 3: return f(Int<3>{});
    case 4: return f(Int<4>{});
    case 5: return f(Int<5>{});
    case 6: return f(Int<6>{});
    case 7: return f(Int<7>{});
    default: return f(Int<8>{});
  }
}

// Rows n0..n1 of W in blocks of R = ACC / M rows (ACC accumulators), then one row at a time.
template <int ACC, int M, class Block>
inline void by_blocks(int64_t n0, int64_t n1, Block block) {
  constexpr int R = ACC / M > 0 ? ACC / M : 1;
  int64_t n = n0;
  for (; n + R <= n1; n += R) block(Int<R>{}, n);
  for (; n < n1; ++n) block(Int<1>{}, n);
}

// Where W's elements lie. Row-major: row n's element k at n * K + k. Tiled: TILE_ROWS rows at a
// time, their UNIT-element pieces interleaved (tile t, piece u, row r, element i), so that a block
// of rows reads one stream, in order: the hardware prefetcher keeps ahead of one stream, not of
// eight rows a few hundred bytes long (one Zen 3 thread streamed an 85M-parameter int8 model at
// 9-10 GB/s row-major, 15-17 GB/s tiled: the rate of merely touching every line).
constexpr int64_t TILE_ROWS = 8, UNIT = 16;
// How far ahead of a tiled stream to ask for lines: within L1 (32 KB on the x86-64 CPUs these run
// on), far enough for memory's latency at a Zen 3 thread's rate (4-16 KB measured flat for int8).
constexpr int64_t PREFETCH_BYTES = 8192;

template <bool Tiled>
struct Layout {
  static constexpr bool tiled = Tiled;
  // Row n's element 0, and how far its element k lies from it.
  template <class T>
  static const T* row(const T* w, int64_t K, int64_t n) {
    return Tiled ? w + (n - n % TILE_ROWS) * K + (n % TILE_ROWS) * UNIT : w + n * K;
  }
  static int64_t offset(int64_t k) {
    return Tiled ? (k / UNIT) * (TILE_ROWS * UNIT) + k % UNIT : k;
  }

  // Asks for the lines the R rows from n will read after their elements at k (a UNIT start).
  // Row-major rows are too short for the hardware prefetcher to get ahead within a block: each
  // row asks for the same line in the next block's row (2-3x). In a tiled W each block asks for
  // its own rows' pieces a whole number of piece groups (TILE_ROWS x UNIT elements) ahead, which
  // lands on the same rows further along (past a tile's end: in the next tile). So a block of
  // any size asks for the lines it will read, spread over the tile's time. Asking for a whole
  // tile from its first block alone, as before, overran the CPU's outstanding misses: a Zen 3
  // thread decoded a 134M-parameter int8 model 1.18x faster so, 8 rows over fp32 tiles 1.75x.
  template <int R, class T>
  static void prefetch(const T* w, int64_t K, int64_t n, int64_t k) {
    if constexpr (Tiled) {
      constexpr int64_t group = TILE_ROWS * UNIT * sizeof(T);
      constexpr int64_t ahead = (PREFETCH_BYTES / group > 0 ? PREFETCH_BYTES / group : 1) * group;
      const char* next = reinterpret_cast<const char*>(row(w, K, n) + offset(k)) + ahead;
      for (int64_t b = 0; b < R * UNIT * int64_t(sizeof(T)); b += 64)
        __builtin_prefetch(next + b);
    } else if ((k * int64_t(sizeof(T))) % 64 == 0) {
      for (int r = 0; r < R; ++r) __builtin_prefetch(row(w, K, n + r + R) + k);
    }
  }
};

// ---- float weights: fp32 or bf16, over the set's vector type V --------------------------------

// One output row block: R rows of W against M rows of x, for weights of element type T.
template <class V, class L, class T, int R, int M>
inline void dense_block(const float* x, int64_t K, const T* w, float* y, int64_t n, int64_t N) {
  typename V::reg acc[R][M];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) acc[r][m] = V::zero();
  const T* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = L::row(w, K, n + r);
  for (int64_t k = 0; k < K; k += V::W) {
    typename V::reg xv[M];
    for (int m = 0; m < M; ++m) xv[m] = V::load(x + m * K + k);
    if (k % UNIT == 0) L::template prefetch<R>(w, K, n, k);
    const int64_t at = L::offset(k);
    for (int r = 0; r < R; ++r) {
      typename V::reg wv = V::widen(rows[r] + at);
      for (int m = 0; m < M; ++m) acc[r][m] = V::fma(wv, xv[m], acc[r][m]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) y[m * N + n + r] = V::sum(acc[r][m]);
}

// Calls f(Layout<tiled>) for a run-time choice of layout.
template <class F>
inline void with_layout(bool tiled, F f) {
  if (tiled)
    f(Layout<true>{});
  else
    f(Layout<false>{});
}

template <class V, class T>
inline void dense(const float* x, int64_t M, int64_t K, const T* w, bool tiled, float* y,
                  int64_t n0, int64_t n1, int64_t N) {
  with_layout(tiled, [&](auto layout) {
    using L = decltype(layout);
    with_rows(M, [&](auto rows) {
      constexpr int m = decltype(rows)::value;
      constexpr int acc = std::is_same_v<T, float> ? V::ACC : V::ACC_WIDENED;
      by_blocks<acc, m>(n0, n1, [&](auto block, int64_t n) {
        dense_block<V, L, T, decltype(block)::value, m>(x, K, w, y, n, N);
      });
    });
  });
}

// ---- integer weights: 16-bit lanes of 256-bit vectors ------------------------------------------

constexpr float XQ_MAX = 32767.0f;
constexpr int INT8_ACC = 8, INT4_ACC = 4;  // accumulators per block (16 ymm registers in all)
// Inputs summed in 32-bit lanes before they move to fp32: a lane gains two products of at most
// 128 * 32767 per 16 inputs, so 2048 inputs (256 products, 2^30) stay below 2^31.
constexpr int64_t INT_CHUNK = 2048;

// acc + the pairwise products of the 16-bit lanes of a and b, summed into 32-bit lanes.
inline __m256i dot_pairs(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

inline float sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256i load16(const int16_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

inline __m128i load_bytes(const void* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// Rows of x (M x K, M <= 8) as xq (int16) with dx[m] * xq[m, k] ~ x[m, k], laid out by 16
// inputs: xq[k * M + m * 16 + i] holds input k + i of row m (k a multiple of 16), so that one
// pointer and constant offsets reach every row. A row holding a NaN or an infinity gets a NaN
// scale, so its products are NaN, as a float product's would be. With group > 0, also each
// row's sums per group of inputs (M x K / group) for int4's zero points, of the rounded x, so
// that the product is the rounded x's.
inline void quantize_rows(const float* x, int64_t M, int64_t K, int64_t group, int16_t* xq,
                          float* dx, float* xsum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t m = 0; m < M; ++m) {
    const float* row = x + m * K;
    __m256 amax = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 8) {
      __m256 v = _mm256_loadu_ps(row + k);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v));
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float largest = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    const bool finite = _mm256_movemask_ps(nan) == 0 && largest <= 3.4028234e38f;
    dx[m] = finite ? largest / XQ_MAX : __builtin_nanf("");
    const __m256 inverse = _mm256_set1_ps(finite && largest > 0 ? XQ_MAX / largest : 0.0f);
    for (int64_t k = 0; k < K; k += 16) {
      __m256i lo = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(row + k), inverse));
      __m256i hi = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(row + k + 8), inverse));
      // packs works within 128-bit halves: put the four 64-bit pieces back in order
      __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + k * M + m * 16), packed);
    }
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t g = 0; group > 0 && g < K / group; ++g) {
      __m256i total = _mm256_setzero_si256();
      for (int64_t k = g * group; k < (g + 1) * group; k += 16)
        total = dot_pairs(total, load16(xq + k * M + m * 16), ones);
      xsum[m * (K / group) + g] = sum8(_mm256_cvtepi32_ps(total)) * dx[m];
    }
  }
}

#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
// int8 over a tiled W on 512-bit vectors, for an even block of R rows within one tile: there
// rows r and r + 1 keep their 16-code pieces side by side, so one 32-byte load widens to both
// and meets x's 16 inputs, broadcast to both halves, in one vpdpwssd. That is half the
// instructions and loads per byte of W of int8_block, whose 16-byte loads one Intel Xeon core
// streamed at two thirds of its fp32 rate. Each 32-bit lane sums the products it sums there and
// each row's eight lanes are added as there, so the results are bit for bit the same.
template <int R, int M>
inline void int8_pairs(const int16_t* xq, const float* dx, int64_t K, const int8_t* w,
                       const float* scales, float* y, int64_t n, int64_t N) {
  using L = Layout<true>;
  constexpr int P = R / 2;
  __m512 total[P][M];
  for (int p = 0; p < P; ++p)
    for (int m = 0; m < M; ++m) total[p][m] = _mm512_setzero_ps();
  const int8_t* rows[P];
  for (int p = 0; p < P; ++p) rows[p] = L::row(w, K, n + 2 * p);
  for (int64_t k0 = 0; k0 < K; k0 += INT_CHUNK) {
    const int64_t k1 = k0 + INT_CHUNK < K ? k0 + INT_CHUNK : K;
    __m512i acc[P][M];
    for (int p = 0; p < P; ++p)
      for (int m = 0; m < M; ++m) acc[p][m] = _mm512_setzero_si512();
    for (int64_t k = k0; k < k1; k += 16) {
      const int16_t* xk = xq + k * M;
      L::template prefetch<R>(w, K, n, k);
      const int64_t at = L::offset(k);
      __m512i xs[M];
      for (int m = 0; m < M; ++m) xs[m] = _mm512_broadcast_i64x4(load16(xk + m * 16));
      for (int p = 0; p < P; ++p) {
        __m512i codes = _mm512_cvtepi8_epi16(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[p] + at)));
        for (int m = 0; m < M; ++m) acc[p][m] = _mm512_dpwssd_epi32(acc[p][m], codes, xs[m]);
      }
    }
    for (int p = 0; p < P; ++p)
      for (int m = 0; m < M; ++m)
        total[p][m] = _mm512_add_ps(total[p][m], _mm512_cvtepi32_ps(acc[p][m]));
  }
  for (int p = 0; p < P; ++p)
    for (int m = 0; m < M; ++m) {
      const __m512d both = _mm512_castps_pd(total[p][m]);
      const __m256 first = _mm256_castpd_ps(_mm512_castpd512_pd256(both));
      const __m256 second = _mm256_castpd_ps(_mm512_extractf64x4_pd(both, 1));
      y[m * N + n + 2 * p] = sum8(first) * dx[m] * scales[n + 2 * p];
      y[m * N + n + 2 * p + 1] = sum8(second) * dx[m] * scales[n + 2 * p + 1];
    }
}
#endif

// int8: y = dx * s_n * sum_k xq_k q_k, summed as integers INT_CHUNK inputs at a time.
template <class L, int R, int M>
inline void int8_block(const int16_t* xq, const float* dx, int64_t K, const int8_t* w,
                       const float* scales, float* y, int64_t n, int64_t N) {
#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
  if constexpr (L::tiled && R % 2 == 0) return int8_pairs<R, M>(xq, dx, K, w, scales, y, n, N);
#endif
  __m256 total[R][M];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) total[r][m] = _mm256_setzero_ps();
  const int8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = L::row(w, K, n + r);
  for (int64_t k0 = 0; k0 < K; k0 += INT_CHUNK) {
    const int64_t k1 = k0 + INT_CHUNK < K ? k0 + INT_CHUNK : K;
    __m256i acc[R][M];
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) acc[r][m] = _mm256_setzero_si256();
    for (int64_t k = k0; k < k1; k += 16) {
      const int16_t* xk = xq + k * M;  // loaded where used: kept in registers where they fit
      L::template prefetch<R>(w, K, n, k);
      const int64_t at = L::offset(k);
      for (int r = 0; r < R; ++r) {
        __m256i codes = _mm256_cvtepi8_epi16(load_bytes(rows[r] + at));
        for (int m = 0; m < M; ++m) acc[r][m] = dot_pairs(acc[r][m], codes, load16(xk + m * 16));
      }
    }
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m)
        total[r][m] = _mm256_add_ps(total[r][m], _mm256_cvtepi32_ps(acc[r][m]));
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) y[m * N + n + r] = sum8(total[r][m]) * dx[m] * scales[n + r];
}

// int4: y = sum_g s_g (sum_{k in g} q_k x_k - z_g sum_{k in g} x_k). The codes' products are
// summed as integers per group and scaled once per group; the zero points' term uses the group
// sums of x, computed once per call rather than once per row of W.
template <class L, int R, int M>
inline void int4_block(const int16_t* xq, const float* dx, const float* xsum, int64_t K,
                       int64_t group, const uint8_t* w, const float* scales, const float* zeros,
                       float* y, int64_t n, int64_t N) {
  const int64_t groups = K / group, half = group / 2;
  const __m256i low_nibble = _mm256_set1_epi16(0x0F);
  __m256 total[R][M];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) total[r][m] = _mm256_setzero_ps();
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = L::row(w, K / 2, n + r);
  for (int64_t g = 0; g < groups; ++g) {
    __m256i acc[R][M];
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) acc[r][m] = _mm256_setzero_si256();
    for (int64_t j = 0; j < half; j += 16) {
      const int16_t* lo_x = xq + (g * group + j) * M;  // x for the low nibbles
      const int16_t* hi_x = lo_x + half * M;            // and for the high ones
      L::template prefetch<R>(w, K / 2, n, g * half + j);
      const int64_t at = L::offset(g * half + j);
      for (int r = 0; r < R; ++r) {
        // a byte widened to 16 bits holds its high nibble in bits 4..7 alone: no mask needed
        __m256i codes = _mm256_cvtepu8_epi16(load_bytes(rows[r] + at));
        __m256i lo = _mm256_and_si256(codes, low_nibble), hi = _mm256_srli_epi16(codes, 4);
        for (int m = 0; m < M; ++m) {
          acc[r][m] = dot_pairs(acc[r][m], lo, load16(lo_x + m * 16));
          acc[r][m] = dot_pairs(acc[r][m], hi, load16(hi_x + m * 16));
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      __m256 scale = _mm256_set1_ps(scales[(n + r) * groups + g]);
      for (int m = 0; m < M; ++m)
        total[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][m]), scale, total[r][m]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const float* s = scales + (n + r) * groups;
    const float* z = zeros + (n + r) * groups;
    for (int m = 0; m < M; ++m) {
      float offset = 0.0f;
      for (int64_t g = 0; g < groups; ++g) offset += s[g] * z[g] * xsum[m * groups + g];
      y[m * N + n + r] = sum8(total[r][m]) * dx[m] - offset;
    }
  }
}

}  // namespace

// Defines them in an instruction set's file, over its float vector type V.
#define LMFORGE_DECODE_DEFINE(isa, V)                                                           \
  void dense_f32_##isa(const float* x, int64_t M, int64_t K, const float* w, bool tiled,       \
                       float* y, int64_t n0, int64_t n1, int64_t N) {                           \
    dense<V, float>(x, M, K, w, tiled, y, n0, n1, N);                                           \
  }                                                                                             \
  void dense_bf16_##isa(const float* x, int64_t M, int64_t K, const uint16_t* w, bool tiled,   \
                        float* y, int64_t n0, int64_t n1, int64_t N) {                          \
    dense<V, uint16_t>(x, M, K, w, tiled, y, n0, n1, N);                                        \
  }                                                                                             \
  void quantize_##isa(const float* x, int64_t M, int64_t K, int64_t group, int16_t* xq,        \
                      float* dx, float* xsum) {                                                 \
    quantize_rows(x, M, K, group, xq, dx, xsum);                                                \
  }                                                                                             \
  void int8_##isa(const int16_t* xq, const float* dx, int64_t M, int64_t K, const int8_t* w,   \
                  bool tiled, const float* scales, float* y, int64_t n0, int64_t n1,           \
                  int64_t N) {                                                                  \
    with_layout(tiled, [&](auto layout) {                                                       \
      using L = decltype(layout);                                                               \
      with_rows(M, [&](auto rows) {                                                             \
        constexpr int m = decltype(rows)::value;                                                \
        by_blocks<INT8_ACC, m>(n0, n1, [&](auto block, int64_t n) {                             \
          int8_block<L, decltype(block)::value, m>(xq, dx, K, w, scales, y, n, N);              \
        });                                                                                     \
      });                                                                                       \
    });                                                                                         \
  }                                                                                             \
  void int4_##isa(const int16_t* xq, const float* dx, const float* xsum, int64_t M, int64_t K, \
                  int64_t group, const uint8_t* w, bool tiled, const float* scales,            \
                  const float* zeros, float* y, int64_t n0, int64_t n1, int64_t N) {            \
    with_layout(tiled, [&](auto layout) {                                                       \
      using L = decltype(layout);                                                               \
      with_rows(M, [&](auto rows) {                                                             \
        constexpr int m = decltype(rows)::value;                                                \
        by_blocks<INT4_ACC, m>(n0, n1, [&](auto block, int64_t n) {                             \
          int4_block<L, decltype(block)::value, m>(xq, dx, xsum, K, group, w, scales, zeros, y, \
                                                   n, N);                                       \
        });                                                                                     \
      });                                                                                       \
    });                                                                                         \
  }

}  // namespace lmforge_decode
