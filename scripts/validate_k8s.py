#!/usr/bin/env python3
"""Offline checks of the manifests under k8s/, run by scripts/validate-k8s.sh (which
installs kubernetes-validate and promql-parser into a venv first).

Usage: validate_k8s.py "<kubernetes versions>" <manifest root>

- Every kustomization.yaml (Kustomization or Component): known fields, every resource,
  component and patch file it names exists; every other .yaml file is named by one (else
  nothing would validate it).
- Each Kustomization is built with `kubectl kustomize` (kustomize is built into kubectl;
  `kustomize build` if only that is installed) and every built resource is checked as below,
  so the component under components/ is checked as applied (existing-deployment/).
- Built-in kinds: kubernetes-validate's strict JSON schemas (unknown fields and wrong types
  fail) for each Kubernetes version in K8S_VERSIONS, plus 1.27 and 1.28 for plain-sidecar/
  (clusters without native sidecars). An unknown kind or apiVersion fails too (the
  kubernetes-validate CLI only warns about those, so this calls its validate() directly).
- Prometheus Operator kinds (no schema shipped): field names checked, every PromQL
  expression parsed (promql-parser), every snowlease_* metric name checked against the
  metrics the sidecar exports.
- snowlease containers (args start with a snowlease subcommand) harden themselves, not via
  the pod: non-root numeric UID, read-only root filesystem, no privilege escalation, all
  capabilities dropped, seccomp RuntimeDefault. App containers are the user's own.
- The worker container: probes on /readyz and /livez; in initContainers a native sidecar
  (restartPolicy: Always) whose startupProbe gates the app; its port named `snowlease` and
  the pod's prometheus.io/port are the port it listens on (--listen / SNOWLEASE_LISTEN, else
  DEFAULT_LISTEN read from src/); only env vars snowlease reads (read from src/). The
  Dockerfile's EXPOSE is the default port.
- A container started by `snowlease exec`: `--` in its command with the app's command
  after it, the snowlease volume mounted.
- A worker with `--mint-socket` (mint mode): the socket's folder is a volume the sidecar
  mounts writable and the first app container mounts at the same path; the app can connect
  (mode 0660: the pod's fsGroup, or the sidecar's group among the app's); no `snowlease
  exec` in that pod (it refuses mint mode, exit 5). An overlay using a component keeps the base
  Deployment's pod securityContext and each app container's securityContext, image, env,
  ports and args, and its command is the exec wrapper followed by the base's command.
- The component on ordinary kustomizations, built from overlays written under target/: of
  two Deployments only the annotated one changes, a StatefulSet and a Java Deployment keep
  their command and args, the app name is each workload's annotation; a wrapped container
  without `command` fails the build. Likewise the mint component (components/snowlease-mint/):
  the sidecar alone, its group the pod's fsGroup, the socket's volume mounted read-only into
  the app, whose command is left alone; a pod without fsGroup fails the build.
- A NetworkPolicy beside a workload with a snowlease sidecar selects its pods and admits the
  sidecar's port only from chosen peers, never from everywhere; k8s/ itself ships one.
- The guard-open Job opens the guard of the app k8s/deployment.yaml runs (same SNOWLEASE_APP);
  docs/kubernetes.md's deploy step 1 lists every kustomization that sets the image.
- Self-test: broken copies (one per rule) must each be rejected for their reason.
"""
import copy
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

import promql_parser
import yaml
from kubernetes_validate import utils

VERSIONS = sys.argv[1].split()
ROOT = sys.argv[2]

# What the sidecar exports (src/worker_id/metrics.rs, build_info in src/http.rs); counters
# carry _total. A unit test there (known_metrics_of_the_k8s_check_are_the_exported_ones)
# compares this set with what the sidecar registers.
KNOWN_METRICS = {
    "snowlease_build_info",
    "snowlease_lease_held",
    "snowlease_worker_id",
    "snowlease_worker_ids",
    "snowlease_worker_id_range_overlaps",
    "snowlease_renewals_total",
    "snowlease_leases_lost_total",
    "snowlease_reacquisitions_total",
    "snowlease_claim_attempts_total",
    "snowlease_claim_guard_opens_timestamp_seconds",
    "snowlease_clock_skew_seconds",
    "snowlease_ids_minted_total",
    "snowlease_mint_unavailable_total",
    "snowlease_mint_mark_lead_seconds",
    "snowlease_mint_sequence_waits_total",
}
RULE_KEYS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
GROUP_KEYS = {"name", "interval", "rules", "limit", "query_offset", "labels"}
PODMONITOR_KEYS = {"selector", "namespaceSelector", "podTargetLabels", "podMetricsEndpoints",
                   "jobLabel", "sampleLimit"}
ENDPOINT_KEYS = {"port", "path", "interval", "scrapeTimeout", "scheme", "relabelings",
                 "metricRelabelings"}
KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources", "images", "labels", "namespace",
                      "namePrefix", "nameSuffix", "patches", "components", "replicas",
                      "configMapGenerator", "secretGenerator", "replacements"}
KUSTOMIZE_KINDS = {("kustomize.config.k8s.io/v1beta1", "Kustomization"),
                   ("kustomize.config.k8s.io/v1alpha1", "Component")}
DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def default_listen_port():
    """The port of the worker's default --listen, read from the one constant in src/."""
    found = []
    for path in glob.glob(os.path.join(SRC, "**", "*.rs"), recursive=True):
        with open(path) as f:
            found += re.findall(r'const DEFAULT_LISTEN: &str = "[^"]*:([0-9]+)";', f.read())
    if len(found) != 1:
        sys.exit(f"validate-k8s: expected one DEFAULT_LISTEN constant in src/, found {found}")
    return int(found[0])


DEFAULT_PORT = default_listen_port()


def pool_serve_port():
    """The port of `pool serve`'s default --listen, read from its flag in src/pool/cli.rs."""
    with open(os.path.join(SRC, "pool", "cli.rs")) as f:
        found = re.findall(r'env = "SNOWLEASE_POOL_LISTEN", default_value = "[^"]*:([0-9]+)"',
                           f.read())
    if len(found) != 1:
        sys.exit(f"validate-k8s: expected one default of SNOWLEASE_POOL_LISTEN, found {found}")
    return int(found[0])


