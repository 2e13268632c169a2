"""benchmarks/gpu_check.py, the one command of a GPU machine, checked without a GPU: its dry
run end to end, the commands its GPU run would give, the budget that skips a phase that does
not fit and kills one that runs past its time, the figures read from pytest and metrics.json,
and CIFAR-10's files split into parts and joined back, a corrupted part refused."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REAL_DATA, load_script
from tinyvit import backend as B

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
PHASE_NAMES = ["environment", "fast-tests", "benchmark-128", "launches", "gpu-tests",
               "benchmark-1024", "cifar10"]
RECORD_KEYS = {"name", "command", "status", "reason", "exit_status", "seconds", "timeout_s",
               "log", "figures"}
XDIST = " -n 8" if importlib.util.find_spec("xdist") else ""  # the gpu tests' processes
CIFAR_BATCHES = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]


@pytest.fixture(scope="module")
def gpu_check():
    return load_script(SCRIPT)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """The dry run, every phase, into a fresh folder: (its process, the folder)."""
    out = tmp_path_factory.mktemp("dry") / "out"
    result = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--dry-run",
                             "--data-dir", str(REAL_DATA)],
                            capture_output=True, text=True, timeout=400)
    return result, out


def fake_cifar(data_dir, rng, records=3, skip=()):
    """A folder laid out as CIFAR-10's binary version, with random bytes: {relative path:
    bytes} of its files."""
    folder = data_dir / "cifar-10"
    contents = {f"cifar-10-batches-bin/{name}": rng.bytes(3073 * records)
                for name in CIFAR_BATCHES if name not in skip}
    contents["cifar-10-batches-bin/batches.meta.txt"] = b"airplane\nautomobile\n"
    contents["SHA256SUMS"] = b"(not checked)\n"
    for path, content in contents.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(content)
    return contents


def test_the_dry_run_writes_its_files_and_summary(dry_run):
    result, out = dry_run
    assert result.returncode == 0, result.stdout + result.stderr
    has_mnist = (REAL_DATA / "mnist").is_dir()
    expected = {"summary.json", "environment.json", "launches.json", "benchmark-128.json",
                "benchmark-1024.json"}
    expected |= {f"{name}.log" for name in PHASE_NAMES if has_mnist or name != "cifar10"}
    if has_mnist:
        expected |= {f"cifar10/{name}" for name in ("metrics.json", "curves.png",
                                                    "confusion.png", "best.npz", "last.npz")}
    assert {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} == expected
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines[:-1]] == PHASE_NAMES
    assert lines[-1] == f"wrote {out / 'summary.json'}"

    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"date", "started", "command", "dry_run", "budget_s", "spent_s",
                            "machine", "phases"}
    assert summary["dry_run"] is True and 0 < summary["spent_s"] <= summary["budget_s"] == 540
    assert summary["machine"]["gpu"] is None and summary["machine"]["processor"]
    records = {r["name"]: r for r in summary["phases"]}
    assert list(records) == PHASE_NAMES
    for name, record in records.items():
        assert set(record) == RECORD_KEYS
        if name == "cifar10" and not has_mnist:
            assert record["status"] == "skipped" and "no mnist under --data-dir" in record["reason"]
            continue
        assert (record["status"], record["reason"], record["exit_status"]) == ("ok", None, 0)
        assert record["seconds"] > 0 and record["log"] == f"{name}.log"
        assert (out / record["log"]).read_text().startswith(f"$ {record['command']}\n")


def test_the_dry_run_reads_each_phases_figures(dry_run):
    _, out = dry_run
    figures = {r["name"]: r["figures"] for r in json.loads((out / "summary.json").read_text())
               ["phases"]}
    environment = figures["environment"]
    assert environment["gpu"] is None and environment["numpy"] == np.__version__
    assert {"cupy", "driver", "cuda_driver", "cuda_runtime", "torch", "processor"} <= set(
        environment)
    # without a GPU the gpu tests are collected and skipped; test_fast.py's NumPy half runs
    assert figures["gpu-tests"]["skipped"] > 0 and figures["gpu-tests"]["passed"] == 0
    assert figures["fast-tests"]["passed"] > 0 and figures["fast-tests"]["failed"] == 0
    # the steps are taken on NumPy, and nothing is counted without a GPU
    assert figures["launches"] == {"batch": 8, "steps": 5, "backend": "numpy",
                                   "configs": {"A": {"reference": None, "fast": None,
                                                     "fast-infer": None, "graph": None}}}
    for name, batch in (("benchmark-128", 8), ("benchmark-1024", 64)):
        config = figures[name]["configs"]["A"]
        assert config["batch"] == batch and config["tinyvit"]["train_ms"] > 0
        assert config["tinyvit-graph"]["train_ms"] > 0
        assert figures[name]["tf32"] == "none: float32 on the CPU"
    if figures["cifar10"] is not None:
        training = figures["cifar10"]
        assert training["epochs"] == 1 and 0 <= training["final_test_acc"] <= 1
        assert set(training["reached"]) == {"85%", "88%", "90%"}


def test_the_gpu_run_gives_the_documented_commands(gpu_check, tmp_path):
    """The commands of the run without --dry-run, and their flags as their scripts read them."""
    fake_cifar(tmp_path / "data", np.random.default_rng(0))
    args = gpu_check.parse_args(["--out", str(tmp_path / "out"), "--data-dir",
                                 str(tmp_path / "data")])
    out, data = args.out, args.data_dir
    commands = {phase.name: phase.command(args, 500) for phase in gpu_check.PHASES}
    unset = "env -u CUPY_TF32 -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE"
    assert {name: str(command) for name, command in commands.items()} == {
        "environment": f"python benchmarks/gpu_check.py --environment {out}/environment.json",
        "gpu-tests": "python -m pytest -q -m gpu" + XDIST,
        "fast-tests": "python -m pytest -q tests/test_fast.py",
        "launches": f"python benchmarks/launches.py --json {out}/launches.json --tiers "
                    "reference,fast,graph",
        "benchmark-128": f"{unset} python benchmarks/benchmark.py --gpu --configs A,B,C "
                         f"--batch 128 --tiers fast,graph --json {out}/benchmark-128.json",
        "benchmark-1024": f"{unset} python benchmarks/benchmark.py --gpu --configs A,B,C "
                          f"--batch 1024 --tiers fast,graph --json {out}/benchmark-1024.json",
        # 500 s of the budget left, 30 of them for starting and the final report
        "cifar10": f"env CUPY_TF32=1 python train_mnist.py --recipe cifar10-gpu --data-dir {data} "
                   f"--out {out}/cifar10 --budget 7.8",
    }
    bench = load_script(ROOT / "benchmarks" / "benchmark.py").parse_args(
        commands["benchmark-1024"].argv[2:])
    assert (bench.gpu, bench.configs, bench.batch, bench.tiers) == (
        True, ["A", "B", "C"], 1024, ["fast", "graph"])
    train_mnist = load_script(ROOT / "train_mnist.py")
    config = train_mnist.make_config(train_mnist.parse_args(commands["cifar10"].argv[2:])[0])
    assert (config.dataset, config.backend, config.budget) == ("cifar10", "cupy", 7.8)
    launches = load_script(ROOT / "benchmarks" / "launches.py")
    assert launches.TIERS == ("reference", "fast", "graph")
    # where the environment phase found that capturing a CUDA graph fails: no graph tier
    args.graph_problem = "capturing a CUDA graph failed: ..."
    assert commands["benchmark-128"].argv[commands["benchmark-128"].argv.index("--tiers") + 1] \
        == "fast,graph"
    for command, tiers in [(gpu_check.benchmark(128)[0](args, 500), "fast"),
                           (gpu_check.launches_command(args, 500), "reference,fast")]:
        assert command.argv[command.argv.index("--tiers") + 1] == tiers
    # another recipe, with the step captured in a CUDA graph
    args = gpu_check.parse_args(["--out", str(out), "--data-dir", str(data), "--recipe",
                                 "cifar10-hybrid-gpu", "--cuda-graph"])
    command = gpu_check.cifar10_command(args, 500)
    assert str(command) == (f"env CUPY_TF32=1 python train_mnist.py --recipe cifar10-hybrid-gpu "
                            f"--data-dir {data} --out {out}/cifar10 --cuda-graph --budget 7.8")


@pytest.mark.parametrize("dry, dataset, folder", [
    (False, "cifar10", "cifar-10/cifar-10-batches-bin"),
    (True, "mnist", "mnist"),
])
def test_training_without_its_data_is_skipped_and_says_why(gpu_check, tmp_path, dry, dataset,
                                                           folder):
    args = gpu_check.parse_args(["--out", str(tmp_path / "out"), "--data-dir",
                                 str(tmp_path / "empty")] + (["--dry-run"] if dry else []))
    record = gpu_check.run_phase(gpu_check.PHASES[-1], args, 500)
    assert (record["status"], record["log"]) == ("skipped", None)
    assert record["reason"].startswith(f"no {dataset} under --data-dir {tmp_path / 'empty'}")
    assert f"expected {tmp_path / 'empty' / folder} holding " in record["reason"]
    assert ("--join-cifar" in record["reason"]) == (not dry)


def test_a_phase_runs_only_with_its_seconds_left(gpu_check):
    fixed = gpu_check.Phase("fixed", 240, None, None)
    rest = gpu_check.Phase("rest", 150, None, None, rest=True)
    assert gpu_check.timeout_for(fixed, 300) == 240  # its own time, not what is left
    assert gpu_check.timeout_for(rest, 300) == 300  # all that is left
    for phase in (fixed, rest):
        with pytest.raises(gpu_check.Skip) as skip:
            gpu_check.timeout_for(phase, 100.4)
        assert str(skip.value) == f"needs {phase.seconds} s of the budget, 100 s left"


def alive(pid):
    """Whether process ``pid`` runs (a zombie does not)."""
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] not in "ZX"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_phases_run_in_turn_within_the_budget(gpu_check, tmp_path, monkeypatch, capsys):
    """A failure stops nothing; a phase that needs more than is left is skipped; one past its
    time is killed with its children; the last takes the rest."""
    def python(code):
        return lambda args, timeout: gpu_check.Command(["python", "-c", code])

    def nothing(args, log):
        return None

    sleeper = ("import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', "
               "'import time; time.sleep(60)']); print(child.pid, flush=True); time.sleep(60)")
    monkeypatch.setattr(gpu_check, "PHASES", [
        gpu_check.Phase("fails", 5, python("print('to the log'); exit(3)"), nothing),
        gpu_check.Phase("too-long", 1000, python("pass"), nothing),
        gpu_check.Phase("hangs", 1, python(sleeper), nothing),
        gpu_check.Phase("rest", 1, python("print('ran')"), lambda args, log: {"log": log.name},
                        rest=True),
    ])
    argv = ["--out", str(tmp_path), "--budget", "30"]
    assert gpu_check.check(gpu_check.parse_args(argv), argv) == 1
    records = json.loads((tmp_path / "summary.json").read_text())["phases"]
    assert [(r["name"], r["status"]) for r in records] == [
        ("fails", "failed"), ("too-long", "skipped"), ("hangs", "failed"), ("rest", "ok")]
    fails, too_long, hangs, rest = records
    assert fails["reason"] == "exit status 3 (see fails.log)" and fails["exit_status"] == 3
    assert "to the log" in (tmp_path / "fails.log").read_text()
    assert too_long["reason"].startswith("needs 1000 s of the budget, ") and not too_long["log"]
    assert hangs["reason"] == "killed after its 1 s" and hangs["exit_status"] is None
    assert 1 <= hangs["seconds"] < 10
    log = (tmp_path / "hangs.log").read_text()
    assert not alive(int(log.split("\n")[2]))  # the pid its child printed
    assert log.endswith("\ngpu_check.py: killed it after 1 s\n")
    assert 20 < rest["timeout_s"] <= 30 and rest["figures"] == {"log": "rest.log"}
    printed = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert printed[0][:2] == ["fails", "failed"] and printed[0][4:7] == ["exit", "3",
                                                                          f"{tmp_path}/fails.log"]
    assert printed[1][:7] == ["too-long", "skipped", "(needs", "1000", "s", "of", "the"]
    assert printed[2][4:6] == ["exit", "-"] and printed[2][-5:] == ["(killed", "after", "its",
                                                                    "1", "s)"]


@pytest.mark.parametrize("found, reason", [
    ({"cublas_error": "OSError: libcublas.so.13: cannot open shared object file"},
     "tinyvit's cuBLAS binding failed: OSError: libcublas.so.13: cannot open shared object "
     "file (environment.json)"),
    ({"cublas_library": "libcublas.so.13", "cublas_difference": 0.75},
     "tinyvit's cuBLAS binding's product differs from CuPy's by 7.5e-01 of its largest entry "
     "(environment.json)")])
def test_a_failed_cublas_binding_skips_the_phases_after_the_environment(gpu_check, tmp_path,
                                                                         monkeypatch, found,
                                                                         reason):
    """Every phase after it runs the GPU tier, whose matmuls go through the binding."""
    ran = tmp_path / "ran"
    monkeypatch.setattr(gpu_check, "PHASES", [
        gpu_check.Phase("environment", 5, lambda args, timeout: gpu_check.Command(
            ["python", "-c", "pass"]), lambda args, log: found),
        gpu_check.Phase("fast-tests", 5, lambda args, timeout: gpu_check.Command(
            ["python", "-c", f"open({str(ran)!r}, 'w')"]), lambda args, log: None)])
    argv = ["--out", str(tmp_path / "out"), "--budget", "30"]
    assert gpu_check.check(gpu_check.parse_args(argv), argv) == 1
    records = json.loads((tmp_path / "out/summary.json").read_text())["phases"]
    assert [(r["name"], r["status"], r["reason"]) for r in records] == [
        ("environment", "ok", None), ("fast-tests", "skipped", reason)]
    assert not ran.exists()


@pytest.mark.parametrize("found, problem", [
    ({"graph_captured": 1, "graph_difference": 0.0}, None),
    ({"graph_error": "CUDARuntimeError: cudaErrorStreamCaptureUnsupported"},
     "capturing a CUDA graph failed: CUDARuntimeError: cudaErrorStreamCaptureUnsupported "
     "(environment.json)"),
    ({"graph_captured": 1, "graph_difference": 0.5},
     "a replayed CUDA graph differs from its calls by 5.0e-01 of their largest value "
     "(environment.json)")])
def test_the_graph_tier_is_left_out_where_capture_fails(gpu_check, found, problem):
    records = [{"name": "environment", "figures": found}]
    assert gpu_check.environment_problem(records, "graph") == problem
    assert gpu_check.environment_problem([], "graph") is None  # before the environment phase


def test_pytest_figures_are_read_from_its_summary_line(gpu_check, tmp_path):
    log = tmp_path / "gpu-tests.log"
    log.write_text("$ python -m pytest -q -x -m gpu\n\n....F\n"
                   "FAILED tests/test_fast.py::test_x[cupy-Linear] - AssertionError: 1e-3\n"
                   "!!!!!!!!!!!! stopping after 1 failures !!!!!!!!!!!!\n"
                   "1 failed, 40 passed, 2 skipped, 1 error, 9 deselected in 163.21s (0:02:43)\n")
    assert gpu_check.pytest_figures(None, log) == {
        "passed": 40, "failed": 1, "skipped": 2, "errors": 1, "deselected": 9,
        "pytest_s": 163.21,
        "failures": ["FAILED tests/test_fast.py::test_x[cupy-Linear] - AssertionError: 1e-3"]}
    log.write_text("ImportError while loading conftest\n")
    assert gpu_check.pytest_figures(None, log) is None


def test_training_figures_name_the_first_evaluated_epoch_past_each_accuracy(gpu_check):
    accuracies = {1: 0.5, 3: 0.86, 6: 0.89, 7: 0.905}  # the test set at epochs 1, 3, 6 and 7
    rows = [{"epoch": e, "test_acc": accuracies.get(e), "images_per_s": 1000.0 * e,
             "elapsed_s": 10.0 * e} for e in range(1, 8)]
    figures = gpu_check.training_figures(rows)
    assert figures["reached"] == {"85%": {"epoch": 3, "elapsed_s": 30.0},
                                  "88%": {"epoch": 6, "elapsed_s": 60.0},
                                  "90%": {"epoch": 7, "elapsed_s": 70.0}}
    assert (figures["epochs"], figures["final_test_acc"], figures["best_test_acc"]) == (7, 0.905,
                                                                                         0.905)
    assert figures["images_per_s"] == {"first_epoch": 1000.0, "median_after_first": 4500.0}
    assert figures["evaluated_epochs"] == [1, 3, 6, 7]
    assert "after 4 of the 7 epochs" in figures["note"]
    assert "up to 2 epochs later" in figures["note"]
    assert "note" not in gpu_check.training_figures(rows[:1])


def test_cifar_split_into_parts_joins_back_byte_for_byte(gpu_check, tmp_path):
    contents = fake_cifar(tmp_path / "data", np.random.default_rng(0))
    parts = tmp_path / "parts"
    assert gpu_check.main(["--split-cifar", str(tmp_path / "data"), str(parts),
                           "--part-mib", "0.005"]) == 0
    manifest = json.loads((parts / "manifest.json").read_text())
    part_bytes, total = int(0.005 * 2**20), sum(len(c) for c in contents.values())
    assert len(manifest["parts"]) == math.ceil(total / part_bytes) > len(contents)
    assert sorted(p.name for p in parts.iterdir()) == [
        f"cifar-10.part{i:02d}" for i in range(1, len(manifest["parts"]) + 1)] + ["manifest.json"]
    assert all((parts / p["name"]).stat().st_size <= part_bytes for p in manifest["parts"])
    assert [f["path"] for f in manifest["files"]] == sorted(contents)

    assert gpu_check.main(["--join-cifar", str(parts), str(tmp_path / "joined")]) == 0
    joined = tmp_path / "joined" / "cifar-10"
    assert {p.relative_to(joined).as_posix(): p.read_bytes()
            for p in joined.rglob("*") if p.is_file()} == contents


@pytest.fixture
def split(gpu_check, tmp_path):
    """CIFAR-10 of random bytes split into 5 KiB parts: the parts' folder."""
    fake_cifar(tmp_path / "data", np.random.default_rng(0))
    gpu_check.split_cifar(tmp_path / "data", tmp_path / "parts", 5 / 1024)
    return tmp_path / "parts"


