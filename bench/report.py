#!/usr/bin/env python3
"""Reads rope_bench's JSON and prints the ratios that matter as Markdown.

    python3 bench/report.py build/bench/rope_bench.json [--all] [--plot FILE] [--strict]

Every figure is a ratio of two cases from the same run (same binary, same
machine), so it says more than either absolute number; where a case was
timed against its baseline in the same iterations (bench/paired.hpp: the
counters vs_memcpy, vs_read, vs_native), the row reads that counter, taken
at the same moments, instead of the ratio of two cases timed apart. Each row
with a target from the bench issue gets PASS or MISS. By default only the
headline rows are printed (every target, one figure per question); --all
prints every ratio. With matplotlib
installed and attention cases in the run, it also writes a log-log PNG of
attention time against sequence length (default: attention.png next to the
JSON).

Handles plain runs and runs with --benchmark_repetitions: the median
aggregate is preferred, then the mean, then the median of the repetitions
themselves. Needs only the Python 3 standard library.
"""

import argparse
import json
import math
import os
import re
import statistics
import sys

TIME_TO_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
# Suffixes Google Benchmark appends to a name for options set in code
# (/threads:N is kept: it names a different case).
OPTION_SUFFIX = re.compile(r"/(repeats|min_time|min_warmup_time|iterations|real_time"
                           r"|manual_time|process_time)(:[^/]*)?$")


def base_name(name):
    while True:
        stripped = OPTION_SUFFIX.sub("", name)
        if stripped == name:
            return name
        name = stripped


def numeric_fields(entry):
    """Times in ns and every numeric counter of one JSON entry."""
    scale = TIME_TO_NS.get(entry.get("time_unit", "ns"), 1.0)
    out = {}
    for key, value in entry.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if key in ("real_time", "cpu_time"):
            out[key] = value * scale
        elif key not in ("iterations", "repetitions", "repetition_index", "threads",
                         "family_index", "per_family_instance_index"):
            out[key] = value
    return out


