// The decode kernels (decode_kernels.h) over 16-lane AVX-512 vectors: the integer products in
// AVX-512 VNNI's vpdpwssd, on 512-bit vectors for int8 over a tiled weight, else 256-bit ones.
#include <immintrin.h>

#include "decode_softmax.h"
#include "decode_kernels.h"

namespace lmforge_decode {
namespace {

struct Avx512 {
  using reg = __m512;
  static constexpr int W = 16;    // fp32 lanes
  // (rows of W) x (rows of x) a block works on at once, for fp32 and for bf16 weights
  static constexpr int ACC = 8, ACC_WIDENED = 8;
  static reg zero() { return _mm512_setzero_ps(); }
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static float sum(reg v) { return _mm512_reduce_add_ps(v); }
  static reg widen(const float* p) { return _mm512_loadu_ps(p); }
  static reg widen(const uint16_t* p) {  // bf16 is the top half of an fp32
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
};

}  // namespace

LMFORGE_SOFTMAX_DEFINE(avx512)
LMFORGE_DECODE_DEFINE(avx512, Avx512)

}  // namespace lmforge_decode