POOL_SERVE_PORT = pool_serve_port()


def env_vars_read():
    """Environment variables snowlease reads: clap env twins, std::env::var, EnvFilter."""
    names = set()
    for path in glob.glob(os.path.join(SRC, "**", "*.rs"), recursive=True):
        with open(path) as f:
            text = f.read()
        names.update(re.findall(r'env = "([A-Z0-9_]+)"', text))
        # `env = NAME` with `const NAME: &str = "..."` in the same file.
        for const in re.findall(r'env = ([A-Z][A-Z0-9_]*)\b', text):
            names.update(re.findall(rf'const {const}: &str = "([A-Z0-9_]+)"', text))
        names.update(re.findall(r'env::var(?:_os)?\("([A-Z0-9_]+)"\)', text))
        names.update(re.findall(r'from_env\("([A-Z0-9_]+)"\)', text))
    return names


ENV_READ = env_vars_read()
# Extra Kubernetes versions per folder under k8s/: plain-sidecar/ is for clusters without
# native sidecars (before 1.29), so it must pass their schemas too.
EXTRA_VERSIONS = {"plain-sidecar": ["1.27.0", "1.28.0"]}


def versions_for(path):
    rel = os.path.relpath(os.path.dirname(path), ROOT)
    return VERSIONS + EXTRA_VERSIONS.get(rel.split(os.sep)[0], [])


def check_prometheusrule(res):
    errors = []
    spec = res.get("spec") or {}
    errors += [f"spec.{k}: unknown field" for k in set(spec) - {"groups"}]
    for g, group in enumerate(spec.get("groups") or []):
        errors += [f"spec.groups.{g}.{k}: unknown field" for k in set(group) - GROUP_KEYS]
        for r, rule in enumerate(group.get("rules") or []):
            where = f"spec.groups.{g}.rules.{r}"
            errors += [f"{where}.{k}: unknown field" for k in set(rule) - RULE_KEYS]
            if "alert" in rule:
                if not (rule.get("labels") or {}).get("severity"):
                    errors.append(f"{where}: alert without labels.severity")
                if not (rule.get("annotations") or {}).get("summary"):
                    errors.append(f"{where}: alert without annotations.summary")
            if "for" in rule and not DURATION.match(str(rule["for"])):
                errors.append(f"{where}.for: not a duration: {rule['for']!r}")
            expr = str(rule.get("expr", ""))
            try:
                promql_parser.parse(expr)
            except Exception as e:  # the parser raises plain exceptions
                errors.append(f"{where}.expr: does not parse: {e}")
            for name in re.findall(r"\bsnowlease_[A-Za-z0-9_]+", expr):
                if name not in KNOWN_METRICS:
                    errors.append(f"{where}.expr: unknown metric {name}")
    return errors


def check_podmonitor(res):
    errors = []
    spec = res.get("spec") or {}
    errors += [f"spec.{k}: unknown field" for k in set(spec) - PODMONITOR_KEYS]
    if not spec.get("selector"):
        errors.append("spec.selector: missing")
    for i, ep in enumerate(spec.get("podMetricsEndpoints") or []):
        errors += [f"spec.podMetricsEndpoints.{i}.{k}: unknown field" for k in set(ep) - ENDPOINT_KEYS]
    return errors


CRD_CHECKS = {
    ("monitoring.coreos.com/v1", "PrometheusRule"): check_prometheusrule,
    ("monitoring.coreos.com/v1", "PodMonitor"): check_podmonitor,
}


SNOWLEASE_COMMANDS = {"worker", "install", "exec", "id", "status", "guard", "pool", "sleep"}


def is_snowlease(container):
    """A container running the snowlease image (its args start with a snowlease subcommand)."""
    return not container.get("command") and \
        str((container.get("args") or [""])[0]) in SNOWLEASE_COMMANDS


def containers(res):
    pod = (((res.get("spec") or {}).get("template") or {}).get("spec")) or {}
    for field in ("initContainers", "containers"):
        for c in pod.get(field) or []:
            yield f"{field}/{c.get('name')}", c


