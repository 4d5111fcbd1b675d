// rope/rope.hpp — the core of the library in one include.
//
// RoPE (RoFormer, arXiv 2104.09864) rotates pair p of a query or key at
// position m by m * theta_p, theta_p = base^(-2p/d). Rotations compose, so
// <R_m q, R_n k> = <q, R_(n-m) k>: only relative offsets reach attention.
//
// This is the core: frequencies, tables, kernels and the tensor API, which
// need xsimd (and, for threads, the platform's thread library) alone. The
// attention module needs Eigen and has its own umbrella, <rope/attention.hpp>
// (CMake target rope::attention).
#pragma once

#include "angles.hpp"
#include "apply.hpp"
#include "fp8.hpp"
#include "frequencies.hpp"
#include "half.hpp"
#include "kernels.hpp"
#include "multi_axis.hpp"
#include "options.hpp"
#include "permute.hpp"
#include "reference.hpp"
#include "style.hpp"
#include "table.hpp"
#include "version.hpp"
#include "view.hpp"
