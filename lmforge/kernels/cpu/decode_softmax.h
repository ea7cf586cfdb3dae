// A decode step's two softmaxes, over vectors of exponentials (exp8): its attention, and the
// sampling of its tokens.
//
// Attention straight from the paged KV cache: each row's one new query against the keys and
// values in its blocks (lmforge/infer/kv_cache.py's pool), and its own new key and
// value, which the engine writes into the pool only after the forward.
//
// The engine otherwise gathers every row's blocks into a contiguous copy, writes the new keys
// into it and hands it to SDPA with a mask: three passes over the cache where this makes one,
// and a decode batch's cache is the largest thing a step reads (512 rollouts of 90 tokens in
// a 4-layer, d_model 256 model: 377 MB a step, 18 times its fp32 weights). Per (row, key head):
// the scores of the query heads that share the key head, in one pass over the keys; their
// softmax, exponentials eight at a time; one pass over the values. fp32 throughout, on 256-bit
// vectors in both instruction sets' builds (head dims of 64 or 128 fill them).
//
// Sampling (sample_row): a token of a row of logits at a quantile of its softmax, read in place.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "decode_kernels.h"

namespace lmforge_decode {
namespace {

// e^x lane by lane, for x <= 0 (scores less their maximum): Cephes' expf, a relative error of
// about 2^-23; 0 below -87.3, where e^x leaves fp32's normal range (and for -inf: a masked
// token).
inline __m256 exp8(__m256 x) {
  const __m256 floor = _mm256_set1_ps(-87.3f);
  const __m256 in_range = _mm256_cmp_ps(x, floor, _CMP_GE_OQ);
  x = _mm256_max_ps(x, floor);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // x - n ln 2, in two parts
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  constexpr float coefficients[] = {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f,
                                    1.6666665459e-1f, 5.0000001201e-1f};
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  for (float c : coefficients) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  const __m256 y = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1)));
  const __m256i two_n = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(two_n)), in_range);
}

inline float dot(const float* a, const float* b, int64_t D) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= D; d += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d + 8), _mm256_loadu_ps(b + d + 8), s1);
  }
  if (d < D) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), s0);
  return sum8(_mm256_add_ps(s0, s1));
}

// Four dot products of a with b[0..3] at once (independent chains; one horizontal sum).
inline __m128 dot4(const float* a, const float* const b[4], int64_t D) {
  __m256 s[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                 _mm256_setzero_ps()};
  for (int64_t d = 0; d < D; d += 8) {
    const __m256 x = _mm256_loadu_ps(a + d);
    for (int j = 0; j < 4; ++j) s[j] = _mm256_fmadd_ps(x, _mm256_loadu_ps(b[j] + d), s[j]);
  }
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// Position t's row of a pool laid out (blocks, block_size, D), in the blocks `table` names.
inline const float* position(const float* pool, const int64_t* table, int64_t t,
                             int64_t block_size, int64_t D) {
  return pool + (table[t / block_size] * block_size + t % block_size) * D;
}

// Asks for the lines of the block after position t's, when t starts a block: blocks lie
// anywhere in the pool, where the hardware prefetcher cannot follow.
inline void prefetch_next_block(const float* pool, const int64_t* table, int64_t t,
                                int64_t length, int64_t block_size, int64_t D) {
  if (t % block_size != 0 || t + block_size >= length) return;
  const char* next = reinterpret_cast<const char*>(position(pool, table, t + block_size,
                                                            block_size, D));
  const int64_t bytes = std::min(length - t - block_size, block_size) * D * 4;
  for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(next + b, _MM_HINT_T0);
}

// The G query heads q (G x D) sharing one key head, over `length` cached positions of k_pool
// and v_pool (that head's (blocks, block_size, D)) in the blocks of `table`, then k_new, v_new.
// scores: room for G x round_up(length + 1, 8) floats. out: G x D.
inline void attend_head(const float* q, const float* k_pool, const float* v_pool,
                        const float* k_new, const float* v_new, const int64_t* table,
                        int64_t length, int64_t G, int64_t D, int64_t block_size, float scale,
                        float* scores, float* out) {
  const int64_t T = length + 1, stride = (T + 7) / 8 * 8;
  int64_t t = 0;
  for (; t + 4 <= length; t += 4) {
    prefetch_next_block(k_pool, table, t, length, block_size, D);
    const float* k[4];
    for (int j = 0; j < 4; ++j) k[j] = position(k_pool, table, t + j, block_size, D);
    for (int64_t g = 0; g < G; ++g)
      _mm_storeu_ps(scores + g * stride + t, _mm_mul_ps(dot4(q + g * D, k, D), _mm_set1_ps(scale)));
  }
  for (; t < T; ++t) {
    const float* k = t < length ? position(k_pool, table, t, block_size, D) : k_new;
    for (int64_t g = 0; g < G; ++g) scores[g * stride + t] = dot(q + g * D, k, D) * scale;
  }
  float inverse[64];  // 1 / each head's sum of exponentials (G <= 64, checked by the caller)
  for (int64_t g = 0; g < G; ++g) {
    float* s = scores + g * stride;
    float top = s[0];
    for (int64_t t = 1; t < T; ++t) top = s[t] > top ? s[t] : top;
    const __m256 shift = _mm256_set1_ps(top);
    for (int64_t t = 0; t < T; t += 8)  // the lanes past T are computed and never read
      _mm256_storeu_ps(s + t, exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), shift)));
    float total = 0;
    for (int64_t t = 0; t < T; ++t) total += s[t];
    inverse[g] = 1.0f / total;
  }
  for (int64_t i = 0; i < G * D; i += 8) _mm256_storeu_ps(out + i, _mm256_setzero_ps());
  for (int64_t t = 0; t < T; ++t) {
    prefetch_next_block(v_pool, table, t, length, block_size, D);
    const float* v = t < length ? position(v_pool, table, t, block_size, D) : v_new;
    for (int64_t g = 0; g < G; ++g) {
      const __m256 p = _mm256_set1_ps(scores[g * stride + t]);
      float* o = out + g * D;
      for (int64_t d = 0; d < D; d += 8)
        _mm256_storeu_ps(o + d, _mm256_fmadd_ps(p, _mm256_loadu_ps(v + d),
                                                _mm256_loadu_ps(o + d)));
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    const __m256 norm = _mm256_set1_ps(inverse[g]);
    for (int64_t d = 0; d < D; d += 8)
      _mm256_storeu_ps(out + g * D + d, _mm256_mul_ps(norm, _mm256_loadu_ps(out + g * D + d)));
  }
}

