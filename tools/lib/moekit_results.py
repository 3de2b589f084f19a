#!/usr/bin/env python3
"""moekit_results — the one reader of moekit's and its profilers' output for the tools.

Every table the maintainer's tools print from moekit_bench rows and JSON, `moekit run --json`,
Nsight Compute CSVs, nvidia-smi samples and moekit_host_latency's samples is made here, so the
formats are parsed in one place. Command line: `moekit_results.py COMMAND ARGS...` (the tools call
it so; `moekit_results.py --help` lists the commands); tests/tools/ checks each on fixed inputs.
"""
import collections, csv, glob, io, json, os, re, statistics, subprocess, sys


# ---- shared readers ---------------------------------------------------------------------------

def bench_row(line):
    """A moekit_bench table row "<shape> <routing> <pass> E T N K | <backend> <ms> <TFLOP/s> <check>
    <MHz> | ... | <best>" as (shape, routing, pass, [(backend, fields...)...], best), or None."""
    parts = [p.split() for p in line.split("|")]
    if len(parts) < 2 or len(parts[0]) < 3:
        return None
    return parts[0][0], parts[0][1], parts[0][2], [c for c in parts[1:-1] if c], \
        (parts[-1][0] if parts[-1] else "")


def last_json_line(path):
    """The last line of a file as JSON (`moekit run --json` prints one object last)."""
    return json.loads(open(path).read().strip().splitlines()[-1])


def ncu_csv_rows(path):
    """The rows of an ncu --csv file (--page raw or details) as dicts; the profiled program's own
    output, which ncu interleaves, is left out (ncu's rows are the quoted lines)."""
    with open(path) as f:
        return list(csv.DictReader([l for l in f if l.startswith('"')]))


def bench_rows_json(argv):
    """bench-rows-json MOEKIT_JSON: the number of suite rows in a moekit_bench --json file (0 when
    unreadable)."""
    try:
        print(len(json.load(open(argv[1]))["results"]))
    except (OSError, ValueError, KeyError, IndexError):
        print(0)


def bench_best(argv):
    """bench-best BENCH_LOG: per shape and pass, the best backend's TFLOP/s (uniform / skewed)."""
    order, v = [], {}
    for line in open(argv[1]):
        parts = line.split("|")
        if len(parts) < 3:
            continue
        h = parts[0].split()
        if len(h) < 3 or h[2] not in ("fprop", "dgrad", "wgrad", "wgrad_f32"):
            continue
        best, t = parts[-1].strip(), "?"
        for cell in parts[1:-1]:
            w = cell.split()
            if w and w[0] == best and len(w) > 2:
                t = f"{w[2]} {best}" + (f" @{w[4]}" if len(w) > 4 and w[4].isdigit() else "")
        k = f"{h[0]} {h[2]}"
        if k in v:
            v[k] += " / " + t
        else:
            v[k] = t
            order.append(k)
    for k in order:
        print(f"  {k:22} {v[k]}")


def bandwidth_summary(argv):
    """bandwidth-summary LOG: moekit_bandwidth_probe's read and write rates, "read 4.05 TB/s, write
    3.94 TB/s (268 MB, one kernel)" (its table: "| N | read | ... | TB/s | ...")."""
    got = []
    for line in open(argv[1]):
        c = line.split("|")
        if len(c) > 4 and c[1].strip() in ("read", "write"):
            got.append(f"{c[1].strip()} {c[4].strip()} TB/s")
    print(", ".join(got) + " (268 MB, one kernel)" if got else "FAILED (bandwidth.log)")


def ctest_junit(argv):
    """ctest-junit JUNIT_XML [ALLOWED_SKIP_REGEX]: counts of a ctest --output-junit run: passed,
    failed, skipped by ctest, and passed entries whose output shows a GoogleTest "[  SKIPPED ]"
    case (a skip hidden in a pass); prints "P pass, F fail, S skipped (of N)" and then one line per
    failed or unexpectedly skipped test; exits 1 when any."""
    import xml.etree.ElementTree as ET
    allowed = re.compile(argv[2]) if len(argv) > 2 and argv[2] else None
    root = ET.parse(argv[1]).getroot()
    cases = root.iter("testcase")
    passed, failed, skipped, bad = 0, [], [], []
    total = 0
    for c in cases:
        total += 1
        name = c.get("name", "?").split("  #")[0]  # less ctest's "  # GetParam() = ..."
        status = c.get("status", "")
        out = "".join(e.text or "" for e in c.iter("system-out"))
        if c.find("failure") is not None or status == "fail":
            failed.append(name)
        elif c.find("skipped") is not None or status in ("notrun", "disabled", "skipped") or \
                "[  SKIPPED ]" in out:
            skipped.append(name)
        else:
            passed += 1
    unexpected = [n for n in skipped if not (allowed and allowed.search(n))]
    print(f"{passed} pass, {len(failed)} fail, {len(skipped)} skipped "
          f"({len(unexpected)} unexpected) (of {total})")
    for n in failed:
        print(f"FAILED  {n}")
    for n in unexpected:
        print(f"SKIPPED {n}")
    sys.exit(1 if failed or unexpected else 0)


