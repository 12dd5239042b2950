"""Helm releases of the reference story on the real control plane: charts written from the story's manifests,
and the helm CLI (v3.22.0, built from its Go module: build.py `ensure_helm`) run as a user runs it.

- `write_chart`: a chart whose templates are the given objects as they are (the story's names are already
  unique), its custom resources behind `.Values.instances` (a CRD in templates/ is not there yet when
  `helm install` maps the release's objects, so a user installs the CRD first and the instances with an
  upgrade: `install`), and optionally CRDs in `crds/`, which Helm installs before the templates and never
  deletes (design/helm.md).
- `Helm`: the binary with a home of its own (Helm's config, cache and data, and `~/.kube/cache`, the
  discovery cache a second `helm uninstall` maps the release's objects with), against one kubeconfig and
  one release namespace; `Outcome` is what one command told its user.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs
import yaml

from . import build

JSON = dict[str, Any]
INSTANCES_VALUE = "instances"


def binary() -> Path | None:
    """The helm binary, built when missing; None (with `build.missing_toolchain()` saying why) when it cannot be."""
    found = build.cached_helm()
    if found is None and build.missing_toolchain() is None:
        found = build.ensure_helm()
    return found


def write_chart(directory: Path, name: str, objects: Iterable[JSON], *, crds: Iterable[JSON] = ()) -> Path:
    """A chart at `directory` holding `objects` in templates/ (custom resources of a CRD in this chart's
    templates only when `--set instances=true`) and `crds` in crds/."""
    objects, crds = list(objects), list(crds)
    served_here = {(c["spec"]["group"], c["spec"]["names"]["kind"]) for c in objects
                   if c["kind"] == "CustomResourceDefinition"}
    instances = [o for o in objects if (o["apiVersion"].split("/")[0], o["kind"]) in served_here]
    rest = [o for o in objects if o not in instances]
    templates = directory / "templates"
    templates.mkdir(parents=True)
    (directory / "Chart.yaml").write_text(yaml.safe_dump({"apiVersion": "v2", "name": name, "version": "0.1.0"}))
    (directory / "values.yaml").write_text(yaml.safe_dump({INSTANCES_VALUE: not instances}))
    (templates / "stack.yaml").write_text(yaml.safe_dump_all(rest))
    if instances:
        (templates / "instances.yaml").write_text(
            f"{{{{- if .Values.{INSTANCES_VALUE} }}}}\n{yaml.safe_dump_all(instances)}{{{{- end }}}}\n")
    if crds:
        (directory / "crds").mkdir()
        (directory / "crds" / "crds.yaml").write_text(yaml.safe_dump_all(crds))
    return directory


def needs_upgrade(chart: Path) -> bool:
    """Whether the chart's instances wait for its CRD (templates/instances.yaml): installed, then upgraded."""
    return (chart / "templates" / "instances.yaml").exists()


@attrs.frozen
class Outcome:
    """What one helm command told its user, and when it ran (monotonic seconds)."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    started: float
    ended: float

    @property
    def took(self) -> float:
        return self.ended - self.started

    def __str__(self) -> str:
        return f"helm {' '.join(self.args)}: exit {self.returncode} after {self.took:.1f} s\n{self.stderr.strip()}"


@attrs.frozen
class Helm:
    path: Path
    home: Path
    kubeconfig: Path
    namespace: str

    def run(self, *args: str, timeout: float = 180) -> Outcome:
        # Helm's own config, cache and data and the kube discovery cache under `home`, as on a user's machine;
        # no proxy between helm and a loopback API server.
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        env |= {"HOME": str(self.home), "KUBECONFIG": str(self.kubeconfig),
                "HELM_CONFIG_HOME": str(self.home / "helm" / "config"),
                "HELM_CACHE_HOME": str(self.home / "helm" / "cache"),
                "HELM_DATA_HOME": str(self.home / "helm" / "data")}
        env.pop("KUBECACHEDIR", None)
        argv = (*args, "--namespace", self.namespace)
        started = time.monotonic()
        done = subprocess.run([str(self.path), *argv], capture_output=True, text=True, env=env, timeout=timeout,
                              check=False)
        return Outcome(argv, done.returncode, done.stdout, done.stderr, started, time.monotonic())

    def install(self, release: str, chart: Path) -> None:
        """`helm install`, then, for a chart whose instances wait for its own CRD, `helm upgrade` with them."""
        staged = needs_upgrade(chart)
        done = self.run("install", release, str(chart), "--set", f"{INSTANCES_VALUE}={str(not staged).lower()}")
        assert done.returncode == 0, str(done)
        if staged:
            done = self.run("upgrade", release, str(chart), "--set", f"{INSTANCES_VALUE}=true")
            assert done.returncode == 0, str(done)

    def releases(self) -> dict[str, str]:
        """`helm list -a`: release name -> its status (deployed, uninstalling, ...)."""
        done = self.run("list", "-a", "-o", "json")
        assert done.returncode == 0, str(done)
        return {r["name"]: r["status"] for r in json.loads(done.stdout or "[]")}

    def status(self, release: str) -> JSON:
        """`helm status` as JSON: `info.status`, `info.description`; {} when there is no such release."""
        done = self.run("status", release, "-o", "json")
        return dict(json.loads(done.stdout)) if done.returncode == 0 else {}
