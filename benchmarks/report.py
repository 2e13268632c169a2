"""What benchmark.py prints and writes: the plan of the run, the checks, the ratios between
runners, one table per config, the summary table and the JSON file. The tables come at the
end of the run, once the matmul peak has been measured again."""

import json
from pathlib import Path

from memory import NOT_MEASURED
from runners import RUNNER_NAMES
from tinyvit import backend


def print_plan(args, machine, peak_size, repeats, peaks):
    """The runners and the method of this run, before its first config."""
    if machine["torch"] is None:
        print("PyTorch not found: no PyTorch runner (to compare, pip install torch==2.13.0)")
    print(f"float32 matmul peak ({peak_size}x{peak_size}, best of {repeats}): "
          + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in peaks.items())
          + " (measured again at the end)")
    print(f"timing: {args.rounds} interleaved round(s); each turn {args.warmup} untimed step(s), "
          f"then {args.steps} timed; "
          f"memory: fresh subprocess per runner, config and phase, {args.memory_steps} step(s)")
    print("tinyvit runners: " + ", ".join(RUNNER_NAMES[t] for t in args.tiers)
          + (f"; tinyvit@{args.baseline_label} from {args.baseline} in a child process of "
             f"its own (memory {NOT_MEASURED})" if args.baseline else ""))
    if args.workers > 1:
        print(f"each tier's runner uses {args.workers} worker processes of one BLAS thread each "
              "(tinyvit.train.parallel); its memory figures are summed over them and the parent")
    print()


def describe(c):
    return (f"{c.image_size}x{c.image_size}x{c.in_channels}, patch {c.patch_size}, "
            f"dim {c.embed_dim}, depth {c.depth}, heads {c.num_heads}, "
            f"mlp_ratio {c.mlp_ratio:g}, {c.num_classes} classes")


def print_checks(check):
    if not check["runners"]:
        print(f"  ({check['against']} alone: no cross-check)")
    for name, worst in check["runners"].items():
        print(f"  same function as {check['against']}, {name}: logits rel diff "
              f"{worst['train']['logits_rel_diff']:.1e} (train) "
              f"{worst['eval']['logits_rel_diff']:.1e} (eval), "
              f"loss diff {worst['train']['loss_diff']:.1e}")


# ---------------------------------------------------------------------------
# Ratios between runners
# ---------------------------------------------------------------------------


def ratio(a, b):
    return None if a is None or not b else a / b  # a peak memory growth can be 0


def get(result, runner, *keys):
    """result[runner][k1][k2]..., or None where the runner is absent or memory failed
    or was not measured."""
    value = result.get(runner)
    for k in keys:
        value = value.get(k) if isinstance(value, dict) else None
    return value


def ratio_references(names):
    """The runners whose times (and memory) the others are divided by: the first
    tinyvit runner when there are several, and torch."""
    tinyvits = [n for n in names if n != "torch"]
    first = tinyvits[:1] if len(tinyvits) > 1 else []
    return first + (["torch"] if "torch" in names else [])


def ratios_to(result, name, ref):
    """Runner ``name``'s median times and peak memory over runner ``ref``'s."""
    ratios = {}
    for phase in ("train", "infer"):
        ratios[f"{phase}_ms"] = ratio(get(result, name, phase, "median_ms"),
                                      get(result, ref, phase, "median_ms"))
        ratios[f"{phase}_peak_mb"] = ratio(get(result, name, "peak_memory", phase, "peak_mb"),
                                           get(result, ref, "peak_memory", phase, "peak_mb"))
    return ratios


def add_ratios(result):
    """Each tinyvit runner's ``ratio_to`` every reference runner but itself (above 1:
    slower, more memory)."""
    references = ratio_references(result["runners"])
    for name in result["runners"]:
        if name != "torch":
            result[name]["ratio_to"] = {ref: ratios_to(result, name, ref)
                                        for ref in references if ref != name}


# ---------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------


def render(rows, header, align, groups=None):
    """An aligned text table. ``align``: 'l' or 'r' per column; ``groups``:
    optional (title, number of columns) pairs, centred over their columns."""
    widths = [max(len(str(row[i])) for row in rows + [header]) for i in range(len(align))]
    spans, first = [], 0
    for title, n in groups or []:
        last = first + n - 1
        widths[last] += max(0, len(title) - (sum(widths[first:last + 1]) + 2 * (n - 1)))
        spans.append(title.center(sum(widths[first:last + 1]) + 2 * (n - 1)))
        first = last + 1

    def line(cells):
        return "  " + "  ".join(cells).rstrip()

    def row_line(row):
        return line(str(v).ljust(w) if a == "l" else str(v).rjust(w)
                    for v, w, a in zip(row, widths, align))

    rule = "  " + "-" * (sum(widths) + 2 * (len(widths) - 1))
    top = [line(spans)] if groups else []
    return "\n".join(top + [row_line(header), rule] + [row_line(r) for r in rows])


