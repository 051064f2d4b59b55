"""devtools.binaries: two processes building the same tool at once both end with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

FAKE_GO = """#!/bin/sh
# Stands in for `go build -trimpath -ldflags=... -o OUT PACKAGE`: both builders write
# OUT, and neither finishes before the other has written.
echo binary > "$5"
touch "$READY_DIR/$$"
while [ "$(ls "$READY_DIR" | wc -l)" -lt 2 ]; do sleep 0.05; done
"""

BUILD = """
import sys
from pathlib import Path
from devtools.binaries import _build
_build(sys.argv[1], module=Path('.'), package='.', output=Path(sys.argv[2]))
"""


def test_concurrent_builds_of_one_binary_do_not_rename_each_others_output(
    tmp_path: Path,
) -> None:
    go = tmp_path / "go"
    go.write_text(FAKE_GO)
    go.chmod(0o755)
    ready = tmp_path / "ready"
    ready.mkdir()
    output = tmp_path / "out" / "tool"
    output.parent.mkdir()
    builders = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD, str(go), str(output)],
            env={"READY_DIR": str(ready), "PATH": "/usr/bin:/bin"},
            cwd=Path(__file__).resolve().parents[2],
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [(b.wait(timeout=60), b.stderr.read() if b.stderr else "") for b in builders]
    for code, stderr in results:
        assert code == 0, stderr
    assert output.read_text() == "binary\n"
    assert not list(output.parent.glob("*.partial"))
