"""The single-node cluster itself: pods run, cluster DNS answers, every packet stays on
the machine, and nothing is ever pulled.

- a pod of the locally built Debian image runs on the node; it resolves the cluster's
  names through CoreDNS and reaches the API server through the `kubernetes` Service, and
  a name outside the cluster does not resolve (there is no upstream resolver);
- the network guard: an unprogrammed ClusterIP is refused at once (from the host and from
  a pod) instead of leaving by the default route, a pod cannot reach past the node, and
  the pod network masquerades nothing;
- an image that is not on the node fails with containerd's pull going to its dead-end
  proxy on 127.0.0.1, not to a registry.

The host-level checks need the local node (they are skipped, saying so, against a
cluster given with --kubeconfig).
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import socket
import subprocess
import textwrap
from typing import Any

import pytest
from fixtures.binaries import Image
from fixtures.controlplane import KubeCluster
from fixtures.node_config import DNS_IP, NO_PULLS_PROXY, POD_CIDR, SERVICE_CIDR, SERVICE_IP
from fixtures.node_host import GUARD_CHAIN
from node_support import DEADLINE, poll

# Outside every range the cluster created (TEST-NET-2, RFC 5737): nothing answers there.
OUTSIDE = "198.51.100.7"


def _local(cluster: KubeCluster) -> None:
    if cluster.node is None:
        pytest.skip("checks the local node's host (iptables, containerd): not with --kubeconfig")


def run_pod(cluster: KubeCluster, image: Image, script: str, namespace: str = "default") -> str:
    """Run `python3 -c script` in a pod of `image` to completion; return its output."""
    name = f"probe-{secrets.token_hex(3)}"
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
        "spec": {"restartPolicy": "Never", "automountServiceAccountToken": True,
                 "containers": [{"name": "probe", "image": image.ref, "imagePullPolicy": "Never",
                                 "command": ["python3", "-c", textwrap.dedent(script)]}]},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    try:
        def finished() -> str | None:
            phase = cluster.kubectl("-n", namespace, "get", "pod", name, "-o", "jsonpath={.status.phase}").stdout
            return phase if phase in ("Succeeded", "Failed") else None

        phase = poll(finished, what=f"pod {name} finished")
        logs = cluster.kubectl("-n", namespace, "logs", name).stdout
        assert phase == "Succeeded", f"pod {name} {phase}:\n{logs}"
        return logs
    finally:
        cluster.kubectl("-n", namespace, "delete", "pod", name, "--wait=false", check=False)


CONNECT = """
import json, socket, sys
def connect(host, port):
    s = socket.socket(); s.settimeout(20)
    try:
        s.connect((host, port)); return "open"
    except ConnectionRefusedError:
        return "refused"
    except socket.timeout:
        return "timeout"
    except OSError as e:
        return type(e).__name__ + ": " + str(e)
    finally:
        s.close()
"""


def test_a_pod_runs_and_resolves_cluster_names_only(node: KubeCluster, images: dict[str, Image]) -> None:
    nodes = json.loads(node.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    assert len(nodes) == 1
    ready = {c["type"]: c["status"] for c in nodes[0]["status"]["conditions"]}
    assert ready["Ready"] == "True", ready
    out = run_pod(node, images["debian-python"], CONNECT + """
import ssl, urllib.request, urllib.error
out = {"kubernetes": socket.gethostbyname("kubernetes.default.svc.cluster.local")}
try:
    out["outside"] = socket.gethostbyname("example.com")
except socket.gaierror as e:
    out["outside"] = "unresolved"
d = "/var/run/secrets/kubernetes.io/serviceaccount/"
req = urllib.request.Request("https://kubernetes.default.svc/version",
                             headers={"Authorization": "Bearer " + open(d + "token").read()})
