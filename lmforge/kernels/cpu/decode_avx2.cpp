// The decode kernels (decode_kernels.h) over 8-lane AVX2 vectors with FMA.
#include <immintrin.h>

#include "decode_kernels.h"

namespace lmforge_decode {
namespace {

struct Avx2 {
  using reg = __m256;
  static constexpr int W = 8;    // fp32 lanes
  static constexpr int ACC = 4;  // (rows of W) x (rows of x) a block works on (16 ymm in all)
  static reg zero() { return _mm256_setzero_ps(); }
  static reg set1(float v) { return _mm256_set1_ps(v); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static float sum(reg v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static reg widen(const float* p) { return _mm256_loadu_ps(p); }
  static reg widen(const uint16_t* p) {  // bf16 is the top half of an fp32
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static reg widen(const int8_t* p) {
    __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes));
  }
  static void nibbles(const uint8_t* p, reg& lo, reg& hi) {
    __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    __m128i mask = _mm_set1_epi8(0x0F);
    lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(bytes, mask)));
    hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask)));
  }
};

}  // namespace

LMFORGE_DECODE_DEFINE(avx2, Avx2)

}  // namespace lmforge_decode
