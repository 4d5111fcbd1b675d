// rope/rope.hpp — the whole library in one include.
//
// RoPE (RoFormer, arXiv 2104.09864) rotates pair p of a query or key at
// position m by m * theta_p, theta_p = base^(-2p/d). Rotations compose, so
// <R_m q, R_n k> = <q, R_(n-m) k>: only relative offsets reach attention.
//
// An engine that wants only the kernels, tables and tensor API includes
// <rope/kernels.hpp>, <rope/table.hpp> or <rope/apply.hpp>, which need xsimd
// alone; Eigen enters only through <rope/attention.hpp>.
#pragma once

#include "version.hpp"
#include "style.hpp"
#include "frequencies.hpp"
#include "table.hpp"
#include "angles.hpp"
#include "reference.hpp"
#include "kernels.hpp"
#include "apply.hpp"
#include "attention.hpp"