ctx = ssl.create_default_context(cafile=d + "ca.crt")
out["version"] = json.load(urllib.request.urlopen(req, context=ctx, timeout=20))["gitVersion"]
out["resolv"] = open("/etc/resolv.conf").read()
print(json.dumps(out))
""")
    result = json.loads(out.strip().splitlines()[-1])
    assert result["kubernetes"] == SERVICE_IP
    assert result["outside"] == "unresolved", "a name outside the cluster resolved: a query left the node"
    assert result["version"].startswith("v1.36."), result
    assert f"nameserver {DNS_IP}" in result["resolv"]


def test_unprogrammed_cluster_ip_is_refused_and_pods_cannot_leave_the_node(
    node: KubeCluster, images: dict[str, Image]
) -> None:
    _local(node)
    # 1. The guard is in place in OUTPUT and FORWARD (installed before kube-proxy, which
    #    prepends its own chains later: they accept only established or marked traffic).
    rules = subprocess.run(["iptables", "-w", "5", "-S", GUARD_CHAIN], capture_output=True, text=True,
                           check=True).stdout
    assert f"-A {GUARD_CHAIN} -d {SERVICE_CIDR}" in rules and "-j REJECT" in rules, rules
    assert f"-A {GUARD_CHAIN} -s {POD_CIDR} ! -d {POD_CIDR}" in rules, rules
    for builtin in ("OUTPUT", "FORWARD"):
        chain = subprocess.run(["iptables", "-w", "5", "-S", builtin], capture_output=True, text=True,
                               check=True).stdout.splitlines()
        assert f"-A {builtin} -j {GUARD_CHAIN}" in chain, f"{builtin} does not jump to the guard: {chain}"
    # 2. Nothing masquerades pod traffic to the outside: the only MASQUERADE is kube-proxy's,
    #    for packets it marked (hairpin traffic to a Service), and there is no CNI chain.
    nat = subprocess.run(["iptables", "-w", "5", "-t", "nat", "-S"], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    for rule in nat:
        if "MASQUERADE" in rule or "SNAT" in rule:
            assert rule.startswith("-A KUBE-POSTROUTING "), f"a masquerade that is not kube-proxy's: {rule}"
        assert " CNI-" not in rule and not rule.startswith("-N CNI-"), rule
    kube_postrouting = [r for r in nat if r.startswith("-A KUBE-POSTROUTING ")]
    assert kube_postrouting[0] == "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN", kube_postrouting
    # 3. A Service address nobody programmed fails at once, from the host...
    taken = {s["spec"]["clusterIP"] for s in
             json.loads(node.kubectl("get", "services", "-A", "-o", "json").stdout)["items"]}
    unprogrammed = next(str(ip) for ip in ipaddress.ip_network(SERVICE_CIDR).hosts()
                        if str(ip) not in taken and int(str(ip).rsplit(".", 1)[1]) > 200)
    s = socket.socket()
    s.settimeout(20)
    with pytest.raises(ConnectionRefusedError):
        s.connect((unprogrammed, 80))
    s.close()
    # ... and from a pod; a programmed one works; nothing past the node is reachable.
    out = run_pod(node, images["debian-python"], CONNECT + f"""
print(json.dumps({{"unprogrammed": connect({unprogrammed!r}, 80), "kubernetes": connect({SERVICE_IP!r}, 443),
                   "outside": connect({OUTSIDE!r}, 9)}}))
""")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    assert result == {"unprogrammed": "refused", "kubernetes": "open", "outside": "refused"}, result
    counters = subprocess.run(["iptables", "-w", "5", "-L", GUARD_CHAIN, "-v", "-n", "-x"], capture_output=True,
                              text=True, check=True).stdout
    egress = [line for line in counters.splitlines() if "no pod egress" in line]
    assert egress and int(egress[0].split()[0]) > 0, f"the pod's packet was not rejected by the guard:\n{counters}"


def test_an_image_not_on_the_node_is_never_pulled(node: KubeCluster) -> None:
    _local(node)
    name = f"nopull-{secrets.token_hex(3)}"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
           "spec": {"restartPolicy": "Never", "containers": [
               {"name": "c", "image": "agent-saga.local/not-built-here:1", "imagePullPolicy": "IfNotPresent"}]}}
    node.kubectl("apply", "-f", "-", input=json.dumps(pod))
    try:
        def pull_failed() -> str | None:
            events = node.kubectl("-n", "default", "get", "events", "--field-selector",
                                  f"involvedObject.name={name},reason=Failed", "-o", "json").stdout
            messages = [e["message"] for e in json.loads(events)["items"]]
            return "\n".join(messages) if messages else None

        message = poll(pull_failed, timeout=DEADLINE, what="the pull to fail")
        proxy = NO_PULLS_PROXY.removeprefix("http://")
        assert proxy in message, f"the pull did not go to containerd's dead-end proxy {proxy}: {message}"
    finally:
        node.kubectl("-n", "default", "delete", "pod", name, "--wait=false", check=False)