def load(path):
    """Returns (context, {case name: {field: value}}, repetitions, {name: cv})."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    aggregates = {}   # name -> aggregate_name -> fields
    variation = {}    # name -> coefficient of variation of the time, a fraction
    iterations = {}   # name -> [fields, ...]
    labels = {}       # name -> the case's label (e.g. the instruction set a mode ran on)
    repetitions = 1
    for entry in doc.get("benchmarks", []):
        if entry.get("error_occurred"):
            continue
        name = base_name(entry.get("run_name") or entry.get("name", ""))
        repetitions = max(repetitions, int(entry.get("repetitions", 1) or 1))
        if isinstance(entry.get("label"), str) and entry["label"]:
            labels[name] = entry["label"]
        if entry.get("run_type") == "aggregate":
            if entry.get("aggregate_unit", "time") != "time":
                # The coefficient of variation: unitless, not scaled by time_unit.
                if entry.get("aggregate_name") == "cv" and "cpu_time" in entry:
                    variation[name] = float(entry["cpu_time"])
                continue
            aggregates.setdefault(name, {})[entry.get("aggregate_name")] = numeric_fields(entry)
        else:
            iterations.setdefault(name, []).append(numeric_fields(entry))
    cases = {}  # in the order the bench registered them
    for name in list(dict.fromkeys(list(iterations) + list(aggregates))):
        agg = aggregates.get(name, {})
        if "median" in agg:
            cases[name] = agg["median"]
        elif "mean" in agg:
            cases[name] = agg["mean"]
        else:
            runs = iterations[name]
            keys = set().union(*runs)
            cases[name] = {k: statistics.median(r[k] for r in runs if k in r) for k in keys}
        if name in labels:
            cases[name] = dict(cases[name], label=labels[name])
    return doc.get("context", {}), cases, repetitions, variation


class Report:
    def __init__(self, cases):
        self.cases = cases
        self.rows = []  # (section, figure, shape, value text, target text, verdict)

    def get(self, name):
        return self.cases.get(name)

    @staticmethod
    def speed_ratio(a, b, basis):
        """a's speed over b's: by bytes/s, items/s or time, the first both have."""
        order = {"bytes": ("bytes_per_second", "items_per_second"),
                 "items": ("items_per_second", "bytes_per_second"),
                 "time": ()}[basis]
        for key in order:
            if a.get(key) and b.get(key):
                return a[key] / b[key]
        time = "real_time" if basis == "time" else "cpu_time"
        if not (a.get(time) and b.get(time)):
            time = "cpu_time" if time == "real_time" else "real_time"
        if a.get(time) and b.get(time):
            return b[time] / a[time]
        return None

    def add(self, section, figure, shape, value, target=None, fmt="{:.2f}x"):
        text = "n/a" if value is None else fmt.format(value)
        if target is None:
            self.rows.append((section, figure, shape, text, "", ""))
            return
        describe, ok = target
        verdict = "n/a" if value is None else ("PASS" if ok(value) else "MISS")
        if value is not None and fmt == "{:.2f}x":
            # A value that rounds onto the other side of its target (0.7995x
            # against >= 0.8x) gets the digits that show why it missed.
            digits = 2
            while digits < 6 and ok(float(text[:-1])) != ok(value):
                digits += 1
                text = "{:.{}f}x".format(value, digits)
        self.rows.append((section, figure, shape, text, describe, verdict))

    def ratio(self, section, figure, shape, a, b, basis="items", target=None, paired=None):
        """a's speed over b's. With `paired`, the counter of that name in a
        when a has it: the same ratio taken in the same iterations
        (bench/paired.hpp), steadier than two cases timed apart."""
        ca, cb = self.get(a), self.get(b)
        if ca is None:
            return
        if paired and ca.get(paired):
            self.add(section, figure, shape, ca[paired], target)
            return
        if cb is None:
            return
        self.add(section, figure, shape, self.speed_ratio(ca, cb, basis), target)


def at_least(x):
    return (">= {:g}x".format(x), lambda v: v >= x)


def at_most(x):
    return ("<= {:g}x".format(x), lambda v: v <= x)


def within(fraction):
    return ("within {:.0%}".format(fraction), lambda v: abs(v - 1.0) <= fraction)


def split(name):
    """'family/a/b/.../shape' -> (family, [middle parts], shape)."""
    parts = name.split("/")
    if len(parts) < 3:
        return None
    return parts[0], parts[1:-1], parts[-1]


def shapes_of(cases, family):
    seen = []
    for name in cases:
        parts = split(name)
        if parts and parts[0] == family and parts[2] not in seen:
            seen.append(parts[2])
    return seen


KERNEL_STYLES = ("rotate_half", "block_diagonal")


def kernel_rows(rep):
    cases = rep.cases
    shapes = shapes_of(cases, "kernel")
    # 1. Bandwidth against memcpy of the same bytes. Targets for every shape
    #    and both pairings: out of place >= 0.9x, in place >= 1.3x (2x with
    #    partial rotary, where in place touches a fraction of the bytes; 1x
    #    for a decode step's one token, whose rows are in L1 for memcpy too).
    for shape in shapes:
        memcpy = "kernel/-/memcpy/" + shape
        for style in KERNEL_STYLES:
            for variant in ("simd", "simd_in_place", "simd_inverse", "simd_unaligned"):
                in_place = 2.0 if "partial" in shape else 1.0 if "decode" in shape else 1.3
                target = {"simd": at_least(0.9), "simd_in_place": at_least(in_place)}.get(variant)
                rep.ratio("bandwidth vs memcpy", "kernel {} {} / memcpy".format(style, variant),
                          shape, "kernel/{}/{}/{}".format(style, variant, shape), memcpy,
                          basis="bytes", target=target, paired="vs_memcpy")
    # 2. SIMD against the scalar reference built with the same flags: no
    #    target (g++ vectorises the reference too, so the ratio measures the
    #    compiler as much as rope), kept as information.
    for shape in shapes:
        for style in KERNEL_STYLES:
            for simd, ref in (("simd", "reference"), ("simd_in_place", "reference_in_place")):
                rep.ratio("simd vs reference", "kernel {} {} / {}".format(style, simd, ref), shape,
                          "kernel/{}/{}/{}".format(style, simd, shape),
                          "kernel/{}/{}/{}".format(style, ref, shape))
    # 3. The pairings against each other: speed of block_diagonal over rotate_half.
    for shape in shapes:
        for variant in ("simd", "simd_in_place"):
            target = within(0.15) if shape.startswith("l2") and variant == "simd" else None
            rep.ratio("pairings", "kernel block_diagonal / rotate_half ({})".format(variant), shape,
                      "kernel/block_diagonal/{}/{}".format(variant, shape),
                      "kernel/rotate_half/{}/{}".format(variant, shape), target=target)
    # 4. Placement, direction and alignment, each against the plain simd case.
    section = "placement, direction, alignment"
    for shape in shapes:
        for style in KERNEL_STYLES:
            plain = "kernel/{}/simd/{}".format(style, shape)
            for variant, figure in (("simd_in_place", "in place / out of place"),
                                    ("simd_inverse", "inverse / forward"),
                                    ("simd_unaligned", "unaligned / 64-byte aligned")):
                rep.ratio(section, "kernel {} {}".format(style, figure), shape,
                          "kernel/{}/{}/{}".format(style, variant, shape), plain)


APPLY = re.compile(r"^apply/([^/]+)/([^/]+)/(t\d+)/([^/]+)$")


def apply_memcpy(cases, dtype, threads, shape):
    """The memcpy of the same bytes: per type and thread count if the run has one."""
    for name in ("apply/-/memcpy/{}/{}_{}".format(threads, shape, dtype),
                 "apply/-/memcpy/{}/{}".format(threads, shape),
                 "apply/-/memcpy/" + shape):
        if name in cases and (dtype == "f32" or name.endswith("_" + dtype)):
            return name
    return None


def apply_rows(rep):
    cases = rep.cases
    runs = []
    for name in cases:
        m = APPLY.match(name)
        if m and m.group(1) != "-":
            runs.append(m.groups())  # (dtype, placement, threads, shape)
    for dtype, placement, threads, shape in runs:
        target = None
        if dtype == "f32" and threads == "t1" and "prefill" in shape:
            target = {"out_of_place": at_least(0.9), "in_place": at_least(1.3)}.get(placement)
        elif dtype == "f32" and threads == "t1" and "decode" in shape and placement == "in_place":
            target = at_least(1.0)
        elif dtype == "bf16" and threads == "t1" and placement in ("in_place", "out_of_place"):
            # Against a memcpy of the bf16 bytes; a decode step's 20 KiB are
            # mostly the checked call's fixed cost.
            target = at_least(0.5 if "decode" in shape else 0.9)
        memcpy = apply_memcpy(cases, dtype, threads, shape)
        if memcpy:
            rep.ratio("bandwidth vs memcpy",
                      "apply {} {} {} / memcpy".format(dtype, placement, threads), shape,
                      "apply/{}/{}/{}/{}".format(dtype, placement, threads, shape), memcpy,
                      basis="bytes", target=target, paired="vs_memcpy")
    for dtype, placement, threads, shape in runs:
        name = "apply/{}/{}/{}/{}".format(dtype, placement, threads, shape)
        out_of_place = "apply/{}/out_of_place/{}/{}".format(dtype, threads, shape)
        if placement != "out_of_place":
            rep.ratio("placement, direction, alignment",
                      "apply {} {} {} / out_of_place".format(dtype, threads, placement), shape,
                      name, out_of_place, basis="time")
        if dtype == "bf16":
            rep.ratio("bf16 vs f32", "apply bf16 / f32 {} {} (speed)".format(placement, threads),
                      shape, name, "apply/f32/{}/{}/{}".format(placement, threads, shape),
                      basis="time")
        if threads != "t1":
            rep.ratio("threads", "apply {} {} {} / t1".format(dtype, placement, threads), shape,
                      name, "apply/{}/{}/t1/{}".format(dtype, placement, shape), basis="time")


BUILD = re.compile(r"^apply_(baseline|dispatch)/([^/]+)/([^/]+)/(t\d+)/([^/]+)$")


def build_rows(rep):
    """The same apply cases built three ways, against the -march=native build
    (apply/...): baseline flags through the header-only path, and baseline
    flags through rope::dispatch (target >= 0.95x native)."""
    for name in rep.cases:
        m = BUILD.match(name)
        if not m:
            continue
        build, dtype, placement, threads, shape = m.groups()
        native = "apply/{}/{}/{}/{}".format(dtype, placement, threads, shape)
        target = at_least(0.95) if build == "dispatch" else None
        rep.ratio("builds", "apply {} {} {}: {} / native".format(dtype, placement, threads, build), shape,
                  name, native, basis="time", target=target,
                  paired="vs_native" if build == "dispatch" else None)


def case_time(name, case):
    """ns per iteration: wall time (for a paired case the manual time, its own
    calls alone, which its rates use too), else CPU time."""
    return case.get("real_time") or case.get("cpu_time")


def decode_rows(rep):
    """ns per step and per head of every decode case (items = heads)."""
    for name in rep.cases:
        parts = split(name)
        # fused/... has its own section (fused_rows).
        if not parts or parts[0] == "fused" or "decode" not in parts[2] or "memcpy" in parts[1]:
            continue
        case = rep.cases[name]
        time = case_time(name, case)
        label = "{} {}".format(parts[0], " ".join(parts[1]))
        rep.add("decode step", label + ": ns per step", parts[2], time, fmt="{:.0f} ns")
        items = case.get("items_per_second")
        if items and parts[0] == "kernel":  # items = heads there
            rep.add("decode step", label + ": ns per head", parts[2], 1e9 / items, fmt="{:.1f} ns")


def table_rows(rep):
    for shape in shapes_of(rep.cases, "table"):
        scalar = "table/scalar/" + shape
        for name in rep.cases:
            parts = split(name)
            if not parts or parts[0] != "table" or parts[2] != shape or name == scalar:
                continue
            variant = "/".join(parts[1])
            target = at_least(3.0) if variant == "double_simd" else None
            rep.ratio("table build", "table {} / scalar".format(variant), shape, name, scalar,
                      target=target)


ATTENTION = re.compile(r"^attention/scaling/([^/]+)/L(\d+)$")


def attention_series(cases):
    """The length sweep (multi-head, softmax vs linear): {variant: [(L, case)]}."""
    series = {}
    for name, case in cases.items():
        m = ATTENTION.match(name)
        if m:
            series.setdefault(m.group(1), []).append((int(m.group(2)), case))
    for points in series.values():
        points.sort(key=lambda p: p[0])
    return series


def wall(case):
    return case.get("real_time") or case.get("cpu_time")


def attention_rows(rep, series):
    """The inference targets of the attention cases, then the length sweep."""
    prefill = "32/8 heads, d 128, L 1024"
    t1, t2 = rep.get("attention/prefill/softmax/T1"), rep.get("attention/prefill/softmax/T2")
    gemm = rep.get("attention/prefill/gemm_same_flops")
    if t1 and gemm and t1.get("GFLOP/s") and gemm.get("GFLOP/s"):
        rep.add("attention", "causal softmax prefill GFLOP/s, 1 thread", prefill, t1["GFLOP/s"], fmt="{:.1f}")
        rep.add("attention", "bare Eigen GEMM GFLOP/s, same flops", prefill, gemm["GFLOP/s"], fmt="{:.1f}")
        rep.add("attention", "softmax prefill / Eigen GEMM, 1 thread (GFLOP/s)", prefill,
                t1.get("vs_gemm") or t1["GFLOP/s"] / gemm["GFLOP/s"], target=at_least(0.8))
    if t1 and t2:
        rep.add("attention", "softmax prefill, 2 threads / 1 thread", prefill, wall(t1) / wall(t2),
                target=at_least(1.7))
    memcpy = rep.get("attention/decode/memcpy_kv")
    cache = "1 token, 32/8 heads, d 128, cache 4096"
    for variant, target in (("softmax", at_most(1.5)), ("softmax_step", None)):
        case = rep.get("attention/decode/" + variant)
        if case and memcpy:
            rep.add("attention", "decode {} time / memcpy of the K and V cache".format(variant), cache,
                    wall(case) / wall(memcpy), target=target)
            rep.add("attention", "decode {}: us per step".format(variant), cache, wall(case) / 1e3,
                    fmt="{:.0f} us")
    for variant, points in sorted(series.items()):
        for length, case in points:
            rep.add("attention", "{}: ms".format(variant), "L{}".format(length), wall(case) / 1e6, fmt="{:.2f} ms")
        if len(points) >= 2:
            (l0, c0), (l1, c1) = points[0], points[-1]
            if l1 > l0:
                rep.add("attention", "{}: time ~ L^k, k".format(variant), "L{}..L{}".format(l0, l1),
                        math.log(wall(c1) / wall(c0)) / math.log(l1 / l0), fmt="{:.2f}")
                rep.add("attention", "{}: t(L{}) / t(L{})".format(variant, l1, l0), "8 heads, d 64, m 256",
                        wall(c1) / wall(c0), target=at_most(9.0) if variant == "linear_eq19" else None)
    soft = dict(series.get("softmax", []))
    for variant in ("linear_eq19", "linear"):
        lin = dict(series.get(variant, []))
        for length in sorted(set(soft) & set(lin)):
            if length == max(soft):
                rep.add("attention", "causal softmax time / {} time".format(variant), "L{}, 8 heads".format(length),
                        wall(soft[length]) / wall(lin[length]),
                        target=at_least(3.0) if variant == "linear_eq19" else None)


BATCH_KV = ("f32", "bf16", "f16", "i8")


def batch_rows(rep):
    """The batched decode step over a paged cache (bench/bench_batch.cpp):
    against a read of the same bytes, paged against contiguous, the storage
    types against f32, and threads. Times are wall times."""
    section = "batch decode"
    batch = "16 sequences, 32k tokens, 32/8 heads, d 128"
    name = "attention/batch_decode/{}/{}/T{}".format
    # Targets (the batch issue): bf16 paged T1 <= 1.3x the read's time, i8
    # <= 1.5x; paged >= 0.95x contiguous; bf16 >= 1.7x f32; T2 >= 1.8x T1;
    # dispatch >= 0.95x native. The paired counters (vs_read, vs_T1,
    # vs_contiguous, vs_native) where the run has them.
    read_target = {"bf16": at_most(1.3), "i8": at_most(1.5)}
    for kv in BATCH_KV:
        case, read = rep.get(name(kv, "paged", 1)), rep.get("attention/batch_decode/read/" + kv)
        figure = "batch_decode {} paged T1 time / read of its K and V bytes".format(kv)
        if case and case.get("vs_read"):
            rep.add(section, figure, batch, 1.0 / case["vs_read"], read_target.get(kv))
        elif case and read:
            rep.add(section, figure, batch, wall(case) / wall(read), read_target.get(kv))
    # fp8 caches (issue 45): at most 1.3x the read of their bytes.
    for kv in ("fp8", "fp8e5m2"):
        case = rep.get(name(kv, "paged", 1))
        if case and case.get("vs_read"):
            rep.add(section, "batch_decode {} paged T1 time / read of its K and V bytes".format(kv), batch,
                    1.0 / case["vs_read"], at_most(1.3) if kv == "fp8" else None)
        rep.ratio(section, "batch_decode {} / i8, paged T1 (speed)".format(kv), batch, name(kv, "paged", 1),
                  name("i8", "paged", 1), basis="time")
    for kv in BATCH_KV:
        for threads in (1, 2):
            rep.ratio(section, "batch_decode {} paged / contiguous T{} (speed)".format(kv, threads), batch,
                      name(kv, "paged", threads), name(kv, "contiguous", threads), basis="time",
                      target=at_least(0.95), paired="vs_contiguous")
    for kv in BATCH_KV[1:]:
        rep.ratio(section, "batch_decode {} / f32, paged T1 (speed)".format(kv), batch,
                  name(kv, "paged", 1), name("f32", "paged", 1), basis="time",
                  target=at_least(1.7) if kv == "bf16" else None)
    for kv in BATCH_KV:
        for layout in ("contiguous", "paged"):
            rep.ratio(section, "batch_decode {} {}: T2 / T1 (speed)".format(kv, layout), batch,
                      name(kv, layout, 2), name(kv, layout, 1), basis="time", target=at_least(1.8),
                      paired="vs_T1")
    for kv in BATCH_KV:
        for build in ("baseline", "dispatch"):
            target = at_least(0.95) if build == "dispatch" else None
            rep.ratio(section, "batch_decode {} paged T1: {} build / native (speed)".format(kv, build), batch,
                      "attention/batch_decode_{}/{}/paged/T1".format(build, kv), name(kv, "paged", 1),
                      basis="time", target=target, paired="vs_native" if build == "dispatch" else None)
    rep.ratio(section, "long_decode bf16 paged: T2 / T1 (speed)", "1 sequence, 32k tokens, 32/8 heads, d 128",
              "attention/long_decode/bf16/paged/T2", "attention/long_decode/bf16/paged/T1", basis="time",
              target=at_least(1.7), paired="vs_T1")
    for case_name in ("attention/long_decode/bf16/paged/T1", "attention/batch_decode/bf16/paged/T1"):
        case = rep.get(case_name)
        if case:
            rep.add(section, case_name[len("attention/"):] + ": ms per step", "32k tokens", wall(case) / 1e6,
                    fmt="{:.2f} ms")


FUSED_KV = ("f32", "bf16", "i8")
FUSED_SHAPES = (("prefill", "2048 tokens, 32/8 heads, d 128, QK-norm, pages of 16"),
                ("decode", "16 tokens of 16 sequences, 32/8 heads, d 128, QK-norm"))


def fused_rows(rep):
    """The step before attention (bench/bench_fused.cpp): norm_rope_append
    against a memcpy of its QKV input and against the same work as separate
    calls. Times are wall times."""
    section = "fused append"
    for shape, describe in FUSED_SHAPES:
        for kv in FUSED_KV:
            fused = rep.get("fused/qkv_norm_rope_append/{}/{}".format(kv, shape))
            unfused = rep.get("fused/unfused/{}/{}".format(kv, shape))
            copy = rep.get("fused/memcpy/{}/{}".format(kv, shape))
            if fused and copy:
                rep.add(section, "fused {} time / memcpy of the QKV input".format(kv), describe,
                        wall(fused) / wall(copy))
            if fused and unfused:
                rep.add(section, "unfused {} time / fused time".format(kv), describe,
                        wall(unfused) / wall(fused))


def mode_rows(rep):
    """The product modes of the batch decode step (bench/bench_batch.cpp):
    bf16 products over a bf16 cache and int8 products over an int8 cache,
    each against the exact mode over the same cache in the same iterations
    (vs_exact), with the instruction set the scores ran on (the case's
    label)."""
    section = "product modes"
    batch = "16 sequences, 32k tokens, 32/8 heads, d 128, paged, T1"
    for mode, exact in (("bf16dot", "bf16"), ("i8dot", "i8")):
        case = rep.get("attention/batch_decode/{}/paged/T1".format(mode))
        if not case:
            continue
        how = case.get("label", "")
        figure = "batch_decode {} / exact {} (speed){}".format(mode, exact, ", " + how if how else "")
        rep.ratio(section, figure, batch, "attention/batch_decode/{}/paged/T1".format(mode),
                  "attention/batch_decode/{}/paged/T1".format(exact), basis="time", paired="vs_exact")

    # One causal prompt in each mode (bench/bench_prefill_modes.cpp): the
    # bf16 modes against the f32 mode, every mode against a bare f32 GEMM
    # of the same multiply-adds.
    prompt = "causal prompt L 1024, 32/8 heads, d 128, bf16 q/k/v, T1"
    for mode, target in (("bf16dot", at_least(1.7)), ("amx", at_least(5))):
        case = rep.get("attention/prefill_modes/" + mode)
        how = case.get("label", "") if case else ""
        rep.ratio(section, "prefill_modes {} / f32 (speed){}".format(mode, ", " + how if how else ""), prompt,
                  "attention/prefill_modes/" + mode, "attention/prefill_modes/f32", basis="time", target=target,
                  paired="vs_f32")
    for mode in ("f32", "bf16dot", "amx"):
        rep.ratio(section, "prefill_modes {} / GEMM of its FLOPs (rate)".format(mode), prompt,
                  "attention/prefill_modes/" + mode, "attention/prefill_modes/gemm", basis="time",
                  paired="vs_gemm")


def mla_rows(rep):
    """MLA over a latent cache and DeepSeek's sparse attention
    (bench/bench_mla.cpp): each against a bare f32 GEMM of the same FLOPs
    (GFLOP/s), threads, and the absorbed prefill against the unabsorbed one
    by prompt length (where the crossover lies)."""
    section = "MLA and sparse"
    decode = "16 sequences, 32k tokens, 128 heads, latent 512 + rope 64"
    for kv in ("f32", "bf16", "i8"):
        rep.ratio(section, "mla_decode {} T1 / GEMM of its FLOPs (rate)".format(kv), decode,
                  "attention/mla_decode/{}/T1".format(kv), "attention/mla_decode/gemm", basis="time",
                  target=at_least(0.8) if kv == "bf16" else None, paired="vs_gemm")
        rep.ratio(section, "mla_decode {}: T2 / T1 (speed)".format(kv), decode,
                  "attention/mla_decode/{}/T2".format(kv), "attention/mla_decode/{}/T1".format(kv), basis="time",
                  target=at_least(1.8) if kv == "bf16" else None, paired="vs_T1")
    dot = rep.get("attention/mla_decode/bf16dot/T1")
    how = dot.get("label", "") if dot else ""
    rep.ratio(section, "mla_decode bf16dot / exact bf16, T1 (speed){}".format(", " + how if how else ""), decode,
              "attention/mla_decode/bf16dot/T1", "attention/mla_decode/bf16/T1", basis="time",
              target=at_least(1.6), paired="vs_exact")
    rep.ratio(section, "mla_prefill bf16 / GEMM of its FLOPs (rate)", "2048-token prompt, 128 heads",
              "attention/mla_prefill/bf16", "attention/mla_prefill/gemm", basis="time", target=at_least(0.8),
              paired="vs_gemm")
    rep.ratio(section, "dsa_decode bf16 T1 / GEMM of its FLOPs (rate)", "16 sequences of 32k, top-2048, 128 heads",
              "attention/dsa_decode/bf16/T1", "attention/dsa_decode/gemm", basis="time", target=at_least(0.7),
              paired="vs_gemm")
    for length in (128, 256, 512, 1024):
        rep.ratio(section, "mla prefill absorbed / unabsorbed (speed)", "{}-token prompt".format(length),
                  "attention/mla_prefill_sweep/absorbed/L{}".format(length),
                  "attention/mla_prefill_sweep/unabsorbed/L{}".format(length), basis="time",
                  paired="vs_unabsorbed")


def serving_rows(rep):
    """Shared prefixes, tree verify and shift (bench/bench_cascade.cpp), with
    the targets of the issue that asked for them. Times are wall times."""
    section = "cascade, tree, shift"
    shared = "16 sequences, 4096-token shared prefix + 512 each, 32/8 heads, d 128, T1"
    for kv in ("bf16", "i8"):
        name = "attention/shared_prefix/{}/{}".format
        rep.ratio(section, "shared_prefix {} cascade / plain (speed)".format(kv), shared, name(kv, "cascade"),
                  name(kv, "plain"), basis="time", target=at_least(4), paired="vs_plain")
        case, read = rep.get(name(kv, "cascade")), rep.get("attention/shared_prefix/read/" + kv)
        figure = "shared_prefix {} cascade time / read of the unique bytes".format(kv)
        if case and case.get("vs_read"):
            rep.add(section, figure, shared, 1.0 / case["vs_read"], at_most(1.5))
        elif case and read:
            rep.add(section, figure, shared, wall(case) / wall(read), at_most(1.5))
    # The bf16 product mode (its cascade levels on AMX tiles where the CPU has
    # them), against the default plain step and against the mode's own.
    name = "attention/shared_prefix/{}".format
    dot = rep.get(name("bf16dot/cascade"))
    if dot:
        where = " ({})".format("levels on AMX tiles" if dot.get("tiles") else "levels without AMX")
        rep.ratio(section, "shared_prefix bf16dot cascade / exact plain (speed)", shared + where,
                  name("bf16dot/cascade"), name("bf16/plain"), basis="time", target=at_least(4), paired="vs_plain")
        rep.ratio(section, "shared_prefix bf16dot cascade / bf16dot plain (speed)", shared + where,
                  name("bf16dot/cascade"), name("bf16dot/plain"), basis="time", paired="vs_dot_plain")
        if dot.get("vs_read"):
            rep.add(section, "shared_prefix bf16dot cascade time / read of the unique bytes", shared + where,
                    1.0 / dot["vs_read"], at_most(1.5))
    tree, chain = rep.get("attention/tree_verify/bf16"), rep.get("attention/tree_verify/chain/bf16")
    if tree and chain:
        rep.add(section, "tree_verify bf16 time / the causal chunk's", "16 sequences of 4k, 32 draft tokens each",
                1.0 / tree["vs_chain"] if tree.get("vs_chain") else wall(tree) / wall(chain), at_most(1.2))
    shift, copy = rep.get("attention/shift/bf16"), rep.get("attention/shift/memcpy/bf16")
    if shift and copy:
        rep.add(section, "shift bf16 time / memcpy of the keys it rewrites", "4096 keys, 8 heads, d 128, by 1024",
                1.0 / shift["vs_memcpy"] if shift.get("vs_memcpy") else wall(shift) / wall(copy), at_most(1.3))


def plot_attention(series, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return "matplotlib is not installed: no plot written"
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for variant, points in sorted(series.items()):
        xs = [length for length, _ in points]
        ys = [wall(c) / 1e6 for _, c in points]
        ax.plot(xs, ys, marker="o", label=variant)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_yscale("log")
    ax.set_xlabel("sequence length L (tokens)")
    ax.set_ylabel("time per call (ms)")
    ax.set_title("rope causal attention, 8 heads of d = 64: time against length")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return "plot written to " + path


def context_line(context, repetitions):
    keys = (("cpu_model", "CPU {}"), ("host_name", "host {}"), ("num_cpus", "{} CPUs"),
            ("mhz_per_cpu", "{} MHz"), ("rope_simd_arch", "rope SIMD arch {}"),
            ("rope_baseline_arch", "baseline {}"), ("rope_dispatch_arch", "dispatch {}"),
            ("date", "run {}"))
    parts = [fmt.format(context[k]) for k, fmt in keys if context.get(k) not in (None, "")]
    caches = context.get("caches") or []
    if caches:
        parts.append("caches " + ", ".join(
            "L{}{} {} KiB".format(c.get("level"), "d" if c.get("type") == "Data" else "",
                                  c.get("size", 0) // 1024)
            for c in caches if c.get("type") in ("Data", "Unified")))
    stat = "median of {} repetitions".format(repetitions) if repetitions > 1 else "one repetition"
    parts.append(stat)
    return "; ".join(parts)


def headline(row):
    """The rows a reader decides by: every target, and one figure per question."""
    section, figure, shape, _, target, _ = row
    if target or section in ("table build", "attention", "batch decode", "fused append", "product modes",
                             "MLA and sparse", "cascade, tree, shift"):
        return True
    big = "prefill" in shape
    if section == "builds":
        return True
    if section == "bandwidth vs memcpy":
        return "neox" in shape and " simd" in figure and "unaligned" not in figure
    if section == "simd vs reference":
        return big or "decode" in shape
    if section == "pairings":
        return big
    if section == "placement, direction, alignment":
        return (big and figure.startswith("kernel rotate_half")) or \
            (big and figure in ("apply f32 t1 in_place / out_of_place",
                                "apply f32 t1 out_of_place_streaming / out_of_place")) or \
            (figure.endswith("unaligned / 64-byte aligned") and shape.startswith("l2"))
    if section == "bf16 vs f32":
        return big and " t1 " in figure + " " and ("in_place" in figure or
                                                  "out_of_place t1" in figure)
    if section == "threads":
        return big and figure.startswith("apply f32") and "cached" not in figure and \
            "streaming" not in figure
    if section == "decode step":
        return figure.endswith("ns per head") or figure.startswith("apply f32 in_place t1")
    return False


def markdown(rows):
    lines = ["| figure | shape | value | target | verdict |", "|---|---|---|---|---|"]
    section = None
    for sec, figure, shape, value, target, verdict in rows:
        if sec != section:
            lines.append("| **{}** | | | | |".format(sec))
            section = sec
        lines.append("| {} | {} | {} | {} | {} |".format(figure, shape, value, target, verdict))
    return "\n".join(lines)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", help="rope_bench --benchmark_out=FILE --benchmark_out_format=json")
    parser.add_argument("--plot", help="PNG of attention time against length "
                        "(default: attention.png next to the JSON)")
    parser.add_argument("--all", action="store_true",
                        help="every ratio, not only the headline rows and the targets")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)

    context, cases, repetitions, variation = load(args.json)
    if not cases:
        print("report.py: no benchmark results in " + args.json, file=sys.stderr)
        return 1
    rep = Report(cases)
    kernel_rows(rep)
    apply_rows(rep)
    build_rows(rep)
    decode_rows(rep)
    table_rows(rep)
    series = attention_series(cases)
    attention_rows(rep, series)
    batch_rows(rep)
    fused_rows(rep)
    mode_rows(rep)
    mla_rows(rep)
    serving_rows(rep)

    order = ["bandwidth vs memcpy", "builds", "simd vs reference", "pairings",
             "placement, direction, alignment", "bf16 vs f32", "threads", "decode step",
             "table build", "attention", "batch decode", "fused append", "product modes", "MLA and sparse",
             "cascade, tree, shift"]
    rows = sorted(rep.rows, key=lambda r: order.index(r[0]))  # stable within a section
    shown = rows if args.all else [r for r in rows if headline(r)]
    print("rope_bench report: " + context_line(context, repetitions))
    print()
    print("Ratios (x) are the speed of the first case over the second, from this run; "
          "bandwidth rows compare bytes/s. Decode and attention rows are times.")
    print()
    print(markdown(shown) if shown else "(no case this report knows about)")
    if len(shown) < len(rows):
        print()
        print("{} more rows with --all.".format(len(rows) - len(shown)))
    misses = sum(1 for r in rows if r[5] == "MISS")
    passes = sum(1 for r in rows if r[5] == "PASS")
    print()
    print("targets: {} PASS, {} MISS".format(passes, misses))
    noisy = sorted(name for name, cv in variation.items() if cv > 0.10)
    if noisy:
        print("{} of {} cases varied by more than 10% between repetitions (CPU time), "
              "so their ratios are rough; a quieter machine gives steadier figures: {}".format(
                  len(noisy), len(variation), ", ".join(noisy)))
    if series:
        plot = args.plot or os.path.join(os.path.dirname(os.path.abspath(args.json)),
                                         "attention.png")
        print(plot_attention(series, plot))
    return 1 if args.strict and misses else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:  # piped into head: the reader has what it wanted
        sys.exit(0)
