// rope/kernels/kv_rows.hpp — attention's kernels over a KV cache, in one
// include: the element planes (kv_planes.hpp), the dot and weighted rows
// (kv_dot.hpp), the score rows and the online-softmax state (scores.hpp),
// the decode loop (kv_decode.hpp) and the rounded stores (kv_store.hpp).
#pragma once

#include "kv_decode.hpp"
#include "kv_dot.hpp"
#include "kv_planes.hpp"
#include "kv_store.hpp"
#include "scores.hpp"