def sanitizer_summary(argv):
    """sanitizer-summary LOG TOOL [FOREIGN]: errors of one compute-sanitizer tool in a log
    of "== TOOL ..." sections: memcheck "ERROR SUMMARY: N errors", racecheck "RACECHECK SUMMARY: H
    hazards displayed (E errors, W warnings)" counted as E + W; "no summary" when no section printed
    one. With FOREIGN (a kernel-name substring, e.g. nvjet for cuBLAS's closed kernels), a reported
    race ("... Race reported between ... at KERNEL ..." and its "and ... at KERNEL" lines) whose
    text names FOREIGN is counted apart: the first line printed is the rest, the second
    "foreign M"."""
    tool, cur, n, seen = argv[2], None, 0, False
    foreign = argv[3] if len(argv) > 3 else None
    apart, entry = 0, None

    def close(e):
        return 1 if e is not None and foreign and foreign in e else 0
    for line in open(argv[1]):
        if line.startswith("== "):
            apart += close(entry); entry = None
            cur = line.split()[1] if len(line.split()) > 1 else None
            continue
        if cur != tool:
            continue
        if "Race reported between" in line:
            apart += close(entry); entry = line
            continue
        if entry is not None and re.match(r"=+\s+and ", line):
            entry += line
            continue
        apart += close(entry); entry = None
        m = re.search(r"ERROR SUMMARY: (\d+) error", line)
        if m:
            n += int(m.group(1)); seen = True
        m = re.search(r"RACECHECK SUMMARY:.*\((\d+) errors?, (\d+) warnings?\)", line)
        if m:
            n += int(m.group(1)) + int(m.group(2)); seen = True
    apart += close(entry)
    print(n - apart if seen else "no summary")
    if foreign:
        print(f"foreign {apart}")


def turns_ms(path):
    """A turns log ("== turn T NAME ..." before each run's moekit_bench rows): (names in order of
    appearance, keys (shape, routing, pass, backend) in order, {key: {name: [ms per turn]}})."""
    name, names, order = None, [], []
    ms = collections.defaultdict(lambda: collections.defaultdict(list))
    for line in open(path):
        if line.startswith("== turn "):
            fields = line.split()
            name = fields[3] if len(fields) > 3 else None
            if name is not None and name not in names:
                names.append(name)
            continue
        row = bench_row(line) if name is not None else None
        if row is None:
            continue
        for cell in row[3]:
            if len(cell) < 2:
                continue
            try:
                value = float(cell[1])
            except ValueError:
                continue
            key = (row[0], row[1], row[2], cell[0])
            if key not in ms:
                order.append(key)
            ms[key][name].append(value)
    return names, order, ms


def ab_table(argv):
    """ab-table TURNS_LOG: tools/compare ab's table — per shape, routing, pass and backend the
    median ms of the turns, new and base, and new / base."""
    _, order, ms = turns_ms(argv[1])
    if not order:
        sys.exit("no moekit_bench rows after '== turn N new|base' lines in " + argv[1])
    print("| shape | routing | pass | backend | new ms | base ms | new / base | turns |")
    print("|---|---|---|---|---|---|---|---|")
    for key in order:
        new, base = ms[key]["new"], ms[key]["base"]
        if not new or not base:
            print(f"| {' | '.join(key)} | {'n/a' if not new else f'{statistics.median(new):.4f}'} | "
                  f"{'n/a' if not base else f'{statistics.median(base):.4f}'} | n/a | {len(new)}/{len(base)} |")
            continue
        n, b = statistics.median(new), statistics.median(base)
        print(f"| {' | '.join(key)} | {n:.4f} | {b:.4f} | {n / b:.3f} | {len(new)}/{len(base)} |")


