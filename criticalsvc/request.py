"""The request the rules decide on: what an AdmissionReview request says about one call, decoded.

The rules (criticalsvc/decision.py, criticalsvc/replay.py) take this model; the AdmissionReview wire format
(criticalsvc/admission.py) parses into it and renders from it, and renders their Decision. Imports run
wire -> rules -> request, never back (the `pure-core-one-way` contract in .importlinter).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from .api import NAMESPACES, GroupResource, ObjectRef


@attrs.frozen
class AdmissionRequest:
    """The parts of an AdmissionReview request the rules read: what parse_review decodes and render_review
    encodes."""

    uid: str
    group_resource: GroupResource
    operation: str
    name: str
    namespace: str
    object: Mapping[str, Any] | None = None
    old_object: Mapping[str, Any] | None = None
    sub_resource: str = ""
    kind: str = ""
    dry_run: bool = False
    username: str = ""
    # DELETE only: options.propagationPolicy as sent (None: the type's default); a replay re-uses it.
    propagation_policy: str | None = None

    @property
    def ref(self) -> ObjectRef:
        # For a Namespace the request's `namespace` is its own name; the object is cluster-scoped.
        namespace = "" if self.group_resource == NAMESPACES else self.namespace
        return ObjectRef(self.group_resource, namespace, self.name)
