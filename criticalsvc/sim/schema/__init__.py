"""Custom-resource validation against the CRD's structural schema, worded as kube-apiserver words it.

    validation.py   validate(obj, schema, old), served_schema(crd, version): the entry point
    pruning.py      what the real server drops before it validates
    openapi.py      the OpenAPI schema validator, and the field errors made of its results
    cel.py          the x-kubernetes-validations rules
    ratcheting.py   old/new correlation: unchanged parts of an update do not fail
    defaulting.py   the schema's `default`s, applied to every write before validation
    fielderrors.py  FieldError, and invalid_status(): the 422 Invalid metav1.Status
    goformat.py     values printed as Go prints them      nodes.py  schema nodes and field paths

`validation.validate(obj, schema, old)` is a pure function: it returns the field errors the real API
server finds when an object of a CRD-served type is created (`old=None`), updated or patched (`old` =
the stored object: unchanged parts are *ratcheted*), or when its status subresource is written
(`status_only=True`). `fielderrors.invalid_status()` turns them into the 422 `Invalid` metav1.Status.
The API-server stand-in (sim/apiserver/strategy.py) defaults, then calls both before the admission
webhooks, as the real server's registry does (rest.BeforeCreate / BeforeUpdate run strategy
validation before the validating-admission callback).

What is modelled, and where upstream says so (paths in github.com/kubernetes/…; read at the master
commits of July 2026, the 1.37 line):

* The pipeline - apiextensions-apiserver pkg/registry/customresource/strategy.go (Validate,
  ValidateUpdate, hasBlockingErr), status_strategy.go (ValidateUpdate), validator.go
  (ValidateStatusUpdate validates `status` against the status schema with the field path `status`):
  OpenAPI schema errors first; then the x-kubernetes-validations CEL rules, unless a schema error is
  "blocking" (Unsupported value, Required value, Too long, Too many, or a type error), in which case
  the rules are skipped and one more error is added:
  `<nil>: Invalid value: null: some validation rules were not checked because the object was invalid;
  correct the existing errors to complete validation`.
* The OpenAPI part - kube-openapi pkg/validation/validate (schema.go: per node the type, allOf/anyOf/
  oneOf/not, string, format, number, slice, enum and object validators, in that order; object_validator.go,
  slice_validator.go, values.go, type.go) with the messages of pkg/validation/errors/schema.go
  (`spec.x in body should match '^…$'`, `spec.x in body must be of type string: "integer"`,
  `… should be greater than or equal to 0`, `… should have at least 1 items`,
  `… should have at least 2 properties`, `… should be at least 1 chars long`), turned into field
  errors by apiextensions-apiserver pkg/apiserver/validation/validation.go
  (kubeOpenAPIResultToFieldErrors): required -> `Required value`; enum -> `Unsupported value: "x":
  supported values: "a", "b"`; maxLength -> `Too long: may not be more than N bytes`; maxItems and
  maxProperties -> `Too many: N: must have at most M items`; a type error -> `Invalid value: "<JSON
  type>": <kube-openapi message>` (FieldValueTypeInvalid); anything else -> `Invalid value: <value>:
  <kube-openapi message>`.
* Pruning before validation - apiextensions-apiserver pkg/apiserver/customresource_handler.go
  (unstructuredSchemaCoercer.apply), schema/pruning/algorithm.go and schema/defaulting/prunenulls.go:
  fields the schema does not declare (without x-kubernetes-preserve-unknown-fields) and non-nullable
  nulls without a default are dropped before validation, so they are never errors (the stand-in
  stores the object unpruned; only the copy validated here is pruned).
* Ratcheting (CRDValidationRatcheting, on by default since 1.30) - apiextensions-apiserver
  pkg/apiserver/validation/ratcheting.go and apiserver pkg/cel/common/equality.go (CorrelatedObject):
  on an update an error is dropped when the nearest node that correlates with the old object (object
  properties by name; list-type=map items by their keys; nothing inside atomic or set lists) is
  unchanged.
* CEL rules - apiextensions-apiserver pkg/apiserver/schema/cel/validation.go (validateExpressions,
  fieldErrorForReason, ruleMessageOrDefault, evalMessageExpression): a false rule is reported at the
  node's path plus `fieldPath`, as `Invalid value: <detail>` for objects and lists (the value is
  omitted) or `Invalid value: "<scalar>": <detail>`; the detail is the trimmed messageExpression value
  when it evaluates to a non-empty one-line string, else `message`, else `failed rule: <rule>`;
  `reason` FieldValueForbidden / FieldValueRequired / FieldValueDuplicate give `Forbidden: …`,
  `Required value: …`, `Duplicate value…`. Map entries are addressed `spec.m[key]` there (kube-openapi
  says `spec.m.key`). Rules are evaluated with cel-python (`celpy`): a rule it cannot compile or whose
  function it does not know (the Kubernetes CEL libraries: isURL, quantity, lists, sets, optionals,
  ...) is skipped rather than guessed; runtime-error texts are translated for the common cases only.
* Field errors - apimachinery pkg/util/validation/field/errors.go (ErrorBody: strings `%q`, numbers
  and booleans `%v`, other values as JSON, `Too long`/`Required value`/`Forbidden` without a value),
  and pkg/api/errors/errors.go (NewInvalid): message `<Kind>.<group> "<name>" is invalid: <err>` or,
  for several distinct errors, `… is invalid: [<err1>, <err2>]` (apimachinery pkg/util/errors
  aggregate), details {name, group, kind, causes: [{reason, message, field}]} with one cause per
  error. kubectl rebuilds its `The CriticalService "x" is invalid: …` line from the causes.

Sources (master, July 2026; the 1.37 line):
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apimachinery/pkg/util/validation/field/errors.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apimachinery/pkg/api/errors/errors.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apimachinery/pkg/util/errors/errors.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/validation/validation.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/validation/ratcheting.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/validation/formats.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/validation.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning/algorithm.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting/prunenulls.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiextensions-apiserver/pkg/registry/customresource/strategy.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiextensions-apiserver/pkg/registry/customresource/status_strategy.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiextensions-apiserver/pkg/registry/customresource/validator.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiserver/pkg/cel/common/equality.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiserver/pkg/registry/rest/create.go
  https://github.com/kubernetes/kube-openapi/blob/master/pkg/validation/errors/schema.go
  https://github.com/kubernetes/kube-openapi/blob/master/pkg/validation/validate/schema.go (and type.go,
  validator.go, object_validator.go, slice_validator.go, schema_props.go, values.go)
  https://github.com/kubernetes/kube-openapi/blob/master/pkg/validation/strfmt/time.go (date-time)

Not modelled (documented, not hidden): sibling properties are checked in schema order and map entries
in the object's order, where the real server follows Go's randomised map order (so with several
errors the real order may differ); metadata (name format, generateName) and TypeMeta validation; the
formats other than date-time, date, byte, password and the uuid family; the list-type=map/set
uniqueness check; CEL cost budgets, `optionalOldSelf`, and the Kubernetes CEL extension libraries;
anyOf/oneOf error selection keeps the first failing branch rather than kube-openapi's best match.
"""
