"""RBAC is live on the API server the tests use: no binding, no access; a binding grants it.

The chart's least-privilege RBAC (DESIGN.md §5) is only worth testing against an
authorizer that actually says no.
"""

from __future__ import annotations

import pytest
from fixtures.controlplane import KubeCluster
from fixtures.polling import until
from kubernetes import client
from kubernetes.client.rest import ApiException


def _can(authz: client.AuthorizationV1Api, user: str, namespace: str, verb: str, resource: str) -> bool:
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=user,
            groups=["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
            resource_attributes=client.V1ResourceAttributes(
                namespace=namespace, verb=verb, resource=resource
            ),
        )
    )
    return bool(authz.create_subject_access_review(review).status.allowed)


def test_service_account_denied_until_bound(kube: KubeCluster, kube_namespace: str) -> None:
    admin = kube.api_client()
    core = client.CoreV1Api(admin)
    rbac = client.RbacAuthorizationV1Api(admin)
    authz = client.AuthorizationV1Api(admin)
    ns = kube_namespace
    sa = "agent-saga-operator"
    user = f"system:serviceaccount:{ns}:{sa}"

    core.create_namespaced_service_account(
        ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=sa))
    )
    core.create_namespaced_config_map(
        ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="policy"), data={"k": "v"})
    )

    # Without a binding: the SubjectAccessReview says no, and a request made as the
    # service account (impersonated by the admin) is refused with 403.
    assert not _can(authz, user, ns, "list", "configmaps")
    as_sa = client.CoreV1Api(kube.api_client(user=user))
    with pytest.raises(ApiException) as exc:
        as_sa.list_namespaced_config_map(ns)
    assert exc.value.status == 403
    assert "cannot list resource" in str(exc.value.body)

    rbac.create_namespaced_role(
        ns,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="configmap-reader"),
            rules=[client.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["get", "list", "watch"])],
        ),
    )
    rbac.create_namespaced_role_binding(
        ns,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="configmap-reader"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="configmap-reader"),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name=sa, namespace=ns)],
        ),
    )

    # The authorizer reads RBAC objects from an informer: allow it a moment to catch up.
    until("the RoleBinding taking effect", lambda: _can(authz, user, ns, "list", "configmaps"), timeout=30,
          interval=0.1)

    names = [cm.metadata.name for cm in as_sa.list_namespaced_config_map(ns).items]
    assert "policy" in names

    # Least privilege: the binding grants exactly what the Role says, in that namespace only.
    assert not _can(authz, user, ns, "delete", "configmaps")
    with pytest.raises(ApiException) as exc:
        as_sa.delete_namespaced_config_map("policy", ns)
    assert exc.value.status == 403
    assert not _can(authz, user, "default", "list", "configmaps")
    assert not _can(authz, user, ns, "list", "secrets")


def test_anonymous_and_unknown_users_are_refused(kube: KubeCluster, kube_namespace: str) -> None:
    nobody = client.CoreV1Api(kube.api_client(user="mallory"))
    with pytest.raises(ApiException) as exc:
        nobody.list_namespaced_secret(kube_namespace)
    assert exc.value.status == 403