def check_hardening(res):
    """The snowlease containers harden themselves (not through the pod's securityContext,
    which would reach the app too): non-root with a numeric UID, read-only root, no
    escalation, all capabilities dropped, seccomp RuntimeDefault. App containers are the
    user's own and are not checked."""
    errors = []
    for where, c in containers(res):
        if not is_snowlease(c):
            continue
        sc = c.get("securityContext") or {}
        if sc.get("runAsNonRoot") is not True:
            errors.append(f"{where}: runAsNonRoot is not true")
        if not isinstance(sc.get("runAsUser"), int) or sc["runAsUser"] == 0:
            errors.append(f"{where}: runAsUser is not a numeric non-root UID")
        if sc.get("readOnlyRootFilesystem") is not True:
            errors.append(f"{where}: readOnlyRootFilesystem is not true")
        if sc.get("allowPrivilegeEscalation") is not False:
            errors.append(f"{where}: allowPrivilegeEscalation is not false")
        if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
            errors.append(f"{where}: capabilities.drop lacks ALL")
        if (sc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            errors.append(f"{where}: seccompProfile is not RuntimeDefault")
    return errors


def check_exec_wrapping(res):
    """A container started through `snowlease exec` has `--` in its command with the app's
    command after it (in `command` or `args`), and mounts the snowlease volume (binary and
    ID file)."""
    errors = []
    for where, c in containers(res):
        command = [str(a) for a in c.get("command") or []]
        if len(command) < 2 or not command[0].endswith("/snowlease") or command[1] != "exec":
            continue
        if "--" not in command:
            errors.append(f"{where}: the snowlease exec command must hold --")
        elif command[-1] == "--" and not c.get("args"):
            errors.append(f"{where}: snowlease exec with nothing after -- runs nothing")
        mounts = {m.get("name") for m in c.get("volumeMounts") or []}
        if "snowlease" not in mounts:
            errors.append(f"{where}: snowlease exec without the snowlease volume")
    return errors


# The image's user and group (Dockerfile: USER 65532:65532).
IMAGE_GID = 65532


def option(container, flag, env):
    """A snowlease option of `container`: `--flag=V` or `--flag V` in its args, else the value
    of env var `env`, else None."""
    args = [str(a) for a in container.get("args") or []]
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
    for e in container.get("env") or []:
        if e.get("name") == env and "value" in e:
            return str(e["value"])
    return None


def mount_holding(container, path):
    """The container's volume mount whose mountPath holds `path` (the deepest), or None."""
    found = [m for m in container.get("volumeMounts") or []
             if path.startswith(str(m.get("mountPath", "")).rstrip("/") + "/")]
    return max(found, key=lambda m: len(m["mountPath"]), default=None)


def is_exec(container):
    command = [str(a) for a in container.get("command") or []]
    return len(command) >= 2 and command[0].endswith("/snowlease") and command[1] == "exec"


def check_mint_socket(res):
    """A worker in mint mode with `--mint-socket` (SNOWLEASE_MINT_SOCKET) serves the app a
    socket it can reach: the socket's folder is a volume the sidecar mounts writable and the
    pod's first other container (the app) mounts at the same path; the app shares the
    socket's group, as the socket has mode 0660 (the pod's fsGroup, which the kubelet gives
    every container and an emptyDir, or the sidecar's group among the app's groups); and no
    container starts through `snowlease exec`, which refuses a sidecar in mint mode (exit 5)."""
    errors = []
    pod = res["spec"]["template"]["spec"]
    psc = pod.get("securityContext") or {}
    for where, c in containers(res):
        if c.get("command") or (c.get("args") or [None])[0] != "worker":
            continue
        socket = option(c, "--mint-socket", "SNOWLEASE_MINT_SOCKET")
        if socket is None:
            continue
        own = mount_holding(c, socket)
        if own is None or own.get("readOnly"):
            errors.append(f"{where}: --mint-socket {socket} is on no writable volume mount")
            continue
        app = next((a for a in pod.get("containers") or [] if a is not c), None)
        if app is None:
            errors.append(f"{where}: mints for no app container")
            continue
        theirs = mount_holding(app, socket) or {}
        if (theirs.get("name"), theirs.get("mountPath")) != (own["name"], own["mountPath"]):
            errors.append(f"containers/{app.get('name')}: mounts no volume {own['name']} at "
                          f"{own['mountPath']}, where the mint socket {socket} is")
        group = (c.get("securityContext") or {}).get("runAsGroup", psc.get("runAsGroup", IMAGE_GID))
        app_groups = {(app.get("securityContext") or {}).get("runAsGroup", psc.get("runAsGroup"))}
        app_groups |= set(psc.get("supplementalGroups") or [])
        if psc.get("fsGroup") is None and group not in app_groups:
            errors.append(f"containers/{app.get('name')}: cannot connect to the mint socket "
                          f"(mode 0660, group {group}): no pod fsGroup, and the app's groups "
                          f"{sorted(g for g in app_groups if g is not None)} lack it")
        errors += [f"{w}: snowlease exec refuses a sidecar in mint mode (exit 5); the app asks "
                   f"GET /next instead" for w, other in containers(res) if is_exec(other)]
    return errors


def check_kept(built, base):
    """An overlay that adds snowlease to `base` keeps the app's own settings: pod
    securityContext, and per app container its securityContext, image, env, ports and
    args; a wrapped container runs what the base ran: its command is the
    `snowlease exec ... --` wrapper followed by the base's own command."""
    errors = []
    bpod, pod = base["spec"]["template"]["spec"], built["spec"]["template"]["spec"]
    if bpod.get("securityContext") != pod.get("securityContext"):
        errors.append(f"pod securityContext changed: {bpod.get('securityContext')} -> "
                      f"{pod.get('securityContext')}")
    by_name = {c["name"]: c for c in pod.get("containers") or []}
    for bc in bpod.get("containers") or []:
        c = by_name.get(bc["name"])
        if c is None:
            errors.append(f"containers/{bc['name']}: gone")
            continue
        for field in ("securityContext", "image", "env", "ports", "args"):
            if bc.get(field) != c.get(field):
                errors.append(f"containers/{bc['name']}: {field} changed: {bc.get(field)} -> "
                              f"{c.get(field)}")
        command, bcommand = c.get("command") or [], bc.get("command") or []
        if command == bcommand:
            continue
        wrapper = command[:command.index("--") + 1] if "--" in command else command
        if not bcommand or command[len(wrapper):] != bcommand:
            errors.append(f"containers/{bc['name']}: command {command} does not run what the "
                          f"base ran (its command {bcommand} after the exec wrapper)")
    return errors


def serves(container):
    """`worker` or `pool serve` when `container` runs one of them, else None."""
    args = [str(a) for a in container.get("args") or []]
    if container.get("command") or not args:
        return None
    if args[0] == "worker":
        return "worker"
    if args[:2] == ["pool", "serve"]:
        return "pool serve"
    return None


def check_sidecar(res):
    """The snowlease server containers (args: worker, or pool serve): probes on /readyz and
    /livez; as an init container a native sidecar whose startupProbe gates the app."""
    errors = []
    pod = res["spec"]["template"]["spec"]
    for field in ("initContainers", "containers"):
        for c in pod.get(field) or []:
            if not serves(c):
                continue
            where = f"{field}/{c.get('name')}"
            probes = {"readinessProbe": "/readyz", "livenessProbe": "/livez"}
            if field == "initContainers":
                probes["startupProbe"] = "/readyz"
                if c.get("restartPolicy") != "Always":
                    errors.append(f"{where}: a sidecar in initContainers needs restartPolicy: Always")
            for probe, path in probes.items():
                if ((c.get(probe) or {}).get("httpGet") or {}).get("path") != path:
                    errors.append(f"{where}: {probe} must GET {path}")
            errors += check_port(res, c, where)
            unread = [e.get("name") for e in c.get("env") or [] if e.get("name") not in ENV_READ]
            if unread:
                errors.append(f"{where}: env {unread} not read by snowlease (src/)")
    return errors


def listen_port(container):
    """The port the worker (or pool serve) listens on: --listen or SNOWLEASE_LISTEN
    (SNOWLEASE_POOL_LISTEN), else the code's default."""
    if serves(container) == "pool serve":
        listen = option(container, "--listen", "SNOWLEASE_POOL_LISTEN")
        return int(listen.rsplit(":", 1)[1]) if listen else POOL_SERVE_PORT
    args = [str(a) for a in container.get("args") or []]
    for i, arg in enumerate(args):
        if arg.startswith("--listen="):
            return int(arg.rsplit(":", 1)[1])
        if arg == "--listen" and i + 1 < len(args):
            return int(args[i + 1].rsplit(":", 1)[1])
    for env in container.get("env") or []:
        if env.get("name") == "SNOWLEASE_LISTEN" and "value" in env:
            return int(str(env["value"]).rsplit(":", 1)[1])
    return DEFAULT_PORT


def check_port(res, container, where):
    """The sidecar's port named `snowlease` (probes, PodMonitor) and the prometheus.io/port
    annotation must be the port the worker listens on."""
    errors = []
    port = listen_port(container)
    named = {p.get("name"): p.get("containerPort") for p in container.get("ports") or []}
    name = "pool-serve" if serves(container) == "pool serve" else "snowlease"
    if named.get(name) != port:
        errors.append(f"{where}: port '{name}' is {named.get(name)}, "
                      f"it listens on {port} (src default {DEFAULT_PORT}, pool serve "
                      f"{POOL_SERVE_PORT})")
    annotations = (res["spec"]["template"].get("metadata") or {}).get("annotations") or {}
    if "prometheus.io/port" in annotations and str(annotations["prometheus.io/port"]) != str(port):
        errors.append(f"{where}: annotation prometheus.io/port is "
                      f"{annotations['prometheus.io/port']}, the worker listens on {port}")
    return errors


def sidecar_ports(workload):
    """Names and numbers of the ports the snowlease sidecar of `workload` declares."""
    spec = workload["spec"]["template"]["spec"]
    found = set()
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        if is_snowlease(c):
            for p in c.get("ports") or []:
                found |= {p.get("name"), p.get("containerPort")}
    return found - {None}


def check_networkpolicy(policy, workloads):
    """A NetworkPolicy beside workloads with a snowlease sidecar: it selects their pods and
    admits the sidecar's port only from selected peers (never from everywhere)."""
    errors = []
    spec = policy.get("spec") or {}
    selector = (spec.get("podSelector") or {}).get("matchLabels") or {}
    for w in workloads:
        ports = sidecar_ports(w)
        if not ports:
            continue
        labels = (w["spec"]["template"].get("metadata") or {}).get("labels") or {}
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            errors.append(f"podSelector {selector} does not select the pods of "
                          f"{w['kind']}/{w['metadata']['name']} (labels {labels})")
        if "Ingress" not in (spec.get("policyTypes") or ["Ingress"]):
            errors.append("policyTypes lacks Ingress: the sidecar's port stays open")
        for i, rule in enumerate(spec.get("ingress") or []):
            rule_ports = [p.get("port") for p in rule.get("ports") or []]
            admits = not rule_ports or any(p in ports for p in rule_ports)
            peers = rule.get("from") or []
            wide = not peers or any("ipBlock" in p and p["ipBlock"].get("cidr") in
                                    ("0.0.0.0/0", "::/0") for p in peers)
            if admits and wide:
                errors.append(f"ingress[{i}] admits the sidecar's port "
                              f"{sorted(map(str, ports))} from everywhere")
    return errors


def check_policies(resources):
    """Errors of every NetworkPolicy among one build's resources."""
    workloads = [r for r in resources if r.get("kind") in ("Deployment", "StatefulSet")]
    return [f"NetworkPolicy/{r['metadata']['name']}: {e}" for r in resources
            if r.get("kind") == "NetworkPolicy" for e in check_networkpolicy(r, workloads)]


def check_dockerfile():
    """The image's EXPOSE names the default port."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "Dockerfile")
    with open(path) as f:
        exposed = re.findall(r"^EXPOSE\s+([0-9]+)", f.read(), re.M)
    if exposed != [str(DEFAULT_PORT)]:
        return [f"Dockerfile: EXPOSE {exposed}, the default --listen port is {DEFAULT_PORT}"]
    return []


def check_resource(res, path, versions=None):
    """Error messages for one resource (empty when valid)."""
    if not isinstance(res, dict) or "kind" not in res or "apiVersion" not in res:
        return [f"{path}: not a Kubernetes resource (kind/apiVersion missing)"]
    kind, api = res["kind"], res["apiVersion"]
    name = (res.get("metadata") or {}).get("name", "?")
    label = f"{path}: {kind}/{name}"
    if (api, kind) in CRD_CHECKS:
        return [f"{label}: {e}" for e in CRD_CHECKS[(api, kind)](res)]
    errors = []
    for version in versions or versions_for(path):
        try:
            utils.validate(res, version, strict=True)
        except utils.ValidationError as e:
            where = ".".join(str(p) for p in e.path)
            errors.append(f"{label} against {version}: {where}: {e.message}")
        except utils.SchemaNotFoundError as e:
            errors.append(f"{label}: {e.message}")
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        errors += [f"{label}: {e}"
                   for e in check_hardening(res) + check_sidecar(res) + check_exec_wrapping(res)
                   + check_mint_socket(res)]
    return errors


def load(path):
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def check_kustomization(res, path):
    """Errors of a kustomization.yaml (Kustomization or Component), and the paths it uses."""
    label = f"{path}: {res.get('kind')}"
    if (res.get("apiVersion"), res.get("kind")) not in KUSTOMIZE_KINDS:
        return [f"{label}: apiVersion/kind not one of {sorted(KUSTOMIZE_KINDS)}"], set()
    errors = [f"{label}: {k}: unknown field" for k in set(res) - KUSTOMIZATION_KEYS]
    base = os.path.dirname(path)
    entries = list(res.get("resources") or []) + list(res.get("components") or [])
    entries += [p["path"] for p in res.get("patches") or [] if "path" in p]
    used = set()
    for entry in entries:
        target = os.path.normpath(os.path.join(base, entry))
        if os.path.isdir(target):
            target = os.path.join(target, "kustomization.yaml")
        if not os.path.isfile(target):
            errors.append(f"{label}: {entry} does not exist")
        used.add(target)
    return errors, used


def kustomize_build(folder):
    """The resources `kubectl kustomize <folder>` (or `kustomize build`) produces."""
    if shutil.which("kubectl"):
        argv = ["kubectl", "kustomize", folder]
    elif shutil.which("kustomize"):
        argv = ["kustomize", "build", folder]
    else:
        sys.exit("validate-k8s: needs kubectl (kustomize built in) or kustomize on PATH")
    run = subprocess.run(argv, capture_output=True, text=True)
    if run.returncode != 0:
        return None, run.stderr.strip()
    return [doc for doc in yaml.safe_load_all(run.stdout) if doc], None


def load(path):
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def base_of(res, folder, kustomization):
    """The resource of the same kind and name among the folder's own resource files."""
    for entry in kustomization.get("resources") or []:
        path = os.path.join(folder, entry)
        if os.path.isfile(path):
            for doc in load(path):
                if doc.get("kind") == res["kind"] and \
                        doc.get("metadata", {}).get("name") == res["metadata"]["name"]:
                    return doc
    return None


failures = []
checked = 0
files = sorted(glob.glob(os.path.join(ROOT, "**", "*.yaml"), recursive=True))
if not files:
    sys.exit(f"validate-k8s: no manifests under {ROOT}/")
# 1. Every kustomization.yaml is well-formed; every other file is used by one (else nothing
#    below would build, and so validate, it).
roots, used = {}, set()
for path in files:
    if os.path.basename(path) != "kustomization.yaml":
        continue
    res = load(path)[0]
    errors, uses = check_kustomization(res, path)
    failures += errors
    used |= uses
    if res.get("kind") == "Kustomization":
        roots[os.path.dirname(path)] = res
    print(("FAIL" if errors else "ok  ") + f" {path}: {res.get('kind')}")
for path in files:
    if os.path.basename(path) != "kustomization.yaml" and os.path.normpath(path) not in used:
        failures.append(f"{path}: listed in no kustomization.yaml, so never built or validated")
# 2. What `kubectl kustomize` builds from each Kustomization, resource by resource.
built = {}
for folder, kustomization in sorted(roots.items()):
    resources, error = kustomize_build(folder)
    if error:
        failures.append(f"{folder}: kubectl kustomize failed: {error}")
        continue
    built[folder] = resources
    policy_errors = [f"{folder} (built): {e}" for e in check_policies(resources)]
    if folder == ROOT and not any(r.get("kind") == "NetworkPolicy" for r in resources):
        policy_errors.append(f"{folder} (built): no NetworkPolicy: the sidecar's port is open "
                             "to every pod")
    failures += policy_errors
    versions = versions_for(os.path.join(folder, "kustomization.yaml"))
    for res in resources:
        errors = check_resource(res, f"{folder} (built)", versions)
        if kustomization.get("components") and res.get("kind") == "Deployment":
            base = base_of(res, folder, kustomization)
            if base is None:
                errors.append(f"{folder}: Deployment/{res['metadata']['name']}: no base file")
            else:
                errors += [f"{folder}: Deployment/{res['metadata']['name']}: {e}"
                           for e in check_kept(res, base)]
        checked += 1
        failures += errors
        if not errors:
            print(f"ok   {folder} (built): {res['kind']}/"
                  f"{(res.get('metadata') or {}).get('name', '-')} "
                  f"(Kubernetes {', '.join(versions)})")
failures += check_dockerfile()


def app_names(resources):
    """SNOWLEASE_APP of every snowlease container among `resources`."""
    names = set()
    for r in resources:
        if r.get("kind") not in ("Deployment", "StatefulSet", "Job"):
            continue
        spec = r["spec"]["template"]["spec"]
        for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            if is_snowlease(c):
                names |= {e.get("value") for e in c.get("env") or []
                          if e.get("name") == "SNOWLEASE_APP"}
    return names - {None}


# The guard-open Job opens the guard of the app k8s/deployment.yaml runs (a Job for another
# name leaves the pods waiting one TTL, then refuses).
guard_apps = app_names(built.get(os.path.join(ROOT, "guard-open"), []))
deploy_apps = app_names(built.get(ROOT, []))
if guard_apps != deploy_apps:
    failures.append(f"{ROOT}/guard-open: SNOWLEASE_APP {sorted(guard_apps)} differs from "
                    f"{ROOT}/deployment.yaml's {sorted(deploy_apps)}")
# Deploy step 1 names every kustomization that sets the image's tag.
with open(os.path.join(os.path.dirname(os.path.abspath(ROOT)), "docs", "kubernetes.md")) as f:
    step_one = f.read().split("1. **Image.**", 1)[-1].split("2. **", 1)[0]
for folder, kustomization in sorted(roots.items()):
    rel = os.path.relpath(folder, os.path.dirname(os.path.abspath(ROOT)))
    if folder != ROOT and kustomization.get("images") and f"`{rel}/`" not in step_one:
        failures.append(f"docs/kubernetes.md, Deploy step 1: `{rel}/` sets the image "
                        "but is not in the step's list")
for e in failures:
    print(f"FAIL {e}")

# Self-test: each broken copy must be rejected, or the check above proves nothing.
def first(folder, kind):
    """The first resource of `kind` built from k8s/<folder>; exits when that build failed."""
    found = [r for r in built.get(os.path.join(ROOT, folder) if folder else ROOT, [])
             if r.get("kind") == kind]
    if not found:
        print(f"FAIL self-test: no {kind} built from {ROOT}/{folder}; {len(failures)} failures")
        sys.exit(1)
    return found[0]


deployment = first("", "Deployment")
rule = first("monitoring", "PrometheusRule")
plain = first("plain-sidecar", "Deployment")
overlay = first("existing-deployment", "Deployment")
overlay_base = load(os.path.join(ROOT, "existing-deployment", "deployment.yaml"))[0]
mint = first("existing-deployment-mint", "Deployment")
crawler = first("pool-serve", "Deployment")


def broken(res, mutate):
    res = copy.deepcopy(res)
    mutate(res)
    return res


def pod(res):
    return res["spec"]["template"]["spec"]


cases = {
    "unknown field imagePullPolicyy in a container":
        (broken(deployment, lambda r: pod(r)["containers"][0].update(imagePullPolicyy="Always")),
        "imagePullPolicyy"),
    "replicas as a string":
        (broken(deployment, lambda r: r["spec"].update(replicas="three")),
        "spec.replicas"),
    "restartPolicy misspelt in the sidecar":
        (broken(deployment, lambda r: pod(r)["initContainers"][1].update(restartPolicy="Allways")),
        "restartPolicy"),
    "kind misspelt (Deploymnet)":
        (broken(deployment, lambda r: r.update(kind="Deploymnet")),
        "Deploymnet"),
    "sidecar port off the code's default --listen port":
        (broken(deployment, lambda r: pod(r)["initContainers"][1]["ports"][0].update(
            containerPort=DEFAULT_PORT + 1)),
        "port 'snowlease' is"),
    "prometheus.io/port annotation off the sidecar's port":
        (broken(deployment, lambda r: r["spec"]["template"]["metadata"]["annotations"].update(
            {"prometheus.io/port": "8080"})),
        "prometheus.io/port is 8080"),
    "env var POD_NAME that snowlease never reads":
        (broken(deployment, lambda r: pod(r)["initContainers"][1]["env"].append(
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})),
        "not read by snowlease"),
    "preStop.sleep in plain-sidecar/ (Kubernetes 1.30+)":
        (broken(plain, lambda r: pod(r)["containers"][0]["lifecycle"].update(
            preStop={"sleep": {"seconds": 20}})),
        "against 1.28.0"),
    "snowlease init container may escalate privileges":
        (broken(deployment, lambda r: pod(r)["initContainers"][0]["securityContext"].update(
            allowPrivilegeEscalation=True)),
        "allowPrivilegeEscalation"),
    "sidecar non-root only through the pod's securityContext (reaches the app too)":
        (broken(deployment, lambda r: (
            pod(r)["initContainers"][1]["securityContext"].pop("runAsNonRoot"),
            pod(r).update(securityContext={"runAsNonRoot": True}))),
        "runAsNonRoot is not true"),
    "exec wrapper without --":
        (broken(overlay, lambda r: pod(r)["containers"][0]["command"].remove("--")),
        "must hold --"),
    "component sets a pod-level securityContext":
        (broken(overlay, lambda r: pod(r)["securityContext"].update(runAsUser=65532)),
        "pod securityContext changed"),
    "component changes the app container's securityContext":
        (broken(overlay, lambda r: pod(r)["containers"][0]["securityContext"].update(
            readOnlyRootFilesystem=True)),
        "securityContext changed"),
    "component drops the app's command (the image's ENTRYPOINT)":
        (broken(overlay, lambda r: pod(r)["containers"][0]["command"].pop()),
        "does not run what the base ran"),
    "component changes the app's args":
        (broken(overlay, lambda r: pod(r)["containers"][0].update(args=[])),
        "args changed"),
    "alert on a metric that does not exist":
        (broken(rule, lambda r: r["spec"]["groups"][0]["rules"][0].update(
            expr="increase(snowlease_lease_lost_total[10m]) > 0")),
        "unknown metric"),
    "mint socket on no volume the app mounts":
        (broken(mint, lambda r: pod(r)["containers"][0]["volumeMounts"].pop()),
        "where the mint socket"),
    "mint socket on the sidecar's read-only root":
        (broken(mint, lambda r: pod(r)["initContainers"][0]["volumeMounts"].clear()),
        "on no writable volume mount"),
    "mint socket without a group the app has (no fsGroup)":
        (broken(mint, lambda r: (pod(r).pop("securityContext"),
                                 pod(r)["initContainers"][0]["securityContext"].pop("runAsGroup"))),
        "cannot connect to the mint socket"),
    "snowlease exec beside a minting sidecar":
        (broken(mint, lambda r: pod(r)["containers"][0].update(
            command=["/var/run/snowlease/bin/snowlease", "exec", "--", "/app/orders-server"])),
        "refuses a sidecar in mint mode"),
    "pool serve's port off its --listen":
        (broken(crawler, lambda r: pod(r)["initContainers"][0]["env"][1].update(
            value="[::]:7393")),
        "port 'pool-serve' is 7392, it listens on 7393"),
    "pool serve without its readiness probe":
        (broken(crawler, lambda r: pod(r)["initContainers"][0].pop("readinessProbe")),
        "readinessProbe must GET /readyz"),
    "alert expression that does not parse":
        (broken(rule, lambda r: r["spec"]["groups"][0]["rules"][0].update(
            expr="increase(snowlease_leases_lost_total[10m] > 0")),
        "does not parse"),
}
policy = first("", "NetworkPolicy")
policy_cases = {
    "NetworkPolicy admitting the sidecar's port from everywhere":
        (broken(policy, lambda r: r["spec"]["ingress"][1].pop("from")), "from everywhere"),
    "NetworkPolicy admitting every port from everywhere":
        (broken(policy, lambda r: r["spec"]["ingress"][0].pop("ports")), "from everywhere"),
    "NetworkPolicy selecting other pods":
        (broken(policy, lambda r: r["spec"]["podSelector"]["matchLabels"].update(
            {"app.kubernetes.io/name": "billing"})), "does not select"),
}
crawler_policy = first("pool-serve", "NetworkPolicy")
policy_cases["pool serve's port open to every pod"] = (
    broken(crawler_policy, lambda r: r["spec"]["ingress"][0].pop("from")), "from everywhere")
