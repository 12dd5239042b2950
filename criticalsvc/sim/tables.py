"""Server-side printing: objects as meta.k8s.io Tables, as kube-apiserver renders them for `kubectl get`.

kubectl get asks `Accept: application/json;as=Table;v=v1;g=meta.k8s.io, ...;v=v1beta1..., application/json`
and prints the columns the server chose. Sources (Kubernetes 1.37):

* custom resources: apiextensions-apiserver registry/customresource/tableconvertor: a Name column,
  then the CRD version's additionalPrinterColumns, each evaluated as JSONPath (jsonpath.py) on the object; a
  version without columns gets one, Age (apiserver/helpers.go serveDefaultColumnsIfEmpty). Cells are
  typed by the column: integer, number, boolean, date (a human age: "5m3s"), string (JSONPath's text).
* CustomResourceDefinitions: registry/customresourcedefinition/tableconvertor (Scope, Versions, ...).
* built-ins: kubernetes pkg/printers/internalversion/printers.go, with every column (the server
  prints Wide: kubectl hides priority > 0 columns unless -o wide); types without a printer there
  (roles, clusterroles, limitranges) get rest.defaultTableConvertor's Name and Created At.

Each row carries the object as `includeObject` asks: PartialObjectMetadata (the default), the
whole object (Object), or nothing (None).

Simplified: the Pod and Service printers keep their columns but compute the common cases only
(no init-container or readiness-gate accounting, no load-balancer ingress); built-ins whose printer
is not ported here (jobs, cronjobs, nodes, persistent volumes and claims, ingresses, ...) print Name
and Age.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from ..api import GroupResource
from . import jsonpath

__all__ = ["DEFAULT", "FALLBACK", "Printer", "TableError", "crd_table_columns", "human_duration", "make_table",
           "printer_for", "selector_string"]

NAME_DOC = ("Name must be unique within a namespace. Is required when creating resources, although some resources "
            "may allow a client to request the generation of an appropriate name automatically. Name is primarily "
            "intended for creation idempotence and configuration definition. Cannot be updated. More info: "
            "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names")
CREATED_DOC = ("CreationTimestamp is a timestamp representing the server time when this object was created. It is "
               "not guaranteed to be set in happens-before order across separate operations. Clients may not set "
               "this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. "
               "Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/"
               "api-conventions.md#metadata")
Obj = Mapping[str, Any]
Cell = Any


class TableError(ValueError):
    """A Table that cannot be built as asked (bad includeObject, bad JSONPath): 400 BadRequest."""


def column(name: str, type_: str = "string", description: str = "", *, priority: int = 0,
           format_: str = "") -> dict[str, Any]:
    return {"name": name, "type": type_, "format": format_, "description": description, "priority": priority}


NAME = column("Name", "string", NAME_DOC, format_="name")
AGE = column("Age", "string", CREATED_DOC)
CONTAINERS = column("Containers", description="Names of each container in the template.", priority=1)
IMAGES = column("Images", description="Images referenced by each container in the template.", priority=1)


# --- time --------------------------------------------------------------------------------------------
def human_duration(seconds_float: float) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration."""
    seconds = math.trunc(seconds_float)
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    if seconds < 60 * 2:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        s = seconds % 60
        return f"{minutes}m" if s == 0 else f"{minutes}m{s}s"
    if minutes < 60 * 3:
        return f"{minutes}m"
    hours = seconds // 3600
    if hours < 8:
        m = minutes % 60
        return f"{hours}h" if m == 0 else f"{hours}h{m}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        h = hours % 24
        return f"{hours // 24}d" if h == 0 else f"{hours // 24}d{h}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        dy = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if dy == 0 else f"{hours // 24 // 365}y{dy}d"
    return f"{hours // 24 // 365}y"


def _parse_time(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC).timestamp()
    except ValueError:
        return None


def _since(value: Any, now: float) -> str:
    """printers.go translateTimestampSince: "<unknown>" for a missing timestamp."""
    t = _parse_time(value)
    return "<unknown>" if t is None else human_duration(now - t)


def _typed_cell(type_: str, value: Any, now: float) -> Cell:
    """tableconvertor.cellForJSONValue (and the string case of ConvertToTable)."""
    if value is None:
        return None
    if type_ == "string":
        return jsonpath.text(value)
    if type_ == "integer" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    if type_ == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if type_ == "boolean" and isinstance(value, bool):
        return value
    if type_ == "date" and isinstance(value, str):
        t = _parse_time(value)
        return "<invalid>" if t is None else human_duration(now - t)
    return None


# --- printers ----------------------------------------------------------------------------------------
Row = Callable[[Obj, float], list[Cell]]


class Printer:
    """Columns and a row function; `empty_rows` is what an empty list renders as (null for some)."""

    def __init__(self, columns: Sequence[Mapping[str, Any]], row: Row, *, empty_rows: list[Any] | None = None):
        self.columns = [dict(c) for c in columns]
        self.row = row
        self.empty_rows = empty_rows


def _md(obj: Obj) -> Mapping[str, Any]:
    md = obj.get("metadata")
    return md if isinstance(md, Mapping) else {}


def _get(obj: Any, *path: str, default: Any = None) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return default if obj is None else obj


def _int(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _name(obj: Obj) -> str:
    return str(_md(obj).get("name", ""))


def _age(obj: Obj, now: float) -> str:
    return _since(_md(obj).get("creationTimestamp"), now)


def _containers(obj: Obj) -> tuple[str, str]:
    containers = _get(obj, "spec", "template", "spec", "containers", default=[])
    containers = [c for c in containers if isinstance(c, Mapping)] if isinstance(containers, list) else []
    return ",".join(str(c.get("name", "")) for c in containers), ",".join(str(c.get("image", "")) for c in containers)


def selector_string(selector: Any) -> str:
    """metav1.LabelSelectorAsSelector(s).String(): requirements sorted by key."""
    if not isinstance(selector, Mapping):
        return ""
    parts: list[tuple[str, str]] = []
    for key, value in sorted((selector.get("matchLabels") or {}).items()):
        parts.append((key, f"{key}={value}"))
    for expr in selector.get("matchExpressions") or []:
        if not isinstance(expr, Mapping):
            continue
        key, op = str(expr.get("key", "")), expr.get("operator")
        values = ",".join(sorted(str(v) for v in expr.get("values") or []))
        text = {"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})", "Exists": key,
                "DoesNotExist": f"!{key}"}.get(str(op), key)
        parts.append((key, text))
    return ",".join(text for _, text in sorted(parts, key=lambda p: p[0]))


def _format_selector(selector: Any) -> str:
    """metav1.FormatLabelSelector: "<none>" when empty."""
    return selector_string(selector) or "<none>"


def _format_labels(labels: Any) -> str:
    """labels.FormatLabels: "<none>" when empty."""
    if not isinstance(labels, Mapping) or not labels:
        return "<none>"
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _deployment(obj: Obj, now: float) -> list[Cell]:
    desired = _int(_get(obj, "spec", "replicas", default=1))  # defaulted to 1 by the real API server
    status = _get(obj, "status", default={})
    names, images = _containers(obj)
    return [_name(obj), f"{_int(status.get('readyReplicas'))}/{desired}", _int(status.get("updatedReplicas")),
            _int(status.get("availableReplicas")), _age(obj, now), names, images,
            selector_string(_get(obj, "spec", "selector"))]


def _replicaset(obj: Obj, now: float) -> list[Cell]:
    status = _get(obj, "status", default={})
    names, images = _containers(obj)
    return [_name(obj), _int(_get(obj, "spec", "replicas", default=1)), _int(status.get("replicas")),
            _int(status.get("readyReplicas")), _age(obj, now), names, images,
            _format_selector(_get(obj, "spec", "selector"))]


def _statefulset(obj: Obj, now: float) -> list[Cell]:
    names, images = _containers(obj)
    desired = _int(_get(obj, "spec", "replicas", default=1))
    return [_name(obj), f"{_int(_get(obj, 'status', 'readyReplicas'))}/{desired}", _age(obj, now), names, images]


def _daemonset(obj: Obj, now: float) -> list[Cell]:
    status = _get(obj, "status", default={})
    names, images = _containers(obj)
    return [_name(obj), *(_int(status.get(k)) for k in ("desiredNumberScheduled", "currentNumberScheduled",
                                                         "numberReady", "updatedNumberScheduled", "numberAvailable")),
            _format_labels(_get(obj, "spec", "template", "spec", "nodeSelector")), _age(obj, now), names, images,
            _format_selector(_get(obj, "spec", "selector"))]


def _pod(obj: Obj, now: float) -> list[Cell]:
    containers = _get(obj, "spec", "containers", default=[])
    statuses = [s for s in _get(obj, "status", "containerStatuses", default=[]) if isinstance(s, Mapping)]
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(_int(s.get("restartCount")) for s in statuses)
    reason = str(_get(obj, "status", "reason", default="") or _get(obj, "status", "phase", default=""))
    if _md(obj).get("deletionTimestamp"):
        reason = "Terminating"
    none = "<none>"
    return [_name(obj), f"{ready}/{len(containers) if isinstance(containers, list) else 0}", reason, str(restarts),
            _age(obj, now), _get(obj, "status", "podIP") or none, _get(obj, "spec", "nodeName") or none,
            _get(obj, "status", "nominatedNodeName") or none, none]


def _service(obj: Obj, now: float) -> list[Cell]:
    spec = _get(obj, "spec", default={})
    kind = str(spec.get("type") or "ClusterIP")
    external = ",".join(spec.get("externalIPs") or [])
    if kind == "ExternalName":
        external = str(spec.get("externalName") or "")
    elif kind == "LoadBalancer" and not external:
        external = "<pending>"
    ports = []
    for p in spec.get("ports") or []:
        if isinstance(p, Mapping):
            node = f":{p['nodePort']}" if p.get("nodePort") else ""
            ports.append(f"{p.get('port')}{node}/{p.get('protocol') or 'TCP'}")
    return [_name(obj), kind, spec.get("clusterIP") or "<none>", external or "<none>", ",".join(ports) or "<none>",
            _age(obj, now), _format_labels(spec.get("selector"))]


def _event(obj: Obj, now: float) -> list[Cell]:
    # core/v1 and events.k8s.io/v1 Events share the internal type (and this printer) in the API server.
    first_raw = obj.get("firstTimestamp") or obj.get("deprecatedFirstTimestamp")
    first = _since(first_raw, now) if first_raw else _since(obj.get("eventTime"), now)
    last_raw = obj.get("lastTimestamp") or obj.get("deprecatedLastTimestamp")
    last = _since(last_raw, now) if last_raw else first
    count = _int(obj.get("count") or obj.get("deprecatedCount"))
    series = obj.get("series")
    if isinstance(series, Mapping):
        last, count = _since(series.get("lastObservedTime"), now), _int(series.get("count"))
    elif count == 0:
        count = 1
    involved = obj.get("involvedObject") or obj.get("regarding") or {}
    kind = str(involved.get("kind", "")).lower()
    target = f"{kind}/{involved['name']}" if involved.get("name") else kind
    source = obj.get("source") or obj.get("deprecatedSource") or {}
    component = source.get("component") or obj.get("reportingComponent") or obj.get("reportingController") or ""
    host = source.get("host") or obj.get("reportingInstance") or ""
    return [last, obj.get("type", ""), obj.get("reason", ""), target, involved.get("fieldPath", ""),
            f"{component}, {host}" if host else component, str(obj.get("message") or obj.get("note") or "").strip(),
            first, count, _name(obj)]


def _binding(obj: Obj, now: float) -> list[Cell]:
    ref = obj.get("roleRef") or {}
    users, groups, sas = [], [], []
    for s in obj.get("subjects") or []:
        if not isinstance(s, Mapping):
            continue
        if s.get("kind") == "User":
            users.append(str(s.get("name", "")))
        elif s.get("kind") == "Group":
            groups.append(str(s.get("name", "")))
        elif s.get("kind") == "ServiceAccount":
            sas.append(f"{s.get('namespace', '')}/{s.get('name', '')}")
    return [_name(obj), f"{ref.get('kind', '')}/{ref.get('name', '')}", _age(obj, now), ", ".join(users),
            ", ".join(groups), ", ".join(sas)]


def _crd(obj: Obj, now: float) -> list[Cell]:
    spec = _get(obj, "spec", default={})
    versions = sorted(f"{v.get('name')}{'(storage)' if v.get('storage') else ''}"
                      for v in spec.get("versions") or [] if isinstance(v, Mapping) and v.get("served"))
    established = any(isinstance(c, Mapping) and c.get("type") == "Established" and c.get("status") == "True"
                      for c in _get(obj, "status", "conditions", default=[]))
    return [_name(obj), spec.get("scope", ""), ",".join(versions), _md(obj).get("creationTimestamp", ""),
            spec.get("group", ""), _get(spec, "names", "kind", default=""),
            ",".join(_get(spec, "names", "shortNames", default=[])), established]


def _created_at(obj: Obj, now: float) -> list[Cell]:
    return [_name(obj), _md(obj).get("creationTimestamp", "")]


def _name_age(obj: Obj, now: float) -> list[Cell]:
    return [_name(obj), _age(obj, now)]


def _count(key: str, extra: str | None = None) -> Row:
    def row(obj: Obj, now: float) -> list[Cell]:
        n = len(obj.get(key) or {}) + (len(obj.get(extra) or {}) if extra else 0)
        return [_name(obj), n, _age(obj, now)]
    return row


def _workload_columns(*middle: Mapping[str, Any], selector: bool = True) -> list[Mapping[str, Any]]:
    tail = [column("Selector", description="Label selector for pods.", priority=1)] if selector else []
    return [NAME, *middle, AGE, CONTAINERS, IMAGES, *tail]


_EVENT_COLUMNS = [
    column("Last Seen", description="The time at which the most recent occurrence of this event was recorded."),
    column("Type", description="Type of this event (Normal, Warning), new types could be added in the future"),
    column("Reason", description="This should be a short, machine understandable string that gives the reason "
           "for the transition into the object's current status."),
    column("Object", description="The object that this event is about."),
    column("Subobject", description="If referring to a piece of an object instead of an entire object, this "
           "string should contain a valid JSON/Go field access statement.", priority=1),
    column("Source", description="The component reporting this event. Should be a short machine understandable "
           "string.", priority=1),
    column("Message", description="A human-readable description of the status of this operation."),
    column("First Seen", description="The time at which the event was first recorded. (Time of server receipt is "
           "in TypeMeta.)", priority=1),
    column("Count", description="The number of times this event has occurred.", priority=1),
    column("Name", "string", NAME_DOC, priority=1, format_="name"),
]
_BINDING_COLUMNS = [NAME, column("Role", description="RoleRef can reference a Role in the current namespace or a "
                                 "ClusterRole in the global namespace."), AGE,
                    column("Users", description="Users in the roleBinding", priority=1),
                    column("Groups", description="Groups in the roleBinding", priority=1),
                    column("ServiceAccounts", description="ServiceAccounts in the roleBinding", priority=1)]
DEFAULT = Printer([NAME, column("Created At", "date", CREATED_DOC)], _created_at, empty_rows=None)
_WEBHOOKS = Printer([NAME, column("Webhooks", "integer", "Webhooks indicates the number of webhooks registered in "
                                  "this configuration"), AGE], _count("webhooks"), empty_rows=[])

PRINTERS: dict[GroupResource, Printer] = {
    GroupResource("", "namespaces"): Printer(
        [NAME, column("Status", description="The status of the namespace"), AGE],
        lambda o, now: [_name(o), str(_get(o, "status", "phase", default="")), _age(o, now)], empty_rows=[]),
    GroupResource("apps", "deployments"): Printer(_workload_columns(
        column("Ready", description="Number of the pod with ready state"),
        column("Up-to-date", description="Total number of non-terminating pods targeted by this deployment that "
               "have the desired template spec."),
        column("Available", description="Total number of available non-terminating pods (ready for at least "
               "minReadySeconds) targeted by this deployment.")), _deployment, empty_rows=[]),
    GroupResource("apps", "replicasets"): Printer(_workload_columns(
        column("Desired", "integer", "Replicas is the number of desired pods."),
        column("Current", "integer", "Replicas is the most recently observed number of non-terminating pods."),
        column("Ready", "integer", "The number of non-terminating pods targeted by this ReplicaSet with a Ready "
               "Condition.")), _replicaset, empty_rows=[]),
    GroupResource("apps", "statefulsets"): Printer(_workload_columns(
        column("Ready", description="Number of the pod with ready state"), selector=False), _statefulset,
        empty_rows=[]),
    GroupResource("apps", "daemonsets"): Printer(_workload_columns(
        *(column(n, "integer", d) for n, d in (
            ("Desired", "The total number of nodes that should be running the daemon pod."),
            ("Current", "The number of nodes that are running at least 1 daemon pod."),
            ("Ready", "The number of nodes that should be running the daemon pod and have one or more of the "
             "daemon pod running with a Ready Condition."),
            ("Up-to-date", "The total number of nodes that are running updated daemon pod"),
            ("Available", "The number of nodes that should be running the daemon pod and have one or more of the "
             "daemon pod running and available."))),
        column("Node Selector", description="NodeSelector is a selector which must be true for the pod to fit on "
               "a node.")), _daemonset, empty_rows=[]),
    GroupResource("", "pods"): Printer([
        NAME, column("Ready", description="The aggregate readiness state of this pod for accepting traffic."),
        column("Status", description="The aggregate status of the containers in this pod."),
        column("Restarts", description="The number of times the containers in this pod have been restarted and "
               "when the last container in this pod has restarted."), AGE,
        column("IP", description="podIP address allocated to the pod.", priority=1),
        column("Node", description="NodeName indicates in which node this pod is scheduled.", priority=1),
        column("Nominated Node", description="nominatedNodeName is set only when this pod preempts other pods on "
               "the node.", priority=1),
        column("Readiness Gates", description="If specified, all readiness gates will be evaluated for pod "
               "readiness.", priority=1)], _pod, empty_rows=[]),
    GroupResource("", "services"): Printer([
        NAME, column("Type", description="type determines how the Service is exposed."),
        column("Cluster-IP", description="clusterIP is the IP address of the service."),
        column("External-IP", description="externalIPs is a list of IP addresses for which nodes in the cluster "
               "will also accept traffic for this service."),
        column("Port(s)", description="The list of ports that are exposed by this service."), AGE,
        column("Selector", description="Route service traffic to pods with label keys and values matching this "
               "selector.", priority=1)], _service, empty_rows=[]),
    GroupResource("", "configmaps"): Printer(
        [NAME, column("Data", description="Data contains the configuration data."), AGE],
        _count("data", "binaryData"), empty_rows=[]),
    GroupResource("", "secrets"): Printer(
        [NAME, column("Type", description="Used to facilitate programmatic handling of secret data."),
         column("Data", description="Data contains the secret data."), AGE],
        lambda o, now: [_name(o), str(o.get("type") or ""), len(o.get("data") or {}), _age(o, now)], empty_rows=[]),
    GroupResource("", "serviceaccounts"): Printer([NAME, AGE], _name_age, empty_rows=[]),
    GroupResource("", "events"): Printer(_EVENT_COLUMNS, _event, empty_rows=[]),
    GroupResource("events.k8s.io", "events"): Printer(_EVENT_COLUMNS, _event, empty_rows=[]),
    GroupResource("coordination.k8s.io", "leases"): Printer(
        [NAME, column("Holder", description="holderIdentity contains the identity of the holder of a current "
                      "lease."), AGE],
        lambda o, now: [_name(o), str(_get(o, "spec", "holderIdentity", default="")), _age(o, now)], empty_rows=[]),
    GroupResource("admissionregistration.k8s.io", "validatingwebhookconfigurations"): _WEBHOOKS,
    GroupResource("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): _WEBHOOKS,
    GroupResource("rbac.authorization.k8s.io", "rolebindings"): Printer(_BINDING_COLUMNS, _binding, empty_rows=[]),
    GroupResource("rbac.authorization.k8s.io", "clusterrolebindings"): Printer(_BINDING_COLUMNS, _binding,
                                                                              empty_rows=[]),
    GroupResource("rbac.authorization.k8s.io", "roles"): DEFAULT,
    GroupResource("rbac.authorization.k8s.io", "clusterroles"): DEFAULT,
    GroupResource("", "limitranges"): DEFAULT,
    GroupResource("apiextensions.k8s.io", "customresourcedefinitions"): Printer([
        NAME, column("Scope", description="Cluster/Namespaced"), column("Versions", description="Served versions"),
        column("Created At", "date", CREATED_DOC), column("Group", description="API group", priority=1),
        column("Kind", description="CustomResource kind", priority=1),
        column("ShortNames", description="Short names", priority=1),
        column("Established", "boolean", "Established status", priority=1)], _crd, empty_rows=None),
}
FALLBACK = Printer([NAME, AGE], _name_age, empty_rows=[])


def crd_table_columns(crd: Mapping[str, Any] | None, version: str) -> Printer:
    """The Table printer of a custom resource: Name, then the CRD version's printer columns (or Age)."""
    columns: list[Mapping[str, Any]] = []
    for v in _get(crd, "spec", "versions", default=[]) if crd is not None else []:
        if isinstance(v, Mapping) and v.get("name") == version:
            columns = [c for c in v.get("additionalPrinterColumns") or [] if isinstance(c, Mapping)]
    if not columns:
        columns = [{"name": "Age", "type": "date", "description": CREATED_DOC,
                    "jsonPath": ".metadata.creationTimestamp"}]
    headers = [NAME]
    paths: list[tuple[str, jsonpath.Steps]] = []
    for c in columns:
        path = str(c.get("jsonPath", ""))
        try:
            steps = jsonpath.parse(path)
        except jsonpath.JSONPathError as exc:
            raise TableError(str(exc)) from exc
        paths.append((str(c.get("type", "string")), steps))
        headers.append(column(str(c.get("name", "")), str(c.get("type", "string")),
                              str(c.get("description") or f"Custom resource definition column (in JSONPath "
                                  f"format): {path}"), priority=_int(c.get("priority")),
                              format_=str(c.get("format") or "")))

    def row(obj: Obj, now: float) -> list[Cell]:
        cells: list[Cell] = [_name(obj)]
        for type_, steps in paths:
            found = jsonpath.walk([obj], steps)
            cells.append(_typed_cell(type_, found[0], now) if found else None)
        return cells

    return Printer(headers, row, empty_rows=[])


def printer_for(gr: GroupResource) -> Printer:
    return PRINTERS.get(gr, FALLBACK)


def partial_metadata(obj: Obj, group_version: str = "meta.k8s.io/v1") -> dict[str, Any]:
    return {"kind": "PartialObjectMetadata", "apiVersion": group_version, "metadata": dict(_md(obj))}


def make_table(printer: Printer, objects: Sequence[Obj], *, now: float, resource_version: str,
               include_object: str = "", headers: bool = True, group_version: str = "meta.k8s.io/v1",
               is_list: bool = True) -> dict[str, Any]:
    """A meta.k8s.io Table of `objects`, each row carrying the object as `include_object` asks."""
    if include_object not in ("", "Metadata", "Object", "None"):
        raise TableError(f'Unable to convert to Table as requested: includeObject: Invalid value: "{include_object}": '
                         "must be 'Metadata', 'Object', 'None', or empty")
    rows: list[dict[str, Any]] | None = []
    for obj in objects:
        row: dict[str, Any] = {"cells": printer.row(obj, now)}
        if include_object == "Object":
            row["object"] = obj
        elif include_object == "None":
            row["object"] = None  # TableRow.Object is a RawExtension: null, not omitted
        else:
            row["object"] = partial_metadata(obj, group_version)
        rows.append(row)  # type: ignore[union-attr]
    if not objects and is_list:
        rows = None if printer.empty_rows is None else []
    table: dict[str, Any] = {"kind": "Table", "apiVersion": group_version,
                             "metadata": {"resourceVersion": resource_version}}
    table["columnDefinitions"] = printer.columns if headers else None  # not omitempty in metav1.Table
    table["rows"] = rows
    return table
