// rope/attention/serving_instances.hpp — the combinations of element types
// rope's attention library compiles (forwarders.hpp, src/attention/
// serving.cpp): for every cache type E (float, BFloat16, Float16, int8,
// Float8E4M3, Float8E5M2),
// append with rows In and q_out QO, append's K/V form with rows In, and
// attend with q rows Q and out rows O, each of float, BFloat16, Float16.
// An X-macro: the includer says what APPEND(In, QO, E), APPEND_KV(In, E)
// and ATTEND(Q, O, E) become.
#pragma once

#include <cstdint>

#include "../fp8.hpp"
#include "../half.hpp"

// clang-format off
#define ROPE_SERVING_INSTANCES(APPEND, APPEND_KV, ATTEND) \
  APPEND(float, float, float) \
  APPEND(float, rope::BFloat16, float) \
  APPEND(float, rope::Float16, float) \
  APPEND(rope::BFloat16, float, float) \
  APPEND(rope::BFloat16, rope::BFloat16, float) \
  APPEND(rope::BFloat16, rope::Float16, float) \
  APPEND(rope::Float16, float, float) \
  APPEND(rope::Float16, rope::BFloat16, float) \
  APPEND(rope::Float16, rope::Float16, float) \
  APPEND_KV(float, float) \
  APPEND_KV(rope::BFloat16, float) \
  APPEND_KV(rope::Float16, float) \
  ATTEND(float, float, float) \
  ATTEND(float, rope::BFloat16, float) \
  ATTEND(float, rope::Float16, float) \
  ATTEND(rope::BFloat16, float, float) \
  ATTEND(rope::BFloat16, rope::BFloat16, float) \
  ATTEND(rope::BFloat16, rope::Float16, float) \
  ATTEND(rope::Float16, float, float) \
  ATTEND(rope::Float16, rope::BFloat16, float) \
  ATTEND(rope::Float16, rope::Float16, float) \
  APPEND(float, float, rope::BFloat16) \
  APPEND(float, rope::BFloat16, rope::BFloat16) \
  APPEND(float, rope::Float16, rope::BFloat16) \
  APPEND(rope::BFloat16, float, rope::BFloat16) \
  APPEND(rope::BFloat16, rope::BFloat16, rope::BFloat16) \
  APPEND(rope::BFloat16, rope::Float16, rope::BFloat16) \
  APPEND(rope::Float16, float, rope::BFloat16) \
  APPEND(rope::Float16, rope::BFloat16, rope::BFloat16) \
  APPEND(rope::Float16, rope::Float16, rope::BFloat16) \
  APPEND_KV(float, rope::BFloat16) \
  APPEND_KV(rope::BFloat16, rope::BFloat16) \
  APPEND_KV(rope::Float16, rope::BFloat16) \
  ATTEND(float, float, rope::BFloat16) \
  ATTEND(float, rope::BFloat16, rope::BFloat16) \
  ATTEND(float, rope::Float16, rope::BFloat16) \
  ATTEND(rope::BFloat16, float, rope::BFloat16) \
  ATTEND(rope::BFloat16, rope::BFloat16, rope::BFloat16) \
  ATTEND(rope::BFloat16, rope::Float16, rope::BFloat16) \
  ATTEND(rope::Float16, float, rope::BFloat16) \
  ATTEND(rope::Float16, rope::BFloat16, rope::BFloat16) \
  ATTEND(rope::Float16, rope::Float16, rope::BFloat16) \
  APPEND(float, float, rope::Float16) \
  APPEND(float, rope::BFloat16, rope::Float16) \
  APPEND(float, rope::Float16, rope::Float16) \
  APPEND(rope::BFloat16, float, rope::Float16) \
  APPEND(rope::BFloat16, rope::BFloat16, rope::Float16) \
  APPEND(rope::BFloat16, rope::Float16, rope::Float16) \
  APPEND(rope::Float16, float, rope::Float16) \
  APPEND(rope::Float16, rope::BFloat16, rope::Float16) \
  APPEND(rope::Float16, rope::Float16, rope::Float16) \
  APPEND_KV(float, rope::Float16) \
  APPEND_KV(rope::BFloat16, rope::Float16) \
  APPEND_KV(rope::Float16, rope::Float16) \
  ATTEND(float, float, rope::Float16) \
  ATTEND(float, rope::BFloat16, rope::Float16) \
  ATTEND(float, rope::Float16, rope::Float16) \
  ATTEND(rope::BFloat16, float, rope::Float16) \
  ATTEND(rope::BFloat16, rope::BFloat16, rope::Float16) \
  ATTEND(rope::BFloat16, rope::Float16, rope::Float16) \
  ATTEND(rope::Float16, float, rope::Float16) \
  ATTEND(rope::Float16, rope::BFloat16, rope::Float16) \
  ATTEND(rope::Float16, rope::Float16, rope::Float16) \
  APPEND(float, float, std::int8_t) \
  APPEND(float, rope::BFloat16, std::int8_t) \
  APPEND(float, rope::Float16, std::int8_t) \
  APPEND(rope::BFloat16, float, std::int8_t) \
  APPEND(rope::BFloat16, rope::BFloat16, std::int8_t) \
  APPEND(rope::BFloat16, rope::Float16, std::int8_t) \
  APPEND(rope::Float16, float, std::int8_t) \
  APPEND(rope::Float16, rope::BFloat16, std::int8_t) \
  APPEND(rope::Float16, rope::Float16, std::int8_t) \
  APPEND_KV(float, std::int8_t) \
  APPEND_KV(rope::BFloat16, std::int8_t) \
  APPEND_KV(rope::Float16, std::int8_t) \
  ATTEND(float, float, std::int8_t) \
  ATTEND(float, rope::BFloat16, std::int8_t) \
  ATTEND(float, rope::Float16, std::int8_t) \
  ATTEND(rope::BFloat16, float, std::int8_t) \
  ATTEND(rope::BFloat16, rope::BFloat16, std::int8_t) \
  ATTEND(rope::BFloat16, rope::Float16, std::int8_t) \
  ATTEND(rope::Float16, float, std::int8_t) \
  ATTEND(rope::Float16, rope::BFloat16, std::int8_t) \
  ATTEND(rope::Float16, rope::Float16, std::int8_t) \
  APPEND(float, float, rope::Float8E4M3) \
  APPEND(float, rope::BFloat16, rope::Float8E4M3) \
  APPEND(float, rope::Float16, rope::Float8E4M3) \
  APPEND(rope::BFloat16, float, rope::Float8E4M3) \
  APPEND(rope::BFloat16, rope::BFloat16, rope::Float8E4M3) \
  APPEND(rope::BFloat16, rope::Float16, rope::Float8E4M3) \
  APPEND(rope::Float16, float, rope::Float8E4M3) \
  APPEND(rope::Float16, rope::BFloat16, rope::Float8E4M3) \
  APPEND(rope::Float16, rope::Float16, rope::Float8E4M3) \
  APPEND_KV(float, rope::Float8E4M3) \
  APPEND_KV(rope::BFloat16, rope::Float8E4M3) \
  APPEND_KV(rope::Float16, rope::Float8E4M3) \
  ATTEND(float, float, rope::Float8E4M3) \
  ATTEND(float, rope::BFloat16, rope::Float8E4M3) \
  ATTEND(float, rope::Float16, rope::Float8E4M3) \
  ATTEND(rope::BFloat16, float, rope::Float8E4M3) \
  ATTEND(rope::BFloat16, rope::BFloat16, rope::Float8E4M3) \
  ATTEND(rope::BFloat16, rope::Float16, rope::Float8E4M3) \
  ATTEND(rope::Float16, float, rope::Float8E4M3) \
  ATTEND(rope::Float16, rope::BFloat16, rope::Float8E4M3) \
  ATTEND(rope::Float16, rope::Float16, rope::Float8E4M3) \
  APPEND(float, float, rope::Float8E5M2) \
  APPEND(float, rope::BFloat16, rope::Float8E5M2) \
  APPEND(float, rope::Float16, rope::Float8E5M2) \
  APPEND(rope::BFloat16, float, rope::Float8E5M2) \
  APPEND(rope::BFloat16, rope::BFloat16, rope::Float8E5M2) \
  APPEND(rope::BFloat16, rope::Float16, rope::Float8E5M2) \
  APPEND(rope::Float16, float, rope::Float8E5M2) \
  APPEND(rope::Float16, rope::BFloat16, rope::Float8E5M2) \
  APPEND(rope::Float16, rope::Float16, rope::Float8E5M2) \
  APPEND_KV(float, rope::Float8E5M2) \
  APPEND_KV(rope::BFloat16, rope::Float8E5M2) \
  APPEND_KV(rope::Float16, rope::Float8E5M2) \
  ATTEND(float, float, rope::Float8E5M2) \
  ATTEND(float, rope::BFloat16, rope::Float8E5M2) \
  ATTEND(float, rope::Float16, rope::Float8E5M2) \
  ATTEND(rope::BFloat16, float, rope::Float8E5M2) \
  ATTEND(rope::BFloat16, rope::BFloat16, rope::Float8E5M2) \
  ATTEND(rope::BFloat16, rope::Float16, rope::Float8E5M2) \
  ATTEND(rope::Float16, float, rope::Float8E5M2) \
  ATTEND(rope::Float16, rope::BFloat16, rope::Float8E5M2) \
  ATTEND(rope::Float16, rope::Float16, rope::Float8E5M2)
// clang-format on
