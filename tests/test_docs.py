"""The documentation's examples and the CLI it describes, checked against real mounts.

Every fenced code block of the documents in ``DOCS`` is either run here or explicitly marked as
not runnable, so that a renamed flag, field or function fails this test instead of a reader who
copies the example.

The convention (docs/DEVELOPMENT.md, "Examples in the docs", says the same for writers):

* A marker is an HTML comment on the last non-blank line before the block's opening fence
  (invisible in rendered Markdown): ``<!-- docs-test: ... -->``.
* ``<!-- docs-test: illustrative: REASON -->``: the block is not run. REASON (required) says why,
  e.g. it needs a cluster, Slurm, AWS, GPUs or a long run, or it is sample output.
* ``<!-- docs-test: run -->`` (the default for unmarked ``sh``, ``bash``, ``shell``, ``console``
  and ``python`` blocks): the block runs from the repository root with ``metfs`` on ``PATH``
  (the binary under test), the Python package of this checkout importable, and the example paths
  below replaced. ``run mounted`` mounts the dataset at the mountpoint first; ``run hdf5`` does so
  with an HDF5 container dataset (``train.h5``: ``images`` and ``labels``) and
  ``--hdf5-container``. Shell blocks run under ``bash -euo pipefail``; a ``console`` block is
  ``$ command`` lines (``\\`` continues them) each followed by its exact expected output.
* ``<!-- docs-test: input NAME: COMMAND -->``: the block is a file's contents; it is saved as
  NAME in an empty directory and COMMAND (which names NAME) must succeed there.
* ``<!-- docs-test: metrics-file -->``: the block is an excerpt of a ``--metrics-file`` file: its
  ``# HELP`` and ``# TYPE`` lines appear verbatim in the file of a real mount, and each sample's
  metric appears there with the same label names.
* Any other block without a marker (no language, ``csv``, ``promql``, ...) fails the test.

Example paths replaced in run blocks (a generated dataset of small files with class directories,
names with spaces and non-ASCII characters, and empty files):

* ``/lustre/proj/imagenet``, ``/lustre/proj/data``: the dataset (the capacity tier);
* ``/nvme/metfs``: the cache directory (empty, exists), so the socket is ``/nvme/metfs/metfs.sock``;
* ``/mnt/met``: the mountpoint (exists).

Independently of the blocks: every ``metfs SUBCOMMAND --flag`` written in the docs (code blocks,
illustrative ones included, inline code, and ``METFS_ARGS`` for the Slurm scripts' mount) names an
existing subcommand and flag; every ``--flag`` in the inline code of README.md and the user's
topic documents (``FLAG_DOCS``) is a flag of some subcommand; every relative link of a document
leads to a file that exists (and to a heading there, for a ``#fragment``); docs/CONFIGURATION.md
is what ``scripts/config_doc.py`` generates from ``metfs config --defaults``; and every key of
its tables is a flag of ``metfs mount`` with the documented default and a key the config file
loader accepts.
"""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

from conftest import ROOT, Mount, is_mounted, make_tree, metfs_bin, wait_for

DOCS = [
    ROOT / "README.md",
    ROOT / "ARCHITECTURE.md",
    ROOT / "deploy" / "slurm" / "README.md",
    ROOT / "bindings" / "python" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]

# The topic documents the README hands a user on to (its table of links), besides README.md:
# they must exist, and every `--flag` in the inline code of those in FLAG_DOCS is a flag of
# metfs or metfs-shuffle.
USER_DOCS = [
    ROOT / "README.md",
    *(
        ROOT / "docs" / name
        for name in (
            "USAGE.md",
            "SEMANTICS.md",
            "PERMISSIONS.md",
            "CONFIGURATION.md",
            "SHARED.md",
            "AGGREGATE.md",
            "DYNAMIC_SHARDING.md",
            "TRANSFORM.md",
            "FORMATS.md",
            "DEVELOPMENT.md",
        )
    ),
]
# (DYNAMIC_SHARDING.md names the flags of its test and benchmark scripts, DEVELOPMENT.md those
# of cargo and the scripts.)
FLAG_DOCS = [d for d in USER_DOCS if d.name not in ("DYNAMIC_SHARDING.md", "DEVELOPMENT.md")]
CONFIGURATION = ROOT / "docs" / "CONFIGURATION.md"
# Subcommands the docs describe (in illustrative blocks only) before the binary has them; their
# flags are checked like any other's as soon as `metfs --help` lists them.
UPCOMING = frozenset({"doctor"})

