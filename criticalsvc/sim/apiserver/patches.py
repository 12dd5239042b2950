"""The three patch types of a PATCH request: JSON merge patch, strategic merge patch, JSON patch.

JSON patch (RFC 6902) is the `jsonpatch` library's. Merge patch (RFC 7386) is ten lines. Strategic
merge patch is the part kubectl's client-side apply and `kubectl patch` use, driven by the patch
strategies of k8s.io/api's struct tags (`patchMergeKey`, `patchStrategy`), written out in MERGE_KEYS
below; the real one is k8s.io/apimachinery pkg/util/strategicpatch/patch.go.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import jsonpatch
import jsonpointer


class PatchError(ValueError):
    """A JSON patch that cannot be applied (bad pointer, failed test, unknown operation)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test); `target` is not modified."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations")
    try:
        return jsonpatch.apply_patch(target, operations, in_place=False)
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
        raise PatchError(str(exc)) from exc


# patchMergeKey of the object lists kubectl patches (k8s.io/api struct tags); other lists are replaced.
MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name", "env": "name",
    "volumes": "name", "imagePullSecrets": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath",
    "conditions": "type", "ownerReferences": "uid", "hostAliases": "ip", "resourceClaims": "name",
}
# Primitive lists with patchStrategy=merge (ObjectMeta.finalizers): the patch's values are added.
MERGED_PRIMITIVE_LISTS = frozenset({"finalizers"})
_DELETE = object()


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """The part of strategic merge patch kubectl's client-side apply and `kubectl patch` use.

    Directives: `$patch: replace|delete` (maps and list items), `$deleteFromPrimitiveList/<f>`;
    `$setElementOrder/<f>` and `$retainKeys` are dropped. Object lists in MERGE_KEYS merge by key
    (`ports` by containerPort, else port); `finalizers` is a merged set; other lists are replaced.
    """
    result = _smp(target, patch)
    return {} if result is _DELETE else result


def _smp(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "delete":
        return _DELETE
    base: dict[str, Any] = {} if directive == "replace" or not isinstance(target, Mapping) else dict(target)
    deletions: list[tuple[str, list[Any]]] = []
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            deletions.append((key.partition("/")[2], list(value or [])))
        elif value is None:
            base.pop(key, None)
        elif isinstance(value, Mapping):
            merged = _smp(base.get(key), value)
            if merged is _DELETE:
                base.pop(key, None)
            else:
                base[key] = merged
        elif isinstance(value, list):
            base[key] = _smp_list(key, base.get(key), value)
        else:
            base[key] = value
    for key, values in deletions:
        if isinstance(base.get(key), list):
            base[key] = [v for v in base[key] if v not in values]
    return base


def _smp_list(key: str, current: Any, patch: list[Any]) -> list[Any]:
    if any(isinstance(x, Mapping) and x.get("$patch") == "replace" for x in patch):
        return [_smp(None, x) for x in patch if not (isinstance(x, Mapping) and x.get("$patch") == "replace")]
    existing = list(current) if isinstance(current, list) else []
    merge_key = MERGE_KEYS.get(key)
    if key == "ports":
        merge_key = "containerPort" if any(isinstance(x, Mapping) and "containerPort" in x for x in patch) else "port"
    if merge_key and all(isinstance(x, Mapping) for x in patch) and all(isinstance(x, Mapping) for x in existing):
        for item in patch:
            at = next((i for i, x in enumerate(existing) if x.get(merge_key) == item.get(merge_key)), None)
            if item.get("$patch") == "delete":
                if at is not None:
                    del existing[at]
            elif at is None:
                existing.append(_smp(None, item))
            else:
                existing[at] = _smp(existing[at], item)
        return existing
    if key in MERGED_PRIMITIVE_LISTS:
        return existing + [x for x in patch if x not in existing]
    return [_smp(None, x) for x in patch]
