// Weight-only matrix products for decoding, written once over a vector type V and compiled once
// per instruction set (decode_avx2.cpp, decode_avx512.cpp): y[m, n] = sum_k x[m, k] * W[n, k]
// for a few rows m of fp32 activations and a weight W stored as int8 with one scale per row,
// packed int4 with a scale and a zero point per group of inputs (lmforge's half-group nibble
// layout, quant/schemes.py), bf16, or fp32.
//
// Decode is bound by the bytes of W it reads, so each kernel reads W exactly once per call, in
// order, converting its codes to fp32 in registers, and reuses every loaded piece of W for all
// rows of x and every loaded piece of x for R rows of W (R * rows accumulators in registers).
// The activations stay fp32: the results are the dequantized weight's products up to summation
// order, so quality is the quantization's own, with no error from rounding activations.
//
// No torch header is included here: this code is compiled with instruction-set flags, and any
// inline function it shared with the rest of the library could be linked into code that runs
// on a CPU without those instructions.
#pragma once

#include <cstdint>

namespace lmforge_decode {
namespace {

// One output row block: R rows of W against M rows of x, for weights of element type T.
template <class V, class T, int R, int M>
inline void dense_block(const float* x, int64_t K, const T* w, const float* scales, float* y,
                        int64_t n, int64_t N) {
  typename V::reg acc[R][M];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) acc[r][m] = V::zero();
  for (int64_t k = 0; k < K; k += V::W) {
    typename V::reg xv[M];
    for (int m = 0; m < M; ++m) xv[m] = V::load(x + m * K + k);
    const bool line_start = (k * sizeof(T)) % 64 == 0;
    for (int r = 0; r < R; ++r) {
      if (line_start) __builtin_prefetch(w + (n + r + R) * K + k);  // see int4_block
      typename V::reg wv = V::widen(w + (n + r) * K + k);
      for (int m = 0; m < M; ++m) acc[r][m] = V::fma(wv, xv[m], acc[r][m]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float scale = scales ? scales[n + r] : 1.0f;
    for (int m = 0; m < M; ++m) y[m * N + n + r] = V::sum(acc[r][m]) * scale;
  }
}

// int4: sum_g s_g * (sum_{j in g} q_j x_j - z_g * sum_{j in g} x_j). The codes' products are
// summed per group in vector registers and scaled once per group; the zero points' term uses
// the group sums of x (xsum, M x G), computed once per call rather than once per row of W.
template <class V, int R, int M>
inline void int4_block(const float* x, const float* xsum, int64_t K, int64_t group,
                       const uint8_t* w, const float* scales, const float* zeros, float* y,
                       int64_t n, int64_t N) {
  const int64_t groups = K / group, half = group / 2;
  typename V::reg total[R][M];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) total[r][m] = V::zero();
  for (int64_t g = 0; g < groups; ++g) {
    typename V::reg acc[R][M];
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) acc[r][m] = V::zero();
    for (int64_t j = 0; j < half; j += V::W) {
      typename V::reg lo_x[M], hi_x[M];
      for (int m = 0; m < M; ++m) {
        lo_x[m] = V::load(x + m * K + g * group + j);
        hi_x[m] = V::load(x + m * K + g * group + half + j);
      }
      const bool line_start = (g * half + j) % 64 == 0;
      for (int r = 0; r < R; ++r) {
        // W's rows are a few hundred bytes, too short for the hardware prefetcher to get ahead
        // within a block: each row asks for the same line in the next block's row (2-3x)
        if (line_start) __builtin_prefetch(w + (n + r + R) * (K / 2) + g * half + j);
        typename V::reg lo, hi;
        V::nibbles(w + (n + r) * (K / 2) + g * half + j, lo, hi);
        for (int m = 0; m < M; ++m) {
          acc[r][m] = V::fma(lo, lo_x[m], acc[r][m]);
          acc[r][m] = V::fma(hi, hi_x[m], acc[r][m]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      typename V::reg scale = V::set1(scales[(n + r) * groups + g]);
      for (int m = 0; m < M; ++m) total[r][m] = V::fma(acc[r][m], scale, total[r][m]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const float* s = scales + (n + r) * groups;
    const float* z = zeros + (n + r) * groups;
    for (int m = 0; m < M; ++m) {
      float offset = 0.0f;
      for (int64_t g = 0; g < groups; ++g) offset += s[g] * z[g] * xsum[m * groups + g];
      y[m * N + n + r] = V::sum(total[r][m]) - offset;
    }
  }
}

template <class V, class T, int M>
void dense_rows(const float* x, int64_t K, const T* w, const float* scales, float* y, int64_t n0,
                int64_t n1, int64_t N) {
  constexpr int R = V::ACC / M > 0 ? V::ACC / M : 1;
  int64_t n = n0;
  for (; n + R <= n1; n += R) dense_block<V, T, R, M>(x, K, w, scales, y, n, N);
  for (; n < n1; ++n) dense_block<V, T, 1, M>(x, K, w, scales, y, n, N);
}

template <class V, int M>
void int4_rows(const float* x, const float* xsum, int64_t K, int64_t group, const uint8_t* w,
               const float* scales, const float* zeros, float* y, int64_t n0, int64_t n1,
               int64_t N) {
  constexpr int R = V::ACC / M > 0 ? V::ACC / M : 1;
  int64_t n = n0;
  for (; n + R <= n1; n += R) int4_block<V, R, M>(x, xsum, K, group, w, scales, zeros, y, n, N);
  for (; n < n1; ++n) int4_block<V, 1, M>(x, xsum, K, group, w, scales, zeros, y, n, N);
}

}  // namespace

// The entry points each instruction set's file defines: rows n0..n1 of y (M x N, M <= 8).
#define LMFORGE_DECODE_ENTRY_POINTS(isa)                                                       \
  void dense_f32_##isa(const float* x, int64_t M, int64_t K, const float* w, float* y,        \
                       int64_t n0, int64_t n1, int64_t N);                                     \
  void dense_bf16_##isa(const float* x, int64_t M, int64_t K, const uint16_t* w, float* y,    \
                        int64_t n0, int64_t n1, int64_t N);                                    \
  void int8_##isa(const float* x, int64_t M, int64_t K, const int8_t* w, const float* scales, \
                  float* y, int64_t n0, int64_t n1, int64_t N);                                \
  void int4_##isa(const float* x, const float* xsum, int64_t M, int64_t K, int64_t group,     \
                  const uint8_t* w, const float* scales, const float* zeros, float* y,        \
                  int64_t n0, int64_t n1, int64_t N);

// Defines them in an instruction set's file, over its vector type V, by the number of rows.
#define LMFORGE_DECODE_DEFINE(isa, V)                                                          \
  template <class T>                                                                           \
  static void dense_any(const float* x, int64_t M, int64_t K, const T* w, const float* scales, \
                        float* y, int64_t n0, int64_t n1, int64_t N) {                         \
    switch (M) {                                                                               \
      case 1: return dense_rows<V, T, 1>(x, K, w, scales, y, n0, n1, N);                       \
      case 2: return dense_rows<V, T, 2>(x, K, w, scales, y, n0, n1, N);                       \
      case 3: return dense_rows<V, T, 3>(x, K, w, scales, y, n0, n1, N);                       \
      case 4: return dense_rows<V, T, 4>(x, K, w, scales, y, n0, n1, N);                       \
      case 5: return dense_rows<V, T, 5>(x, K, w, scales, y, n0, n1, N);                       \
      case 6: return dense_rows<V, T, 6>(x, K, w, scales, y, n0, n1, N);                       \
      case 7: return dense_rows<V, T, 7>(x, K, w, scales, y, n0, n1, N);                       \
      default: return dense_rows<V, T, 8>(x, K, w, scales, y, n0, n1, N);                      \
    }                                                                                          \
  }                                                                                            \
  void dense_f32_##isa(const float* x, int64_t M, int64_t K, const float* w, float* y,        \
                       int64_t n0, int64_t n1, int64_t N) {                                    \
    dense_any<float>(x, M, K, w, nullptr, y, n0, n1, N);                                       \
  }                                                                                            \
  void dense_bf16_##isa(const float* x, int64_t M, int64_t K, const uint16_t* w, float* y,    \
                        int64_t n0, int64_t n1, int64_t N) {                                   \
    dense_any<uint16_t>(x, M, K, w, nullptr, y, n0, n1, N);                                    \
  }                                                                                            \
  void int8_##isa(const float* x, int64_t M, int64_t K, const int8_t* w, const float* scales, \
                  float* y, int64_t n0, int64_t n1, int64_t N) {                               \
    dense_any<int8_t>(x, M, K, w, scales, y, n0, n1, N);                                       \
  }                                                                                            \
  void int4_##isa(const float* x, const float* xsum, int64_t M, int64_t K, int64_t group,     \
                  const uint8_t* w, const float* scales, const float* zeros, float* y,        \
                  int64_t n0, int64_t n1, int64_t N) {                                         \
    switch (M) {                                                                               \
      case 1: return int4_rows<V, 1>(x, xsum, K, group, w, scales, zeros, y, n0, n1, N);       \
      case 2: return int4_rows<V, 2>(x, xsum, K, group, w, scales, zeros, y, n0, n1, N);       \
      case 3: return int4_rows<V, 3>(x, xsum, K, group, w, scales, zeros, y, n0, n1, N);       \
      case 4: return int4_rows<V, 4>(x, xsum, K, group, w, scales, zeros, y, n0, n1, N);       \
      case 5: return int4_rows<V, 5>(x, xsum, K, group, w, scales, zeros, y, n0, n1, N);       \
      case 6: return int4_rows<V, 6>(x, xsum, K, group, w, scales, zeros, y, n0, n1, N);       \
      case 7: return int4_rows<V, 7>(x, xsum, K, group, w, scales, zeros, y, n0, n1, N);       \
      default: return int4_rows<V, 8>(x, xsum, K, group, w, scales, zeros, y, n0, n1, N);      \
    }                                                                                          \
  }

}  // namespace lmforge_decode
