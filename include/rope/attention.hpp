// rope/attention.hpp — the attention module in one include: softmax and
// linear attention with RoPE on Q and K (never V), and their feature maps.
//
//   softmax: out_i = sum_j softmax_j((R_pq_i q_i) . (R_pk_j k_j) * scale) v_j
//   linear:  out_i = phi(q_i)^T sum_j phi(k_j) v_j^T / g(phi(q_i)^T sum_j phi(k_j))
//
// Layout: one batch x head is a matrix with one token per row (Eigen,
// row-major results); softmax also takes rope::View tensors with grouped-query
// heads. This is the only part of rope that needs Eigen (CMake target
// rope::attention); it includes the core, <rope/rope.hpp>. docs/attention.md
// has the API in brief.
#pragma once

#include "rope.hpp"

#include "attention/append.hpp"
#include "attention/batch.hpp"
#include "attention/common.hpp"
#include "attention/features.hpp"
#include "attention/linear.hpp"
#include "attention/paged.hpp"
#include "attention/softmax.hpp"
