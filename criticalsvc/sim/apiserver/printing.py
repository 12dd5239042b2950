"""Server-side printing and the other answer forms a GET can ask for in its Accept header.

`Accept: application/json;as=Table;v=v1;g=meta.k8s.io` on a get, list or watch answers a meta.k8s.io
Table (tables.py: a CRD's printer columns, the built-in printers), so `kubectl get` prints the
server's columns; `as=PartialObjectMetadataList;g=meta.k8s.io;v=v1` answers a metadata-only list
(metadata informers, the gate's caches). The content negotiation is k8s.io/apiserver
pkg/endpoints/handlers/negotiation; the Table conversion pkg/registry/rest/table.go.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from ...restmapper import ResourceType
from .. import tables
from ..store import StatusError, Store
from .registry import describing_crd

TABLE_VERSIONS = ("v1", "v1beta1")


class OutputForm(NamedTuple):
    """What a GET answers: the object(s) as stored, a meta.k8s.io Table of them (kubectl get), or, for a
    list, a PartialObjectMetadataList (metadata-only informers, the gate's caches)."""

    table: bool = False
    group_version: str = "meta.k8s.io/v1"
    include_object: str = ""
    metadata_list: bool = False


def output_form(accept: str, params: Mapping[str, str]) -> OutputForm:
    """The first form of the Accept header this stand-in serves: `application/json;as=Table;v=v1;g=meta.k8s.io`
    (or v1beta1) for a Table, `as=PartialObjectMetadataList;g=meta.k8s.io;v=v1` for a metadata-only list,
    plain JSON otherwise (protobuf and YAML answers are not served, so those entries are passed over; so
    is the single-object PartialObjectMetadata form, whose clients also accept JSON)."""
    for media in accept.split(","):
        kind, *options = (p.strip() for p in media.split(";"))
        opts = {k.strip().lower(): v.strip() for k, _, v in (o.partition("=") for o in options)}
        if kind.lower() not in ("application/json", "application/*", "*/*"):
            continue
        if "as" not in opts:
            return OutputForm()
        if opts["as"] == "Table" and opts.get("g") == "meta.k8s.io" and opts.get("v") in TABLE_VERSIONS:
            return OutputForm(True, f"meta.k8s.io/{opts['v']}", params.get("includeObject", ""))
        if opts["as"] == "PartialObjectMetadataList" and opts.get("g") == "meta.k8s.io" and opts.get("v") == "v1":
            return OutputForm(metadata_list=True)
    return OutputForm()


def printer(store: Store, t: ResourceType, crd_path: Path | None) -> tables.Printer:
    """How the real API server prints `t`: the CRD's printer columns, else the built-in printer.
    Call holding the store (it reads the CRD)."""
    crd = describing_crd(store, t, crd_path)
    if crd is not None:
        try:
            return tables.crd_table_columns(crd, t.version)
        except tables.TableError:  # the API server falls back to its default convertor
            return tables.DEFAULT
    return tables.printer_for(t.group_resource)


def table(printer: tables.Printer, objects: list[dict[str, Any]], *, now: float, resource_version: str,
          form: OutputForm, headers: bool = True, is_list: bool = True) -> dict[str, Any]:
    """A meta.k8s.io Table of `objects`; a 400 for an includeObject the API server does not know."""
    try:
        return tables.make_table(printer, objects, now=now, resource_version=resource_version,
                                 include_object=form.include_object, headers=headers,
                                 group_version=form.group_version, is_list=is_list)
    except tables.TableError as exc:
        raise StatusError(400, "BadRequest", str(exc)) from exc
