"""The cluster as the user's own kubeconfig reaches it, and the API server's refusals as
messages that say what to do.

Nothing here holds a credential of its own: the client is built from the kubeconfig
(``--kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``; ``--context``), or
from the pod's service account when run inside a cluster without one, so RBAC and
admission apply to the person running the command. ``--as`` / ``--as-group``
impersonate, exactly as kubectl's flags do (the user needs the ``impersonate`` verb).

The ``kubernetes`` package loads when a command first talks to the cluster
(``pip install 'agent-saga[kubectl]'``); without it, the command says so.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import SagaError

__all__ = ["GROUP", "PLURALS", "VERSION", "Cluster", "ClusterError", "cluster_arguments", "connect",
           "network_errors"]

GROUP = "agentsaga.dev"
VERSION = "v1alpha1"
#: Kind -> plural of the five custom resources (docs/crds.md).
PLURALS = {
    "KillSwitch": "killswitches",
    "BudgetLimit": "budgetlimits",
    "SagaPolicy": "sagapolicies",
    "ModelRoute": "modelroutes",
    "Approval": "approvals",
}

T = TypeVar("T")


class ClusterError(SagaError):
    """The cluster refused or could not be asked; the message names what to do.

    ``code`` is the exit status: 1 the cluster answered no (RBAC, admission, not found,
    invalid, a conflict), 2 it could not be asked (no kubeconfig, unreachable)."""

    def __init__(self, message: str, *, code: int = 1, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.code = code


def cluster_arguments(p: argparse.ArgumentParser) -> None:
    """kubectl's connection flags (defaults suppressed, so they may come before or after
    the subcommand without one position overwriting the other)."""
    g = p.add_argument_group("cluster (as kubectl)")
    s = argparse.SUPPRESS
    g.add_argument("--kubeconfig", default=s, help="the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    g.add_argument("--context", default=s, help="the kubeconfig context (default: its current context)")
    g.add_argument("-n", "--namespace", default=s,
                   help="the namespace (default: the context's namespace, else default)")
    g.add_argument("-A", "--all-namespaces", action="store_true", default=s, help="every namespace")
    g.add_argument("--as", dest="as_user", metavar="USER", default=s, help="impersonate this user (as kubectl --as)")
    g.add_argument("--as-group", dest="as_group", metavar="GROUP", default=s,
                   help="impersonate this group too (with --as)")
    g.add_argument("--request-timeout", type=float, default=s, metavar="SECONDS",
                   help="give up on one API request after this long (default 30)")


@dataclass
class Cluster:
    """An API client as the user, the namespace commands act in, and error translation."""

    api: Any
    namespace: str
    all_namespaces: bool
    server: str
    context: str | None
    timeout: float = 30.0
    _user: str | None = field(default=None, repr=False)

    # ------------------------------------------------------------------ identity
    def username(self) -> str | None:
        """Who the API server says the caller is (a SelfSubjectReview), or None when this
        cluster cannot say (an API server older than 1.28, or the review forbidden)."""
        if self._user is None:
            from kubernetes import client
            from kubernetes.client.exceptions import ApiException

            try:
                review = client.AuthenticationV1Api(self.api).create_self_subject_review(
                    client.V1SelfSubjectReview(), _request_timeout=self.timeout)
            except ApiException as e:
                if e.status in (403, 404, 405):
                    return None
                raise self.explain(e, "ask who you are (create selfsubjectreviews)") from None
            except network_errors() as e:
                raise self.unreachable(e) from None
            info = review.status.user_info if review.status is not None else None
            self._user = (info.username if info is not None else None) or ""
        return self._user or None

    # ------------------------------------------------------------------ custom objects
    def custom(self) -> Any:
        """The ``CustomObjectsApi`` of this client."""
        from kubernetes import client

        return client.CustomObjectsApi(self.api)

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """``fn(*args, **kw)`` with this cluster's timeout; an ``ApiException`` or a
        connection failure becomes a ``ClusterError`` naming ``what`` was refused."""
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, _request_timeout=self.timeout, **kw)
        except ApiException as e:
            raise self.explain(e, what) from None
        except network_errors() as e:
            raise self.unreachable(e) from None

    def list(self, kind: str, namespace: str | None = None, *, label_selector: str | None = None) -> list[dict[str, Any]]:
        """Objects of ``kind`` in ``namespace`` (``None``: every namespace), sorted by
        namespace and name."""
        plural = PLURALS[kind]
        api = self.custom()
        kw: dict[str, Any] = {"label_selector": label_selector} if label_selector else {}
        where = f"in namespace {namespace}" if namespace else "in any namespace"
        if namespace is None:
            out = self.call(f"list {plural} {where}", api.list_cluster_custom_object, GROUP, VERSION, plural, **kw)
        else:
            out = self.call(f"list {plural} {where}", api.list_namespaced_custom_object, GROUP, VERSION,
                            namespace, plural, **kw)
        items: list[dict[str, Any]] = list(out.get("items") or [])
        items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        return items

    def scope_namespace(self) -> str | None:
        """``None`` with ``-A``, else the namespace."""
        return None if self.all_namespaces else self.namespace

    # ------------------------------------------------------------------ errors
    def unreachable(self, exc: BaseException) -> ClusterError:
        """The API server did not answer: say where we tried and what to check."""
        ctx = f" (context {self.context})" if self.context else ""
        return ClusterError(
            f"cannot reach the Kubernetes API server at {self.server}{ctx}: {_short(exc)}. Check that the "
            f"cluster is running and that --context / --kubeconfig name it (kubectl cluster-info)", code=2)

    def explain(self, e: Any, what: str) -> ClusterError:
        """An ``ApiException`` as a sentence: what was refused, the API server's reason,
        and what to do about it."""
        status = int(getattr(e, "status", 0) or 0)
        message = _api_message(e)
        who = f"as {self._user}" if self._user else "with your credentials"
        if status == 401:
            return ClusterError(f"the API server did not accept your credentials ({message}): log in again or "
                                f"check the user of your kubeconfig context", code=2)
        if status == 403 and _is_admission(message):
            return ClusterError(f"refused by the cluster's admission policy when trying to {what}: {message}")
        if status == 403:
            return ClusterError(
                f"forbidden: you cannot {what} ({message}). Ask a cluster admin for a RoleBinding that grants "
                f"it (docs/kubectl-plugin.md, \"Permissions\"); check with kubectl auth can-i")
        if status == 404 and "the server could not find the requested resource" in message:
            return ClusterError(
                f"the agent-saga CustomResourceDefinitions are not installed in this cluster (cannot {what}): "
                f"install the chart (helm install agent-saga charts/agent-saga) or kubectl apply -f crds/")
        if status == 404:
            return ClusterError(f"not found: cannot {what} ({message}); check the name and the namespace "
                                f"(-n NAMESPACE)")
        if status == 409:
            return ClusterError(f"conflict: cannot {what} ({message}); it changed meanwhile or already "
                                f"exists: look at it again and retry")
        if status == 422:
            return ClusterError(f"the API server refused the object (cannot {what}): {message}")
        if status == 429:
            return ClusterError(
                f"the API server is shedding load: it refused to {what} (HTTP 429: {message}); nothing was "
                f"changed. A read is asked again when the server says, up to 10 times, before this message. "
                f"Try again in a minute; if it persists, a cluster admin can see which priority level rejects "
                f"your requests: kubectl get flowschemas,prioritylevelconfigurations", code=2)
        if status == 0:
            return self.unreachable(e)
        return ClusterError(f"cannot {what} {who}: HTTP {status} {getattr(e, 'reason', '')}: {message}")


def _api_message(e: Any) -> str:
    body = getattr(e, "body", None)
    try:
        doc = json.loads(body) if body else {}
    except (TypeError, ValueError):
        doc = {}
    if isinstance(doc, dict) and doc.get("message"):
        return str(doc["message"])
    return str(getattr(e, "reason", "") or e)


def _is_admission(message: str) -> bool:
    # A ValidatingAdmissionPolicy's refusal: '... is forbidden: ValidatingAdmissionPolicy 'p'
    # with binding 'p' denied request: ...'; a webhook's: 'admission webhook "w" denied the
    # request: ...'. RBAC's says 'User "eve" cannot patch resource ...'.
    return "denied request" in message or "denied the request" in message or "admission" in message.lower()


def network_errors() -> tuple[type[BaseException], ...]:
    """What the client raises when the API server does not answer (refused, timed out,
    TLS failed): urllib3's errors and ``OSError``."""
    import urllib3.exceptions

    return (OSError, urllib3.exceptions.HTTPError)