for what, (bad, expect) in policy_cases.items():
    hits = [e for e in check_policies([deployment, crawler, bad]) if expect in e]
    if hits:
        print(f"ok   self-test rejects {what}: {hits[0]}")
    else:
        failures.append(f"self-test: {what} was not rejected for {expect!r}")
        print(f"FAIL self-test: {what} was not rejected for {expect!r}")

# Each broken copy must be rejected for the reason it was broken for.
for what, (res, expect) in cases.items():
    errors = check_resource(res, f"self-test ({what})", VERSIONS + ["1.28.0"])
    if res["metadata"].get("name") == overlay["metadata"]["name"] and res["kind"] == "Deployment":
        errors += check_kept(res, overlay_base)
    hits = [e for e in errors if expect in e]
    if hits:
        print(f"ok   self-test rejects {what}: {hits[0]}")
    else:
        failures.append(f"self-test: {what} was not rejected for {expect!r}: {errors}")
        print(f"FAIL self-test: {what} was not rejected for {expect!r}: {errors}")


# 3. The component on ordinary kustomizations (issue 21.2), built by `kubectl kustomize`
# from overlays written to a temporary folder beside k8s/: only workloads annotated
# snowlease/app are changed, Deployments and StatefulSets alike, each keeps its command and
# args, the app name comes from its own annotation; a wrapped container without `command`
# fails the build with a message naming it.
COMPONENT_BASE = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: orders, annotations: {snowlease/app: orders}}
spec:
  selector: {matchLabels: {app: orders}}
  template:
    metadata: {labels: {app: orders}}
    spec:
      containers:
        - {name: orders, image: orders:1, command: [/app/orders-server], args: [--listen=:8000]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: billing}
