"""Reading manifests: YAML streams, `kind: List` documents, directories and ManifestWork bundles.

Every object comes back with where it was found (`bundle.yaml: document 3`, `... items[2]`), so a
problem is reported as one line naming the file and document. A ManifestWork
(work.open-cluster-management.io) is expanded into its `spec.workload.manifests`, each remembering
the ManifestWork it belongs to: that grouping is what a ManifestWork agent deletes at once.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import yaml

from .errors import MalformedManifest

MANIFESTWORK_API_GROUP = "work.open-cluster-management.io"


@attrs.frozen
class Manifest:
    obj: Mapping[str, Any]
    where: str
    bundle: str = ""  # the ManifestWork (or file) the object was grouped in

    @property
    def api_version(self) -> str:
        return str(self.obj["apiVersion"])

    @property
    def kind(self) -> str:
        return str(self.obj["kind"])


def _documents(text: str, where: str) -> Iterator[tuple[Any, str]]:
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise MalformedManifest("", f"{line}not valid YAML: {problem}", where=where) from None
    for i, doc in enumerate(docs, start=1):
        if doc is not None:
            yield doc, f"{where}: document {i}"


def _expand(doc: Any, where: str, bundle: str) -> Iterator[Manifest]:
    if not isinstance(doc, Mapping):
        raise MalformedManifest("", "a manifest must be a mapping (an object)", where=where)
    if "apiVersion" not in doc or not isinstance(doc.get("apiVersion"), str) or not doc["apiVersion"]:
        raise MalformedManifest("apiVersion", "required", where=where)
    if not isinstance(doc.get("kind"), str) or not doc["kind"]:
        raise MalformedManifest("kind", "required", where=where)
    if doc["kind"].endswith("List") and isinstance(doc.get("items"), list):
        for i, item in enumerate(doc["items"]):
            yield from _expand(item, f"{where} items[{i}]", bundle)
        return
    if doc["kind"] == "ManifestWork" and doc["apiVersion"].startswith(MANIFESTWORK_API_GROUP + "/"):
        name = (doc.get("metadata") or {}).get("name") or where
        manifests = ((doc.get("spec") or {}).get("workload") or {}).get("manifests")
        if not isinstance(manifests, list):
            raise MalformedManifest("spec.workload.manifests", "required: a list", where=where)
        for i, item in enumerate(manifests):
            yield from _expand(item, f"{where} spec.workload.manifests[{i}]", f"manifestwork/{name}")
        return
    metadata = doc.get("metadata")
    if not isinstance(metadata, Mapping) or not isinstance(metadata.get("name"), str) or not metadata["name"]:
        raise MalformedManifest("metadata.name", "required", where=where)
    yield Manifest(doc, where, bundle)


def load_text(text: str, where: str, *, bundle: str = "") -> list[Manifest]:
    out: list[Manifest] = []
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as exc:
            raise MalformedManifest("", f"line {exc.lineno}: not valid JSON: {exc.msg}", where=where) from None
        docs = parsed if isinstance(parsed, list) else [parsed]
        for i, doc in enumerate(docs, start=1):
            out.extend(_expand(doc, f"{where}: document {i}", bundle or where))
        return out
    for doc, doc_where in _documents(text, where):
        out.extend(_expand(doc, doc_where, bundle or where))
    return out


def load_path(path: str) -> list[Manifest]:
    """A file, a directory (its *.yaml/*.yml/*.json, sorted) or '-' for standard input."""
    if path == "-":
        return load_text(sys.stdin.read(), "<stdin>")
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.suffix in (".yaml", ".yml", ".json") and f.is_file())
        if not files:
            raise MalformedManifest("", "no .yaml, .yml or .json files in this directory", where=path)
        out: list[Manifest] = []
        for f in files:
            out.extend(load_path(str(f)))
        return out
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MalformedManifest("", "no such file", where=path) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MalformedManifest("", f"cannot read: {exc}", where=path) from None
    return load_text(text, path)
