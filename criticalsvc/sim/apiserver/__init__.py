"""The API-server stand-in: the simulator's Store served over the Kubernetes REST API, shaped like
kube-apiserver's request path.

    server.py        hypercorn: `serve` (on the caller's loop), `ServerThread` (on its own thread)
    standin.py       StandIn: the ASGI app, its lifecycle, the writer thread and the store's lock
    dispatch.py      the request path: RequestInfo, then the handler for its verb
    requestinfo.py   a path parsed into verb, API group, version, namespace, resource, name, subresource
    reads.py         get, list          watch.py      watch streams and their fan-out
    writes.py        create, update, patch            deletes.py    delete, deletecollection
    subresources.py  status, scale, finalize          reviews.py    SelfSubject*Review (kubectl auth)
    strategy.py      defaulting, validation and what an update keeps (the registry strategies)
    admission.py     writes through the store's admission webhooks, and their warnings
    discovery.py     discovery documents (pure)       openapi.py    OpenAPI documents (pure)
    registry.py      what is served: types, subresources, verbs, the CRDs that describe them
    printing.py      Accept negotiation: Table (server-side printing), metadata-only lists
    selectors.py     label and field selectors        patches.py    merge, strategic merge, JSON patch
    bodies.py        request bodies (JSON, YAML, protobuf)   responses.py  JSON answers, Status, Warning headers

What real clients need, and only that (measured with kubectl 1.32 and the `kubernetes` Python client
37; design/kubernetes-semantics.md §12): `/version` (minor "32", so the Cloud SDK's kubectl
dispatcher runs its 1.32 binary), discovery (aggregated v2 when asked with `v=v2`, legacy otherwise;
CRD groups appear as the CRD is created and go when it is gone), `/openapi/v2` as an empty protobuf
document (client-side validation finds no schema and passes), `/openapi/v3` for CRD-backed group
versions (so `kubectl explain criticalservices` works; each kind declares server-side
`fieldValidation`, so kubectl does not validate against a partial schema), and the resource verbs:
get, list (label and field selectors), watch (resourceVersion, 410 Gone as an ERROR event,
bookmarks, timeoutSeconds), create, update, patch (merge, a minimal strategic merge, JSON patch),
delete (DeleteOptions: propagationPolicy, preconditions, dryRun), deletecollection, the `status`
subresource, `namespaces/{name}/finalize` and the `scale` subresource of Deployments, ReplicaSets and
StatefulSets (`kubectl scale`). Errors are metav1.Status objects carrying the store's code, reason and
message, so kubectl prints them the real way (`Error from server (Forbidden): ...`).

What kubectl ≥ 1.32 needs beyond that, checked against kube-apiserver 1.37 (tests/test_clusters_api.py):
* server-side printing: `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` on get, list and watch
  answers a meta.k8s.io Table (sim/tables.py: CRD printer columns, the built-in printers), so `kubectl
  get` prints the server's columns; a Table watch sends the column definitions with its first event only;
* request bodies in JSON, YAML or Kubernetes protobuf (sim/protobuf.py; client-go's typed clients send
  it: `kubectl create namespace|deployment|configmap|...`, `kubectl auth can-i`), a 415 naming what is
  not decoded otherwise (client-go falls back to JSON after a 415 for CBOR only);
* the create-only review APIs `kubectl auth can-i` (and `--list`) and `kubectl auth whoami` post: every
  review allows (there is no authorization here); discovery categories of built-ins (`kubectl get all`);
* custom resources get their structural schema's `default`s on every write, then are validated
  against it (sim/schema: OpenAPI and CEL rules, ratcheting on update, the status subresource against
  the status schema): 422 Invalid with the real server's field errors, before any webhook is called;
* `Warning` headers as the API server's warning recorder writes them: raw UTF-8 (a webhook's "…"
  included), deduplicated, cut to 256 runes each once they pass 4096 in total.
Store semantics (finalizers, admission, terminating namespaces and CRDs) live in sim/store.py; this
package translates HTTP to store calls and never re-implements them.

Use (what `criticalsvc serve --embedded` needs):

    store = Store(clock=time.time)
    store.create(crd_manifest)                                   # before serving: no lock needed yet
    store.webhooks.append(RegisteredWebhook(WebhookClient(url, ca_bundle=ca_pem)))  # or register_webhooks
    standin = StandIn(store, start_controllers=start_controllers)
    await serve(standin, host="127.0.0.1", port=0, on_ready=lambda url: write_kubeconfig(path, url))

`ServerThread(standin)` does the same on a thread of its own for synchronous callers and tests.

Simplifications (documented, not hidden): one served version per resource; `limit` is ignored and no
`continue` token is returned (allowed by the API); answers are JSON only (no protobuf, YAML or
PartialObjectMetadata forms: clients that ask for them also accept JSON); protobuf bodies are decoded
for the kinds kubectl's generators and the reviews send (sim/protobuf.py), others get 415; some built-in
printers are simplified or print NAME/AGE only (sim/tables.py); the Scale subresource of custom resources
is not served; field selectors accept any dotted path; watch selector transitions are computed
against what this watch has seen; a write waiting on a slow webhook holds up other writes (never
reads) for up to its timeoutSeconds; no authentication or authorization (the user is the
`Impersonate-User` header, else `kubernetes-admin`).
"""