spec:
  selector: {matchLabels: {app: billing}}
  template:
    metadata: {labels: {app: billing}}
    spec:
      containers:
        - {name: billing, image: billing:1, args: [--port=9000]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: payments, labels: {app: payments}, annotations: {snowlease/app: payments}}
spec:
  selector: {matchLabels: {app: payments}}
  template:
    metadata: {labels: {app: payments}}
    spec:
      containers:
        - name: payments
          image: payments:1
          command: [java, -jar, /app/payments.jar]
          args: [--server.port=8080]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: ledger, annotations: {snowlease/app: ledger-ids}}
spec:
  serviceName: ledger
  selector: {matchLabels: {app: ledger}}
  template:
    metadata: {labels: {app: ledger}, annotations: {team: money}}
    spec:
      initContainers:
        - {name: migrate, image: ledger:1, command: [/migrate]}
      containers:
        - name: ledger
          image: ledger:1
          command: [/ledger]
          volumeMounts: [{name: data, mountPath: /data}]
"""
NO_COMMAND = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: orders, annotations: {snowlease/app: orders}}
spec:
  selector: {matchLabels: {app: orders}}
  template:
    metadata: {labels: {app: orders}}
    spec:
      containers:
        - {name: orders, image: orders:1, args: [--listen=:8000]}
"""