def test_a_corrupted_part_is_refused_before_anything_is_written(gpu_check, split, tmp_path,
                                                                capsys):
    part = split / "cifar-10.part02"
    content = bytearray(part.read_bytes())
    content[100] ^= 1
    part.write_bytes(bytes(content))
    entry = json.loads((split / "manifest.json").read_text())["parts"][1]
    assert gpu_check.main(["--join-cifar", str(split), str(tmp_path / "joined")]) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"gpu_check.py: error: --join-cifar: {part}: expected 5120 bytes "
                            f"with SHA-256 {entry['sha256']}, got 5120 bytes with SHA-256 ")
    assert error.endswith("; copy this part again")
    assert not (tmp_path / "joined").exists()


def test_a_missing_part_is_named(gpu_check, split, tmp_path):
    (split / "cifar-10.part03").unlink()
    with pytest.raises(gpu_check.PartsError, match=r"part03 is missing; manifest.json lists \d+ "
                                                   r"parts: cifar-10.part01, cifar-10.part02, "):
        gpu_check.join_cifar(split, tmp_path / "joined")


def test_a_file_unlike_its_manifest_entry_is_not_written(gpu_check, split, tmp_path):
    manifest = json.loads((split / "manifest.json").read_text())
    manifest["files"][0]["sha256"] = "0" * 64
    (split / "manifest.json").write_text(json.dumps(manifest))
    target = tmp_path / "joined" / "cifar-10" / manifest["files"][0]["path"]
    with pytest.raises(gpu_check.PartsError, match=f"{target}: expected SHA-256 0{{64}}"):
        gpu_check.join_cifar(split, tmp_path / "joined")
    assert not target.exists()


