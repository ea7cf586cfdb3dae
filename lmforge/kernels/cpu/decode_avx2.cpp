// The decode kernels (decode_kernels.h) over 8-lane AVX2 vectors with FMA: the integer products
// in vpmaddwd and vpaddd.
#include <immintrin.h>

#include "decode_softmax.h"
#include "decode_kernels.h"

namespace lmforge_decode {
namespace {

struct Avx2 {
  using reg = __m256;
  static constexpr int W = 8;    // fp32 lanes
  // (rows of W) x (rows of x) a block works on, for fp32 weights: eight rows of W at one row of x,
  // within 16 ymm registers with x's rows. 4 streamed a 134M model's fp32 weights 14-16 % slower
  // at one and two rows; bf16 weights, which widening keeps bound by instructions, ran 4-7 %
  // slower with 8 than with 4 (one Zen 3 thread).
  static constexpr int ACC = 8, ACC_WIDENED = 4;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static float sum(reg v) { return sum8(v); }
  static reg widen(const float* p) { return _mm256_loadu_ps(p); }
  static reg widen(const uint16_t* p) {  // bf16 is the top half of an fp32
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
};

}  // namespace

LMFORGE_SOFTMAX_DEFINE(avx2)
LMFORGE_DECODE_DEFINE(avx2, Avx2)

}  // namespace lmforge_decode
