"""The benchmark script runs (its quick mode, as CI may run it): it is a script,
not a timed test, so only its output's shape is checked, never its figures; and
its interleaving leaves each turn's first steps untimed."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "benchmark.py"
PROFILE = SCRIPT.with_name("layer_profile.py")


@pytest.fixture(scope="module")
def bench():
    return load_script(SCRIPT)


@pytest.fixture(scope="module")
def measure(bench):
    """benchmark.py's timing and FLOP counts (loading it puts benchmarks/ on sys.path)."""
    return importlib.import_module("measure")


class FakeClock:
    """Seconds that only the fake runners' steps advance; ``last`` is the
    (framework, phase) of the step before."""

    def __init__(self):
        self.now, self.last = 0.0, None


class FakeRunner:
    """A runner whose step takes 1 ms, or 1 s when the step before it was another
    runner's or another phase's (the cost of switching)."""

    def __init__(self, name, clock):
        self.name, self.clock = name, clock
        self.phase, self.steps = None, []

    def set_training(self, mode):
        self.phase = "train" if mode else "infer"

    def _step(self):
        key = (self.name, self.phase)
        self.clock.now += 1e-3 if self.clock.last in (None, key) else 1.0
        self.clock.last = key
        self.steps.append(self.phase)

    train_step = infer = _step

    def sync(self):
        pass


@pytest.mark.parametrize("warmup, slow_steps", [(0, 7), (1, 0), (2, 0)])
def test_every_turn_starts_with_untimed_steps(measure, monkeypatch, warmup, slow_steps):
    """2 rounds of 3 timed steps: every turn (framework x phase x round) begins with
    ``warmup`` untimed steps, which take the switching cost; with none, the first
    timed step of every turn but the very first pays it (7 of 8 turns)."""
    clock = FakeClock()
    monkeypatch.setattr(measure.time, "perf_counter", lambda: clock.now)
    runners = [FakeRunner("tinyvit", clock), FakeRunner("torch", clock)]
    times = measure.time_interleaved(runners, steps=3, rounds=2, warmup=warmup)
    assert sorted(times) == sorted((n, p) for n in ("tinyvit", "torch") for p in ("train", "infer"))
    assert all(len(ms) == 6 for ms in times.values())
    timed = [t for ms in times.values() for t in ms]
    assert sum(t == pytest.approx(1000.0) for t in timed) == slow_steps
    assert sum(t == pytest.approx(1.0) for t in timed) == len(timed) - slow_steps
    for r in runners:  # per round: warmup + 3 training steps, then warmup + 3 inferences
        assert r.steps == (["train"] * (warmup + 3) + ["infer"] * (warmup + 3)) * 2


@pytest.mark.parametrize("script, flags, message", [
    (SCRIPT, ["--rounds", "0"], "--rounds must be at least 1, got 0"),
    (SCRIPT, ["--batch", "-3"], "--batch must be at least 1, got -3"),
    (SCRIPT, ["--warmup", "-1"], "--warmup must be at least 0, got -1"),
    (SCRIPT, ["--configs", "A,Z"], "unknown config(s) ['Z']; known: A, B, C"),
    (SCRIPT, ["--quick", "--configs", "D"], "unknown config(s) ['D']; known: A, B, C"),
    (SCRIPT, ["--configs", " , "], "--configs: expected one or more of A, B, C, got none"),
    (SCRIPT, ["--quick", "--steps", "0"], "--steps must be at least 1, got 0"),
    (SCRIPT, ["--tiers", "fast,quick"],
     "--tiers: expected distinct names among fast, reference, graph, got fast,quick"),
    (SCRIPT, ["--baseline", "/nonexistent"],
     "--baseline: expected a source tree holding tinyvit/__init__.py, got /nonexistent"),
    (PROFILE, ["--images", "0"], "--images must be at least 1, got 0"),
    (PROFILE, ["--batch", "-1"], "--batch must be at least 1, got -1"),
    (PROFILE, ["--config", "b", "--recipe", "mnist"],
     "--config B and --recipe mnist each name a step: give one"),
])
def test_bad_flags_are_named_in_one_line(capsys, script, flags, message):
    with pytest.raises(SystemExit) as exit:
        load_script(script).parse_args(flags)
    assert exit.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f": error: {message}")


