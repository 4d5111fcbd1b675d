// rope/attention/serving.hpp — the serving path in one include, without
// Eigen: a server's step planned once (plan.hpp), then per layer the new
// tokens appended (append.hpp: QK-norm, RoPE, the rounded or quantized write
// into the planned slots) and attended (attend.hpp: softmax over the paged
// cache, with an optional log-sum-exp), and partial states merged
// (state.hpp). Four entry points — plan, append, attend, merge — and four
// option types — Threads, AppendOptions, Logits, Mask:
//
//   namespace ra = rope::attention;
//   ra::plan(plan, ra::Shape::of(cache, q_heads), batch, threads);     // once per step
//   for each layer:
//     ra::append(plan, cache[layer], q, k, v, q, {rotation, norms...});  // Q rotated in place
//     ra::attend(plan, cache[layer], q, out, logits, mask);
//
// The caches (cache.hpp) hold float, BFloat16, Float16 or int8; Q, K, V and
// out are float, BFloat16 or Float16. docs/attention.md is the guide.
#pragma once

#include "cache.hpp"
#include "forwarders.hpp"
#include "logits.hpp"
#include "masks.hpp"
#include "plan.hpp"
#include "rotation.hpp"
#include "shift.hpp"
#include "state.hpp"

// Header-only: the checked calls, compiled in this unit. With
// ROPE_ATTENTION_LIBRARY, rope's attention library holds them
// (forwarders.hpp).
#if !defined(ROPE_ATTENTION_LIBRARY)
#include "append.hpp"
#include "attend.hpp"
#endif