// The token of one row of logits x (V of them, -inf: masked) at quantile u in [0, 1) of
// softmax(x): the first whose cumulative weight exceeds u times the total. Three passes over the
// row (its maximum, the total of e^(x - max), the walk to u), writing nothing: torch's softmax
// and cumsum write the row twice, and a cumsum is one serial pass per row.
inline int64_t sample_row(const float* x, int64_t V, float u) {
  float top = x[0];
  for (int64_t t = 1; t < V; ++t) top = x[t] > top ? x[t] : top;
  const __m256 shift = _mm256_set1_ps(top);
  float weights[8];
  auto eight = [&](int64_t t) {  // e^(x - max) of x[t..t+8), lanes past V zero
    if (t + 8 <= V) return exp8(_mm256_sub_ps(_mm256_loadu_ps(x + t), shift));
    for (int i = 0; i < 8; ++i) weights[i] = t + i < V ? x[t + i] - top : -INFINITY;
    return exp8(_mm256_loadu_ps(weights));
  };
  __m256 sums = _mm256_setzero_ps();
  for (int64_t t = 0; t < V; t += 8) sums = _mm256_add_ps(sums, eight(t));
  const float target = u * sum8(sums);
  float cumulative = 0;
  int64_t last = 0;  // the last token with any weight: where rounding leaves the walk short
  for (int64_t t = 0; t < V; t += 8) {
    const __m256 e = eight(t);
    const float block = sum8(e);
    if (block == 0) continue;
    _mm256_storeu_ps(weights, e);
    if (cumulative + block <= target) {
      cumulative += block;
      for (int i = 0; i < 8; ++i) last = weights[i] > 0 ? t + i : last;
      continue;
    }
    for (int i = 0; i < 8; ++i) {
      if (weights[i] == 0) continue;
      cumulative += weights[i];
      last = t + i;
      if (cumulative > target) return last;
    }
  }
  return last;
}

}  // namespace

#define LMFORGE_SOFTMAX_DEFINE(isa)                                                           \
  void attend_head_##isa(const float* q, const float* k_pool, const float* v_pool,             \
                         const float* k_new, const float* v_new, const int64_t* table,         \
                         int64_t length, int64_t G, int64_t D, int64_t block_size, float scale, \
                         float* scores, float* out) {                                           \
    attend_head(q, k_pool, v_pool, k_new, v_new, table, length, G, D, block_size, scale,       \
                scores, out);                                                                   \
  }                                                                                             \
  int64_t sample_row_##isa(const float* x, int64_t V, float u) { return sample_row(x, V, u); }

}  // namespace lmforge_decode
