// rope/products.hpp — how the serving path's decode loop multiplies queries
// by keys (kernels/kv_products.hpp has the arithmetic of each mode).
#pragma once

namespace rope {

// exact: every product a float fused multiply-add over the widened values
// (the default; its bytes never change). bf16 (bf16 caches): q rounded to
// bf16, each score an AVX512-BF16 dot product. int8 (int8 caches): q
// quantized per row, each score an integer dot product times the scales.
// Each mode gives the decode loop the same bytes on every instruction set.
// bf16 with cascade levels also rounds the levels' softmax weights to bf16
// and runs their products on AMX tiles where the CPU and OS have them
// (attention/cascade_tiles.hpp), and there runs a prompt's tokens (two or
// more new tokens of a sequence, not a tree, under a dense mask) on the
// tiles the same way: bounded, not the same bytes everywhere
// (docs/attention.md, "Product modes").
enum class Products { exact, bf16, int8 };

}  // namespace rope
