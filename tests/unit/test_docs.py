"""The documentation: the README a newcomer reads first, and the docs/ site built by mkdocs."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
# Markdown links [text](target): the target up to a space or the closing parenthesis.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# What the docs must not point at: files beside the repository, and how it was built.
OUTSIDE = re.compile(r"\.\./shared|DESIGN\.md|\bissues? \d+")


# A transcript: a fenced block whose first line is `$ dispatcher ...` (or .venv/bin/dispatcher),
# continued by lines ending in a backslash, then what the command prints.
TRANSCRIPT = re.compile(r"^```\n\$ ((?:\.venv/bin/)?dispatcher (?:[^\n]*\\\n)*[^\n]*)\n(.*?)^```$",
                        re.M | re.S)


def _transcripts() -> list[tuple[str, str, str]]:
    return [(f"{page.relative_to(REPO)}:{page.read_text()[:m.start()].count(chr(10)) + 2}",
             m[1], m[2])
            for page in PAGES for m in TRANSCRIPT.finditer(page.read_text())]


@pytest.mark.parametrize(("where", "command", "printed"), _transcripts(),
                         ids=[t[0] for t in _transcripts()])
def test_every_transcript_is_what_the_command_prints(where: str, command: str,
                                                     printed: str) -> None:
    """Run from the repository as written (the installed `dispatcher`), it prints exactly
    what the page shows."""
    argv = shlex.split(command.replace("\\\n", " "))
    argv[0] = str(Path(sys.executable).parent / "dispatcher")
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.stdout == printed, f"{where}: {command}\n{done.stderr}"


def test_the_site_builds_with_every_link_and_page_checked(tmp_path: Path) -> None:
    """`mkdocs build --strict` fails on a broken link or anchor, a page missing from the
    navigation, or a link out of docs/ (the site would publish it broken)."""
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "guide" / "appwrappers" / "index.html").exists()


def test_the_readme_starts_with_the_two_commands_and_stays_short() -> None:
    text = README.read_text()
    first_block = text.split("```")[1]
    commands = [line.split()[:2] for line in first_block.splitlines() if line.strip()][1:]
    assert commands == [["make", "demo"], ["make", "test"]]
    assert len(text.splitlines()) <= 250


#: What a newcomer sees before scrolling: the two commands, what it is, the try-out.
FIRST_SCREEN = 60


def test_the_first_screen_says_what_it_is_and_lets_one_try_it_without_go() -> None:
    lines = README.read_text().splitlines()
    first = "\n".join(lines[:FIRST_SCREEN])
    assert "gang-scheduling queue dispatcher for Kubernetes" in first
    # The try-out: a plain install, then plan and simulate on the shipped examples; no
    # make, no Go, no cluster.
    block = re.search(r"## Try it in two minutes[^\n]*\n(.*?)\n## ", "\n".join(lines),
                      re.S)
    assert block is not None and lines.index(block.group(0).splitlines()[0]) < 25
    tryout = block.group(1)
    assert "pip install" in tryout and "make" not in tryout and "go " not in tryout.lower()
    for verb in ("plan", "simulate"):
        assert f"dispatcher {verb} " in tryout
    # Then the cluster demo, the web view it prints the address of, and the real node's.
    assert "make demo" in first and "web view" in first and "make demo-real" in first


def test_the_tryout_commands_run_as_written() -> None:
    """The README's try-out `dispatcher ...` lines, run from the repository with the
    installed command: each exits 0 and prints its report."""
    text = README.read_text()
    tryout = text.split("## Try it in two minutes", 1)[1].split("\n## ", 1)[0]
    commands = [line for line in tryout.splitlines() if line.startswith("dispatcher ")]
    assert commands
    for command in commands:
        argv = shlex.split(command)
        argv[0] = str(Path(sys.executable).parent / "dispatcher")
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120,
                              check=False)
        assert done.returncode == 0, f"{command}: {done.stderr}"
        assert "3 started, 3 finished" in done.stdout or "dispatch" in done.stdout


def test_the_trace_pages_say_where_the_itp_traces_are_published() -> None:
    for page in (DOCS / "guide" / "simulate.md", DOCS / "benchmarks.md"):
        assert "https://github.com/microsoft/elasticflow-traces" in page.read_text(), page


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_lead_to_files_of_the_repository(page: Path) -> None:
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.is_relative_to(REPO), f"{target}: outside the repository"
        assert path.exists(), f"{page.name}: {target} does not exist"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_page_mentions_files_outside_the_repository(page: Path) -> None:
    found = OUTSIDE.findall(page.read_text())
    assert not found, f"{page.relative_to(REPO)} mentions {found}"


def _leaves(values: dict[str, object], prefix: str = "") -> list[str]:
    out: list[str] = []
    for key, value in values.items():
        if isinstance(value, dict) and value and key not in ("customPolicy",):
            out.extend(_leaves(value, f"{prefix}{key}."))
        else:
            out.append(f"{prefix}{key}")
    return out


def test_the_chart_readme_names_every_value() -> None:
    import yaml

    chart = REPO / "charts" / "dispatcher"
    readme = (chart / "README.md").read_text()
    values = yaml.safe_load((chart / "values.yaml").read_text())
    for leaf in _leaves(values):
        head, _, last = leaf.rpartition(".")
        # Rows name a group once: `controller.resources`, `.nodeSelector`, ...
        assert f"`{leaf}`" in readme or (head and f"`{head}." in readme
                                         and f"`.{last}`" in readme), leaf


def test_readme_labels_the_namespace_as_the_docs_do_before_installing() -> None:
    label = ("kubectl label namespace dispatcher-system "
             "pod-security.kubernetes.io/enforce=restricted")
    for page in (README, DOCS / "operations.md", REPO / "charts" / "dispatcher" / "README.md"):
        text = page.read_text()
        assert label in text, page
        assert text.index(label) < text.index("helm install dispatcher"), page
        assert "--create-namespace" not in text.split(label)[0].split("```")[-1], page


# A pointer in a comment: (FILE, "Section"), FILE a path of the repository.
SECTION = re.compile(r"\(([\w./-]+), \"([^\"]+)\"")


def test_the_charts_values_point_at_sections_that_exist() -> None:
    values = REPO / "charts" / "dispatcher" / "values.yaml"
    pointers = SECTION.findall(values.read_text())
    assert pointers
    for name, section in pointers:
        page = REPO / name
        assert page.is_file(), f"values.yaml points at {name}, not a file of the repository"
        headings = [line.lstrip("#").strip() for line in page.read_text().splitlines()
                    if line.startswith("#")]
        assert section in headings, f"values.yaml points at {name}, \"{section}\": no such section"


@pytest.mark.parametrize("example", sorted((REPO / "examples").rglob("*.yaml")),
                         ids=lambda p: str(p.relative_to(REPO)))
def test_no_example_points_at_files_outside_the_repository(example: Path) -> None:
    """A user's clone has no ../shared: an example's suggested command must not need it."""
    found = OUTSIDE.findall(example.read_text())
    assert not found, f"{example.relative_to(REPO)} mentions {found}"


def test_the_home_page_links_every_page_of_the_site() -> None:
    nav = re.findall(r":\s+([\w/.-]+\.md)$", (REPO / "mkdocs.yml").read_text(), re.M)
    linked = set(LINK.findall((DOCS / "index.md").read_text()))
    missing = [page for page in nav if page != "index.md" and page not in linked]
    assert not missing, f"docs/index.md does not link {missing}"
