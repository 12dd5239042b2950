"""The reference story on a live cluster: its objects, its finalizer controller, deleters, and an observer.

- `Story`: the reference story's manifests with every name made unique by a suffix, so scenarios
  never meet each other's leftovers on a shared control plane; the paths of its objects.
- `FinalizerController`: the provider's job, played by a thread. While the provider Deployment
  exists it removes the story's finalizer from every CR being deleted, as the real controller would
  while its pods run; once the Deployment is gone nothing removes it (the stuck teardown the gate
  prevents).
- `RepeatingDeleter`: a client that sends a DELETE for every object of the bundle, then re-sends the
  refused ones every `interval` until every object is gone: a person re-running `kubectl delete -f`,
  or a GitOps controller re-reconciling its prune. It is not the Open Cluster Management work agent,
  which makes one pass and leaves its refusals to the garbage collector: that is manifestwork.py.
- `Observer`: watches every object's collection and records the resourceVersion of each deletion;
  `order_violations()` lists each pair where a provider was deleted before something it protects.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import yaml

from .client import Client

ROOT = Path(__file__).resolve().parents[2]
STORY = ROOT / "api" / "examples" / "reference-story.yaml"
REPLAY_EXAMPLE = ROOT / "api" / "examples" / "replay.yaml"
FINALIZER = "my.crd.group/super-important"
# Names that a suffix makes unique (the CRD group is in the CRD's name and in the finalizer's).
_RENAMED = ("finalizer-namespace", "finalizer-deployment", "cool-apps", "my.crd.group")


def object_path(obj: dict[str, Any]) -> str:
    """The REST path of a manifest's object (every kind in the stories pluralizes with an `s`)."""
    api_version, kind = obj["apiVersion"], obj["kind"]
    base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
    namespace = obj["metadata"].get("namespace")
    middle = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{middle}/{kind.lower()}s/{obj['metadata']['name']}"


@attrs.frozen
class Story:
    suffix: str
    text: str

    @classmethod
    def make(cls, suffix: str) -> Story:
        text = STORY.read_text()
        for name in _RENAMED:
            text = text.replace(name, _rename(name, suffix))
        return cls(suffix, text)

    def name(self, original: str) -> str:
        return _rename(original, self.suffix)

    @property
    def objects(self) -> list[dict[str, Any]]:
        return [d for d in yaml.safe_load_all(self.text) if d]

    @property
    def group(self) -> str:
        return self.name("my.crd.group")

    @property
    def finalizer(self) -> str:
        return f"{self.group}/super-important"

    @property
    def crd_name(self) -> str:
        return f"coolresources.{self.group}"

    @property
    def namespace(self) -> str:
        return self.name("finalizer-namespace")

    @property
    def cr_namespace(self) -> str:
        return self.name("cool-apps")

    @property
    def deployment_path(self) -> str:
        return f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{self.name('finalizer-deployment')}"

    @property
    def critical_service(self) -> str:
        return self.name("for-finalizer-deployment")

    def paths(self) -> dict[str, str]:
        """kind/name -> REST path, for every object of the story."""
        return {f"{o['kind']}/{o['metadata']['name']}": object_path(o) for o in self.objects}

    def reader_role(self) -> str:
        """The aggregated ClusterRole a user adds so the gate may read the story's custom resources."""
        return yaml.safe_dump({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": f"criticalsvc-read-{self.group}",
                         "labels": {"criticalsvc.io/aggregate-to-reader": "true"}},
            "rules": [{"apiGroups": [self.group], "resources": ["coolresources"], "verbs": ["get", "list", "watch"]}],
        })

    def dependents(self) -> dict[str, list[str]]:
        """provider key -> keys of what must be gone first (the design's safe order)."""
        keys = list(self.paths())
        crs = [k for k in keys if k.startswith("CoolResource/")]
        crd = f"CustomResourceDefinition/{self.crd_name}"
        deployment = f"Deployment/{self.name('finalizer-deployment')}"
        namespace = f"Namespace/{self.namespace}"
        # The CriticalService goes after its provider and what that provider serves. It may go before
        # the provider's namespace when that namespace is not terminating yet (the gate's rule): the
        # namespace then protects nothing any more.
        return {deployment: [*crs, crd], namespace: [*crs, crd, deployment],
                f"CriticalService/{self.critical_service}": [*crs, crd, deployment]}


