"""May this ServiceAccount update that type? The question a SubjectAccessReview answers (pure).

Against a live cluster the API server answers it exactly (a SubjectAccessReview, criticalsvc/discover/read.py):
every authorizer, aggregated ClusterRoles already filled in. A snapshot has no API server, so its RBAC objects
answer instead, as the RBAC authorizer would
(https://github.com/kubernetes/kubernetes/blob/v1.37.2/plugin/pkg/auth/authorizer/rbac/rbac.go): a
ClusterRoleBinding grants its role everywhere, a RoleBinding only in its namespace; a rule matches when its
verbs, apiGroups and resources each contain the asked one or "*", and a rule limited to resourceNames does not
grant a question about the whole type. A ServiceAccount is also the user system:serviceaccount:NS:NAME and a
member of the groups system:serviceaccounts and system:serviceaccounts:NS.

Whoever may update objects of every type (cluster-admin) is no evidence for any one finalizer: `SUPERUSER_PROBE`
asks about a type that cannot exist, and an allowed answer marks the account as such.
"""

from __future__ import annotations

import attrs

from ..api import GroupResource
from .inventory import Inventory, PolicyRule, Subject

# A type no API server serves (the .invalid TLD is reserved, RFC 2606): only a wildcard grant allows it.
SUPERUSER_PROBE = GroupResource("discover.criticalsvc.invalid", "probes")


@attrs.frozen(order=True)
class AccessQuestion:
    """May ServiceAccount `account` (namespace, name) `verb` objects of `group_resource` in `namespace`
    ("": in every namespace, or a cluster-scoped type)?"""

    account: tuple[str, str]
    verb: str
    group_resource: GroupResource
    namespace: str = ""

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.account[0]}:{self.account[1]}"


@attrs.frozen
class AccessAnswer:
    allowed: bool | None  # None: no answer (the review failed)
    reason: str = ""


def _contains(values: tuple[str, ...], wanted: str) -> bool:
    return "*" in values or wanted in values


def _grants(rule: PolicyRule, verb: str, gr: GroupResource) -> bool:
    return (not rule.resource_names and _contains(rule.verbs, verb) and _contains(rule.api_groups, gr.group)
            and _contains(rule.resources, gr.resource))


def _is(subject: Subject, account: tuple[str, str]) -> bool:
    namespace, name = account
    if subject.kind == "ServiceAccount":
        return subject.namespace == namespace and subject.name == name
    if subject.kind == "User":
        return subject.name == f"system:serviceaccount:{namespace}:{name}"
    if subject.kind == "Group":
        return subject.name in ("system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                                "system:authenticated")
    return False


def review(question: AccessQuestion, inv: Inventory) -> AccessAnswer:
    """The snapshot's RBAC answer to `question` (see the module docstring); allowed None without RBAC objects."""
    if not inv.has_rbac:
        return AccessAnswer(None, "the snapshot holds no RBAC objects to answer from")
    roles = {(r.namespace, r.name): r for r in inv.roles}
    for b in sorted(inv.bindings, key=lambda b: (b.namespace, b.name)):
        if b.namespace and b.namespace != question.namespace:
            continue  # a RoleBinding grants only in its namespace
        if not any(_is(s, question.account) for s in b.subjects):
            continue
        role = roles.get(("" if b.role_kind == "ClusterRole" else b.namespace, b.role_name))
        if role is not None and any(_grants(r, question.verb, question.group_resource) for r in role.rules):
            kind = "RoleBinding" if b.namespace else "ClusterRoleBinding"
            where = f" {b.namespace}/" if b.namespace else " "
            return AccessAnswer(True, f"{kind}{where}{b.name} grants {b.role_kind} {b.role_name}")
    return AccessAnswer(False, "no binding grants it")
