"""What an UPDATE changes, as far as spec.holdUpdates and spec.scaleToZero care (pure).

`decide` (criticalsvc/decision.py, section "UPDATE of a provider") asks two questions of an UPDATE's
`oldObject`/`object` pair:

    changes_content(old, new)   does it change anything a lock holds? Not when it only
                                  - removes finalizers (the garbage collector's and every finalizer
                                    controller's last step: holding it would wedge the teardown the
                                    gate orders; GC: pkg/controller/garbagecollector/operations.go,
                                    removeFinalizer, a JSON merge PATCH of metadata.finalizers),
                                  - removes ownerReferences or clears their blockOwnerDeletion (the
                                    garbage collector orphaning dependents, or unblocking them for a
                                    foreground deletion: garbagecollector.go attemptToDeleteItem and
                                    attemptToOrphanWorker, patch.go),
                                  - changes status (a separate subresource the router never sends, but
                                    a type without one stores status in the main resource),
                                  - changes bookkeeping metadata the API server writes itself
                                    (resourceVersion, managedFields, generation, ...),
                                  - sets or removes the break-glass annotation only (removing it
                                    restores the protection and must not be held by it),
                                  - sets the gate's own labels (criticalsvc.io/protected, updates-held:
                                    the leader writes them on what it protects, held or not);
    replicas(obj, scale=...)    the desired replica count: spec.replicas of a workload (absent: the
                                apps/v1 default of 1, so never 0), or of an autoscaling/v1 Scale,
                                whose spec.replicas is `omitempty`, so a Scale to zero arrives as
                                `spec: {}` (k8s.io/api autoscaling/v1 types.go, ScaleSpec).

Upstream, at tag v1.37.2:
https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/garbagecollector/operations.go
https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/garbagecollector/garbagecollector.go
https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/api/autoscaling/v1/types.go
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from .api import BREAK_GLASS_ANNOTATION, PROTECTED_LABEL, UPDATES_HELD_LABEL

# Metadata the API server sets or keeps itself; a client's value is ignored or must match
# (k8s.io/apimachinery pkg/api/validation/objectmeta.go, ValidateObjectMetaUpdate; the registry's
# BeforeUpdate sets generation and managedFields).
BOOKKEEPING_METADATA = frozenset({"resourceVersion", "managedFields", "generation", "selfLink", "uid",
                                  "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"})
# Compared on their own (only shrinking is exempt), so left out of the plain comparison.
_LISTS = frozenset({"finalizers", "ownerReferences"})


def changes_content(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    """Whether `new` differs from `old` in more than the exempt ways listed in the module docstring.

    Without both objects the answer is True: an UPDATE always carries both, and a request that does
    not is not one the gate can show to be harmless."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return True
    if _content(old) != _content(new):
        return True
    old_md, new_md = _metadata(old), _metadata(new)
    return _adds_finalizers(old_md, new_md) or _changes_owners(old_md, new_md)


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    md = obj.get("metadata")
    return md if isinstance(md, Mapping) else {}


def _content(obj: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in obj.items() if k not in ("status", "metadata")}
    md = {k: v for k, v in _metadata(obj).items() if k not in BOOKKEEPING_METADATA and k not in _LISTS}
    annotations = md.get("annotations")
    if isinstance(annotations, Mapping):
        rest = {k: v for k, v in annotations.items() if k != BREAK_GLASS_ANNOTATION}
        # An empty map and no map are the same to the API server (omitempty).
        if rest:
            md["annotations"] = rest
        else:
            md.pop("annotations")
    labels = md.get("labels")
    if isinstance(labels, Mapping):
        # The gate's own labels are not the object's content: they say it is protected (protectionlabels.py), and
        # the gate must be able to write them on an object whose updates it holds; removing one is decided apart
        # (decision.py, Rule.PROTECTION_LABEL).
        md["labels"] = {k: v for k, v in labels.items() if k not in (PROTECTED_LABEL, UPDATES_HELD_LABEL)}
    if not md.get("labels"):
        md.pop("labels", None)
    out["metadata"] = md
    return out


def _list(md: Mapping[str, Any], key: str) -> list[Any]:
    value = md.get(key)
    return list(value) if isinstance(value, list) else []


def _adds_finalizers(old_md: Mapping[str, Any], new_md: Mapping[str, Any]) -> bool:
    # A multiset difference: re-ordering is no addition (the API server keeps finalizers as a list,
    # but none of its semantics depend on their order).
    try:
        return bool(Counter(_list(new_md, "finalizers")) - Counter(_list(old_md, "finalizers")))
    except TypeError:  # an unhashable entry: not a finalizer list the API server would store
        return True


def _changes_owners(old_md: Mapping[str, Any], new_md: Mapping[str, Any]) -> bool:
    """True unless every new ownerReference is an old one, at most with blockOwnerDeletion cleared."""
    old_refs = [r for r in _list(old_md, "ownerReferences") if isinstance(r, Mapping)]
    new_refs = _list(new_md, "ownerReferences")
    if len(new_refs) > len(old_refs):
        return True
    remaining = [_unblocked(r) for r in old_refs]
    for ref in new_refs:
        if not isinstance(ref, Mapping):
            return True
        plain = _unblocked(ref)
        if plain not in remaining:
            return True
        i = remaining.index(plain)
        if ref.get("blockOwnerDeletion") and not old_refs[i].get("blockOwnerDeletion"):
            return True  # setting blockOwnerDeletion is a change; only clearing it is the collector's
        del remaining[i]
        del old_refs[i]
    return False


def _unblocked(ref: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in ref.items() if k != "blockOwnerDeletion"}


def replicas(obj: Mapping[str, Any] | None, *, scale: bool) -> int | None:
    """The desired replicas of a workload (`scale=False`) or an autoscaling/v1 Scale (`scale=True`);
    None when the object says nothing usable (no object, no spec, a value that is not an integer).

    A workload without spec.replicas has 1 (the apps/v1 default, applied before admission); a Scale
    without it has 0 (the field is `omitempty`)."""
    if not isinstance(obj, Mapping):
        return None
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return 0 if scale else None
    value = spec.get("replicas", 0 if scale else 1)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def scales_to_zero(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None, *, scale: bool) -> bool:
    """The update sets replicas to 0 from more than 0 (or from an old value it cannot read)."""
    after = replicas(new, scale=scale)
    if after != 0:
        return False
    before = replicas(old, scale=scale)
    return before is None or before > 0


__all__ = ["BOOKKEEPING_METADATA", "changes_content", "replicas", "scales_to_zero"]