def _rename(name: str, suffix: str) -> str:
    if not suffix:
        return name  # the story as shipped
    if name == "my.crd.group":
        return f"my-{suffix}.crd.group"
    return f"{name}-{suffix}"


class FinalizerController(threading.Thread):
    """Removes `finalizer` from deleting CRs of `crs_path` while the Deployment at `deployment_path` exists: the
    reference story's controller, and the real projects' in tests/test_realcluster_discover.py (kwok's pods run no
    code)."""

    def __init__(self, client: Client, *, deployment_path: str, crs_path: str, finalizer: str,
                 interval: float = 0.2) -> None:
        super().__init__(daemon=True, name="finalizer-controller")
        self.client, self.deployment_path, self.crs_path = client, deployment_path, crs_path
        self.finalizer, self.interval = finalizer, interval
        self.stopping = threading.Event()
        self.removed: list[str] = []

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            try:
                if not self.client.exists(self.deployment_path):
                    continue  # no pods, no controller: nothing removes the finalizer now
                self.removed += remove_deleting_finalizers(self.client, self.crs_path, self.finalizer)
            except Exception:
                continue

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)


@contextlib.contextmanager
def story_finalizer_controller(client: Client, story: Story) -> Iterator[FinalizerController]:
    """The stand-in for the story's provider while the block runs: removes its finalizer from deleting CRs while
    the Deployment exists."""
    controller = FinalizerController(client, deployment_path=story.deployment_path,
                                     crs_path=f"/apis/{story.group}/v1/coolresources", finalizer=story.finalizer)
    controller.start()
    try:
        yield controller
    finally:
        controller.stop()


@attrs.define
class DeleteAttempt:
    key: str
    status: int
    message: str
    at: float


