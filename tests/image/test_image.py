"""The image holds Berth's packages and no local-cluster tooling.

The Dockerfile installs the build context, and the context is what .dockerignore admits.
These tests read .dockerignore as Docker does, copy what it admits, build the wheel from
that copy as the Dockerfile's `pip install .` would, and look inside: no Docker needed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {"berth", "controller", "webhook", "extender", "cli"}

Rule = tuple[bool, str, re.Pattern[str]]  # (re-admits, pattern as written, its regex)


def rules(text: str) -> list[Rule]:
    """The patterns of a .dockerignore, in order, as Docker compiles them."""
    result = []
    for line in text.splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        admits = pattern.startswith("!")
        pattern = os.path.normpath(pattern.removeprefix("!").strip()).lstrip("/")
        result.append((admits, pattern, re.compile(_regex(pattern))))
    return result


def _regex(pattern: str) -> str:
    """Docker's glob: `*` and `?` stay within a path segment, `**` spans segments."""
    if "[" in pattern or "\\" in pattern:
        raise ValueError(f"{pattern}: character classes and escapes are not read here")
    parts = re.split(r"(\*\*/?|\*|\?)", pattern)
    table = {"*": "[^/]*", "?": "[^/]"}
    regex = ""
    for index, part in enumerate(parts):
        if part.startswith("**"):
            regex += ".*" if index == len(parts) - 2 and not parts[-1] else "(.*/)?"
        else:
            regex += table.get(part) or re.escape(part)
    return regex


def excluded(path: str, patterns: list[Rule]) -> bool:
    """The last pattern that matches the path or one of its parent directories decides."""
    parents = ["/".join(path.split("/")[:n]) for n in range(1, path.count("/") + 2)]
    verdict = False
    for admits, _, regex in patterns:
        if any(regex.fullmatch(candidate) for candidate in parents):
            verdict = not admits
    return verdict


def context_files(root: Path, patterns: list[Rule]) -> list[str]:
    """The files Docker sends as the build context; an excluded directory is skipped unless
    a re-admitting pattern lies under it, as Docker's walk does."""
    found = []
    for directory, subdirectories, files in os.walk(root):
        relative = Path(directory).relative_to(root).as_posix()
        prefix = "" if relative == "." else f"{relative}/"
        subdirectories[:] = [
            name
            for name in subdirectories
            if not excluded(prefix + name, patterns)
            or any(
                admits and f"{text}/".startswith(f"{prefix}{name}/") for admits, text, _ in patterns
            )
        ]
        found += [prefix + name for name in files if not excluded(prefix + name, patterns)]
    return sorted(found)


@pytest.mark.parametrize(
    ("path", "is_excluded"),
    [
        ("pyproject.toml", False),
        ("berth/api/keys.py", False),
        ("cli/berth.py", False),
        ("berth/__pycache__/cli.cpython-311.pyc", True),
        ("berth/api/__pycache__/keys.cpython-311.pyc", True),
        ("devtools/cluster.py", True),
        ("tests/unit/test_api.py", True),
        ("tools/kcp/go.mod", True),
        (".venv/bin/python", True),
        ("Dockerfile", True),
    ],
)
def test_dockerignore_admits_only_the_packages(path: str, is_excluded: bool) -> None:
    assert excluded(path, rules((REPO / ".dockerignore").read_text())) is is_excluded


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    context = tmp_path_factory.mktemp("context")
    for name in context_files(REPO, rules((REPO / ".dockerignore").read_text())):
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, context / name)
    out = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    built = subprocess.run(
        [*pip, "--wheel-dir", str(out), str(context)], capture_output=True, text=True
    )
    assert built.returncode == 0, built.stderr
    return next(out.glob("*.whl"))


def test_wheel_holds_the_packages_and_no_devtools(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    top = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top == PACKAGES


def test_console_scripts_are_the_cli_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        entry_points = next(
            archive.read(name).decode()
            for name in archive.namelist()
            if name.endswith(".dist-info/entry_points.txt")
        )
    assert "berth = cli.berth:main" in entry_points
    assert "kubectl-migrate = cli.migrate:main" in entry_points


# Run with the wheel and the installed dependencies on the path, and nothing of the
# checkout: -I leaves the working directory out, -S skips the .pth files, among them
# the one that maps this checkout's packages (devtools too) into the virtualenv.
PROBE = """
import json, sys
sys.path[:0] = sys.argv[1:]
import cli.berth, cli.migrate
parser = cli.berth.parser()
commands = next(a for a in parser._actions if a.dest == "command").choices
try:
    import devtools
    importable = True
except ModuleNotFoundError:
    importable = False
print(json.dumps({
    "file": cli.berth.__file__,
    "commands": sorted(commands),
    "devtools_loaded": sorted(m for m in sys.modules if m.split(".")[0] == "devtools"),
    "devtools_importable": importable,
}))
"""


def test_berth_runs_from_the_wheel_without_devtools(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    paths = dict.fromkeys([str(site), sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    probe = subprocess.run(
        [sys.executable, "-I", "-S", "-c", PROBE, *paths],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    seen = json.loads(probe.stdout)
    assert seen["file"].startswith(str(site))
    assert not seen["devtools_importable"]
    assert seen["devtools_loaded"] == []
    assert seen["commands"] == ["certs", "controller", "crds", "extender", "migrate", "webhook"]