@pytest.mark.parametrize("script", ["benchmark.py", "ops.py", "layer_profile.py", "compiled.py",
                                    "scaling.py"])
def test_a_bad_kernel_setting_is_one_line_before_any_work(capsys, monkeypatch, script):
    """Checked as the flags are (a script without ``parse_args`` checks in ``main``)."""
    monkeypatch.setenv("TINYVIT_MKL", "on")
    module = load_script(SCRIPT.with_name(script))
    with pytest.raises(SystemExit) as exit:
        getattr(module, "parse_args", module.main)([])
    assert exit.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        ": error: TINYVIT_MKL: expected 1 (MKL's products, where it is installed) or 0 "
        "(NumPy's), got 'on'")


@pytest.mark.parametrize("flags, configs, steps, rounds", [
    ([], ["A", "B", "C"], 5, 3),
    (["--quick"], ["A"], 2, 1),
    (["--quick", "--configs", "b"], ["B"], 2, 1),  # the flag given beside --quick wins
    (["--configs", "C", "--quick", "--rounds", "2"], ["C"], 2, 2),
])
def test_quick_sets_only_the_flags_not_given(bench, flags, configs, steps, rounds):
    args = bench.parse_args(flags)
    assert (args.configs, args.steps, args.rounds) == (configs, steps, rounds)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])  # 2: tinyvit's step split over worker processes
def test_benchmark_quick_mode_runs(tmp_path, workers):
    out = tmp_path / "bench.json"
    result = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--workers", str(workers),
                             "--json", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(out.read_text())
    assert list(figures["configs"]) == ["A"] and figures["settings"]["workers"] == workers
    # cls pooling: tinyvit's last block computes one row, PyTorch (when installed) every row
    flops = figures["configs"]["A"]["forward_matmul_flops"]
    every_row = 621_314_048
    assert 0 < flops["tinyvit"] < every_row and flops.get("torch", every_row) == every_row
    train = figures["configs"]["A"]["tinyvit"]["train"]
    assert train["median_ms"] > 0 and train["images_per_s"] > 0
    memory = figures["configs"]["A"]["tinyvit"]["peak_memory"]["train"]
    assert memory["peak_mb"] > 0
    if Path("/proc/self/status").exists():  # with workers, the parent's and theirs
        assert ("summed over 3 processes" in memory["method"]) == (workers == 2)
    assert "summary" in result.stdout.lower()


# runs the script given after it with torch unimportable, as where it is not installed
WITHOUT_TORCH = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = sys.argv[1:]; "
                 "runpy.run_path(sys.argv[0], run_name='__main__')")