class RepeatingDeleter:
    """Deletes every path, re-sending refused DELETEs every `interval` s until all are gone, and going on
    through whatever else it meets (not the OCM work agent's one pass: see manifestwork.py):

    - a DELETE of a custom resource whose CRD is gone by then is answered 404 with a plain-text body
      ("404 page not found", not a Status): the object is gone;
    - a request that gets no answer (the API server restarting): the object stays pending; the error is
      kept in `errors`.
    """

    def __init__(self, client: Client, paths: dict[str, str], *, interval: float = 0.5,
                 propagation: str = "Background") -> None:
        self.client, self.paths, self.interval, self.propagation = client, paths, interval, propagation
        self.attempts: list[DeleteAttempt] = []
        self.errors: list[str] = []

    def run(self, *, timeout: float) -> bool:
        """True when everything is gone within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        pending = dict(self.paths)
        while pending and time.monotonic() < deadline:
            for key, path in list(pending.items()):
                try:
                    response = self.client.delete(path, body={"kind": "DeleteOptions", "apiVersion": "v1",
                                                              "propagationPolicy": self.propagation})
                    gone = response.status_code == 404 or not self.client.exists(path)
                except httpx.HTTPError as exc:
                    self.errors.append(f"{key}: {type(exc).__name__}: {exc}"[:300])
                    continue
                self.attempts.append(DeleteAttempt(key, response.status_code, _status_message(response),
                                                   time.monotonic()))
                if gone:
                    del pending[key]
            if pending:
                time.sleep(self.interval)
        return not pending

    def refused(self) -> list[DeleteAttempt]:
        return [a for a in self.attempts if a.status == 403]


class Observer(threading.Thread):
    """Watches the collection of every object from one resourceVersion on and records, per object, the
    resourceVersion at which it was first marked for deletion (`marked`: a deletionTimestamp, or its
    DELETED event) and the one at which it was deleted (`first_gone`: the DELETED event's object carries
    the revision of the deletion), and when (`gone_at`, monotonic seconds).

    A watch delivers every change in order, so two deletions between two looks cannot swap places unseen
    (a polling observer saw both gone in the same round and took that for "in order"). The resourceVersions
    of one API server's objects come from one sequence (etcd's revision for the real control plane, the
    store's counter for the stand-in), so they order the deletions of objects of different types too;
    Kubernetes calls them opaque, and nothing here does more than compare them. A watch that breaks resumes
    from the last resourceVersion seen. Where it cannot (410 Gone: a restarted API server's watch cache
    starts later), the collection is listed again and an object found missing was deleted somewhere in
    between: `gone_after` holds that lower bound (for a DELETED event it equals `first_gone`), `gaps` says
    where it happened, and `order_violations` reports a pair whose order the gap leaves unknown.

    `interval` is the pause before re-watching after a break; `rounds` counts the events handled.
    """

    def __init__(self, client: Client, paths: dict[str, str], *, interval: float = 0.1) -> None:
        super().__init__(daemon=True, name="observer")
        self.client, self.paths, self.interval = client, paths, interval
        self.marked: dict[str, int] = {}
        self.first_gone: dict[str, int] = {}
        self.gone_after: dict[str, int] = {}
        self.gone_at: dict[str, float] = {}
        self.gaps: list[str] = []
        self.rounds = 0
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._uids: dict[str, str] = {}
        self._collections: dict[str, dict[str, str]] = {}  # collection path -> name -> key
        for key, path in paths.items():
            collection, name = path.rsplit("/", 1)
            self._collections.setdefault(collection, {})[name] = key
        self._listed = threading.Barrier(len(self._collections) + 1)
        self._watchers = [threading.Thread(target=self._watch, args=(c, names), daemon=True, name=f"observe {c}")
                          for c, names in self._collections.items()]
        self._open: set[Any] = set()

    def start(self) -> None:
        """Start watching; returns once every collection has been listed (what happens after is seen)."""
        super().start()
        for watcher in self._watchers:
            watcher.start()
        try:
            self._listed.wait(timeout=60)
        except threading.BrokenBarrierError:
            self.stop()
            raise AssertionError(f"the observer could not list {sorted(self._collections)} within 60 s") from None

    def run(self) -> None:
        self.stopping.wait()

    def stop(self) -> None:
        self.stopping.set()
        with self._lock:
            responses = list(self._open)
        for response in responses:
            with contextlib.suppress(Exception):
                response.close()
        for watcher in self._watchers:
            watcher.join(10)
        if self.is_alive():
            self.join(10)

    # --- one collection -----------------------------------------------------------------------------
    def _done(self, names: dict[str, str]) -> bool:
        return all(k in self.first_gone for k in names.values())

    def _watch(self, collection: str, names: dict[str, str]) -> None:
        seen: int | None = None  # the last resourceVersion of this collection's stream handled
        resume = False  # whether the stream can resume from `seen` (else: list again)
        listed = False
        while not self.stopping.is_set():
            try:
                if not resume:
                    rv = self._list(collection, names, since=seen)
                    if not listed:
                        listed = True
                        with contextlib.suppress(threading.BrokenBarrierError):
                            self._listed.wait(timeout=60)
                    if rv is None:  # the type is no longer served (its CRD deleted)
                        self._unserved(collection, names, since=seen)
                        return
                    seen, resume = rv, True
                if self._done(names):
                    return
                seen, resume = self._follow(collection, names, seen)
            except (httpx.HTTPError, ValueError, KeyError):
                pass  # a broken stream or an unanswered list (an API server going away): resume
            if listed and self._done(names):
                return
            self.stopping.wait(self.interval)

    def _list(self, collection: str, names: dict[str, str], *, since: int | None) -> int | None:
        """List the collection; what is missing from it was deleted after `since` (before the first list:
        before the observation began). Returns the list's resourceVersion; None when the type is not served."""
        response = self.client.request("GET", collection)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        page = response.json()
        rv = int(page["metadata"]["resourceVersion"])
        present = {item["metadata"]["name"]: item for item in page.get("items") or []}
        missed = []
        for name, key in names.items():
            if name in present:
                self._event(key, "ADDED", present[name])
            elif key not in self.first_gone:
                missed.append(key)
                self._gone(key, rv, after=since if since is not None else 0)
        if since is not None and missed:
            with self._lock:
                self.gaps.append(f"{collection}: listed again at {rv} after {since}; {', '.join(sorted(missed))} "
                                 "went in between")
        return rv

    def _follow(self, collection: str, names: dict[str, str], rv: int) -> tuple[int, bool]:
        """Watch from `rv` until the stream ends: (the last resourceVersion handled, whether to resume from it)."""
        params = {"watch": "true", "resourceVersion": str(rv), "allowWatchBookmarks": "true",
                  "timeoutSeconds": "60"}
        with self.client.http.stream("GET", collection, params=params,
                                     timeout=httpx.Timeout(10.0, read=90.0)) as response:
            if response.status_code == 410:
                return rv, False
            if response.status_code == 404:
                return rv, False  # the next list says whether the type is gone
            response.raise_for_status()
            with self._lock:
                self._open.add(response)
            try:
                for line in response.iter_lines():
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        return rv, obj.get("code") != 410
                    key = names.get(obj["metadata"].get("name", ""))
                    if key is not None and kind in ("ADDED", "MODIFIED", "DELETED"):
                        self._event(key, kind, obj)
                    rv = int(obj["metadata"]["resourceVersion"])
                    if self._done(names):
                        break
            finally:
                with self._lock:
                    self._open.discard(response)
        return rv, True

    # --- what was seen --------------------------------------------------------------------------------
    def _event(self, key: str, kind: str, obj: dict[str, Any]) -> None:
        metadata = obj["metadata"]
        rv, uid = int(metadata["resourceVersion"]), str(metadata.get("uid") or "")
        with self._lock:
            self.rounds += 1
            if self._uids.setdefault(key, uid) != uid or key in self.first_gone:
                return  # another object of the same name, after the one observed was gone
            if kind == "DELETED" or metadata.get("deletionTimestamp"):
                self.marked.setdefault(key, rv)
        if kind == "DELETED":
            self._gone(key, rv)

    def _gone(self, key: str, rv: int, *, after: int | None = None) -> None:
        with self._lock:
            if key not in self.first_gone:
                self.marked.setdefault(key, rv)
                self.first_gone[key] = rv
                self.gone_after[key] = rv if after is None else after
                self.gone_at[key] = time.monotonic()

    def _unserved(self, collection: str, names: dict[str, str], *, since: int | None) -> None:
        """The type is gone (its CRD deleted): what was not seen going went some time after `since`."""
        missed = sorted(k for k in names.values() if k not in self.first_gone)
        for key in missed:
            self._gone(key, 1 << 62, after=since or 0)
        if missed:
            with self._lock:
                self.gaps.append(f"{collection}: no longer served; {', '.join(missed)} went after {since}")

    def order_violations(self, dependents: Mapping[str, Sequence[str]]) -> list[str]:
        """Each (provider, dependent) where the provider was deleted before the dependent, or while the dependent
        was never deleted; and each pair whose order a gap in the watches leaves unknown."""
        found = []
        for provider, needs in dependents.items():
            if provider not in self.first_gone:
                continue
            p_lo, p_hi = self.gone_after[provider], self.first_gone[provider]
            for dependent in needs:
                if dependent not in self.first_gone:
                    found.append(f"{provider} deleted at resourceVersion {p_hi}, {dependent} never")
                    continue
                d_lo, d_hi = self.gone_after[dependent], self.first_gone[dependent]
                if d_hi < p_lo:
                    continue  # surely first
                if p_hi < d_lo:
                    found.append(f"{provider} deleted at resourceVersion {p_hi}, {dependent} only later, at {d_hi}")
                else:
                    found.append(f"{provider} (deleted within resourceVersions {p_lo}..{p_hi}) and {dependent} "
                                 f"({d_lo}..{d_hi}): their order is not known (a gap in the watches: {self.gaps})")
        return found

    def order(self) -> list[str]:
        return sorted(self.first_gone, key=lambda k: self.first_gone[k])


