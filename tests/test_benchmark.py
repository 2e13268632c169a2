"""The benchmark script runs (its quick mode, as CI may run it): it is a script,
not a timed test, so only its output's shape is checked, never its figures."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "benchmark.py"


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])  # 2: tinyvit's step split over worker processes
def test_benchmark_quick_mode_runs(tmp_path, workers):
    out = tmp_path / "bench.json"
    result = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--workers", str(workers), "--json", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(out.read_text())
    assert list(figures["configs"]) == ["A"] and figures["settings"]["workers"] == workers
    flops = figures["configs"]["A"]["forward_matmul_flops"]  # cls pooling: tinyvit's last block, one row
    assert 0 < flops["tinyvit"] < flops["torch"] == 621_314_048
    train = figures["configs"]["A"]["tinyvit"]["train"]
    assert train["median_ms"] > 0 and train["images_per_s"] > 0
    memory = figures["configs"]["A"]["tinyvit"]["peak_memory"]["train"]
    assert memory["peak_mb"] > 0
    if Path("/proc/self/status").exists():  # with workers, the parent's and theirs
        assert ("summed over 3 processes" in memory["method"]) == (workers == 2)
    assert "summary" in result.stdout.lower()
