// The decode kernels' entry points (decode_kernels.h defines them, once per instruction set),
// declared apart from the kernels so that decode_ops.cpp, compiled without instruction-set
// flags, sees no code that needs them.
#pragma once

#include <cstdint>

// The entry points each instruction set's file defines: rows n0..n1 of y (M x N, M <= 8), from
// x itself (float weights) or from x as quantize_rows gives it (integer weights), for a W laid
// out row-major or tiled (decode_kernels.h's Layout; tiled: n0 and n1 multiples of 8); and one
// (row, key head) of a decode step's attention over the paged KV cache, and one row's sampled
// token (decode_softmax.h).
#define LMFORGE_DECODE_ENTRY_POINTS(isa)                                                        \
  void dense_f32_##isa(const float* x, int64_t M, int64_t K, const float* w, bool tiled,       \
                       float* y, int64_t n0, int64_t n1, int64_t N);                            \
  void dense_bf16_##isa(const float* x, int64_t M, int64_t K, const uint16_t* w, bool tiled,   \
                        float* y, int64_t n0, int64_t n1, int64_t N);                           \
  void quantize_##isa(const float* x, int64_t M, int64_t K, int64_t group, int16_t* xq,        \
                      float* dx, float* xsum);                                                  \
  void int8_##isa(const int16_t* xq, const float* dx, int64_t M, int64_t K, const int8_t* w,   \
                  bool tiled, const float* scales, float* y, int64_t n0, int64_t n1,           \
                  int64_t N);                                                                   \
  void int4_##isa(const int16_t* xq, const float* dx, const float* xsum, int64_t M, int64_t K, \
                  int64_t group, const uint8_t* w, bool tiled, const float* scales,            \
                  const float* zeros, float* y, int64_t n0, int64_t n1, int64_t N);             \
  void attend_head_##isa(const float* q, const float* k_pool, const float* v_pool,             \
                         const float* k_new, const float* v_new, const int64_t* table,         \
                         int64_t length, int64_t G, int64_t D, int64_t block_size, float scale, \
                         float* scores, float* out);                                            \
  int64_t sample_row_##isa(const float* x, int64_t V, float u);