def env_table(argv):
    """env-table TURNS_LOG: tools/compare env's table — each variant's median ms over its turns,
    its ratio to the first variant's, and the turns counted."""
    variants, order, ms = turns_ms(argv[1])
    if not order:
        sys.exit("no moekit_bench rows after '== turn N NAME' lines in " + argv[1])
    head = ["shape", "routing", "pass", "backend"] + [f"{v} ms" for v in variants] + \
           [f"{v} / {variants[0]}" for v in variants[1:]] + ["turns"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for key in order:
        got = {v: ms[key][v] for v in variants}
        med = {v: statistics.median(got[v]) if got[v] else None for v in variants}
        cells = list(key) + [f"{med[v]:.4f}" if med[v] is not None else "n/a" for v in variants]
        ref = med[variants[0]]
        cells += [f"{med[v] / ref:.3f}" if med[v] is not None and ref else "n/a" for v in variants[1:]]
        cells.append("/".join(str(len(got[v])) for v in variants))
        print("| " + " | ".join(cells) + " |")


def orders_summary(argv):
    """orders-summary STUDY_LOG: per setting, the median over the GEMM suite of default / setting
    TFLOP/s with its extremes, from a settings-tables log (tools/compare orders)."""
    import statistics, sys
    lines = open(argv[1]).read().splitlines()
    head = next((l for l in lines if l.startswith("| shape | routing | pass |")), None)
    if head is None:
        sys.exit("no GEMM table (| shape | routing | pass | ...) in " + argv[1])
    cols = [c.strip() for c in head.strip("|").split("|")][3:-1]  # settings, without best / default
    rows = []
    for l in lines:
        c = [x.strip() for x in l.strip("|").split("|")]
        if len(c) == len(cols) + 4 and c[2] in ("fprop", "dgrad", "wgrad", "wgrad_f32"):
            try:
                rows.append((f"{c[0]} {c[1]} {c[2]}", [float(x) for x in c[3:3 + len(cols)]]))
            except ValueError:
                pass
    if not rows or cols[0] != "default":
        sys.exit("no GEMM rows with a default column in " + argv[1])
    for i, name in enumerate(cols[1:], 1):
        q = sorted((v[0] / v[i], k) for k, v in rows)
        print(f"default / {name}, GEMM suite TFLOP/s over {len(q)} rows: median "
              f"{statistics.median(r for r, _ in q):.3f}, min {q[0][0]:.3f} ({q[0][1]}), "
              f"max {q[-1][0]:.3f} ({q[-1][1]})")


def settings_tables(argv):
    """settings-tables DIR PRESET TURNS GEMM_TURNS SETTING...: tools/compare orders' GEMM-suite and
    MLP-step tables (default and each setting) from its moekit_bench JSON, `moekit run --json` files
    and clock samples."""
    import json, re, statistics, sys
    d, preset, turns, gemm_turns = argv[1], argv[2], int(argv[3]), int(argv[4])
    settings = argv[5:]

    def stem(setting):  # the setting's name in file names, as file_of writes it
        return re.sub(r"[^A-Za-z0-9_.-]", "-", setting)

    def mhz(run):  # the run's median busy SM clock, or None without samples
        try:
            return float(open(f"{d}/{run}.mhz").read())
        except (OSError, ValueError):
            return None

    def median_mhz(stems):
        vals = [v for v in (mhz(s) for s in stems) if v is not None]
        return f"{statistics.median(vals):.0f}" if vals else "-"

    def load(path):
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    print("# sm90 settings against the default (tools/compare orders)\n")
    # Per configuration and setting: the median over the turns of each run's median TFLOP/s; a check
    # that failed in any turn marks the cell.
    runs = {}
    for t in settings:
        for turn in range(1, gemm_turns + 1):
            for r in (load(f"{d}/gemm-{stem(t)}-{turn}.json") or {}).get("results", []):
                b = r.get("backends", {}).get("sm90")
                if b:
                    runs.setdefault((r["shape"], r["routing"], r["pass"]), {}).setdefault(t, []).append(b)
    rows = {key: {t: {"tflops": statistics.median(b["tflops"] for b in bs),
                      "check": {"pass": all(b.get("check", {}).get("pass", False) for b in bs)}}
                  for t, bs in per.items()} for key, per in runs.items()}
    print(f"## GEMM suite, sm90 backend, TFLOP/s (median of {gemm_turns} run(s) in turns; every run checked)\n")
    print("| shape | routing | pass | " + " | ".join(settings) + " | best / default |")
    print("|---|---|---|" + "---|" * (len(settings) + 1))
    for key in sorted(rows):
        cells, best = [], 0.0
        for t in settings:
            b = rows[key].get(t)
            if b is None:
                cells.append("-")
                continue
            ok = b.get("check", {}).get("pass", False)
            cells.append(f"{b['tflops']:.1f}" + ("" if ok else " FAIL"))
            if ok:
                best = max(best, b["tflops"])
        base = rows[key].get("default", {}).get("tflops")
        ratio = f"{best / base:.3f}" if base else "-"
        print(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + f" | {ratio} |")
    print("| SM clock, MHz | | (median of the runs' busy samples) | " +
          " | ".join(median_mhz([f"gemm-{stem(t)}-{k}" for k in range(1, gemm_turns + 1)])
                     for t in settings) + " | |")

    if turns:
      print(f"\n## {preset} MLP step (fused; cuBLAS: GEMMs + SwiGLU kernels), skewed, 20 steps, ms (median per run, in turns)\n")
      print("| setting | " + " | ".join(f"turn {k}" for k in range(1, turns + 1)) +
            " | mean | SM MHz | mean x GHz (M cycles) | fp64 check |")
      print("|---|" + "---|" * (turns + 4))
      for t in settings + ["cublas"]:
          ms, checks = [], []
          for turn in range(1, turns + 1):
              doc = load(f"{d}/step-{stem(t)}-{turn}.json")
              ms.append(doc["step_ms"] if doc else None)
              if doc:
                  checks.append("PASS" if doc.get("check", {}).get("passed") else "FAIL")
          vals = [m for m in ms if m is not None]
          mean = f"{statistics.mean(vals):.3f}" if vals else "-"
          cells = [f"{m:.3f}" if m is not None else "failed" for m in ms]
          clock = median_mhz([f"step-{stem(t)}-{k}" for k in range(1, turns + 1)])
          cycles = f"{statistics.mean(vals) * float(clock) / 1e3:.2f}" if vals and clock != "-" else "-"
          print(f"| {t} | " + " | ".join(cells) + f" | {mean} | {clock} | {cycles} | "
                f"{', '.join(checks) or '-'} |")


def mlp_run_line(argv):
    """mlp-run-line RUN_JSON BACKEND CLOCK: one line of a `moekit run --json` result (step ms,
    TFLOP/s, check, clock) for tools/compare mlp."""
    import json, sys
    r = json.loads(open(argv[1]).read().strip().splitlines()[-1])
    c = r.get("check", {})
    check = ("PASS" if c.get("passed") else "FAIL") + f" (max error {c.get('max_error')})" if c else "skipped"
    clk = f"  {argv[3]}" if argv[3] else ""
    print(f"{r['preset']:6} fused={r['fused']!s:5} backend={argv[2]:6} step {r['step_ms']:.3f} ms "
          f"(enqueue {r.get('enqueue_ms', 0):.3f})  {r['gflops']/1e3:.1f} TFLOP/s  check {check}{clk}")


def mlp_ab_table(argv):
    """mlp-ab-table DIR ENV PRESET...: tools/compare mlp's A/B table of fused runs in turns."""
    import glob, json, os, statistics, sys
    d, env, presets = argv[1], argv[2], argv[3:]
    def ms(path):
        try:
            return json.loads(open(path).read().strip().splitlines()[-1])["step_ms"]
        except (OSError, ValueError, KeyError, IndexError):
            return None
    print(f"\n## A/B in turns: fused default (A) vs fused with {env} (B), step ms\n")
    print("| preset | A runs | B runs | A median | B median | A / B |")
    print("|---|---|---|---|---|---|")
    for p in presets:
        a = [m for m in (ms(f) for f in sorted(glob.glob(f"{d}/{p}-ab-a*.json"))) if m is not None]
        b = [m for m in (ms(f) for f in sorted(glob.glob(f"{d}/{p}-ab-b*.json"))) if m is not None]
        if not a or not b:
            print(f"| {p} | {len(a)} | {len(b)} | - | - | - |")
            continue
        am, bm = statistics.median(a), statistics.median(b)
        print(f"| {p} | {', '.join(f'{x:.3f}' for x in a)} | {', '.join(f'{x:.3f}' for x in b)} | "
              f"{am:.3f} | {bm:.3f} | {am / bm:.3f} |")


def step_kernels(argv):
    """step-kernels PRESET CSV...: tools/profile step's table — every kernel of one MLP step per
    backend, from ncu CSVs (the timed step: the tail its predecessor repeats)."""
    import csv, os, re, sys
    preset, files = argv[1], argv[2:]

    def kernels(path):
        """(short name, µs) of each launch of the last step, in launch order."""
        rows = []
        for r in ncu_csv_rows(path):
            if r.get("Metric Name") != "gpu__time_duration.sum":
                continue
            name = r["Kernel Name"]
            base = name.replace("(anonymous namespace)", "anon")
            while re.search(r"<[^<>]*>", base):
                base = re.sub(r"<[^<>]*>", "", base)  # template arguments, innermost first
            base = base.split("(")[0].split()[-1].split("::")[-1]  # "void ns::kernel(params)" → kernel
            if "GemmUniversal" in name:
                short = "sm90 GEMM" + (" +dswiglu" if "DSwiGlu" in name else
                                       " +swiglu" if "SwiGlu" in name else "")
            elif "nvjet" in name or "xmma" in name or "cublas" in name.lower():
                short = "cuBLAS " + base[:28]
            else:
                short = base[:36]
            rows.append((short, float(r["Metric Value"].replace(",", "")) / 1e3))
        # The warm-up step and the timed step launch the same kernels; launches before them (weight
        # and buffer set-up) differ. The timed step: the longest tail that its predecessor repeats
        # (the longest: a per-expert cuBLAS loop repeats short tails too).
        names = [n for n, _ in rows]
        for p in range(len(rows) // 2, 0, -1):
            if names[-p:] == names[-2 * p:-p]:
                return rows[-p:]
        return rows[len(rows) // 2:]

    runs = {os.path.basename(p)[:-4]: kernels(p) for p in files}
    print(f"# one {preset} grouped-MLP step, every kernel timed alone by ncu (own clocks, warm caches)\n")
    for backend, ks in runs.items():
        total = sum(us for _, us in ks)
        gemm = sum(us for n, us in ks if "GEMM" in n or n.startswith("cuBLAS"))
        print(f"{backend:12} {len(ks):3} kernels  total {total/1e3:8.3f} ms  GEMMs {gemm/1e3:8.3f} ms  other {(total-gemm)/1e3:7.3f} ms")
    print()
    width = max(len(r) for r in runs.values())
    names = list(runs)
    print("| # | " + " | ".join(f"{b} kernel | {b} µs" for b in names) + " |")
    print("|---|" + "---|---|" * len(names))
    for i in range(width):
        cells = []
        for b in names:
            ks = runs[b]
            cells += [ks[i][0], f"{ks[i][1]:.1f}"] if i < len(ks) else ["", ""]
        print(f"| {i} | " + " | ".join(cells) + " |")


def ncu_table(argv):
    """ncu-table TITLE NAME=CSV...: tools/profile gemm's table of ncu metrics per variant, summed or
    duration-weighted over several kernels."""
    import csv, sys
    title, runs = argv[1], [a.split("=", 1) for a in argv[2:]]
    ADDITIVE = (".sum",)  # summed over kernels; everything else (pct, ratio, per_second) is weighted
    def merged(path):
        """{metric: value} over every kernel launch in one ncu CSV."""
        per_id = {}
        for r in ncu_csv_rows(path):
            try:
                v = float(r["Metric Value"].replace(",", ""))
            except (KeyError, ValueError):
                continue
            per_id.setdefault(r["ID"], {})[r["Metric Name"]] = v
        out, time_of = {}, {i: m.get("gpu__time_duration.sum", 0.0) for i, m in per_id.items()}
        total_time = sum(time_of.values())
        for i, m in per_id.items():
            for name, v in m.items():
                if name.endswith(ADDITIVE):
                    out[name] = out.get(name, 0.0) + v
                elif total_time > 0:
                    out[name] = out.get(name, 0.0) + v * time_of[i] / total_time
        out["kernels"] = float(len(per_id))
        # SM cycles: each kernel's duration (ns) at its own clock, summed — what a variant costs with
        # the clock taken out (under the power limit the clock is the other half of the time).
        if all("sm__cycles_elapsed.avg.per_second" in m for m in per_id.values()):
            out["cycles"] = sum(time_of[i] * m["sm__cycles_elapsed.avg.per_second"] * 1e-9
                                for i, m in per_id.items())
        return out
    values = {name: merged(path) for name, path in runs}
    names = [n for n, _ in runs]
    short = {
        "kernels": ("kernels profiled", 1),
        "gpu__time_duration.sum": ("µs", 1e-3), "dram__bytes_read.sum": ("DRAM read MB", 1e-6),
        "dram__bytes_write.sum": ("DRAM write MB", 1e-6),
        "lts__t_bytes.sum": ("L2 bytes, MB (all clients)", 1e-6),
        "sm__inst_executed.sum": ("instructions, M", 1e-6),
        "dram__throughput.avg.pct_of_peak_sustained_elapsed": ("DRAM % of peak", 1),
        "lts__t_sector_hit_rate.pct": ("L2 hit %", 1),
        "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("SM % of peak", 1),
        "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed": ("tensor pipe % active", 1),
        "sm__cycles_elapsed.avg.per_second": ("SM MHz", 1e-6),
        "cycles": ("SM cycles, M (µs × MHz)", 1e-6),
        "lts__t_requests_srcunit_tex_op_read.sum": ("L2 read requests from the SMs, M", 1e-6),
        "lrc__request_sectors_op_read_coalescing_achieved_type_hardware.sum":
            ("read sectors the LRC merged (no L2 lookup), M", 1e-6),
    }
    print(f"\n# ncu, {title}, the timed call (own clocks, warm caches)\n")
    print("| metric | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    def row(label, m, scale):
        print(f"| {label} | " + " | ".join(
            f"{values[n][m] * scale:.1f}" if m in values[n] else "n/a" for n in names) + " |")
    for m, (label, scale) in short.items():
        row(label, m, scale)
    stalls = sorted({m for n in names for m in values[n]
                     if m.startswith("smsp__average_warps_issue_stalled_")},
                    key=lambda m: -max(values[n].get(m, 0.0) for n in names))
    for m in stalls[:8]:
        row("stall " + m[len("smsp__average_warps_issue_stalled_"):-len("_per_issue_active.ratio")], m, 1)
    import os
    for m in filter(None, os.environ.get("GEMM_PROFILE_EXTRA_METRICS", "").split(",")):
        row(m, m, 1)  # as ncu reports it (base units), summed over kernels when it ends in .sum


def ncu_second_half(argv):
    """ncu-second-half CSV: keeps the GEMM kernels of the timed (second) call of an ncu CSV, in
    place (the whole file stays as CSV.all)."""
    import csv, io, re, sys
    path = argv[1]
    ours = re.compile(r"write_gemm_pointers|write_counts|fill_kernel|moekit::|randn_bf16|count_nonfinite|"
                      r"bf16_to_f32|gather_strided|count_diff")
    lines = open(path + ".all").read().splitlines(keepends=True)
    quoted = [l for l in lines if l.startswith('"')]
    if not quoted:
        sys.exit(0)
    ids = []
    for r in csv.DictReader(io.StringIO("".join(quoted))):
        if r["ID"] not in ids and not ours.search(r.get("Kernel Name", "")):
            ids.append(r["ID"])
    keep = set(ids[len(ids) // 2:])
    with open(path, "w") as f:
        f.write(quoted[0])
        for l in quoted[1:]:
            if next(csv.reader([l]))[0] in keep:
                f.write(l)


def ncu_source_table(argv):
    """ncu-source-table TOP CONTEXT CSV [CSV_B]: tools/profile hotspots' table of ncu's
    per-instruction stall samples (or the difference of two runs)."""
    import csv, re, sys
    top, context, paths = int(argv[1]), (int(argv[2]) if argv[2] else None), argv[3:]

    def num(s):
        try:
            return float(str(s).replace(",", ""))
        except ValueError:
            return 0.0

    class Page:
        """One source page: its rows and the columns the tables read."""
        def __init__(self, path):
            with open(path, newline="") as f:
                lines = [l for l in f if l.startswith('"')]
            # ncu puts a "Kernel Name" line before the table's header ("Address","Source",...).
            head = next((i for i, l in enumerate(lines) if l.startswith('"Address"')), 0)
            self.rows = list(csv.DictReader(lines[head:]))
            if not self.rows:
                sys.exit("no rows in " + path)
            cols = list(self.rows[0].keys())
            # The all-samples column ("Warp Stall Sampling (All Samples)") and the per-reason ones
            # ("stall_long_sb", ...; ncu 2025.3 also has "stall_... (Not Issued)" columns, left out).
            self.total = next((c for c in cols if "Sampling (All" in c), None)
            if self.total is None:
                sys.exit("no 'Warp Stall Sampling (All Samples)' column in " + path + "; columns: " + ", ".join(cols))
            self.source = next((c for c in cols if c.strip().lower() in ("source", "sass")),
                               cols[1] if len(cols) > 1 else cols[0])
            self.addr = next((c for c in cols if "Address" in c), None)
            self.reasons = [c for c in cols if c.startswith("stall_") and "(" not in c]
            self.executed = next((c for c in cols if c.strip() == "Instructions Executed"), None)
            self.samples = sum(num(r[self.total]) for r in self.rows)

        def text(self, r):
            return r[self.source].strip()

        def mix(self):
            """Warp-level instructions executed per opcode (the first word of the SASS after any
            predicate, with its modifiers); None without the column."""
            if self.executed is None:
                return None
            mix = {}
            for r in self.rows:
                words = r[self.source].split()
                if words and words[0].startswith("@"):
                    words = words[1:]
                if words:
                    mix[words[0]] = mix.get(words[0], 0.0) + num(r[self.executed])
            return mix

    def table(page):
        all_samples = page.samples or 1.0
        print(f"{len(page.rows)} SASS instructions, {page.samples:.0f} stall samples; top {top}:")
        print("| share % | address | instruction | top reasons (share of its samples) |")
        print("|---|---|---|---|")
        for r in sorted(page.rows, key=lambda r: -num(r[page.total]))[:top]:
            n = num(r[page.total])
            why = sorted(((num(r[c]), c) for c in page.reasons), reverse=True)[:3]
            why = ", ".join(f"{c[len('stall_'):]} {100 * v / n:.0f}%" for v, c in why if v > 0 and n > 0)
            print(f"| {100 * n / all_samples:.1f} | {r.get(page.addr, '') if page.addr else ''} | "
                  f"{page.text(r)[:60]} | {why} |")
        mix = page.mix()
        if mix is not None:
            count = sum(mix.values()) or 1.0
            print(f"\ninstruction mix: {count / 1e6:.2f} M warp instructions executed; top {top}:")
            print("| opcode | M executed | share % |")
            print("|---|---|---|")
            for op, v in sorted(mix.items(), key=lambda kv: -kv[1])[:top]:
                print(f"| {op} | {v / 1e6:.3f} | {100 * v / count:.1f} |")

    def diff(a, b):
        """B against A. Per instruction only where both pages are one kernel binary (the same SASS at
        every offset from the kernel's first address: one kernel on two problems or settings); the
        instruction mix in any case (two kernels)."""
        print(f"A: {len(a.rows)} SASS instructions, {a.samples:.0f} stall samples; "
              f"B: {len(b.rows)}, {b.samples:.0f}")
        def by_offset(page):
            """{offset: (row, the SASS with its branch targets as offsets)}: a kernel loads at another
            address in every run."""
            if page.addr is None:
                return None
            where = [int(r[page.addr], 16) for r in page.rows]
            base, end = min(where), max(where)
            local = lambda m: f"+0x{int(m.group(0), 16) - base:x}" if base <= int(m.group(0), 16) <= end else m.group(0)
            return {w - base: (r, re.sub(r"0x[0-9a-fA-F]+", local, page.text(r))) for w, r in zip(where, page.rows)}
        oa, ob = by_offset(a), by_offset(b)
        same = oa is not None and ob is not None and oa.keys() == ob.keys() and all(
            oa[k][1].split() == ob[k][1].split() for k in oa)
        if same:
            print(f"\none binary: the instructions whose samples differ most (top {top}):")
            print("| offset | instruction | A samples | B samples | B - A |")
            print("|---|---|---|---|---|")
            moved = sorted(oa, key=lambda k: -abs(num(ob[k][0][b.total]) - num(oa[k][0][a.total])))[:top]
            for k in moved:
                na, nb = num(oa[k][0][a.total]), num(ob[k][0][b.total])
                print(f"| 0x{k:x} | {oa[k][1][:60]} | {na:.0f} | {nb:.0f} | {nb - na:+.0f} |")
        else:
            print("\ntwo binaries: no per-instruction comparison")
        ma, mb = a.mix(), b.mix()
        if ma is None or mb is None:
            return
        print(f"\ninstruction mix, M warp instructions executed: A {sum(ma.values()) / 1e6:.2f}, "
              f"B {sum(mb.values()) / 1e6:.2f}; the opcodes that differ most (top {top}):")
        print("| opcode | A | B | B - A |")
        print("|---|---|---|---|")
        for op in sorted(set(ma) | set(mb), key=lambda o: -abs(mb.get(o, 0.0) - ma.get(o, 0.0)))[:top]:
            va, vb = ma.get(op, 0.0), mb.get(op, 0.0)
            print(f"| {op} | {va / 1e6:.3f} | {vb / 1e6:.3f} | {(vb - va) / 1e6:+.3f} |")

    def around(page, context):
        """Each of the top hotspots with the `context` instructions before it and two after, in address
        order, with their samples: what a hot branch or stall waits on is often the instruction before it
        (an mbarrier try-wait's predicate, a load's register)."""
        order = page.rows
        if page.addr is not None:
            order = sorted(page.rows, key=lambda r: int(r[page.addr], 16))
        index = {id(r): i for i, r in enumerate(order)}
        all_samples = page.samples or 1.0
        for rank, hot in enumerate(sorted(page.rows, key=lambda r: -num(r[page.total]))[:top], 1):
            i = index[id(hot)]
            print(f"\n#{rank}: {100 * num(hot[page.total]) / all_samples:.1f}% of the samples")
            print("| | address | instruction | samples |")
            print("|---|---|---|---|")
            for r in order[max(0, i - context):i + 3]:
                mark = ">>" if r is hot else ""
                print(f"| {mark} | {r.get(page.addr, '') if page.addr else ''} | {page.text(r)[:70]} | "
                      f"{num(r[page.total]):.0f} |")

    pages = [Page(p) for p in paths]
    if context is not None:
        around(pages[0], context)
    else:
        table(pages[0]) if len(pages) == 1 else diff(*pages)


def host_samples(argv):
    """host-samples RAW TOP: tools/profile host's table of moekit_host_latency's stack samples,
    symbolised (addr2line), inclusive and self."""
    import collections, subprocess, sys
    raw, top = argv[1], int(argv[2])
    head = next(l for l in open(raw) if l.startswith("profile:")).split()
    # "profile: <calls> calls, <us> us/call enqueue, <n> samples in <s> s"
    us_per_call, samples = float(head[3]), int(head[6])
    frames = [l.split() for l in open(raw) if l.startswith("frame ")]
    by_module = collections.defaultdict(set)
    for _, depth, module, off, hits in frames:
        by_module[module].add(off)
    names = {}
    for module, offs in by_module.items():
        offs = sorted(offs)
        try:
            out = subprocess.run(["addr2line", "-f", "-C", "-e", module, *offs], capture_output=True,
                                 text=True, check=True).stdout.splitlines()
            fn = out[0::2]
        except (OSError, subprocess.CalledProcessError):
            fn = ["??"] * len(offs)
        short = module.rsplit("/", 1)[-1]
        for off, f in zip(offs, fn):
            names[(module, off)] = f"{f if f != '??' else off} [{short}]"
    incl, self_ = collections.Counter(), collections.Counter()
    for _, depth, module, off, hits in frames:
        name = names[(module, off)]
        incl[name] += int(hits)
        if depth == "0":
            self_[name] += int(hits)
    def show(title, counter):
        print(f"-- {title} (share of {samples} samples, us per call of {us_per_call:.2f})")
        for name, n in counter.most_common(top):
            share = n / max(samples, 1)
            print(f"{100 * share:6.1f}% {share * us_per_call:7.2f} us  {name[:150]}")
    show("inclusive", incl)
    show("self", self_)


def clock_summary(argv):
    """clock-summary SMI_FILE [--mhz]: one line of nvidia-smi samples taken while the GPU was busy:
    median SM clock and power, and the clock-event reasons active (tools/lib/clock-sample)."""
    import os, statistics, sys
    path, mode = argv[1], argv[2]
    # nvidia-smi's clocks_event_reasons bits (nvml.h, nvmlClocksEventReason*).
    REASONS = {0x1: "idle", 0x2: "app clocks", 0x4: "sw power cap", 0x8: "hw slowdown",
               0x10: "sync boost", 0x20: "sw thermal", 0x40: "hw thermal", 0x80: "hw power brake",
               0x100: "display clocks"}
    rows = []
    if os.path.exists(path):
        for line in open(path):
            fields = [v.strip() for v in line.split(",")]
            try:
                mask = int(fields[2], 16) if len(fields) > 2 else None
                rows.append((float(fields[0]), float(fields[1]), mask))
            except (ValueError, IndexError):
                pass
    if not rows:
        sys.exit(0)
    peak = max(w for _, w, _ in rows)
    busy = [r for r in rows if r[1] >= peak / 2]
    mhz = statistics.median(m for m, _, _ in busy)
    if mode == "--mhz":
        print(f"{mhz:.0f}")
        sys.exit(0)
    line = (f"SM {mhz:.0f} MHz, {statistics.median(w for _, w, _ in busy):.0f} W "
            f"(median of {len(busy)} busy samples)")
    masks = [k for _, _, k in busy if k is not None]
    if masks:
        counts = [(label, sum(1 for k in masks if k & bit)) for bit, label in REASONS.items()]
        top = sorted((c for c in counts if c[1]), key=lambda c: -c[1])
        line += "; clock limited by: " + (", ".join(f"{label} {100 * n // len(masks)}%"
                                                     for label, n in top) or "nothing")
    print(line)


def power_table(argv):
    """power-table NAME=JSON...: bench/studies/tools/power-study's energy-per-FLOP table from
    moekit_bench JSON."""
    import json, statistics, sys
    runs = {}  # (name, data) -> {(shape, routing, pass): [(tflops, mhz, watts)]}
    names = []
    for arg in argv[1:]:
        name, path = arg.split("=", 1)
        if name not in names:
            names.append(name)
        d = json.load(open(path))
        data = d.get("data", "normal")
        backend = "cublas" if name.startswith("cublas") else "sm90"
        rows = runs.setdefault((name, data), {})
        for r in d["results"]:
            b = r["backends"].get(backend)
            if not b or not b.get("check", {}).get("pass", False):
                sys.exit(f"{path}: {r['shape']} {r['pass']}: no checked {backend} result")
            if not b.get("power_w") or not b.get("tflops"):
                sys.exit(f"{path}: {r['shape']} {r['pass']}: no power or throughput reading")
            rows.setdefault((r["shape"], r["routing"], r["pass"]), []).append(
                (b["tflops"], b.get("sm_mhz", 0), b["power_w"]))
    datas = [x for x in ("normal", "constant") if any((n, x) in runs for n in names)]
    problems = []
    for (n, x), rows in runs.items():
        problems += [p for p in rows if p not in problems]
    def med(name, data, p):
        v = runs.get((name, data), {}).get(p)
        if not v:
            return None
        t, m, w = (statistics.median(x[i] for x in v) for i in range(3))
        return t, m, w, w / t  # pJ per FLOP
    ref = names[0]
    print(f"\n# Energy per FLOP (pJ = W / TFLOP/s), medians over turns; ratios to {ref}\n")
    head = "| shape | routing | pass | variant |"
    for x in datas:
        head += f" {x} TFLOP/s | MHz | W | pJ/FLOP | / {ref} |"
    if len(datas) == 2:
        head += " operand part (normal − constant) |"
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    sums = {}
    for p in problems:
        for n in names:
            cells, pj = [], {}
            for x in datas:
                v, r = med(n, x, p), med(ref, x, p)
                if v is None:
                    cells.append(" — | — | — | — | — |")
                    continue
                pj[x] = v[3]
                ratio = v[3] / r[3] if r else float("nan")
                sums.setdefault((n, x), []).append(ratio)
                cells.append(f" {v[0]:.1f} | {v[1]:.0f} | {v[2]:.0f} | {v[3]:.3f} | {ratio:.3f} |")
            line = f"| {p[0]} | {p[1]} | {p[2]} | {n} |" + "".join(cells)
            if len(datas) == 2:
                line += f" {pj['normal'] - pj['constant']:.3f} |" if len(pj) == 2 else " — |"
            print(line)
    print(f"\n# Median energy per FLOP / {ref}'s over the problems\n")
    for n in names:
        print(f"{n}: " + ", ".join(
            f"{x} {statistics.median(sums[(n, x)]):.3f} (min {min(sums[(n, x)]):.3f}, max "
            f"{max(sums[(n, x)]):.3f})" for x in datas if (n, x) in sums))


COMMANDS = {
    "bench-rows-json": bench_rows_json,
    "bench-best": bench_best,
    "bandwidth-summary": bandwidth_summary,
    "ctest-junit": ctest_junit,
    "sanitizer-summary": sanitizer_summary,
    "ab-table": ab_table,
    "env-table": env_table,
    "orders-summary": orders_summary,
    "settings-tables": settings_tables,
    "mlp-run-line": mlp_run_line,
    "mlp-ab-table": mlp_ab_table,
    "step-kernels": step_kernels,
    "ncu-table": ncu_table,
    "ncu-second-half": ncu_second_half,
    "ncu-source-table": ncu_source_table,
    "host-samples": host_samples,
    "clock-summary": clock_summary,
    "power-table": power_table,
}


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print("usage: moekit_results.py COMMAND ARGS...\ncommands:", file=sys.stderr)
        for n, f in COMMANDS.items():
            print(f"  {n:18} {(f.__doc__ or '').strip().splitlines()[0]}", file=sys.stderr)
        sys.exit(2)
    COMMANDS[sys.argv[1]](sys.argv[1:])


if __name__ == "__main__":
    main()
