"""One-line mutants of the safety checks, and the tests that must catch each (`nox -s mutants`).

Each mutant is a change someone could make by mistake that leaves the code running but unsafe: a
re-created object replayed, a fail-open condition, an unreadable replica count let through. For each,
the script applies the change to a copy of the checkout (the working tree is never touched), runs the
tests named for it there (never the realcluster ones: the default suite without a control plane must
catch every one), and puts the file back. A mutant "survives" when those tests still pass; the script
then exits 1.

    python -m tests.mutants            # all of them (a few minutes on 2 cores)
    python -m tests.mutants --list
    python -m tests.mutants replayer-no-precondition replay-settled-uid

Not part of the default CI run: it runs the named tests once per mutant.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parent.parent


@attrs.frozen
class Mutant:
    name: str
    path: str
    old: str  # must occur exactly once in `path`
    new: str
    tests: tuple[str, ...]  # pytest node ids (files or tests) that must fail with the mutant applied


REPLAY_TESTS = ("tests/test_replay_safety.py",)
REPLAYER_TESTS = ("tests/test_replayer.py",)
ROUTER_TESTS = ("tests/test_webhookrouter.py",)
VERIFY = "tests/test_verify.py"
ENFORCEMENT = ("tests/test_verify_enforcement.py::"
               "test_no_interleaving_of_the_leaders_steps_admits_a_protected_delete_on_a_lagging_api_server")
CAUGHT_UP = "tests/test_caughtup.py"

MUTANTS: tuple[Mutant, ...] = (
    Mutant("replay-settled-uid", "criticalsvc/replay.py",
           "    if obj.uid and obj.uid != intent.uid:\n", "    if False:\n", REPLAY_TESTS),
    Mutant("replay-settled-terminating", "criticalsvc/replay.py",
           "    if obj.terminating:\n        return Drop(", "    if False:\n        return Drop(", REPLAY_TESTS),
    Mutant("replay-going-away-namespace", "criticalsvc/replay.py",
           "(namespace.terminating or bool(namespace.uid and namespace.uid in armed))",
           "(bool(namespace.uid and namespace.uid in armed))", REPLAY_TESTS),
    Mutant("replay-plan-protected", "criticalsvc/replay.py",
           "        if decision.rule == Rule.DELETION_PROTECTED:\n", "        if False:\n", REPLAY_TESTS),
    Mutant("replay-intent-for-all", "criticalsvc/replay.py",
           "    if any(services.get(name) is None or services[name].replay_deletion",
           "    if all(services.get(name) is None or services[name].replay_deletion", REPLAY_TESTS),
    Mutant("replayer-no-precondition", "criticalsvc/replayer.py",
           '"kind": "DeleteOptions", "preconditions": {"uid": intent.uid}}', '"kind": "DeleteOptions"}',
           REPLAYER_TESTS),
    Mutant("replayer-no-fresh-uid", "criticalsvc/replayer.py",
           '        if metadata.get("uid") != intent.uid:\n', "        if False:\n", REPLAYER_TESTS),
    Mutant("replayer-no-never", "criticalsvc/replayer.py",
           "        if (metadata.get(\"annotations\") or {}).get(REPLAY_DELETION_ANNOTATION) == replay.NEVER:\n",
           "        if False:\n", REPLAYER_TESTS),
    Mutant("replayer-409-retried", "criticalsvc/replayer.py",
           "            if exc.code == 409:\n", "            if False:\n", REPLAYER_TESTS),
    Mutant("replayer-403-retried", "criticalsvc/replayer.py",
           '            if exc.code == 403 and "admission webhook" not in exc.message:\n',
           "            if False:\n", REPLAYER_TESTS),
    Mutant("replayer-403-webhook-dropped", "criticalsvc/replayer.py",
           '            if exc.code == 403 and "admission webhook" not in exc.message:\n',
           "            if exc.code == 403:\n", REPLAYER_TESTS),
    Mutant("condition-fail-open", "criticalsvc/condition.py",
           "        result = exc\n    except Exception as exc:\n"
           "        return _error_text(str(exc) or type(exc).__name__)\n",
           "        result = exc\n    except Exception as exc:\n        return False\n",
           ("tests/test_condition.py",)),
    Mutant("updates-unreadable-before", "criticalsvc/updates.py",
           "    return before is None or before > 0\n", "    return before is not None and before > 0\n",
           ("tests/test_updates.py",)),
    Mutant("router-409-not-retried", "criticalsvc/webhookrouter.py",
           "RETRY)\n            self.metrics.webhook_route_syncs", "RETRY)\n            conflict = False\n"
           "            self.metrics.webhook_route_syncs", ROUTER_TESTS),
    Mutant("router-event-every-round", "criticalsvc/webhookrouter.py",
           "        if error == self._reported:\n            return\n", "", ROUTER_TESTS),
    Mutant("router-created-without-routes", "criticalsvc/webhookrouter.py",
           "            if stored[shard] is None and not parts[shard]:\n", "            if False:\n", ROUTER_TESTS),
    Mutant("graph-no-provider-crd-edge", "criticalsvc/graph.py",
           "    if gr.group and gr != CRITICAL_SERVICES:\n", "    if False:\n",
           ("tests/test_graph.py", f"{VERIFY}::test_the_crd_cycle_bundle_is_refused_at_create_naming_the_crd_edge")),
    Mutant("graph-no-critical-service-crd-edge", "criticalsvc/graph.py",
           "    out.append((_crd(CRITICAL_SERVICES, state),", "    out.append((KubeObject(CRDS, '', ''),",
           ("tests/test_graph.py",)),
    Mutant("graph-no-namespace-step", "criticalsvc/graph.py",
           "        if not ns or nsorder.confined(b):\n", "        if True:\n",
           (f"{VERIFY}::test_the_namespace_content_cycle_is_admitted_with_a_warning_naming_the_namespace_step",)),
    # The cycle check looks a named criterion up by its object's name (graph.ServiceEdges): not indexed, no edge.
    Mutant("graph-named-criterion-unindexed", "criticalsvc/graph.py",
           'self.named[gr, criterion.target.namespace or "", criterion.target.name].append(entry)\n',
           "pass\n", ("tests/test_graph.py",)),
    # Issue 34: CREATE -> Enforcing follows the cache event; polling again makes it wait for the next POLL.
    Mutant("router-polls-not-event-driven", "criticalsvc/webhookrouter.py",
           "                    await wait_event(POLL)\n", "                    await self.sleep(POLL)\n",
           ROUTER_TESTS),
    # Issue 34: a pending Ready follows the cache event that stores its label; without it, the next interval.
    Mutant("status-pending-waits-for-interval", "criticalsvc/statuswriter.py",
           "wait_event(timeout)) \\\n            if callable(wait_event) and self._pending else None",
           "wait_event(timeout)) \\\n            if False else None",
           ("tests/test_statuswriter.py",)),
    # The labeller keeps last round's labels lacking only while no labelled type was written: a label taken off
    # by hand is put back.
    Mutant("labeller-reuses-stale-adds", "criticalsvc/labeller.py",
           "adds = self._wanted[1] if self._wanted[2] == labelled else", "adds = self._wanted[1] if True else",
           ("tests/test_protection_labels.py", "tests/test_webhookrouter.py")),
    # The state keeps an object a write left equal, and counts no write; one with a new label is stored and counted.
    Mutant("state-keeps-a-changed-object", "criticalsvc/state.py",
           "        if store.objects.get(key) == obj:\n", "        if store.objects.get(key) is not None:\n",
           ("tests/test_state.py",)),
    Mutant("state-keeps-a-relabelled-critical-service", "criticalsvc/state.py",
           "        if old is not None and old == cs and old.labels == cs.labels:\n",
           "        if old is not None and old == cs:\n", ("tests/test_state.py",)),
    # Its round is skipped only while no provider's labels were written where it read them.
    Mutant("router-inputs-ignore-provider-labels", "criticalsvc/webhookrouter.py",
           "                tuple(writes(gr, ns) for gr, ns in self._stamped),\n", "                (),\n",
           ("tests/test_webhookrouter.py",)),
    # The router hands the last Desired back only while every CriticalService's routes are those of then.
    Mutant("router-reuses-a-changed-desired", "criticalsvc/webhookrouter.py",
           "        if same and len(kept) == len(self._routes) and self._wanted is not None",
           "        if len(kept) == len(self._routes) and self._wanted is not None", ("tests/test_webhookrouter.py",)),
    # ... and skips a round only while nothing was written where it reads the providers: a new member is labelled.
    Mutant("labeller-skip-ignores-providers", "criticalsvc/labeller.py",
           "                tuple(writes(gr, ns) for gr, ns in self._stamped),\n", "                (),\n",
           ("tests/test_protection_labels.py",)),
    # ... and its union only while every CriticalService protects what it did: a provider created is labelled.
    Mutant("labeller-reuses-a-changed-union", "criticalsvc/labeller.py",
           "same = same and known is not None and known[2] == protected and known[0].uid == cs.uid",
           "same = same and known is not None", ("tests/test_protection_labels.py",)),
    # ... and a status pass computes only the statuses whose inputs changed; computing none misses the label stored.
    Mutant("status-key-ignores-writes", "criticalsvc/statuswriter.py",
           "                shared[gr, ns] = writes(gr, ns)\n",
           "                shared[gr, ns] = 0\n", ("tests/test_statuswriter.py",)),
    # ... and skips a whole pass only while nothing was written where the statuses read.
    Mutant("status-pass-skip-ignores-reads", "criticalsvc/statuswriter.py",
           "                tuple((writes(gr, ns), _readable(state, gr)) for gr, ns in self._pairs))\n",
           "                ())\n", ("tests/test_statuswriter.py",)),
    # ... and takes a key as standing, unworked, only when nothing it reads moved: not its types' writes, ...
    Mutant("status-shortcut-ignores-stamps", "criticalsvc/statuswriter.py",
           "        if stamps != base[3]:\n",
           "        if False:\n", ("tests/test_statuswriter.py",)),
    # ... not its routes going out of the live set, ...
    Mutant("status-shortcut-ignores-fewer-live", "criticalsvc/statuswriter.py",
           "            more = grown[id(then)] = then.live <= facts.live and then.written <= facts.written\n",
           "            more = grown[id(then)] = True\n", ("tests/test_statuswriter.py",)),
    # ... nor a type learnt (a name resolving otherwise).
    Mutant("status-shortcut-ignores-mapper", "criticalsvc/statuswriter.py",
           "        world = (generation, shared[\"labels\"],", "        world = (0, shared[\"labels\"],",
           ("tests/test_statuswriter.py",)),
    # A shard's namespaceSelector names every namespace its routes are in: one left out, its routes route nothing.
    Mutant("route-namespace-selector-short", "criticalsvc/webhookconfigurations.py",
           'else sorted(n for n in namespaces if n)\n', 'else sorted(n for n in namespaces if n)[:1]\n',
           ("tests/test_routing.py",)),
    # One-key selectors are one list lookup per key, by namespace/value: a wrong namespace there routes nothing.
    Mutant("route-one-key-selector-namespace", "criticalsvc/webhookconfigurations.py",
           'scoped.update(f"{r.namespace}/{v}" for v in requirement.values)',
           'scoped.update(f"{v}/{v}" for v in requirement.values)', ("tests/test_routing.py",)),
    # An event during a labelling round is not lost: without the count compared, the next round waits for IDLE.
    # What a CriticalService protects kept after its provider (or a member) appeared: never labelled.
    Mutant("labeller-memo-ignores-writes", "criticalsvc/labeller.py",
           "stamp is not None and known[1] == stamp and", "stamp is not None and",
           ("tests/test_protection_labels.py",)),
    Mutant("labeller-event-during-round-lost", "criticalsvc/labeller.py",
           'isinstance(seen, int) and getattr(self.source, "changes", None) != seen:', "False:",
           ("tests/test_protection_labels.py",)),
    # A CriticalService event that names a type not watched yet must reconcile the watches; skipped, it is never read.
    Mutant("watchset-reconcile-skipped", "criticalsvc/cache/watchset.py",
           "        self._reconcile_skipped = not self._changes_watches(old, cs)\n",
           "        self._reconcile_skipped = True\n", ("tests/test_cache.py",)),
    Mutant("router-no-resync", "criticalsvc/webhookrouter.py",
           "self._next_sync = parts, started + RESYNC", "self._next_sync = parts, float('inf')",
           ROUTER_TESTS),
    # A probe answered from an older configuration counts the newest routes live (Enforcing before routed).
    Mutant("router-older-digest-counts-all-live", "criticalsvc/webhookrouter.py",
           "        live = seen & written\n", "        live = written\n", ROUTER_TESTS),
    # The pause after a round paced on its length (a second, as a probe's backoff takes): the next CriticalService
    # waits it out.
    Mutant("router-paced-on-round-length", "criticalsvc/webhookrouter.py",
           "await self.sleep(max(MIN_PAUSE, self.busy))", "await self.sleep(max(MIN_PAUSE, 1.0))", ROUTER_TESTS),
    # The routes remembered per CriticalService reused after a label was stored or removed where they look.
    Mutant("router-memo-ignores-labels", "criticalsvc/webhookrouter.py",
           "(known.type is t or known.type == t) and known.stamp == stamp:", "(known.type is t or known.type == t):",
           ROUTER_TESTS),
    # Shard 0 (the one configuration of earlier versions) written with the others, not after them: an API server
    # could hold it narrowed before the shard that now holds the routes it dropped.
    Mutant("router-shard-0-not-last", "criticalsvc/webhookrouter.py",
           "        outcomes = list(await asyncio.gather(*(write(*w) for w in writes if w[0] != 0)))\n"
           "        outcomes += [await write(*w) for w in writes if w[0] == 0]\n",
           "        outcomes = [await write(*w) for w in writes]\n", ROUTER_TESTS),
    # The protection label removable while protected (the DELETE would then reach no webhook).
    Mutant("protection-label-removable", "criticalsvc/decision.py",
           "    if not keeping:\n        return None\n", "    if True:\n        return None\n",
           ("tests/test_protection_labels.py", ENFORCEMENT)),
    # A route by name dropped for an object that only exists, not labelled (and Ready says Enforcing then).
    Mutant("route-dropped-for-unlabelled", "criticalsvc/protectionlabels.py",
           "    return obj is not None and all(obj.labels.get(key) == LABEL_VALUE for key in labels)\n",
           "    return obj is not None\n", ("tests/test_protection_labels.py", ENFORCEMENT)),
    # Ready=Enforcing claimed before the label is stored, on the strength of a route by name one API server was seen
    # holding: another API server, lagging, admits the DELETE (the explorer's lagging API server finds it).
    Mutant("ready-before-label-stored", "criticalsvc/status.py",
           "    pending = [ref for ref in missing if ref not in label_errors] if routing.labelled else []\n",
           "    pending = []\n", (ENFORCEMENT,)),
    # Never an ALLOW from a stale cache: the fresh reads, the Finalizer catch-up, and (below) the confirmation on
    # the cache caught up to one consistent read.
    Mutant("live-protected-allow-unconfirmed", "criticalsvc/live.py",
           "        if decision.protected or decision.rule in (Rule.CRITERIA_MET, Rule.WARN_ONLY):\n",
           "        if False:\n",
           ("tests/test_live.py::test_a_stale_cache_allow_becomes_a_deny_after_confirmation",)),
    # The fresh read of the CriticalServices that may protect an object: those of its namespace and those naming
    # none (a selector over every namespace, a cluster-scoped provider). Without the second, a CriticalService
    # selecting across namespaces, created a moment ago, is missed and the stale cache's ALLOW stands.
    Mutant("live-services-in-namespace-only", "criticalsvc/live.py",
           '        services: list[CriticalService] = list(self._answer(("services-in", "", group), []))\n',
           "        services: list[CriticalService] = []\n",
           ("tests/test_live.py::test_the_criticalservices_read_fresh_are_those_of_the_namespace_and_those_naming_none",)),
    Mutant("catchup-mirror-trusted", "criticalsvc/cache/catchup.py",
           "    if compare_resource_versions(reached, target) >= 0:\n        return CaughtUp(",
           "    if True:\n        return CaughtUp(", ("tests/test_catchup.py",)),
    Mutant("caughtup-no-probe", "criticalsvc/cache/current.py",
           "    if compare_resource_versions(start, target) >= 0:\n", "    if True:\n", (CAUGHT_UP,)),
    Mutant("caughtup-floor-not-waited-for", "criticalsvc/cache/current.py",
           "        if proof.holds(now):\n", "        if True:\n", (CAUGHT_UP,)),
    Mutant("caughtup-floor-forgotten", "criticalsvc/cache/current.py",
           "    proof = Current(gr, target, floor, watches)\n", "    proof = Current(gr, target, start, watches)\n",
           (f"{CAUGHT_UP}::test_a_cache_relisted_below_what_the_probe_saw_is_waited_for",)),
    Mutant("caughtup-410-as-current", "criticalsvc/cache/current.py",
           "            if exc.gone:\n                raise expired from exc\n",
           "            if exc.gone:\n                return Current(gr, target, floor, watches)\n",
           (f"{CAUGHT_UP}::test_an_expired_version_falls_back_to_the_fresh_reads",)),
    Mutant("caughtup-one-round", "criticalsvc/caughtup.py",
           "            if not stale:  # checked", "            if not stale or round_ > 1:  # checked",
           (f"{CAUGHT_UP}::test_a_service_written_after_the_consistent_read_gets_its_types_proven",)),
    Mutant("caughtup-version-reused", "criticalsvc/caughtup.py",
           "        target = await fresh_version(self.transport, services, deadline)\n",
           "        self.target = target = getattr(self, 'target', None) or await fresh_version(self.transport, "
           "services, deadline)\n",
           (f"{CAUGHT_UP}::test_each_confirmation_reads_its_own_version",)),
    Mutant("caughtup-one-etcd-assumed", "criticalsvc/caughtup.py",
           "        if self.shares_target(gr) and compare_resource_versions(exact, target) >= 0:\n",
           "        if compare_resource_versions(exact, target) >= 0:\n",
           (f"{CAUGHT_UP}::test_a_type_in_another_etcd_is_caught_up_to_a_version_of_its_own",)),
    Mutant("caughtup-lagging-type-not-woken", "criticalsvc/caughtup.py",
           "        own = await fresh_version(self.transport, resource, deadline)\n", "        own = target\n",
           (f"{CAUGHT_UP}::test_a_cache_behind_only_by_version_is_confirmed_on_a_bookmark",)),
    Mutant("caughtup-successor-read", "criticalsvc/cache/watchset.py",
           "        if reflector is None or gr in self.successors or not reflector.watching:\n",
           "        if reflector is None or not reflector.watching:\n",
           (f"{CAUGHT_UP}::test_a_cache_listing_beside_its_watch_falls_back_to_the_fresh_reads",)),
    # discover: an account that may update every type is no evidence of which controller processes a finalizer.
    Mutant("discover-superuser-as-evidence", "criticalsvc/discover/propose.py",
           "(superusers if probe is not None and probe.allowed else allowed).append((w, answer))",
           "allowed.append((w, answer))", ("tests/test_discover.py",)),
    # Covered must name what the criteria miss, not call everything covered.
    Mutant("coverage-all-covered", "criticalsvc/discover/coverage.py",
           "return [s for s in served if not any(covers(c, s.criterion, resolve) for c in cs.criteria)]",
           "return []", ("tests/test_coverage.py",)),
)


def copy_checkout(into: Path) -> Path:
    """The checkout's files (tracked and untracked, not ignored) under `into`. Run from there, Python and
    pytest import the copy's criticalsvc: the editable install's finder comes after sys.path."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