def fmt(value, spec=".1f"):
    return "-" if value is None else format(value, spec)


def display(name):
    return "PyTorch" if name == "torch" else name


def memory_cell(result, runner, phase):
    if result[runner]["peak_memory"] == NOT_MEASURED:
        return NOT_MEASURED
    return fmt(get(result, runner, "peak_memory", phase, "peak_mb"))


def spread_cell(stats):
    return f"{stats['min_ms']:.1f} / {stats['max_ms']:.1f}"


def rate_cell(stats):
    return f"{stats['gflops']:.1f} ({100 * stats['fraction_of_peak']:.0f}%)"


def config_rows(result):
    """The rows of one config's table: times, rates and memory, with their ratios."""
    names, references = result["runners"], ratio_references(result["runners"])

    def row(label, cell):
        return [label] + [cell(n) for n in names]

    def ratio_rows(label, key):
        return [row(f"{label} / {display(ref)}",
                    lambda n: "" if n in (ref, "torch")
                    else fmt(result[n]["ratio_to"][ref][key], ".2f"))
                for ref in references]

    rows = []
    for phase in ("train", "infer"):
        rows += [row(f"{phase} ms, median", lambda n: fmt(result[n][phase]["median_ms"])),
                 row(f"{phase} ms, min / max", lambda n: spread_cell(result[n][phase])),
                 row(f"{phase} images/s", lambda n: fmt(result[n][phase]["images_per_s"], ".0f")),
                 row(f"{phase} GFLOP/s (% peak)", lambda n: rate_cell(result[n][phase])),
                 *ratio_rows(f"{phase} ms", f"{phase}_ms")]
    for phase in ("train", "infer"):
        rows.append(row(f"{phase} peak memory MB", lambda n: memory_cell(result, n, phase)))
    for phase in ("train", "infer"):
        rows += ratio_rows(f"{phase} peak MB", f"{phase}_peak_mb")
    return rows


def print_config(name, result):
    """One column per runner; the ratio rows divide each tinyvit runner's figure by
    the reference runner's named in the row."""
    names = result["runners"]
    print(f"\nconfig {name}: {result['config']}, batch {result['batch']}")
    flops = result["forward_matmul_flops"]
    print(f"  {result['params']:,} parameters; matmul FLOPs per batch, forward (train step 3x): "
          + ", ".join(f"{display(n)} {flops[n] / 1e9:.2f} G" for n in names))
    print(render(config_rows(result), [""] + [display(n) for n in names],
                 "l" + "r" * len(names)))
    trained = result["loss_after_training"]
    print(f"  loss after {trained['steps']} train steps on the batch: "
          + ", ".join(f"{display(n)} {trained[n]:.5f}" for n in names))


def summary_row(config, result, name, references):
    row = [config, display(name)]
    for phase in ("train", "infer"):
        row.append(fmt(result[name][phase]["median_ms"]))
        row += ["" if ref == name or name == "torch"
                else fmt(result[name]["ratio_to"][ref][f"{phase}_ms"], ".2f")
                for ref in references]
    row.append(rate_cell(result[name]["train"]))
    row += [memory_cell(result, name, phase) for phase in ("train", "infer")]
    return row


def print_summary(results, peaks):
    """One row per config and runner."""
    references = ratio_references(next(iter(results.values()))["runners"])
    ratio_columns = [f"/ {display(ref)}" for ref in references]
    groups = [("", ["config", "runner"]), ("train ms", ["median", *ratio_columns]),
              ("infer ms", ["median", *ratio_columns]), ("train", ["GFLOP/s (% peak)"]),
              ("peak MB", ["train", "infer"])]
    header = [col for _, cols in groups for col in cols]
    rows = [summary_row(config, result, name, references)
            for config, result in results.items() for name in result["runners"]]
    print("\nsummary (/ X = median time over X's: above 1, slower than X; % of the "
          f"{backend.get_backend()} matmul peak; peaks, best of start and end: "
          + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in peaks.items()) + ")")
    print(render(rows, header, "ll" + "r" * (len(header) - 2), [(t, len(c)) for t, c in groups]))


def write_json(path, machine, settings, peak_size, peaks, results):
    """The run's figures as JSON; ``peaks``: the matmul peaks used, before and after."""
    payload = {"machine": machine, "settings": settings, "matmul_peak_size": peak_size,
               "matmul_peak_gflops": peaks, "configs": results}
    Path(path).write_text(json.dumps(payload, indent=2))
    print(f"\nwrote {path}")