def wait_for(check: Any, *, timeout: float, what: str, interval: float = 0.2,
             explain: Callable[[], str] | None = None) -> None:
    """Poll `check` until it holds; on timeout fail naming `what`, and what `explain` says of the cluster then."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            said = f"; {explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{said}")
        time.sleep(interval)


def remaining(client: Client, paths: Iterable[str]) -> str:
    """What of `paths` still exists, each with what may hold it: its deletionTimestamp, finalizers and (a namespace)
    the namespace controller's conditions."""
    said = []
    for path in paths:
        obj = client.get(path)
        if obj is None:
            continue
        md = obj.get("metadata") or {}
        held = [f"deleted at {md['deletionTimestamp']}" if md.get("deletionTimestamp") else "not deleted"]
        if md.get("finalizers"):
            held.append(f"finalizers {md['finalizers']}")
        held += [f"{c.get('type')}: {c.get('message')}" for c in (obj.get("status") or {}).get("conditions") or []
                 if isinstance(c, dict) and c.get("status") == "True" and path.startswith("/api/v1/namespaces/")
                 and path.count("/") == 4]
        said.append(f"{path} ({'; '.join(held)})")
    return "still there: " + ", ".join(said) if said else "nothing left"


def all_gone(client: Client, paths: Iterable[str]) -> bool:
    return not any(client.exists(p) for p in paths)