def build_with_component(tmp, name, base, component="snowlease"):
    """`kubectl kustomize` of an overlay of `base` (YAML text) with components/`component`."""
    folder = os.path.join(tmp, name)
    os.makedirs(folder)
    with open(os.path.join(folder, "base.yaml"), "w") as f:
        f.write(base)
    component = os.path.relpath(os.path.join(ROOT, "components", component), folder)
    with open(os.path.join(folder, "kustomization.yaml"), "w") as f:
        f.write("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
                f"resources: [base.yaml]\ncomponents: [{component}]\n")
    return kustomize_build(folder)


def check_opted_in(res, base):
    """`res` (built) is `base` with snowlease added: sidecar, app name, wrapper, mount."""
    errors = [f"{res['kind']}/{res['metadata']['name']}: {e}" for e in check_kept(res, base)]
    where = f"{res['kind']}/{res['metadata']['name']}"
    app = base["metadata"]["annotations"]["snowlease/app"]
    spec = res["spec"]["template"]
    if (spec["metadata"].get("annotations") or {}).get("snowlease/app") != app:
        errors.append(f"{where}: pod annotation snowlease/app is not {app!r}")
    names = [c["name"] for c in spec["spec"].get("initContainers") or []]
    base_names = [c["name"] for c in base["spec"]["template"]["spec"].get("initContainers") or []]
    # Strategic merge puts the patch's first: the app's own start once an ID is published.
    if names != ["install-snowlease", "snowlease"] + base_names:
        errors.append(f"{where}: initContainers {names}, want snowlease's, then {base_names}")
    sidecar = next((c for c in spec["spec"].get("initContainers") or []
                    if c["name"] == "snowlease"), {})
    source = next((e.get("valueFrom") for e in sidecar.get("env") or []
                   if e["name"] == "SNOWLEASE_APP"), None)
    if source != {"fieldRef": {"fieldPath": "metadata.annotations['snowlease/app']"}}:
        errors.append(f"{where}: SNOWLEASE_APP comes from {source}")
    app_container = spec["spec"]["containers"][0]
    if not app_container.get("command", [""])[0].endswith("/snowlease"):
        errors.append(f"{where}: first container not started through snowlease exec")
    base_mounts = base["spec"]["template"]["spec"]["containers"][0].get("volumeMounts") or []
    if app_container.get("volumeMounts") != base_mounts + [
            {"name": "snowlease", "mountPath": "/var/run/snowlease", "readOnly": True}]:
        errors.append(f"{where}: volumeMounts {app_container.get('volumeMounts')}")
    return errors