def run_tiny(tmp_path, *flags, torch=True):
    """The script in quick mode on a batch of 8 with ``flags``: (its JSON, its stdout)."""
    out = tmp_path / "bench.json"
    python = [sys.executable] + ([] if torch else ["-c", WITHOUT_TORCH])
    result = subprocess.run([*python, str(SCRIPT), "--quick", "--batch", "8",
                             "--json", str(out), *flags],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(out.read_text()), result.stdout


def check_runner_figures(config, name):
    for phase in ("train", "infer"):
        assert config[name][phase]["median_ms"] > 0 and config[name][phase]["gflops"] > 0
    assert config["loss_after_training"][name] > 0


@pytest.fixture(scope="module")
def both_tiers_and_this_tree(tmp_path_factory):
    """run_tiny's JSON and stdout with both tiers timed and this tree as its own baseline:
    the child imports the same code, so its logits and its loss after training are
    tinyvit's."""
    return run_tiny(tmp_path_factory.mktemp("tiers"), "--tiers", "fast,reference",
                    "--baseline", str(ROOT), "--baseline-label", "same")


@pytest.mark.slow
def test_benchmark_times_both_tiers(bench, measure, both_tiers_and_this_tree):
    figures, stdout = both_tiers_and_this_tree
    config = figures["configs"]["A"]
    torch = ["torch"] if figures["machine"]["torch"] else []
    assert config["runners"] == ["tinyvit", "tinyvit-reference", "tinyvit@same", *torch]
    assert figures["settings"]["tiers"] == ["fast", "reference"]
    for name in ["tinyvit", "tinyvit-reference", *torch]:
        check_runner_figures(config, name)
        assert config[name]["peak_memory"]["train"]["peak_mb"] > 0
    assert config["check"]["against"] == "tinyvit"
    assert sorted(config["check"]["runners"]) == sorted(["tinyvit-reference", "tinyvit@same",
                                                         *torch])
    # both tiers' last block computes the class token's row alone
    flops = config["forward_matmul_flops"]
    one_row = measure.matmul_flops(bench.CONFIGS["A"], 8, last_block_rows=1)
    assert flops["tinyvit"] == flops["tinyvit-reference"] == one_row
    ratios = config["tinyvit-reference"]["ratio_to"]
    assert sorted(ratios) == sorted(["tinyvit", *torch]) and ratios["tinyvit"]["train_ms"] > 0
    assert "tinyvit-reference" in stdout.split("summary")[1]


@pytest.mark.slow
def test_benchmark_baseline_of_this_tree_computes_the_same(both_tiers_and_this_tree):
    figures, stdout = both_tiers_and_this_tree
    config = figures["configs"]["A"]
    torch = ["torch"] if figures["machine"]["torch"] else []
    assert config["runners"] == ["tinyvit", "tinyvit-reference", "tinyvit@same", *torch]
    assert figures["settings"]["baseline"] == str(ROOT)
    for name in config["runners"]:
        check_runner_figures(config, name)
    same = config["check"]["runners"]["tinyvit@same"]
    assert same["train"]["logits_rel_diff"] == same["eval"]["logits_rel_diff"] == 0
    losses = config["loss_after_training"]
    assert losses["tinyvit@same"] == pytest.approx(losses["tinyvit"], rel=1e-6)
    assert config["tinyvit@same"]["peak_memory"] == "not measured"
    flops = config["forward_matmul_flops"]
    assert flops["tinyvit@same"] == flops["tinyvit"]
    assert config["tinyvit@same"]["ratio_to"]["tinyvit"]["infer_ms"] > 0
    assert "not measured" in stdout.split("summary")[1]


@pytest.mark.slow
def test_benchmark_compares_tinyvits_without_torch(tmp_path):
    figures, _ = run_tiny(tmp_path, "--tiers", "fast,reference", "--baseline", str(ROOT),
                          "--baseline-label", "same", torch=False)
    config = figures["configs"]["A"]
    assert figures["machine"]["torch"] is None
    assert config["runners"] == ["tinyvit", "tinyvit-reference", "tinyvit@same"]
    for name in config["runners"]:
        check_runner_figures(config, name)
    for name in ("tinyvit-reference", "tinyvit@same"):
        assert list(config[name]["ratio_to"]) == ["tinyvit"]


@pytest.mark.parametrize("flags, layers", [
    ([], "fast kernels of tinyvit.fast.cpu: Linear x26,"),
    (["--reference"], "reference layers (tinyvit.nn)"),
])
def test_profile_charges_every_part_of_the_step(flags, layers):
    """The layer profile runs on a recipe's step, in the tier asked for, and lists
    exclusive times that, with 'everything else', cover the timed step (so no part is
    counted twice)."""
    out = subprocess.run([sys.executable, str(PROFILE), "--recipe", "cifar10", "--batch", "8",
                          "--images", "32", "--epochs", "1", *flags],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"recipe cifar10: 811,146 parameters, batch 8, backend numpy, "
                               f"{layers}")
    step = float(lines[2].split("timers: ")[1].split(" ms")[0])
    parts = {line[:32].strip(): float(line[32:]) for line in lines[3:]}
    assert {"Linear.backward", "Attention.forward", "GELU.forward", "LayerNorm.backward",
            "AdamW.update", "augment.random_crop", "augment.horizontal_flip",
            "everything else"} <= set(parts)
    assert sum(parts.values()) == pytest.approx(step, abs=0.02 * len(parts))  # printed to 0.01 ms


def test_profile_charges_a_layers_other_entry_points_to_its_own_forward_and_backward(bench):
    """The fast Block and MLP call a LayerNorm's forward_residual and backward_residual and
    a Linear's project in place of forward and backward: each is timed, and charged to
    the layer it ran on, not to the block that called it (``bench``: benchmarks/ on the
    path, for the profile's imports)."""
    from tinyvit.fast import cpu
    labels = {(owner, name): label
              for owner, name, label in load_script(PROFILE).timed_methods()}
    norm, linear = cpu.LayerNorm(4), cpu.Linear(2, 3)
    assert labels[(cpu.LayerNorm, "forward_residual")](norm) == "LayerNorm.forward"
    assert labels[(cpu.LayerNorm, "backward_residual")](norm) == "LayerNorm.backward"
    assert labels[(cpu.Linear, "project")](linear) == "Linear.forward"
    assert labels[(cpu.Linear, "backward")](linear) == "Linear.backward"


def test_profile_of_a_benchmark_config_charges_its_step():
    """With --config the profile times benchmark.py's step of that model: no augmentation,
    --images / --batch steps an epoch."""
    out = subprocess.run([sys.executable, str(PROFILE), "--config", "A", "--batch", "8",
                          "--images", "24", "--epochs", "2"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("config A: 139,018 parameters, batch 8, backend numpy, fast "
                               "kernels of tinyvit.fast.cpu: Linear x18,")
    assert lines[1].endswith(" ms (6 steps)")
    step = float(lines[2].split("timers: ")[1].split(" ms")[0])
    parts = {line[:32].strip(): float(line[32:]) for line in lines[3:]}
    # ClassAttention's backward is Attention's method, charged to the layer it ran on
    assert {"Linear.backward", "Attention.forward", "Attention.backward",
            "ClassAttention.forward", "ClassAttention.backward", "AdamW.update",
            "everything else"} <= set(parts)
    assert not any(label.startswith("augment.") for label in parts)
    assert sum(parts.values()) == pytest.approx(step, abs=0.02 * len(parts))


@pytest.mark.slow
def test_conv_benchmark_runs(tmp_path):
    out = tmp_path / "conv.json"
    script = SCRIPT.parent / "conv_benchmark.py"
    result = subprocess.run([sys.executable, str(script), "--batch", "2", "--rounds", "1",
                             "--json", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(out.read_text())
    assert len(figures["results"]) == 10 and figures["batch"] == 2  # the presets' stem shapes
    assert all(r["tinyvit"]["total_ms"] > 0 for r in figures["results"].values())
    layouts = {label: r["tinyvit"]["layout"] for label, r in figures["results"].items()}
    assert layouts["28x28x1 -> 32, 3x3 s2 p1"] == "channels-first"  # C 1 < Wo 14
    assert layouts["14x14x32 -> 64, 3x3 s2 p1"] == "channels-last"  # C 32 >= Wo 7


@pytest.fixture(scope="module")
def scaling(bench):
    """scaling.py (it imports layer_profile.py from benchmarks/, which loading
    benchmark.py puts on sys.path)."""
    return load_script(SCRIPT.with_name("scaling.py"))


def test_scaling_models_a_ring_allreduce(scaling):
    """2 (N - 1) / N of the bytes over the link, and 2 (N - 1) messages."""
    assert scaling.ring_allreduce_s(1e9, 2, 8) == pytest.approx(1.0 + 2 * scaling.LATENCY)
    assert scaling.ring_allreduce_s(1e9, 4, 8) == pytest.approx(1.5 + 6 * scaling.LATENCY)


def test_scaling_stops_gaining_where_doubling_gains_less_than_a_tenth(scaling):
    assert scaling.stops_gaining({2: 1.9, 4: 3.5, 8: 3.8, 16: 3.0}, 128) == \
        "N=4 (32 images a machine)"
    assert scaling.stops_gaining({2: 1.9, 4: 3.5}, 128) == "beyond N=4"


def test_scaling_takes_the_median_of_each_figure_over_runs(scaling):
    runs = [{"processes": 1, "recipes": {"mnist": {"batch": 128, "step_ms": t}}}
            for t in (30.0, 10.0, 20.0)]
    assert scaling.median_run(runs) == {"processes": 1,
                                        "recipes": {"mnist": {"batch": 128, "step_ms": 20.0}}}


def test_launches_sorts_the_profilers_cuda_events_by_name(bench):
    launches = load_script(SCRIPT.with_name("launches.py"))
    assert [launches.kind(name) for name in ("Memcpy HtoD (Pageable -> Device)",
                                             "Memset (Device)", "gelu_forward",
                                             "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n")] == [
        "memcpy", "memset", "kernel", "kernel"]


def test_paired_times_two_commands_in_turn_and_stops_at_a_failure(tmp_path, capsys):
    paired = load_script(SCRIPT.with_name("paired.py"))
    log = tmp_path / "order.txt"
    paired.main(["-n", "2", f"echo A >> {log}", f"echo B >> {log}"])
    assert log.read_text().split() == ["A", "B", "A", "B", "A", "B"]  # the warm-ups, then pairs
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["A", "B", "A/B wall, pair by pair"]
    with pytest.raises(SystemExit, match=r"^paired.py: exit status 3 from: exit 3$"):
        paired.main(["-n", "1", "exit 3", "true"])


@pytest.mark.parametrize("numba, mkl, says", [
    (True, False, "GELU, LayerNorm and the softmax compiled by Numba (TINYVIT_NUMBA=0: in NumPy "
                  "blocks); Linear's products by NumPy's BLAS"),
    (False, True, "GELU, LayerNorm and the softmax in NumPy blocks; Linear's products by MKL "
                  "(TINYVIT_MKL=0: NumPy's BLAS)"),
])
def test_the_machine_report_says_which_route_the_cpu_kernels_take(bench, numba, mkl, says):
    """What a figure was measured with: benchmark.py's report (and its JSON), ops.py's,
    compiled.py's and the layer profile's first line name the kernels' threads and routes."""
    import machine
    kernels = {"threads": 3, "numba": numba, "mkl": mkl}
    assert machine.describe_cpu_kernels(kernels) == f"tinyvit threads 3; {says}"
    assert set(machine.machine_report(gpu=False)["cpu_kernels"]) == {"threads", "numba", "mkl"}


def test_ops_prints_a_row_per_op_with_both_times(capsys):
    """benchmarks/ops.py on a batch of 2 images: every op's row, with a time for each
    framework, a ratio and a share of the bandwidth or of the GEMM throughput."""
    pytest.importorskip("torch")
    ops = load_script(SCRIPT.with_name("ops.py"))
    ops.main(["--rounds", "1", "--repeats", "1", "--batch", "2"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| op, float32 | tinyvit ms | PyTorch ms | ratio |")
    assert len(rows) == 1 + 33
    for row in rows[1:]:
        name, ours, theirs, ratio, moved, share, their_share = row.strip("| ").split(" | ")
        assert float(ours) > 0 and float(theirs) > 0 and ratio.endswith("x")
        assert share.endswith("%") or share.endswith("% GEMM"), row
    with pytest.raises(SystemExit):
        ops.main(["--batch", "0"])


def test_compiled_prints_a_row_per_op_and_route(capsys):
    """benchmarks/compiled.py on 64 rows: tinyvit's blocks, each compiled route that is
    installed and PyTorch, each timed on both ops, each over the blocks' time."""
    compiled = load_script(SCRIPT.with_name("compiled.py"))
    compiled.main(["--rounds", "1", "--repeats", "1", "--rows", "64"])
    out = capsys.readouterr().out
    routes = out.split("routes: ", 1)[1].splitlines()[0].split(", ")
    assert routes[0] == "tinyvit (NumPy blocks)"
    rows = [line.strip("| ").split(" | ") for line in out.splitlines() if line.startswith("| ")]
    assert rows[0] == ["op, float32", "route", "ms", "/ tinyvit's blocks"]
    assert [(op, route) for op, route, _, _ in rows[1:]] == [
        (op, route) for route in routes for op in (compiled.GELU_ROW, compiled.NORM_ROW)]
    assert all(float(ms) > 0 for _, _, ms, _ in rows[1:])
    with pytest.raises(SystemExit):
        compiled.main(["--rows", "0"])