def apply_story(kubectl: Any, client: Client, story: Story, *, timeout: float = 60) -> None:
    """Apply the story as a user does (its reader role first; twice, as the CRs need their CRD), then
    wait until the gate protects its provider: a dry-run DELETE of the Deployment is refused."""
    for text in (story.reader_role(), story.text):
        done = kubectl("apply", "-f", "-", input=text)
        if done.returncode != 0 and text is not story.text:
            raise AssertionError(f"kubectl apply failed: {done.stderr}")
    done = kubectl("wait", "--for=condition=Established", f"crd/{story.crd_name}", "--timeout=60s")
    assert done.returncode == 0, done.stderr
    done = kubectl("apply", "-f", "-", input=story.text)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: client.delete(story.deployment_path, params={"dryRun": "All"}).status_code == 403,
             timeout=timeout, what=f"the gate to protect {story.deployment_path} (dry-run DELETE refused)")


class SharedFinalizerController(threading.Thread):
    """`FinalizerController` for many stories in one thread (when a thread per story would be too many).

    Each round serves every story in turn exactly as its own controller would: while the story's
    provider Deployment exists it removes the story's finalizer from its CRs being deleted. A story
    whose Deployment was seen gone is dropped for good (a Deployment does not come back in a teardown),
    so the rounds shrink as the teardowns progress.
    """

    def __init__(self, client: Client, stories: Sequence[Story], *, interval: float = 0.2) -> None:
        super().__init__(daemon=True, name="shared-finalizer-controller")
        self.client, self.interval = client, interval
        self.serving = {s.suffix: s for s in stories}
        self.stopping = threading.Event()
        self.removed: dict[str, list[str]] = {s.suffix: [] for s in stories}

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            for suffix, story in list(self.serving.items()):
                if self.stopping.is_set():
                    return
                try:
                    if not self.client.exists(story.deployment_path):
                        del self.serving[suffix]  # no pods, no controller: nothing removes the finalizer now
                        continue
                    crs_path = f"/apis/{story.group}/v1/coolresources"
                    self.removed[suffix] += remove_deleting_finalizers(self.client, crs_path, story.finalizer)
                except Exception:  # a controller keeps going through API errors
                    continue

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


def remove_deleting_finalizers(client: Client, crs_path: str, finalizer: str) -> list[str]:
    """One pass of a finalizer's controller: remove `finalizer` from every object of the collection `crs_path`
    (`/apis/GROUP/VERSION/RESOURCE`, namespaced or cluster-scoped) being deleted (a JSON patch guarded by the
    resourceVersion); the names of the objects released."""
    released = []
    for item in (client.get(crs_path) or {}).get("items", []):
        meta = item["metadata"]
        if meta.get("deletionTimestamp") and finalizer in (meta.get("finalizers") or []):
            kept = [f for f in meta["finalizers"] if f != finalizer]
            version_path, _, resource = crs_path.rpartition("/")
            where = f"/namespaces/{meta['namespace']}" if meta.get("namespace") else ""
            path = f"{version_path}{where}/{resource}/{meta['name']}"
            patch = [{"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
                     {"op": "replace", "path": "/metadata/finalizers", "value": kept}]
            if client.json_patch(path, patch).status_code == 200:
                released.append(meta["name"])
    return released


def _status_message(response: Any) -> str:
    """The message of an error answer: a Status' `message`, else the body's text ("404 page not found")."""
    if response.status_code < 400:
        return ""
    try:
        body = response.json()
    except ValueError:
        return str(response.text).strip()[:300]
    return str(body.get("message", "")) if isinstance(body, dict) else str(body)[:300]


def replay_grant() -> dict[str, Any]:
    """The operator's grant that lets the gate replay the reference story's refused deletions: the
    ClusterRole of api/examples/replay.yaml (aggregated into criticalsvc-replay), as a user applies it."""
    return next(d for d in yaml.safe_load_all(REPLAY_EXAMPLE.read_text()) if d and d["kind"] == "ClusterRole")