SHELL_LANGS = {"sh", "bash", "shell"}
RUN_BY_DEFAULT = SHELL_LANGS | {"console", "python"}
RUN_OPTIONS = {"mounted", "hdf5"}

MARKER = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)(.*)$")
PLACEHOLDER = re.compile(
    r"(?<![\w./-])(/lustre/proj/imagenet|/lustre/proj/data|/nvme/metfs|/mnt/met)(?![\w.-])"
)


@dataclass
class Block:
    doc: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str | None

    @property
    def name(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    def kind(self) -> tuple[str, str]:
        """(kind, argument): ("run", options), ("illustrative", reason), ("input", spec), or
        ("unmarked", "") for a block this test cannot classify."""
        if self.marker is None:
            return ("run", "") if self.lang in RUN_BY_DEFAULT else ("unmarked", "")
        m = re.match(r"([\w-]+)\s*:?\s*(.*)$", self.marker)
        if not m:
            return ("unmarked", "")
        return m.group(1), m.group(2).strip()


def parse_blocks(doc: Path) -> list[Block]:
    lines = doc.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        mm = MARKER.match(lines[j].strip()) if j >= 0 else None
        body: list[str] = []
        k = i + 1
        while k < len(lines) and not (
            lines[k].strip().startswith(fence[0] * len(fence))
            and lines[k].strip().strip(fence[0]) == ""
        ):
            body.append(lines[k][len(indent) :] if lines[k].startswith(indent) else lines[k])
            k += 1
        assert k < len(lines), f"{doc.relative_to(ROOT)}:{i + 1}: code block never closed"
        out.append(Block(doc, i + 1, lang, "\n".join(body) + "\n", mm.group(1) if mm else None))
        i = k + 1
    return out


def all_blocks() -> list[Block]:
    return [b for d in DOCS if d.exists() for b in parse_blocks(d)]


def prose(doc: Path) -> str:
    """A document's text outside code blocks, with lines joined (inline code may wrap)."""
    lines = doc.read_text().splitlines()
    keep, inside, fence = [], False, ""
    for line in lines:
        m = FENCE.match(line)
        if m and (not inside or line.strip().strip(fence[0]) == ""):
            if not inside:
                inside, fence = True, m.group(2)
            else:
                inside = False
            continue
        if not inside:
            keep.append(line)
    return " ".join(keep)


# ---------------------------------------------------------------------------------------------
# The CLI's help, parsed


@pytest.fixture(autouse=True)
def _built(metfs: str) -> None:
    """Every test here runs the binary (the `metfs` fixture builds it when METFS_BIN is unset)."""


def run_metfs(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([metfs_bin(), *args], capture_output=True, text=True, timeout=60, **kw)


@lru_cache(maxsize=None)
def subcommands() -> frozenset[str]:
    r = run_metfs("--help")
    assert r.returncode == 0, r.stderr
    section = r.stdout.split("Commands:", 1)[1].split("Options:", 1)[0]
    return frozenset(re.findall(r"(?m)^  ([a-z][a-z0-9-]*)\s", section))


@dataclass
class Opt:
    takes_value: bool
    default: str | None


@lru_cache(maxsize=None)
def nested(sub: str) -> frozenset[str]:
    """The subcommands of `metfs SUB` (`dds status`, ...), if it has any."""
    r = run_metfs(sub, "--help")
    if r.returncode != 0 or "Commands:" not in r.stdout:
        return frozenset()
    section = r.stdout.split("Commands:", 1)[1].split("Options:", 1)[0]
    return frozenset(re.findall(r"(?m)^  ([a-z][a-z0-9-]*)\s", section)) - {"help"}


@lru_cache(maxsize=None)
def options(sub: str) -> dict[str, Opt]:
    """`--flag` -> what `metfs SUB --help` (long help) says of it; SUB may be `dds status`."""
    r = run_metfs(*sub.split(), "--help")
    assert r.returncode == 0, f"metfs {sub} --help: {r.stderr}"
    opts: dict[str, Opt] = {}
    current: str | None = None
    text: dict[str, list[str]] = {}
    for line in r.stdout.splitlines():
        m = re.match(r"^\s+(?:-\w, )?(--[a-z0-9][a-z0-9-]*)(\s+<[^>]+>)?(.*)$", line)
        if m:
            current = m.group(1)
            opts[current] = Opt(bool(m.group(2)), None)
            text[current] = [m.group(3)]
        elif current and line.strip():
            text[current].append(line.strip())
    for flag, parts in text.items():
        d = re.search(r"\[default: ([^\]]*)\]", " ".join(parts))
        opts[flag].default = d.group(1) if d else None
    return opts


def invocations(shell: str) -> list[tuple[str, list[str]]]:
    """`metfs SUB --flag ...` invocations in shell text: (SUB, flags)."""
    out = []
    shell = re.sub(r"\\\n\s*", " ", shell)
    for line in shell.splitlines():
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:]
        # `metfs` in command position: at the start, or after `;`, `|`, `&&`, `(` or `$(`.
        for m in re.finditer(
            r"(?:^|[;|&(]\s*)(?:\S*/)?metfs\s+([a-z][a-z0-9-]*)(.*?)(?=$|[;|&#`)]|\s>)", line
        ):
            sub, rest = m.group(1), m.group(2)
            # A nested subcommand (`metfs dds init ...`) owns the flags after it.
            word = re.match(r"\s+([a-z][a-z0-9-]*)", rest)
            if word and sub in subcommands() and word.group(1) in nested(sub):
                sub, rest = f"{sub} {word.group(1)}", rest[word.end() :]
            flags = re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", rest)
            out.append((sub, flags))
        # deploy/slurm's METFS_ARGS are further `metfs mount` flags.
        for m in re.finditer(r"METFS_ARGS=[\"']([^\"']*)", line):
            out.append(("mount", re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", m.group(1))))
    return out


def test_blocks_are_run_or_marked():
    problems = []
    blocks = all_blocks()
    for b in blocks:
        kind, arg = b.kind()
        if kind == "unmarked":
            problems.append(
                f"{b.name}: ```{b.lang} block neither runnable nor marked "
                "(add <!-- docs-test: illustrative: REASON --> or another marker; see tests/test_docs.py)"
            )
        elif kind == "illustrative" and not arg:
            problems.append(f"{b.name}: illustrative block without a reason")
        elif kind == "run":
            if not (set(arg.split()) <= RUN_OPTIONS):
                problems.append(
                    f"{b.name}: unknown run options {arg!r} (known: {sorted(RUN_OPTIONS)})"
                )
            if b.lang not in RUN_BY_DEFAULT:
                problems.append(f"{b.name}: cannot run a ```{b.lang} block")
        elif kind == "input":
            if not re.match(r"\S+:\s*\S", arg):
                problems.append(f"{b.name}: input marker needs `NAME: COMMAND`, got {arg!r}")
        elif kind not in ("illustrative", "metrics-file"):
            problems.append(f"{b.name}: unknown marker kind {kind!r}")
    assert not problems, "\n".join(problems)
    # The documents this test reads are there and have blocks (a moved file must not make the
    # test pass by reading nothing).
    docs = [*DOCS, *USER_DOCS]
    assert all(d.exists() for d in docs), [str(d) for d in docs if not d.exists()]
    assert sum(b.kind()[0] == "run" for b in blocks) >= 4


def test_documented_invocations_exist():
    """Every `metfs SUB --flag` in code blocks (run or not) and inline code names a real flag."""
    found: list[tuple[str, str, list[str]]] = []
    for b in all_blocks():
        if b.lang in SHELL_LANGS | {"console"}:
            found += [(b.name, sub, flags) for sub, flags in invocations(b.text)]
    for d in DOCS:
        if d.exists():
            for span in re.findall(r"`(metfs [^`]+)`", prose(d)):
                found += [
                    (str(d.relative_to(ROOT)), sub, flags) for sub, flags in invocations(span)
                ]
    problems = []
    for where, sub, flags in found:
        if sub.split()[0] in UPCOMING - subcommands():
            continue  # documented ahead of the binary: checked once the binary has it
        if sub.split()[0] not in subcommands():
            problems.append(
                f"{where}: `metfs {sub}`: no such subcommand (metfs --help: {sorted(subcommands())})"
            )
            continue
        for flag in flags:
            if flag not in options(sub):
                problems.append(
                    f"{where}: `metfs {sub} {flag}`: no such flag in `metfs {sub} --help`"
                )
    assert not problems, "\n".join(problems)
    assert len(found) >= 10, found


@lru_cache(maxsize=None)
def shuffle_options() -> frozenset[str]:
    """The flags of `metfs-shuffle --help` (aggregate mode's MPI exchange, built with the `mpi`
    feature beside the metfs binary; the test command builds it)."""
    exe = Path(metfs_bin()).with_name("metfs-shuffle")
    if not exe.exists():
        subprocess.run(
            [
                "cargo",
                "build",
                "-q",
                "-p",
                "metfs-exchange",
                "--features",
                "mpi",
                "--bin",
                "metfs-shuffle",
            ],
            cwd=ROOT,
            check=True,
        )
    r = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return frozenset(re.findall(r"(?m)^\s+(?:-\w, )?(--[a-z0-9][a-z0-9-]*)", r.stdout))


def test_readme_flags_exist():
    """Every `--flag` in the inline code of README.md and the user's topic documents (FLAG_DOCS)
    is a flag of some metfs subcommand or of `metfs-shuffle` (they name flags in prose, e.g. the rf
    policies' knobs, without the command)."""
    known = {f for sub in subcommands() - {"help"} for f in options(sub)} | shuffle_options()
    assert {"--sender", "--broadcast", "--cache"} <= shuffle_options(), shuffle_options()
    named: dict[str, set[str]] = {}
    for doc in FLAG_DOCS:
        spans = re.findall(r"`([^`]+)`", prose(doc))
        for span in spans:
            for f in re.findall(r"(?:^|[\s\[])(--[a-z0-9][a-z0-9-]*)", span):
                named.setdefault(f, set()).add(str(doc.relative_to(ROOT)))
    assert len(named) >= 40, sorted(named)
    unknown = {f: sorted(where) for f, where in named.items() if f not in known}
    assert not unknown, f"flags no metfs subcommand has: {unknown}"


# ---------------------------------------------------------------------------------------------
# Links between the documents


def slug(heading: str) -> str:
    """The fragment GitHub gives a heading: lower case, code marks and punctuation dropped,
    spaces as hyphens."""
    text = re.sub(r"<[^>]+>", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text.replace("`", ""))
    return text.replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(doc: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(doc):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def prose_lines(doc: Path) -> list[str]:
    """A document's lines outside code blocks."""
    keep, inside, fence = [], False, ""
    for line in doc.read_text().splitlines():
        m = FENCE.match(line)
        if m and (not inside or line.strip().strip(fence[0]) == ""):
            if not inside:
                inside, fence = True, m.group(2)
            else:
                inside = False
            continue
        if not inside:
            keep.append(line)
    return keep


def test_relative_links_resolve():
    """Every relative link of a document leads to a file or directory that exists, and a
    `#fragment` to a heading of its target (so a moved section or document fails here)."""
    docs = sorted({*DOCS, *USER_DOCS, *ROOT.glob("*.md")})
    problems, checked = [], 0
    for doc in docs:
        text = " ".join(prose_lines(doc))
        text = re.sub(r"`[^`]*`", "", text)  # links are not written inside code spans
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            where = f"{doc.relative_to(ROOT)}: ({target})"
            checked += 1
            if not dest.exists():
                problems.append(f"{where}: no such file")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                problems.append(f"{where}: no heading with that fragment in {dest.name}")
    assert not problems, "\n".join(problems)
    assert checked >= 30, checked


# ---------------------------------------------------------------------------------------------
# docs/CONFIGURATION.md: generated from the settings, and checked against `metfs mount --help`
# and the config loader


def test_configuration_page_is_generated():
    """docs/CONFIGURATION.md is exactly what scripts/config_doc.py makes of `metfs config
    --defaults`: the settings' declarations are its one source."""
    env = {**os.environ, "METFS_BIN": metfs_bin()}
    r = subprocess.run(
        ["python3", str(ROOT / "scripts" / "config_doc.py"), "--stdout"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == CONFIGURATION.read_text(), (
        "docs/CONFIGURATION.md differs from the settings' declarations: "
        "run `python3 scripts/config_doc.py` and commit the page"
    )


def config_table() -> list[tuple[str, str, str]]:
    """(TOML table, key, documented default) for every key with a flag in the tables of
    docs/CONFIGURATION.md; the table is "" for top-level keys and e.g. "stager" for the rows
    under the heading `` `[stager]` ``. A default in code is a TOML value; else it is words."""
    out = []
    table: str | None = None
    header: list[str] = []
    for line in prose_lines(CONFIGURATION):
        h = re.match(r"^## (?:`\[([a-z0-9_.]+)\]`|(Top-level keys))\s*$", line)
        if h:
            table = h.group(1) or ""
            continue
        if line.startswith("## "):
            table = None
            continue
        if table is None or not line.startswith("|"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if cells[0] == "key" or cells[0].startswith("key "):
            header = cells
            continue
        if set(cells[0]) <= set("-: ") or header[:4] != ["key", "flag", "environment", "default"]:
            continue
        key = re.fullmatch(r"`([a-z0-9_]+)`", cells[0])
        assert key, f"docs/CONFIGURATION.md: row without a key: {line}"
        out.append((table, key.group(1), cells[3]))
    return out


def norm(s: str) -> str:
    return " ".join(s.replace("`", "").split()).lower()


def loader_keys(tmp_path: Path, table: str = "") -> set[str]:
    """The keys the config file loader accepts (at the top level or in `[table]`), from its own
    error message for an unknown key."""
    cfg = tmp_path / f"probe-{table or 'top'}.toml"
    cfg.write_text((f"[{table}]\n" if table else "") + "metfs_docs_probe = 1\n")
    r = run_metfs("mount", "--config", str(cfg), str(tmp_path / "never-mounted"))
    assert r.returncode != 0
    m = re.search(r"unknown field `metfs_docs_probe`, expected (?:one of )?(.*)", r.stderr)
    assert m, f"[{table}]: {r.stderr}"
    return set(re.findall(r"`([a-z0-9_]+)`", m.group(1)))


def test_config_table_matches_mount_help(tmp_path):
    table = config_table()
    assert len(table) >= 10, table
    opts = options("mount")
    src, cache = tmp_path / "src", tmp_path / "cache"
    make_tree(src, n=3)
    cache.mkdir()
    given = {"source": str(src), "cache": str(cache), "budget": "4MiB"}
    problems = []
    for tb, key, doc_default in table:
        if tb:
            continue  # a key of the file only; test_config_table_keys_load checks it
        flag = "--" + key.replace("_", "-")
        opt = opts.get(flag)
        if opt is None:
            problems.append(f"`{key}`: `metfs mount --help` has no {flag}")
            continue
        d = flag_form(doc_default)
        if d == "(required)":
            if opt.default is not None or not opt.takes_value:
                problems.append(
                    f"`{key}`: documented as required, but {flag} has default {opt.default!r}"
                )
                continue
            # Mounting without it fails and names it.
            args = [a for k, v in given.items() if k != key for a in (f"--{k}", v)]
            r = run_metfs("mount", *args, str(tmp_path / "mnt"))
            if r.returncode == 0 or f"`{key}`" not in r.stderr:
                problems.append(
                    f"`{key}`: documented as required, but a mount without it said: {r.stderr!r}"
                )
        elif opt.default is None:
            problems.append(f"`{key}`: documented default {doc_default!r}, but {flag} shows none")
        elif norm(opt.default) != norm(d):
            problems.append(
                f"`{key}`: docs/CONFIGURATION.md default {doc_default!r}, "
                f"`metfs mount --help` [default: {opt.default}]"
            )
    assert not problems, "\n".join(problems)


def test_config_table_keys_load(tmp_path):
    table = config_table()
    accepted = {tb: loader_keys(tmp_path, tb) for tb in {tb for tb, _, _ in table}}
    missing = [f"[{tb}] {k}" if tb else k for tb, k, _ in table if k not in accepted[tb]]
    assert not missing, f"docs/CONFIGURATION.md keys the config loader rejects: {missing}"


def test_every_mount_flag_is_a_config_key(tmp_path):
    """docs/CONFIGURATION.md: every setting of `metfs mount` is a flag and a key of the TOML
    file, "Only `--config`, `--foreground`, `--reset` and `--run-as` ... are not settings"
    (`--stager-*` and `--control-*` being keys of those tables, the S3 flags keys of `[s3]`)."""
    text = " ".join(CONFIGURATION.read_text().split())
    claim = re.search(r"Only (.*?) are not settings", text)
    assert claim, (
        "docs/CONFIGURATION.md no longer says which mount flags are not settings; update this test"
    )
    not_keys = set(re.findall(r"`(--[a-z0-9-]+)`", claim.group(1))) | {"--help"}
    tables = {
        "": loader_keys(tmp_path),
        "stager": loader_keys(tmp_path, "stager"),
        "control": loader_keys(tmp_path, "control"),
        "s3": loader_keys(tmp_path, "s3"),
        "transform": loader_keys(tmp_path, "transform"),
        "dds": loader_keys(tmp_path, "dds"),
        "share": loader_keys(tmp_path, "share"),
        "aggregate": loader_keys(tmp_path, "aggregate"),
    }

    def is_key(flag: str) -> bool:
        key = flag[2:].replace("-", "_")
        if key == "transform":  # `--transform` is `command` of `[transform]`
            return "command" in tables["transform"]
        if key in ("dds", "node_name", "shard_done"):  # `url`, `node_name`, `shard_done` of `[dds]`
            return {"dds": "url"}.get(key, key) in tables["dds"]
        if key in ("share", "aggregate"):  # `--share` is `enabled` of `[share]`, and so on
            return "enabled" in tables[key]
        if key.startswith("shuffle_"):  # `--shuffle-extra` is `extra` of `[aggregate]`
            return key[len("shuffle_") :] in tables["aggregate"]
        for tb in ("stager", "control", "transform", "dds", "share"):
            if key.startswith(tb + "_") and key[len(tb) + 1 :] in tables[tb]:
                return True
        return key in tables[""] or key in tables["s3"]

    missing = [f for f in options("mount") if f not in not_keys and not is_key(f)]
    assert not missing, (
        f"mount flags without a config key (docs/CONFIGURATION.md says every flag but {sorted(not_keys)} has one): {missing}"
    )
    wrongly_excepted = [f for f in not_keys - {"--help"} if is_key(f) or f not in options("mount")]
    assert not wrongly_excepted, (
        f"docs/CONFIGURATION.md excepts flags that are config keys or not mount flags: {wrongly_excepted}"
    )


def toml_value(doc_default: str, cache: Path) -> str | None:
    """A documented default as a TOML value, or None for prose ("the smallest whose ...")."""
    literal = re.fullmatch(r"`(.*)`", doc_default.strip())
    if literal:
        return literal.group(1)
    d = norm(doc_default)
    m = re.fullmatch(r"\$\w+ or (\S+)", d)
    if m:
        d = m.group(1)
    if re.fullmatch(r"-?\d+(\.\d+)?", d) or d in ("true", "false"):
        return d
    return None


def flag_form(doc_default: str) -> str:
    """A documented default as `--help` shows it: a TOML value in code becomes its flag form
    (`"random"` -> random, `["a", "1 - b"]` -> a,1-b, `1.0` -> 1), words stay words."""
    literal = re.fullmatch(r"`(.*)`", doc_default.strip())
    if not literal:
        return norm(doc_default)
    value = tomllib.loads(f"v = {literal.group(1)}")["v"]
    if isinstance(value, list):
        return ",".join(str(v).replace(" ", "") for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_documented_defaults_are_valid_config_values(mounts, tmp_path):
    """A config file that sets every table key to its documented default mounts."""
    src = tmp_path / "src"
    make_tree(src, n=20)
    m = mounts(src, "4MiB", name="cfg")
    sections: dict[str, list[str]] = {
        "": [f'source = "{src}"', f'cache = "{m.cache}"', 'budget = "4MiB"']
    }
    used = []
    for tb, key, doc_default in config_table():
        if not tb and key in ("source", "cache", "budget"):
            continue
        v = toml_value(doc_default, m.cache)
        if v is not None:
            sections.setdefault(tb, []).append(f"{key} = {v}")
            used.append(key)
    assert len(used) >= 8, used
    cfg = tmp_path / "defaults.toml"
    cfg.write_text(
        "\n".join(
            ("" if not tb else f"[{tb}]\n") + "\n".join(lines) for tb, lines in sections.items()
        )
        + "\n"
    )
    m.mountpoint.mkdir()
    r = run_metfs(
        "mount", "--config", str(cfg), "--history", str(tmp_path / "h.json"), str(m.mountpoint)
    )
    assert r.returncode == 0, f"{cfg.read_text()}\n{r.stderr}\n{m.log()}"
    assert is_mounted(m.mountpoint)
    st = m.status()
    assert st["budget_bytes"] == 4 << 20


# ---------------------------------------------------------------------------------------------
# Running the blocks


def substitute(text: str, paths: dict[str, Path]) -> str:
    def repl(m: re.Match[str]) -> str:
        p = m.group(1)
        if p.startswith("/lustre/"):
            return str(paths["source"])
        if p == "/nvme/metfs":
            return str(paths["cache"])
        return str(paths["mountpoint"])

    return PLACEHOLDER.sub(repl, text)


def block_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("METFS_", "SLURM_"))}
    env["METFS_BIN"] = metfs_bin()
    env["PATH"] = f"{Path(metfs_bin()).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    env["PYTHONPATH"] = str(ROOT / "bindings" / "python" / "src")
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")  # rf history of mounts without --history
    return env


def make_hdf5(src: Path) -> None:
    import h5py
    import numpy as np

    src.mkdir(parents=True)
    rng = np.random.default_rng(3)
    with h5py.File(src / "train.h5", "w") as f:
        f.create_dataset(
            "images",
            data=rng.standard_normal((96, 8, 8)).astype("f4"),
            chunks=(16, 8, 8),
            compression="gzip",
        )
        f.create_dataset("labels", data=(np.arange(96) % 4).astype("i8"))


def run_console(text: str, paths: dict[str, Path], env: dict[str, str], where: str) -> None:
    steps: list[tuple[str, list[str]]] = []
    cont = False
    for line in text.splitlines():
        if cont:
            steps[-1] = (steps[-1][0] + "\n" + line, [])
        elif line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            assert steps, f"{where}: console block must start with a `$ ` command"
            steps[-1][1].append(line.rstrip())
        cont = line.endswith("\\") and (cont or line.startswith("$ "))
    for cmd, expected in steps:
        r = subprocess.run(
            ["bash", "-c", substitute(cmd, paths)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, f"{where}: `{cmd}` failed: {r.stderr}"
        got = [line.rstrip() for line in r.stdout.rstrip("\n").splitlines()]
        while expected and not expected[-1]:
            expected.pop()
        assert got == expected, (
            f"{where}: `{cmd}` printed\n"
            + "\n".join(got)
            + "\nbut the docs show\n"
            + "\n".join(expected)
        )


def check_metrics_sample(block: Block, mounts, tmp_path: Path) -> None:
    src = tmp_path / "lustre"
    make_tree(src, n=20)
    prom = tmp_path / "metfs.prom"
    m = mounts(src, "4MiB", "--metrics-file", str(prom), name="metrics")
    m.mount()
    wait_for(prom.exists, timeout=30, what=f"{prom} to be written")
    real = prom.read_text().splitlines()
    series = {}
    for line in real:
        s = re.match(r"^([a-z_:][a-z0-9_:]*)(?:\{(.*)\})? ", line)
        if s and not line.startswith("#"):
            series.setdefault(s.group(1), set()).add(
                frozenset(re.findall(r'(\w+)="', s.group(2) or ""))
            )
    problems = []
    for line in block.text.splitlines():
        if line.startswith("# "):
            if line not in real:
                problems.append(f"not in the real file: {line}")
            continue
        s = re.match(r"^([a-z_:][a-z0-9_:]*)(?:\{(.*)\})? ", line)
        if not s:
            continue
        labels = frozenset(re.findall(r'(\w+)="', s.group(2) or ""))
        if s.group(1) not in series:
            problems.append(f"no metric {s.group(1)} in the real file")
        elif labels not in series[s.group(1)]:
            problems.append(
                f"{s.group(1)} has labels {sorted(labels)} here, {[sorted(x) for x in series[s.group(1)]]} in the real file"
            )
    assert not problems, (
        f"{block.name}:\n" + "\n".join(problems) + "\n--- real file\n" + "\n".join(real)
    )


RUNNABLE = [b for b in all_blocks() if b.kind()[0] in ("run", "input", "metrics-file")]


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.name for b in RUNNABLE])
def test_block_runs(block: Block, mounts, tmp_path):
    kind, arg = block.kind()
    env = block_env(tmp_path)
    if kind == "input":
        name, cmd = (s.strip() for s in arg.split(":", 1))
        work = tmp_path / "input"
        work.mkdir()
        (work / name).write_text(block.text)
        r = subprocess.run(
            ["bash", "-c", cmd], cwd=work, env=env, capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0, (
            f"{block.name}: `{cmd}` on the block failed: {r.stdout}\n{r.stderr}"
        )
        return

    if kind == "metrics-file":
        check_metrics_sample(block, mounts, tmp_path)
        return

    options_ = set(arg.split())
    src = tmp_path / "lustre"
    extra: list[str] = []
    if "hdf5" in options_:
        make_hdf5(src)
        extra = ["--hdf5-container"]
    else:
        make_tree(src, n=40)
    # 40 files of up to 48 KiB: two mini-epochs at 3 MiB (1.6 MiB of it metadata), so loops
    # over passes see a view switch.
    m: Mount = mounts(src, "12MiB" if extra else "3MiB", *extra, name="doc")
    m.mountpoint.mkdir(parents=True, exist_ok=True)
    if options_ & {"mounted", "hdf5"}:
        m.mount()
    paths = {"source": src, "cache": m.cache, "mountpoint": m.mountpoint}
    text = substitute(block.text, paths)
    if block.lang == "console":
        run_console(block.text, paths, env, block.name)
        return
    script = tmp_path / ("block.py" if block.lang == "python" else "block.sh")
    script.write_text(text)
    cmd = (
        ["python3", str(script)]
        if block.lang == "python"
        else ["bash", "-euo", "pipefail", str(script)]
    )
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, (
        f"{block.name} failed (exit {r.returncode}):\n--- block as run\n{text}--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}\n--- daemon log\n{m.log()}"
    )