def _short(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    text = str(reason if reason is not None else exc)
    return text if len(text) <= 300 else text[:297] + "..."


def connect(args: argparse.Namespace) -> Cluster:
    """A ``Cluster`` from kubectl's flags on ``args`` (kubeconfig, context, namespace,
    impersonation). Raises ``ClusterError`` (exit 2) when there is no usable config."""
    try:
        from kubernetes import config
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise ClusterError("kubectl saga needs the kubernetes package: pip install 'agent-saga[kubectl]'",
                           code=2) from None
    kubeconfig = getattr(args, "kubeconfig", None)
    context = getattr(args, "context", None)
    namespace = getattr(args, "namespace", None)
    try:
        api = config.new_client_from_config(config_file=kubeconfig, context=context)  # type: ignore[no-untyped-call]
        contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        chosen = next((c for c in contexts if c.get("name") == context), None) if context else active
        current = (chosen or {}).get("name")
        namespace = namespace or ((chosen or {}).get("context") or {}).get("namespace") or "default"
    except ConfigException as e:
        api, current = _in_cluster(str(e), kubeconfig, context)
        namespace = namespace or _pod_namespace() or "default"
    except OSError as e:
        raise ClusterError(f"cannot read the kubeconfig {kubeconfig or '(default)'}: {e}", code=2) from None
    # As kubectl (client-go): a read the API server answers 429 or 5xx with Retry-After
    # (load shedding by API Priority and Fairness, a watch cache still initializing) is
    # asked again after the time it names, up to 10 times, before the command fails.
    api.configuration.client_go_retries = True
    if getattr(args, "as_user", None):
        api.set_default_header("Impersonate-User", args.as_user)
    if getattr(args, "as_group", None):
        api.set_default_header("Impersonate-Group", args.as_group)
    return Cluster(api=api, namespace=namespace, all_namespaces=bool(getattr(args, "all_namespaces", False)),
                   server=str(api.configuration.host), context=current,
                   timeout=float(getattr(args, "request_timeout", None) or 30.0))


def _in_cluster(why: str, kubeconfig: str | None, context: str | None) -> tuple[Any, str | None]:
    import os

    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            return client.ApiClient(), None
        except ConfigException:
            pass
    raise ClusterError(
        f"no usable kubeconfig at {kubeconfig or '$KUBECONFIG or ~/.kube/config'} ({why}): pass --kubeconfig FILE or set KUBECONFIG, and --context NAME if it has "
        f"several (kubectl config get-contexts lists them)", code=2) from None


def _pod_namespace() -> str | None:
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip() or None
    except OSError:
        return None
