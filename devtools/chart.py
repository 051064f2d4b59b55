"""The Helm chart in charts/berth beside the kustomize manifests it must equal.

manifests/ stays the one source of truth: with default values the chart renders the
same objects, and `differences` says object by object and field by field where it
does not. The CRDs are copied from manifests/crds by `make crds`; the values table of
the chart's README is written from the comments of values.yaml by `make chart-docs`
(`python -m devtools.chart`).
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devtools.binaries import REPO

CHART = REPO / "charts" / "berth"
MANIFESTS = REPO / "manifests"
README = CHART / "README.md"

Object = dict[str, Any]

HELM_LABELS = ("app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "helm.sh/chart")
"""Labels Helm charts put on every object and kustomize does not: not compared."""

CONFIG_MAP = re.compile(r"^(?P<base>.+-controller-config)-[a-z0-9]{10}$")
"""The controller's ConfigMap, whose name ends in a hash of its content in both renders
(kustomize's configMapGenerator, the chart's sha256): each hashes its own text."""


# --- rendering ---------------------------------------------------------------------


class RenderError(RuntimeError):
    """Helm or kustomize refused to render (bad values, a broken template)."""


def documents(text: str) -> list[Object]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def helm_template(
    helm: Path,
    *,
    release: str = "berth",
    namespace: str = "berth-system",
    values: Sequence[str] = (),
) -> list[Object]:
    """`helm template` of the chart, CRDs included; `values` are `--set` arguments."""
    command = [str(helm), "template", release, str(CHART), "--namespace", namespace]
    command += ["--include-crds", *[arg for value in values for arg in ("--set", value)]]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RenderError(f"`{' '.join(command)}` failed:\n{result.stderr}")
    return documents(result.stdout)


def kustomize(kubectl: Path, directory: Path) -> list[Object]:
    """`kubectl kustomize` of a directory of manifests/ (or an overlay of it)."""
    result = subprocess.run(
        [str(kubectl), "kustomize", str(directory)], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RenderError(f"`kubectl kustomize {directory}` failed:\n{result.stderr}")
    return documents(result.stdout)


# --- comparing ---------------------------------------------------------------------


def key(obj: Object) -> str:
    """How an object is named in a difference: Kind/namespace/name."""
    metadata = obj.get("metadata", {})
    namespace = metadata.get("namespace") or "-"
    return f"{obj.get('kind')}/{namespace}/{metadata.get('name')}"


def normalised(objects: Iterable[Object]) -> dict[str, Object]:
    """Objects by key, without what legitimately differs between the two renders: Helm's
    own labels, the content hash in the controller ConfigMap's name, and the layout of
    its config.yaml (compared as the YAML it holds, so comments do not count)."""
    found: dict[str, Object] = {}
    for original in objects:
        obj = copy.deepcopy(original)
        labels = obj.get("metadata", {}).get("labels")
        if labels:
            for label in HELM_LABELS:
                labels.pop(label, None)
        if obj["kind"] == "ConfigMap":
            obj["metadata"]["name"] = _unhashed(obj["metadata"]["name"])
            obj["data"] = {name: yaml.safe_load(text) for name, text in obj["data"].items()}
        if obj["kind"] == "Deployment":
            for volume in obj["spec"]["template"]["spec"].get("volumes", []):
                if "configMap" in volume:
                    volume["configMap"]["name"] = _unhashed(volume["configMap"]["name"])
        found[key(obj)] = obj
    return found


def _unhashed(name: str) -> str:
    match = CONFIG_MAP.match(name)
    return match.group("base") if match else name


def differences(expected: Iterable[Object], actual: Iterable[Object]) -> list[str]:
    """Every difference between the kustomize objects (`expected`) and the chart's
    (`actual`), one line each, naming the object and the field."""
    want, got = normalised(expected), normalised(actual)
    lines = [f"only in manifests/: {name}" for name in sorted(want.keys() - got.keys())]
    lines += [f"only in the chart: {name}" for name in sorted(got.keys() - want.keys())]
    for name in sorted(want.keys() & got.keys()):
        lines += [f"{name}: {line}" for line in field_differences(want[name], got[name])]
    return lines


def field_differences(want: Any, got: Any, path: str = "") -> list[str]:
    """`path: manifests <value> != chart <value>` for each field that differs."""
    if isinstance(want, Mapping) and isinstance(got, Mapping):
        lines = []
        for field in sorted(want.keys() | got.keys()):
            lines += field_differences(want.get(field), got.get(field), f"{path}.{field}")
        return lines
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        lines = []
        for index, (one, other) in enumerate(zip(want, got, strict=True)):
            lines += field_differences(one, other, f"{path}[{index}]")
        return lines
    if want == got:
        return []
    return [f"{path.lstrip('.') or '(object)'}: manifests {_show(want)} != chart {_show(got)}"]


def _show(value: Any) -> str:
    return "(absent)" if value is None else json.dumps(value, sort_keys=True)


# --- the values table --------------------------------------------------------------

KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z][\w.-]*):(?P<rest>.*)$")
TABLE_START = "<!-- values table: written by `make chart-docs` from values.yaml -->"
TABLE_END = "<!-- end of values table -->"


@dataclass(frozen=True)
class ValueDoc:
    path: str
    default: Any
    description: str


def value_docs(text: str) -> list[ValueDoc]:
    """Each key of values.yaml with the comment lines right above it, in file order.

    values.yaml is block-style YAML, one key per line, so the key paths follow from the
    indentation; the defaults are taken from the parsed file. The keys of mappings inside
    a list belong to the list's value, not to the table."""
    values = yaml.safe_load(text)
    docs: list[ValueDoc] = []
    stack: list[tuple[int, str]] = []
    comment: list[str] = []
    in_list_below: int | None = None  # the indent of the key whose list we are in
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(stripped.lstrip("#").strip())
            continue
        comment, above = [], comment
        match = KEY_LINE.match(line)
        if stripped.startswith("- ") and stack:
            in_list_below = stack[-1][0] if in_list_below is None else in_list_below
        if not match:
            continue  # a blank line or a list item: a comment above it is not a key's
        indent = len(match.group("indent"))
        if in_list_below is not None and indent > in_list_below:
            continue
        in_list_below = None
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group("key")))
        path = ".".join(name for _, name in stack)
        docs.append(ValueDoc(path, _lookup(values, path), " ".join(above)))
    return docs


