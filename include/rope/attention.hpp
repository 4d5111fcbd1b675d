// rope/attention.hpp — the attention module in one include: RoPE on Q and K
// (never V) inside softmax and linear attention.
//
//   softmax: out_i = sum_j softmax_j((R_pq_i q_i) . (R_pk_j k_j) * scale) v_j
//   linear:  out_i = phi(q_i)^T sum_j phi(k_j) v_j^T / g(phi(q_i)^T sum_j phi(k_j))
//
// Two parts:
//   - the serving path (attention/serving.hpp, no Eigen): a server's step
//     over paged KV caches of float, bf16, f16 or int8 — plan once per step,
//     append and attend per layer, merge partial states;
//   - tensors as the caller lays them out (softmax.hpp, linear.hpp,
//     features.hpp, on Eigen): one head's matrices or multi-head views,
//     positions and masks as given, linear (Performer-style) attention and
//     its feature maps.
// This is the only part of rope that needs Eigen (CMake target
// rope::attention); it includes the core, <rope/rope.hpp>.
// docs/attention.md has the API in brief.
#pragma once

#include "rope.hpp"

#include "attention/features.hpp"
#include "attention/linear.hpp"
#include "attention/mla_append.hpp"
#include "attention/mla_attend.hpp"
#include "attention/serving.hpp"
#include "attention/softmax.hpp"