def case_errors(label, component, base_text, check, failing):
    """Builds `component` on the workloads of `base_text` (YAML): each opted-in one must pass
    `check(res, base)` and the resource checks, every other one must come out unchanged; then
    on `failing` = (name, YAML, what its error must name) the build must fail naming it."""
    errors = []
    target = os.path.join(ROOT, "..", "target")
    os.makedirs(target, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target, prefix=f"{component}-cases-") as tmp:
        built, error = build_with_component(tmp, "mixed", base_text, component)
        if error:
            return [f"{label} on 2 Deployments and a StatefulSet: build failed: {error}"]
        bases = {(r["kind"], r["metadata"]["name"]): r for r in yaml.safe_load_all(base_text)}
        for res in built:
            base = bases[(res["kind"], res["metadata"]["name"])]
            if "snowlease/app" not in (base["metadata"].get("annotations") or {}):
                if res != base:
                    errors.append(f"{res['kind']}/{res['metadata']['name']}: not opted in, "
                                  f"but changed")
                continue
            errors += check(res, base)
            errors += [f"{label} case: {e}" for e in check_resource(res, f"{label} case", VERSIONS)]
        name, text, named = failing
        _, error = build_with_component(tmp, name, text, component)
        if error is None:
            errors.append(f"{name}: the build did not fail")
        elif named not in error:
            errors.append(f"{name}: the error does not name {named}: {error}")
    return errors


