"""The controllers that delete things: Kubernetes' built-in ones and the operators' finalizers.

    namespace.py         NamespaceController: empties a Terminating namespace, per resource type,
                         through admission
    crdcleanup.py        CRDCleanupController: deletes a Terminating CRD's instances WITHOUT admission,
                         then lets it go
    garbagecollector.py  GarbageCollector: ownerReferences; deletes orphaned dependents through
                         admission; Foreground / Orphan propagation finalizers
    finalizers.py        FinalizerController: one operator; removes its finalizer from objects being
                         deleted, but only while its provider workload runs (a controller that is gone
                         leaves the finalizer forever: the stuck teardown the gate exists to prevent)
    manager.py           start_controllers: all of them on one store and engine
    workqueue.py         WorkQueue: client-go's rate-limited delaying queue
    base.py              what they share: how a call's outcome shows on the timeline

Every controller watches the store (`store.subscribe`), acts through the store's API calls, and
waits only through `engine.schedule` / `engine.now`; nothing sleeps. The same objects therefore run
in virtual time (tests, `criticalsvc simulate`) and in real time behind the HTTP stand-in.

Timings are Kubernetes' own (design/kubernetes-semantics.md §3, §5, §6): the namespace controller
starts 5 s after it sees a deletion [N4], requeues ~8 s while finalizers hold content and backs off
5 ms·2ⁿ up to 60 s on errors [N4]; the CRD cleanup polls every 5 s for a minute and backs off 5 ms·2ⁿ
up to 1000 s [C1][Q1]; so does the garbage collector [G1][Q1]. client-go's work queue is modelled by `WorkQueue`: one
pending run per key (the earliest wins) and a per-key failure count; the 10 qps token bucket that
client-go adds on top is left out (teardowns here stay far below 10 syncs per second).

Randomness (the Go map order of resource types, an operator's reconcile delay) comes from one
seeded `random.Random`, so a seed replays a run exactly.
"""