def _lookup(values: Any, path: str) -> Any:
    for part in path.split("."):
        values = values[part]
    return values


def undocumented(docs: Sequence[ValueDoc]) -> list[str]:
    """Keys holding a value (not a mapping of further keys) with no description of their
    own nor of a mapping above them."""
    described = [doc.path for doc in docs if doc.description]
    return [
        doc.path
        for doc in docs
        if not (isinstance(doc.default, dict) and doc.default)
        and not any(doc.path == done or doc.path.startswith(done + ".") for done in described)
    ]


def values_table(docs: Sequence[ValueDoc]) -> str:
    """The Markdown table of the documented keys: key, default, description."""
    rows = ["| Key | Default | Description |", "| --- | --- | --- |"]
    for doc in docs:
        if doc.description:
            default = json.dumps(doc.default, separators=(", ", ": "))
            default = default if len(default) <= 60 else "see values.yaml"
            description = doc.description.replace("|", "\\|")
            rows.append(f"| `{doc.path}` | `{default}` | {description} |")
    return "\n".join(rows)


def readme_with_table(readme: str, table: str) -> str:
    """The README with its values table replaced between the two markers."""
    start, end = readme.find(TABLE_START), readme.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError(f"{README} lacks the markers {TABLE_START!r} and {TABLE_END!r}")
    return readme[: start + len(TABLE_START)] + "\n" + table + "\n" + readme[end:]


def main() -> int:
    docs = value_docs((CHART / "values.yaml").read_text())
    missing = undocumented(docs)
    if missing:
        print(
            f"undocumented keys in {CHART / 'values.yaml'}: {', '.join(missing)}", file=sys.stderr
        )
        return 1
    README.write_text(readme_with_table(README.read_text(), values_table(docs)))
    print(f"wrote the values table of {README}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