def report_cases(label, errors, ok):
    for e in errors:
        print(f"FAIL {label} case: {e}")
    if not errors:
        print(f"ok   {label} cases: {ok}")
    return errors


failures += report_cases(
    "component",
    case_errors("component", "snowlease", COMPONENT_BASE, check_opted_in,
                ("a wrapped container without command", NO_COMMAND, "containers/0/command")),
    "2 of 3 Deployments and a StatefulSet opted in, commands kept; no command fails the build")


# 4. The mint component (components/snowlease-mint/) the same way: the sidecar alone (no
# install-snowlease, no exec wrapper), its group the pod's fsGroup, the socket's volume
# mounted read-only into the first container, whose command and args stay (none needed);
# a workload without the annotation is left alone; a pod without fsGroup fails the build.
MINT_BASE = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: orders, annotations: {snowlease/app: orders}}
spec:
  selector: {matchLabels: {app: orders}}
  template:
    metadata: {labels: {app: orders}}
    spec:
      securityContext: {fsGroup: 1000}
      containers:
        - {name: orders, image: orders:1, args: [--listen=:8000]}
        - {name: proxy, image: envoy:1}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: billing}
spec:
  selector: {matchLabels: {app: billing}}
  template:
    metadata: {labels: {app: billing}}
    spec:
      containers:
        - {name: billing, image: billing:1, args: [--port=9000]}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: ledger, annotations: {snowlease/app: ledger-ids}}
spec:
  serviceName: ledger
  selector: {matchLabels: {app: ledger}}
  template:
    metadata: {labels: {app: ledger}}
    spec:
      securityContext: {fsGroup: 2000, runAsNonRoot: true}
      initContainers:
        - {name: migrate, image: ledger:1, command: [/migrate]}
      containers:
        - name: ledger
          image: ledger:1
          command: [/ledger]
          volumeMounts: [{name: data, mountPath: /data}]
"""
NO_FS_GROUP = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: orders, annotations: {snowlease/app: orders}}
spec:
  selector: {matchLabels: {app: orders}}
  template:
    metadata: {labels: {app: orders}}
    spec:
      containers:
        - {name: orders, image: orders:1, command: [/app/orders-server]}
"""


def check_minting(res, base):
    """`res` (built) is `base` with the minting sidecar added: app name, the sidecar alone
    in front of the base's init containers, its group the fsGroup, the app's mount, the
    other containers untouched."""
    where = f"{res['kind']}/{res['metadata']['name']}"
    errors = [f"{where}: {e}" for e in check_kept(res, base)]
    spec, bspec = res["spec"]["template"], base["spec"]["template"]
    app = base["metadata"]["annotations"]["snowlease/app"]
    if (spec["metadata"].get("annotations") or {}).get("snowlease/app") != app:
        errors.append(f"{where}: pod annotation snowlease/app is not {app!r}")
    inits = spec["spec"].get("initContainers") or []
    base_inits = bspec["spec"].get("initContainers") or []
    if [c["name"] for c in inits] != ["snowlease"] + [c["name"] for c in base_inits]:
        errors.append(f"{where}: initContainers {[c['name'] for c in inits]}, want snowlease, "
                      f"then the base's")
    sidecar = inits[0] if inits else {}
    if option(sidecar, "--mint-socket", "SNOWLEASE_MINT_SOCKET") != "/var/run/snowlease/mint.sock" \
            or "--mint" not in (sidecar.get("args") or []):
        errors.append(f"{where}: the sidecar does not mint on /var/run/snowlease/mint.sock")
    fs_group = bspec["spec"]["securityContext"]["fsGroup"]
    if (sidecar.get("securityContext") or {}).get("runAsGroup") != fs_group:
        errors.append(f"{where}: the sidecar's runAsGroup is not the fsGroup {fs_group}")
    first, bfirst = spec["spec"]["containers"][0], bspec["spec"]["containers"][0]
    if first.get("volumeMounts") != (bfirst.get("volumeMounts") or []) + [
            {"name": "snowlease", "mountPath": "/var/run/snowlease", "readOnly": True}]:
        errors.append(f"{where}: volumeMounts {first.get('volumeMounts')}")
    if spec["spec"]["containers"][1:] != bspec["spec"]["containers"][1:]:
        errors.append(f"{where}: containers after the first changed")
    return errors


failures += report_cases(
    "mint component",
    case_errors("mint component", "snowlease-mint", MINT_BASE, check_minting,
                ("a pod without fsGroup", NO_FS_GROUP, "securityContext/fsGroup")),
    "a Deployment and a StatefulSet opted in, sidecar in the fsGroup, commands untouched; "
    "no fsGroup fails the build")

print(f"validate-k8s: {len(files)} files, {len(roots)} kustomizations built, {checked} "
      f"resources checked against Kubernetes "
      f"{', '.join(VERSIONS)}; {len(cases) + len(policy_cases)} broken copies; {len(failures)} failures")
sys.exit(1 if failures else 0)
