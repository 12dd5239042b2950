"""`criticalsvc discover` and the diagnosis of what is stuck: what the cluster already depends on.

    inventory   the facts read from a snapshot or a live cluster, typed: webhook configurations, CRD
                conversions, APIServices, Services, EndpointSlices, pods and their owners, workloads,
                RBAC, namespaces, and the finalizers found on objects (pure)
    serving     a webhook's, a CRD conversion's or an APIService's Service -> the workload behind it
    finalizers  which finalizers are the cluster's own, and which workload may process the others
    rbac        a snapshot's RBAC as a SubjectAccessReview would answer it (live: the API server answers)
    propose     the CriticalServices that would protect all that, with evidence, grants and what was skipped
    render      those as YAML (a comment per CriticalService) or JSON, ready to review and apply
    diagnose    why an object or a namespace is stuck terminating, traced to what is at fault, and the way out
    read        the one module doing I/O: the live reads (metadata-only lists, SubjectAccessReviews)

Everything but `read` is pure: a snapshot and a live read produce the same Inventory and the same answer.
"""
