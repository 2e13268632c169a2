"""The repair search on the two sets ``benchmarks/repair.py`` measures. Set (b), the learner
mistakes of ``benchmarks/mistakes.py``: each fails its exercise's check, its corrected
lines pass it, and a fix, where one is printed, put into the file as printed, passes; nine
in ten at least are fixed. Set (a), every single-edit mutant of a reference backward: a
sample of it, each failing the gradient check and repaired at its own line."""

from pathlib import Path

import pytest

from conftest import load_script

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
BUDGET = 6.0  # seconds per search, three times the default: what is fixed does not depend on
#               how fast the machine is (the benchmark measures the default's)


@pytest.fixture(scope="module")
def repair():
    return load_script(BENCHMARKS / "repair.py")


@pytest.fixture(scope="module")
def workbook(tmp_path_factory, repair):
    folder = tmp_path_factory.mktemp("sets") / "workbook"
    repair.start(folder)
    return folder


@pytest.fixture
def passes_checked_once(repair, monkeypatch):
    """The exercise's check gives a file's text one verdict (its cases are seeded): a text
    that passed is not checked again. A mistake's corrected lines are often the text its
    printed fix wrote."""
    passed, failure = set(), repair._failure

    def once(path, ex, tag):
        text = (ex.name, path.read_text())
        if text in passed:
            return None
        found = failure(path, ex, tag)
        if found is None:
            passed.add(text)
        return found

    monkeypatch.setattr(repair, "_failure", once)


@pytest.mark.slow
def test_every_learner_mistake_is_caught_and_nine_in_ten_are_fixed(repair, workbook,
                                                                   monkeypatch,
                                                                   passes_checked_once):
    """Each mistake's corrected lines pass (so the set stays true as the exercises change),
    the mistake itself fails, and no printed fix is wrong."""
    mistakes = load_script(BENCHMARKS / "mistakes.py")
    monkeypatch.setattr("tinyvit.gradcheck.repair.BUDGET", BUDGET)
    monkeypatch.chdir(workbook)  # as pytest runs in a workbook: its files by their names
    verdicts = {}
    for number, mistake in enumerate(mistakes.MISTAKES):
        row = repair.run_mistake(workbook, mistake, f"b{number}")
        assert row["verdict"] not in ("not caught", "fix wrong"), (mistake.what, row)
        assert repair.run_right(workbook, mistake, f"r{number}"), mistake.what
        verdicts[mistake.what] = row["verdict"]
    fixed = sum(v.startswith("fixed") for v in verdicts.values())
    assert fixed >= 0.9 * len(verdicts), {w: v for w, v in verdicts.items() if v == "named"}


@pytest.mark.parametrize("what, fixed", [
    # one edit of the dAd line, "/ self.head_dim", would make up for both mistakes at once
    ("divided by the scale, taken for sqrt(Dh)", [
        "dq = dS @ k * self.scale", "dk = dS.swapaxes(-1, -2) @ q * self.scale"]),
    # and one of the dx line, "dout" for "d", for the missing reshape of the line after it
    ("dx left as rows (M, in), not reshaped back", [
        "return dx.reshape(*dout.shape[:-1], self.in_features)"]),
])
def test_a_fix_that_makes_up_elsewhere_for_a_mistake_gives_way_to_the_mistakes_lines(
        repair, workbook, monkeypatch, what, fixed):
    """A statement that computes what the library's statement of that name computes is
    right, whatever its text: a fix there makes up for a mistake made elsewhere, and the
    search looks on for one at the mistake's lines."""
    mistakes = load_script(BENCHMARKS / "mistakes.py")
    mistake, = (m for m in mistakes.MISTAKES if m.what == what)
    monkeypatch.setattr("tinyvit.gradcheck.repair.BUDGET", BUDGET)
    monkeypatch.chdir(workbook)
    row = repair.run_mistake(workbook, mistake, "made_up")
    assert row["verdict"] == "fixed at the right line", row["paragraph"]
    printed = repair._printed_fixes(row["paragraph"])
    assert [after for _, _, (after,) in printed] == fixed


def test_a_sample_of_the_mutants_fails_and_is_repaired_at_its_line(repair):
    """Each mutant of the sample fails the check, and any fix printed for it gives the
    reference's gradients; nine in ten are repaired at the mutated line."""
    mutants = repair.mutant_set
    cases, repaired = {}, []
    for number, (name, build, mutant, function) in enumerate(mutants.generate(SMALL)):
        if number % SAMPLE:
            continue
        if name not in cases:
            cases[name] = mutants.Case(build)
        mutants.run(cases[name], mutant, function, BUDGET)
        if mutant.outcome in ("raises", "no effect"):
            continue
        assert mutant.check_failed and (mutant.restores or not mutant.fixed), vars(mutant)
        repaired.append(mutant.right_line and mutant.restores)
    assert len(repaired) >= 30 and sum(repaired) >= 0.9 * len(repaired), repaired


SMALL = ("Linear", "LayerNorm", "GELU", "Tanh", "Dropout", "Residual", "Attention",
         "MaxPool2d", "SoftmaxCrossEntropy")
SAMPLE = 37  # every 37th mutant of those cases' backward passes