def run(mutant: Mutant, root: Path, *, verbose: bool) -> str:
    """'caught', 'SURVIVED' or 'error: ...'; the file is put back whatever happens."""
    path = root / mutant.path
    original = path.read_text()
    if original.count(mutant.old) != 1:
        return f"error: the text to change occurs {original.count(mutant.old)} times in {mutant.path}"
    try:
        path.write_text(original.replace(mutant.old, mutant.new))
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                               "-m", "not realcluster", *mutant.tests], cwd=root, capture_output=not verbose,
                              text=True, check=False)
    finally:
        path.write_text(original)
    return {0: "SURVIVED", 1: "caught"}.get(done.returncode, f"error: pytest exited {done.returncode}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("-v", "--verbose", action="store_true", help="show pytest's output")
    args = parser.parse_args(argv)
    known = {m.name: m for m in MUTANTS}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        parser.error(f"unknown mutant(s): {', '.join(unknown)} (see --list)")
    chosen = [known[n] for n in args.names] if args.names else list(MUTANTS)
    if args.list:
        for m in chosen:
            print(f"{m.name:32} {m.path:28} {' '.join(m.tests)}")
        return 0
    failed = 0
    with tempfile.TemporaryDirectory(prefix="criticalsvc-mutants-") as tmp:
        root = copy_checkout(Path(tmp))
        for m in chosen:
            start = time.monotonic()
            outcome = run(m, root, verbose=args.verbose)
            failed += outcome != "caught"
            print(f"{m.name:32} {outcome:10} {time.monotonic() - start:6.1f} s  {' '.join(m.tests)}", flush=True)
    print(f"{len(chosen) - failed}/{len(chosen)} caught")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
