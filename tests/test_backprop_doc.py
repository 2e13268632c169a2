"""docs/backprop.md against the code it explains: every link into the code points at
what it names, and every section the gradient check's report links to exists.

The page links code with relative links, in three forms:

    [`Name`](../tinyvit/nn/layers.py#L35)
        a module-level class, function or assignment named ``Name``, defined on line 35:
        for a class the line of ``class Name``, for a function the line of its ``def``,
        for an assignment (``SECTIONS = (``) its first line;
    [`Class.method`](../tinyvit/nn/layers.py#L67)
        the line of ``def method`` inside ``class Class`` (or of an assignment to
        ``method`` in the class body);
    [`layers.py: Name`](../tinyvit/nn/layers.py#L35)
        as ``Name`` (or ``Class.method``), the file named in the text too.

A link into ``../tinyvit/``, ``../tests/`` or ``../benchmarks/`` without a line anchor
(``[`tinyvit/nn/conv.py`](../tinyvit/nn/conv.py)``) must name a file or folder that
exists, and so must every path written in backticks outside a link
(``tinyvit/fast/``). A failure names the link and the line where the definition is
now, so that whoever moves code can fix the page at once.

The headings that ``tinyvit.gradcheck.report.SECTIONS`` maps the layers to must be
headings of the page, by ``report.anchor`` (GitHub's anchors), and every link within
the page (``[Linear](#linear)``) must name one of its headings.
"""

import ast
import re
from pathlib import Path

from tinyvit.gradcheck import report

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "backprop.md"
CODE_FOLDERS = ("tinyvit/", "tests/", "benchmarks/")

LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
BACKTICKED_PATH = re.compile(r"`((?:tinyvit|tests|benchmarks)/[^`\s]*)`")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.M)
# the link text: `Name`, `Class.method`, or `file.py: Name` / `file.py: Class.method`
DEFINITION = re.compile(r"^`(?:(?P<file>[\w.]+\.py):\s*)?(?P<name>\w+(?:\.\w+)?)`$")


def page_text():
    return PAGE.read_text(encoding="utf-8")


def prose(text):
    """The page with its fenced code blocks blanked (code there is not a reference),
    line numbers kept."""
    return FENCE.sub(lambda block: "\n" * block.group(0).count("\n"), text)


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


def code_links(text):
    """(link as written, its page line, its text, repository path, anchor line or None)
    for every link into the code folders."""
    links = []
    for match in LINK.finditer(prose(text)):
        label, target = match.groups()
        if not target.startswith("../"):
            continue
        path, _, fragment = target[3:].partition("#")
        if not path.startswith(CODE_FOLDERS):
            continue
        anchor = re.fullmatch(r"L(\d+)", fragment)
        links.append((match.group(0), line_of(text, match.start()), label, path,
                      int(anchor.group(1)) if anchor else None))
    return links


def _assigned_names(node):
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def _defined_lines(body, name):
    """The lines where ``body`` (a module's or a class's statements) defines ``name``."""
    lines = []
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name == name:
                lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and name in _assigned_names(node):
            lines.append(node.lineno)
    return lines


def definition_lines(path, dotted):
    """The lines where ``dotted`` ("Name" or "Class.method") is defined in ``path``, and
    how to say what was looked for."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    if "." not in dotted:
        return _defined_lines(tree.body, dotted), f"`{dotted}`"
    owner, member = dotted.split(".")
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner]
    lines = [line for c in classes for line in _defined_lines(c.body, member)]
    return lines, f"`def {member}` in `class {owner}`"


def github_anchors(text):
    """The anchors of the page's headings, as GitHub makes them: ``report.anchor`` of
    the heading, with -1, -2, ... appended to repeats."""
    anchors, seen = [], {}
    for _, heading in HEADING.findall(prose(text)):
        base = report.anchor(heading.replace("`", ""))
        count = seen.get(base, 0)
        seen[base] = count + 1
        anchors.append(base if count == 0 else f"{base}-{count}")
    return anchors


def test_page_links_into_the_code():
    assert len(code_links(page_text())) > 50, "the page should link every section to its code"


def test_every_link_into_the_code_names_a_file_that_exists():
    missing = [f"page line {line}: {link}: {path} does not exist"
               for link, line, _, path, _ in code_links(page_text()) if not (ROOT / path).exists()]
    assert not missing, "\n".join(missing)


def test_every_line_anchor_points_at_the_definition_it_names():
    problems = []
    for link, line, label, path, anchor in code_links(page_text()):
        if anchor is None or not (ROOT / path).is_file():
            continue
        form = DEFINITION.match(label)
        if form is None:
            problems.append(f"page line {line}: {link}: a link with a line anchor must say what "
                            "it points at: [`Name`], [`Class.method`] or [`file.py: Name`]")
            continue
        if form["file"] and form["file"] != Path(path).name:
            problems.append(f"page line {line}: {link}: the text names {form['file']}, the link "
                            f"{path}")
            continue
        lines, what = definition_lines(path, form["name"])
        if not lines:
            problems.append(f"page line {line}: {link}: {path} has no {what} any more")
        elif anchor not in lines:
            now = " and ".join(str(n) for n in lines)
            problems.append(f"page line {line}: {link}: {what} is on line {now} of {path} now, "
                            f"not {anchor}: make the anchor #L{lines[0]}")
    assert not problems, "\n".join(problems)


def test_every_path_in_backticks_names_a_file_that_exists():
    text = prose(page_text())
    missing = [f"page line {line_of(text, m.start())}: `{m.group(1)}` does not exist"
               for m in BACKTICKED_PATH.finditer(text)
               if not (ROOT / m.group(1).split(":")[0]).exists()]
    assert not missing, "\n".join(missing)


def test_the_gradient_check_report_links_to_headings_of_the_page():
    anchors = set(github_anchors(page_text()))
    missing = [f"{kind.__name__}: SECTIONS names {heading!r}, but the page has no heading with "
               f"the anchor #{report.anchor(heading)}"
               for kind, heading in report.SECTIONS if report.anchor(heading) not in anchors]
    assert not missing, "\n".join(missing)


def test_links_within_the_page_name_its_headings():
    text = page_text()
    anchors = set(github_anchors(text))
    broken = [f"page line {line_of(text, m.start())}: {m.group(0)}"
              for m in LINK.finditer(prose(text))
              if m.group(2).startswith("#") and m.group(2)[1:] not in anchors]
    assert not broken, "no heading for:\n" + "\n".join(broken)