def test_split_wants_the_layout_tinyvit_reads_and_an_empty_folder(gpu_check, tmp_path):
    fake_cifar(tmp_path / "data", np.random.default_rng(0), skip=["test_batch.bin"])
    folder = tmp_path / "data" / "cifar-10" / "cifar-10-batches-bin"
    with pytest.raises(gpu_check.PartsError) as error:
        gpu_check.split_cifar(tmp_path / "data", tmp_path / "parts", 1)
    assert str(error.value) == (f"--split-cifar: expected {folder} holding "
                                f"{', '.join(CIFAR_BATCHES)}; missing test_batch.bin")
    (folder / "test_batch.bin").write_bytes(b"\0" * 3073)
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "old.part01").write_bytes(b"")
    with pytest.raises(gpu_check.PartsError, match="expected a new or empty folder for the "
                                                   "parts, got .* holding old.part01"):
        gpu_check.split_cifar(tmp_path / "data", tmp_path / "parts", 1)


@pytest.mark.parametrize("flags, message", [
    (["--out", "x", "--budget", "0"], "--budget must be above 0, got 0"),
    (["--split-cifar", "a", "b", "--part-mib", "-1"], "--part-mib must be above 0, got -1"),
    ([], "one of the arguments --out --split-cifar --join-cifar is required"),
    (["--out", "x", "--phases", "train"], "argument --phases: invalid choice: 'train'"),
])
def test_bad_flags_are_named_in_one_line(gpu_check, capsys, flags, message):
    with pytest.raises(SystemExit) as exit:
        gpu_check.parse_args(flags)
    assert exit.value.code == 2
    assert f": error: {message}" in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.skipif(B.cupy_available(), reason="a GPU is here")
def test_the_gpu_runs_environment_fails_without_a_gpu(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), "--environment",
                             str(tmp_path / "environment.json")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "expected a GPU that CuPy sees, found none (CuPy " in result.stderr
    assert json.loads((tmp_path / "environment.json").read_text())["gpu"] is None
